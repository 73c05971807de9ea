package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/addon-heartbeat/addon-heartbeat/internal/localcluster"
)

// peakRSS reads the peak resident set of a process (VmHWM), in bytes.
func peakRSS(t *testing.T, pid int) int64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "VmHWM:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no VmHWM in /proc/%d/status", pid)
	return 0
}

// resetPeakRSS sets VmHWM back to the current resident set.
func resetPeakRSS(t *testing.T, pid int) {
	t.Helper()
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0); err != nil {
		t.Fatal(err)
	}
}

// Anything that can reach the webhook's port can send it large bodies. Before
// they were bounded, 16 concurrent 10 MB POSTs took the process to 269 MB,
// past the chart's 256Mi memory limit (an OOM kill in a pod). Against the real
// binary: 16 and then 64 concurrent 10 MB bodies, with their length declared
// and not, leave its peak resident memory under that limit, and Deployments
// created meanwhile through the API server are still injected.
// refusedByReset counts a body whose connection was reset after the
// webhook's early answer.
const refusedByReset = -1

func TestWebhookSurvivesLargeRequestBodies(t *testing.T) {
	limit := resource.MustParse("256Mi") // the chart's default webhook.resources.limits.memory
	url := fmt.Sprintf("https://127.0.0.1:%d/mutate-apps-v1-deployment", webhook.Port)
	// The attacker does not trust the webhook's CA; it needs no answer.
	attacker := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, MaxConnsPerHost: 0}} //nolint:gosec // an attacker
	body := bytes.Repeat([]byte("a"), 10<<20)
	ns := newNamespace(t, "big-bodies")

	for _, n := range []int{16, 64} {
		for _, declared := range []bool{true, false} {
			name := fmt.Sprintf("%d bodies, length declared %v", n, declared)
			resetPeakRSS(t, webhook.Pid())
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			codes := map[int]int{}
			var mu sync.Mutex
			var wg sync.WaitGroup
			for range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					var r io.Reader = bytes.NewReader(body)
					if !declared {
						r = io.MultiReader(r) // hides the length: sent chunked
					}
					req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, r)
					if err != nil {
						t.Error(err)
						return
					}
					req.Header.Set("Content-Type", "application/json")
					code := 0 // the connection closed before an answer
					resp, err := attacker.Do(req)
					switch {
					case err == nil:
						code = resp.StatusCode
						_, _ = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
					case errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE):
						// The webhook answers before reading the body and
						// closes the connection; a client still sending can
						// meet the reset before it reads the answer (the
						// kernel drops what it had received). The body is
						// refused all the same.
						code = refusedByReset
					default:
						t.Logf("a 10 MB body: %v", err)
					}
					mu.Lock()
					codes[code]++
					mu.Unlock()
				}()
			}
			// Meanwhile the API server's reviews are answered.
			for i := range 3 {
				d := createInjected(t, addonDeployment(ns, fmt.Sprintf("during-%d-%v-%d", n, declared, i), 1, nil))
				if _, err := localcluster.ReporterInvocation(d, "x"); err != nil {
					t.Errorf("%s: a Deployment created meanwhile was not injected: %v", name, err)
				}
			}
			wg.Wait()
			cancel()
			peak := peakRSS(t, webhook.Pid())
			t.Logf("%s: answers %v; webhook peak RSS %.1f MiB (limit %s)", name, codes, float64(peak)/(1<<20), limit.String())
			if peak >= limit.Value() {
				t.Errorf("%s: webhook peak RSS %d bytes, over the chart's memory limit %s", name, peak, limit.String())
			}
			for code := range codes {
				if code != http.StatusRequestEntityTooLarge && code != http.StatusLengthRequired && code != refusedByReset {
					t.Errorf("%s: a 10 MB body was answered %d: %v", name, code, codes)
				}
			}
			if exited, err := webhook.Exited(); exited {
				t.Fatalf("the webhook exited: %v", err)
			}
		}
	}
}
