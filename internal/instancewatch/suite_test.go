package instancewatch

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/addon-heartbeat/addon-heartbeat/internal/logging"
	"github.com/addon-heartbeat/addon-heartbeat/internal/testenv"
)

// One real kube-apiserver + etcd for the package, with the upstream
// AddonInstance CRD.
var (
	env *envtest.Environment
	k8s client.Client
)

const testTimeout = 60 * time.Second

func TestMain(m *testing.M) { os.Exit(runSuite(m)) }

func runSuite(m *testing.M) int {
	log, err := logging.New(logging.LevelError)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctrl.SetLogger(log)
	if env, err = testenv.Start(testenv.Options{}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() {
		if err := env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stopping envtest:", err)
		}
	}()
	if k8s, err = client.New(env.Config, client.Options{Scheme: testenv.Scheme()}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
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
