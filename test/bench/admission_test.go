package bench

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/addon-heartbeat/addon-heartbeat/internal/admission"
	"github.com/addon-heartbeat/addon-heartbeat/internal/testenv"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/inject"
)

// BenchmarkAdmission drives the webhook binary over TLS on loopback the way
// the API server does: concurrent HTTP/1.1 keep-alive clients POST
// AdmissionReviews of a realistic addon Deployment (about 8 KB: several
// containers, probes, env) for a fixed time, each sending its next review
// as soon as the answer is in. Every latency is recorded.
//
// BENCH_ADMISSION_DURATION (10s) per variant and concurrency,
// BENCH_ADMISSION_CLIENTS (4,8: each count of concurrent clients in turn).
// The load generator runs in this process, on the same cores as the
// webhook; its CPU per review is reported too.
func BenchmarkAdmission(b *testing.B) {
	duration := envDuration(b, "BENCH_ADMISSION_DURATION", 10*time.Second)
	concurrency := envInts(b, "BENCH_ADMISSION_CLIENTS", []int{4, 8})
	e := startEnv(b, "")
	t := webhookTarget(b, e)
	for _, v := range []struct {
		name      string
		annots    map[string]string
		wantPatch bool
	}{
		{"injected", map[string]string{"addon-heartbeat.io/inject": "true"}, true},
		// matchConditions keep the API server from calling the webhook for
		// these; measured anyway.
		{"not-opted-in", nil, false},
	} {
		body := addonReview(b, v.annots)
		checkReview(b, t, body, v.wantPatch)
		for _, clients := range concurrency {
			b.Run(fmt.Sprintf("%s/clients=%d", v.name, clients), func(b *testing.B) {
				// Warm up: connections, TLS sessions, the heap.
				runLoad(t, body, clients, time.Second)
				cpu0, err := cpuTime(e.webhook.Pid())
				if err != nil {
					b.Fatal(err)
				}
				self0 := selfCPU()
				res := runLoad(t, body, clients, duration)
				cpu1, err := cpuTime(e.webhook.Pid())
				if err != nil {
					b.Fatal(err)
				}
				self1 := selfCPU()
				if res.failures > 0 {
					b.Fatalf("%d of %d reviews failed; first: %v", res.failures, len(res.latencies)+res.failures, res.firstErr)
				}
				n := len(res.latencies)
				slices.Sort(res.latencies)
				b.ReportMetric(0, "ns/op")
				b.ReportMetric(float64(n)/res.elapsed.Seconds(), "reviews/s")
				b.ReportMetric(ms(percentile(res.latencies, 50)), "p50-ms")
				b.ReportMetric(ms(percentile(res.latencies, 99)), "p99-ms")
				b.ReportMetric(ms(percentile(res.latencies, 99.9)), "p99.9-ms")
				b.ReportMetric(ms(res.latencies[n-1]), "max-ms")
				b.ReportMetric(float64(cpu1-cpu0)/float64(time.Microsecond)/float64(n), "webhook-cpu-us/review")
				b.ReportMetric(float64(self1-self0)/float64(time.Microsecond)/float64(n), "loadgen-cpu-us/review")
				b.ReportMetric(float64(len(body)), "review-bytes")
				b.ReportMetric(float64(clients), "clients")
			})
		}
	}
}

type loadResult struct {
	latencies []time.Duration
	elapsed   time.Duration
	failures  int
	firstErr  error
}

// runLoad runs clients closed-loop senders of body for d, each on its own
// keep-alive connection.
func runLoad(t *target, body []byte, clients int, d time.Duration) loadResult {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	start := time.Now()
	results := make([]loadResult, clients)
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() {
			res := &results[i]
			res.latencies = make([]time.Duration, 0, 1<<14)
			var c *conn
			for ctx.Err() == nil {
				if c == nil {
					var err error
					if c, err = t.dial(); err != nil {
						res.failures++
						res.firstErr = cmp.Or(res.firstErr, err)
						continue
					}
				}
				t0 := time.Now()
				if _, err := c.post(body); err != nil {
					c.close()
					c = nil
					if ctx.Err() != nil {
						break
					}
					res.failures++
					res.firstErr = cmp.Or(res.firstErr, err)
					continue
				}
				res.latencies = append(res.latencies, time.Since(t0))
			}
			if c != nil {
				c.close()
			}
		})
	}
	wg.Wait()
	out := loadResult{elapsed: time.Since(start)}
	for _, r := range results {
		out.latencies = append(out.latencies, r.latencies...)
		out.failures += r.failures
		out.firstErr = cmp.Or(out.firstErr, r.firstErr)
	}
	return out
}

// target is the webhook's address and the TLS settings to reach it.
type target struct {
	addr string
	tls  *tls.Config
}

// conn is one HTTP/1.1 keep-alive connection over TLS. It writes each
// request in one piece and reads the answer with net/http's parser, without
// http.Transport's per-connection goroutines: the load generator shares the
// cores with the webhook and should take as little of them as it can.
type conn struct {
	tc   *tls.Conn
	br   *bufio.Reader
	head []byte
	buf  bytes.Buffer
}

func (t *target) dial() (*conn, error) {
	tc, err := tls.Dial("tcp", t.addr, t.tls)
	if err != nil {
		return nil, err
	}
	head := fmt.Appendf(nil, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nAccept: application/json\r\n",
		admission.Path, t.addr)
	return &conn{tc: tc, br: bufio.NewReaderSize(tc, 16<<10), head: head}, nil
}

func (c *conn) close() { _ = c.tc.Close() }

