package heartbeattest_test

import (
	"context"
	"net/http"
	"os"
	"testing"

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
	c, err := rest.HTTPClientFor(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]int{
		"/apis/addons.managed.openshift.io/v1alpha1/addoninstances": 200,
		"/apis/coordination.k8s.io/v1/leases":                       200,
	} {
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, env.Config.Host+path, nil)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET %s: %s, want %d", path, resp.Status, want)
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
