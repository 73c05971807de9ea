package reporter

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/addon-heartbeat/addon-heartbeat/internal/testenv"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/election"
)

// leaseGate is a reverse proxy to the API server that, once closed, holds
// every write to a Lease until it is opened again.
type leaseGate struct {
	closed atomic.Bool
	held   chan struct{} // closed when the first write is held
	once   sync.Once
	open   chan struct{}
}

func (g *leaseGate) handler(t *testing.T, upstream *rest.Config) http.Handler {
	t.Helper()
	target, err := url.Parse(upstream.Host)
	if err != nil {
		t.Fatal(err)
	}
	transport, err := rest.TransportFor(upstream)
	if err != nil {
		t.Fatal(err)
	}
	proxy := &httputil.ReverseProxy{
		Rewrite:   func(r *httputil.ProxyRequest) { r.SetURL(target) },
		Transport: transport,
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if g.closed.Load() && r.Method != http.MethodGet && strings.Contains(r.URL.Path, "/leases/") {
			g.once.Do(func() { close(g.held) })
			select {
			case <-g.open:
			case <-r.Context().Done():
				return
			}
		}
		proxy.ServeHTTP(w, r)
	})
}

// TestProbesAnswerUntilTheLeaseIsReleased runs a leading reporter against a
// real API server and holds its Lease release on SIGTERM: the probes and
// metrics must still answer then, and Run return only after the release.
func TestProbesAnswerUntilTheLeaseIsReleased(t *testing.T) {
	env, err := testenv.Start(testenv.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	k8s, err := client.New(env.Config, client.Options{Scheme: testenv.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	ns, err := testenv.CreateAddon(ctx, k8s, "addon-instance", time.Second)
	if err != nil {
		t.Fatal(err)
	}

	gate := &leaseGate{held: make(chan struct{}), open: make(chan struct{})}
	apiServer := httptest.NewServer(gate.handler(t, env.Config))
	t.Cleanup(apiServer.Close)
	var openOnce sync.Once
	openGate := func() { openOnce.Do(func() { close(gate.open) }) }
	t.Cleanup(openGate)

	cfg := testConfig("127.0.0.1:0", "127.0.0.1:0")
	cfg.Namespace, cfg.LeaderElectionNamespace = ns, ns
	rec, log := newLogRecorder()
	runCtx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- Run(runCtx, cfg, &rest.Config{Host: apiServer.URL}, log) }()
	health := servedAddress(t, rec, "health probes")
	metrics := servedAddress(t, rec, "metrics")

	lease := &coordinationv1.Lease{}
	leaseKey := client.ObjectKey{Namespace: ns, Name: election.LeaseName("addon-instance")}
	await(t, 30*time.Second, "the reporter leading", func() bool {
		err := k8s.Get(ctx, leaseKey, lease)
		return err == nil && ptr.Deref(lease.Spec.HolderIdentity, "") == cfg.Identity
	})
	await(t, 15*time.Second, "a heartbeat", func() bool {
		_, body := httpGet(t, "http://"+metrics+"/metrics")
		v, _ := sample(body, "addon_heartbeat_heartbeats_sent_total")
		return v != "" && v != "0"
	})

	// SIGTERM, with the Lease release held.
	gate.closed.Store(true)
	cancel()
	select {
	case <-gate.held:
	case err := <-done:
		t.Fatalf("Run returned (%v) without writing the Lease:\n%s", err, rec)
	case <-time.After(15 * time.Second):
		t.Fatalf("no Lease write within 15s of the end of the context:\n%s", rec)
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		if code, body := httpGet(t, "http://"+health+path); code != http.StatusOK || body != "ok" {
			t.Errorf("during the hand-over, GET %s = %d %q, want 200 \"ok\"", path, code, body)
		}
	}
	if code, body := httpGet(t, "http://"+metrics+"/metrics"); code != http.StatusOK ||
		!strings.Contains(body, "addon_heartbeat_heartbeats_sent_total") {
		t.Errorf("during the hand-over, GET /metrics = %d:\n%s", code, body)
	}
	select {
	case err := <-done:
		t.Fatalf("Run returned (%v) before the Lease was released", err)
	default:
	}

	openGate()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Run did not return within 15s of the release")
	}
	if err := k8s.Get(ctx, leaseKey, lease); err != nil {
		t.Fatal(err)
	}
	if holder := ptr.Deref(lease.Spec.HolderIdentity, ""); holder != "" {
		t.Errorf("Lease still held by %q after Run returned", holder)
	}
	for _, addr := range []string{health, metrics} {
		if resp, err := noKeepAlive.Get("http://" + addr + "/readyz"); err == nil {
			resp.Body.Close()
			t.Errorf("%s still answers after Run returned", addr)
		}
	}
}
