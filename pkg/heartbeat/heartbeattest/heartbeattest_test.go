//go:build go1.25

package heartbeattest_test

import (
	"context"
	"os"
	"testing"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/heartbeattest"
)

// The environment serves the AddonInstance API as an administrator, refuses
// a client without the token, and leaves nothing behind.
func TestStartServesTheAddonInstanceAPI(t *testing.T) {
	env, err := heartbeattest.Start(heartbeattest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// Through client-go, which waits out a 429 as an API server asks while
	// it starts.
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/apis/addons.managed.openshift.io/v1alpha1/addoninstances", "/apis/coordination.k8s.io/v1/leases"} {
		if err := cs.RESTClient().Get().AbsPath(path).Do(context.Background()).Error(); err != nil {
			t.Errorf("GET %s: %v", path, err)
		}
	}
	anon := rest.AnonymousClientConfig(env.Config)
	ac, err := rest.HTTPClientFor(anon)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := ac.Get(env.Config.Host + "/apis/addons.managed.openshift.io/v1alpha1/addoninstances")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 403 && resp.StatusCode != 401 {
		t.Errorf("anonymous list: %s, want refused", resp.Status)
	}
	dir := env.Dir
	if err := env.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("%s left behind: %v", dir, err)
	}
}
