//go:build go1.25

package heartbeat

import (
	"io"
	"net"
	"net/url"
	"runtime"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

// cutProxy forwards TCP to the API server until cut, which closes its
// listener and every connection: an API server outage, seen from the client.
type cutProxy struct {
	target string
	addr   string

	mu    sync.Mutex
	ln    net.Listener
	conns map[net.Conn]bool
	wg    sync.WaitGroup
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	p := &cutProxy{target: target, addr: "127.0.0.1:0", conns: map[net.Conn]bool{}}
	if err := p.restore(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.cut)
	return p
}

func (p *cutProxy) restore() error {
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.ln, p.addr = ln, ln.Addr().String()
	p.mu.Unlock()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", p.target)
			if err != nil {
				_ = c.Close()
				continue
			}
			p.mu.Lock()
			p.conns[c], p.conns[up] = true, true
			p.mu.Unlock()
			for _, pair := range [][2]net.Conn{{c, up}, {up, c}} {
				p.wg.Add(1)
				go func() {
					defer p.wg.Done()
					_, _ = io.Copy(pair[0], pair[1])
					_ = pair[0].Close()
					_ = pair[1].Close()
				}()
			}
		}
	}()
	return nil
}

func (p *cutProxy) cut() {
	p.mu.Lock()
	if p.ln != nil {
		_ = p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		_ = c.Close()
	}
	p.conns = map[net.Conn]bool{}
	p.mu.Unlock()
	p.wg.Wait()
}

func TestAnAPIOutageDelaysHeartbeatsButNeverStopsTheReporter(t *testing.T) {
	ns := newNamespace(t)
	createInstance(t, ns, "addon-instance", time.Second)
	rec := record(t, ns, "addon-instance")
	u, err := url.Parse(adminCfg.Host)
	if err != nil {
		t.Fatal(err)
	}
	proxy := newCutProxy(t, u.Host)
	cfg := rest.CopyConfig(adminCfg)
	cfg.Host = "https://" + proxy.addr
	rn := startReporter(t, cfg, Options{Namespace: ns, Identity: "only", DeploymentHealth: true})
	rec.waitBeats(t, 3, 30*time.Second)
	steady := runtime.NumGoroutine()

	proxy.cut()
	cutAt := time.Now()
	eventually(t, 30*time.Second, "leadership given up while the API server is unreachable", func() (bool, error) {
		return !rn.IsLeader(), nil
	})
	beatsAtCut := len(rec.snapshot())
	during := runtime.NumGoroutine()
	// Several election attempts fail meanwhile; nothing piles up.
	attempts := rn.metric(t, electionAttempts, "result", "error")
	eventually(t, 30*time.Second, "election attempts during the outage", func() (bool, error) {
		return rn.metric(t, electionAttempts, "result", "error") >= attempts+5, nil
	})
	// The liveness check holds through an outage longer than its window:
	// failed tries are tries.
	cutFor := LivenessWindow(time.Second) + time.Second
	var unhealthy error
	eventually(t, cutFor+30*time.Second, "an outage longer than the liveness window", func() (bool, error) {
		unhealthy = rn.Healthz(nil)
		return unhealthy != nil || time.Since(cutAt) > cutFor, nil
	})
	if unhealthy != nil {
		t.Fatalf("liveness failed %s into an API outage: %v", time.Since(cutAt).Round(time.Second), unhealthy)
	}
	if later := runtime.NumGoroutine(); later > steady {
		t.Errorf("goroutines piled up during the outage: %d, %d when it began, %d before it", later, during, steady)
	}
	if rn.exited() {
		t.Fatal("the reporter stopped during the outage")
	}

	if err := proxy.restore(); err != nil {
		t.Fatalf("reopening the proxy on %s: %v", proxy.addr, err)
	}
	restored := time.Now()
	bs := rec.waitBeats(t, beatsAtCut+3, 30*time.Second)
	t.Logf("goroutines: %d steady, %d in the outage; first heartbeat %s after the API server came back",
		steady, during, beatsAfter(bs, restored)[0].at.Sub(restored))
	if after := runtime.NumGoroutine(); after > steady+3 {
		t.Errorf("goroutines %d after recovery, %d before the outage", after, steady)
	}
}
