package instancewatch

import (
	"context"
	"os"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/addon-heartbeat/addon-heartbeat/internal/logging"
	"github.com/addon-heartbeat/addon-heartbeat/internal/testenv"
)

// One real kube-apiserver + etcd for the package, with the upstream
// AddonInstance CRD.
var (
	env *testenv.Environment
	k8s client.Client
)

const testTimeout = 60 * time.Second

func TestMain(m *testing.M) {
	os.Exit(testenv.RunSuite(m, logging.LevelError, testenv.Options{}, func(s *testenv.Suite) (func() error, error) {
		env, k8s = s.Env, s.Client
		return nil, nil
	}))
}

// await polls cond until it holds, failing the test with what it last saw.
func await(t *testing.T, what string, cond func(ctx context.Context) (bool, string)) {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, testTimeout, true, func(ctx context.Context) (bool, error) {
		ok, seen := cond(ctx)
		last = seen
		return ok, nil
	})
	if err != nil {
		t.Fatalf("%s: %v (last: %s)", what, err, last)
	}
}