// post sends one review and returns the answer's body, valid until the
// next call.
func (c *conn) post(body []byte) ([]byte, error) {
	c.buf.Reset()
	c.buf.Write(c.head)
	c.buf.WriteString("Content-Length: ")
	c.buf.WriteString(strconv.Itoa(len(body)))
	c.buf.WriteString("\r\n\r\n")
	c.buf.Write(body)
	if _, err := c.tc.Write(c.buf.Bytes()); err != nil {
		return nil, err
	}
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		return nil, err
	}
	c.buf.Reset()
	_, err = c.buf.ReadFrom(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("status %d: %s", resp.StatusCode, c.buf.String())
	}
	if resp.Close {
		return nil, errors.New("the server closed the connection")
	}
	return c.buf.Bytes(), nil
}

// checkReview sends one review and checks the answer: allowed, with a JSON
// patch exactly when wantPatch.
func checkReview(b *testing.B, t *target, body []byte, wantPatch bool) {
	b.Helper()
	c, err := t.dial()
	if err != nil {
		b.Fatal(err)
	}
	defer c.close()
	buf, err := c.post(body)
	if err != nil {
		b.Fatal(err)
	}
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(buf, &out); err != nil || out.Response == nil {
		b.Fatalf("not an AdmissionReview (%v): %s", err, buf)
	}
	if !out.Response.Allowed || (len(out.Response.Patch) > 0) != wantPatch {
		b.Fatalf("unexpected response (want a patch: %v): %s", wantPatch, buf)
	}
}

// webhookTarget trusts the CA the webhook put into its configuration's
// caBundle and speaks HTTP/1.1, as the API server does.
func webhookTarget(b *testing.B, e *env) *target {
	b.Helper()
	var mwc admissionregistrationv1.MutatingWebhookConfiguration
	if err := e.cluster.Client.Get(context.Background(), client.ObjectKey{Name: e.webhook.Configuration}, &mwc); err != nil {
		b.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(mwc.Webhooks[0].ClientConfig.CABundle) {
		b.Fatal("the caBundle holds no certificate")
	}
	return &target{
		addr: "127.0.0.1:" + strconv.Itoa(e.webhook.Port),
		tls:  &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}},
	}
}

// selfCPU is the CPU time this process has used.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reviewBytes is the size of the benchmark's AdmissionReview, and
// reviewEnvelope about what the review adds around the object.
const (
	reviewBytes    = 8 << 10
	reviewEnvelope = 640
)

// addonReview is a CREATE AdmissionReview of a realistic addon Deployment,
// about 8 KB: pkg/inject's many-containers input with fields newer than our
// API types, labels, and the env a real addon carries, with annots as its
// annotations besides two ordinary ones.
func addonReview(b *testing.B, annots map[string]string) []byte {
	b.Helper()
	data, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "pkg", "inject", "testdata", "input", "many-containers.yaml"))
	if err != nil {
		b.Fatal(err)
	}
	var m map[string]any
	if err := yaml.Unmarshal(data, &m); err != nil {
		b.Fatal(err)
	}
	spec := m["spec"].(map[string]any)
	spec["futureDeploymentField"] = map[string]any{"enabled": true}
	pod := spec["template"].(map[string]any)["spec"].(map[string]any)
	pod["futurePodField"] = "kept"
	c := pod["containers"].([]any)[0].(map[string]any)
	c["futureContainerField"] = []any{"a", "b"}
	meta := m["metadata"].(map[string]any)
	a := map[string]any{"app.kubernetes.io/name": "my-addon", "app.kubernetes.io/version": "v1.0.0"}
	for k, v := range annots {
		a[k] = v
	}
	meta["annotations"] = a
	// Pad with the settings a real addon passes as env, to reviewBytes.
	env, _ := c["env"].([]any)
	var raw []byte
	for i := 0; len(raw) < reviewBytes-reviewEnvelope; i++ {
		env = append(env, map[string]any{"name": fmt.Sprintf("ADDON_SETTING_%02d", i), "value": "some-configuration-value"})
		c["env"] = env
		if raw, err = json.Marshal(m); err != nil {
			b.Fatal(err)
		}
	}
	dryRun := false
	r := admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID:       "3b4a3f39-2a4e-4c38-9c4f-0a8a5e6c2f11",
			Kind:      metav1.GroupVersionKind{Group: "apps", Version: "v1", Kind: "Deployment"},
			Resource:  metav1.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"},
			Operation: admissionv1.Create, Namespace: "my-addon", Name: "my-addon",
			UserInfo: authenticationv1.UserInfo{Username: "system:serviceaccount:argocd:argocd-application-controller",
				UID: "5f0c1e2a-9d7b-4e47-8a51-0c7d3b9e1a24", Groups: []string{"system:serviceaccounts", "system:serviceaccounts:argocd", "system:authenticated"}},
			Object: runtime.RawExtension{Raw: raw}, DryRun: &dryRun,
		},
	}
	out, err := json.Marshal(r)
	if err != nil {
		b.Fatal(err)
	}
	return out
}

// BenchmarkAdmissionHandler is the same review through the webhook's
// handler in this process, from request bytes to response bytes: the
// handler's own time, allocations and bytes per review, without TLS, the
// HTTP server or the load generator.
func BenchmarkAdmissionHandler(b *testing.B) {
	cfg := inject.DefaultConfig()
	cfg.Image = reporterImage
	for _, v := range []struct {
		name   string
		annots map[string]string
	}{
		{"injected", map[string]string{"addon-heartbeat.io/inject": "true"}},
		{"not-opted-in", nil},
	} {
		b.Run(v.name, func(b *testing.B) {
			body := addonReview(b, v.annots)
			h := &admission.Handler{Config: cfg, Log: logr.Discard()}
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				req := httptest.NewRequest(http.MethodPost, admission.Path, bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				if rec.Code != http.StatusOK {
					b.Fatal(rec.Body.String())
				}
			}
		})
	}
}
