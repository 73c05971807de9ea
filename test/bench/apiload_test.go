package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	addonsv1alpha1 "github.com/openshift/addon-operator/apis/addons/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/addon-heartbeat/addon-heartbeat/internal/testenv"
)

// BenchmarkAPILoad counts, in the API server's audit log, every request the
// reporters of one addon make over BENCH_APILOAD_PERIODS (10) periods of
// BENCH_APILOAD_PERIOD (2s) once they are running, with 1 and with 3
// replicas, by what they touch: AddonInstance writes, AddonInstance reads
// (GET or LIST: polling), watches, and the election Lease. The seed design
// runs in the same API server for comparison: each replica, each period,
// GETs the AddonInstance and writes its status, from a goroutine per tick.
func BenchmarkAPILoad(b *testing.B) {
	period := envDuration(b, "BENCH_APILOAD_PERIOD", 2*time.Second)
	periods := envInt(b, "BENCH_APILOAD_PERIODS", 10)
	audit := filepath.Join(workDir, "audit-apiload.log")
	e := startEnv(b, audit)
	rec := e.recordHeartbeats(b)
	for _, v := range []struct {
		design   string
		replicas int
	}{{"reporter", 1}, {"reporter", 3}, {"seed", 1}, {"seed", 3}} {
		b.Run(fmt.Sprintf("%s/replicas=%d", v.design, v.replicas), func(b *testing.B) {
			ns := fmt.Sprintf("apiload-%s-%d", v.design, v.replicas)
			e.createNamespace(b, ns)
			e.createAddonInstance(b, ns, period)
			d := e.createAddon(b, ns, "operator", "addon", int32(v.replicas))
			if v.design == "seed" {
				kubeconfig, err := e.cluster.ServiceAccountKubeconfig(context.Background(), ns, "addon")
				if err != nil {
					b.Fatal(err)
				}
				runSeed(b, kubeconfig, ns, period, v.replicas)
			} else {
				for i := range v.replicas {
					e.startReporter(b, d, fmt.Sprintf("operator-pod-%d", i))
				}
			}
			// Running: heartbeats arrive, every replica has started.
			rec.waitWrites(b, ns, 3, time.Minute)
			from := time.Now()
			time.Sleep(time.Duration(periods) * period)
			to := time.Now()
			counts := countRequests(b, audit, "system:serviceaccount:"+ns+":addon", from, to)
			n := float64(periods)
			b.ReportMetric(0, "ns/op")
			b.ReportMetric(float64(counts.aiWrites)/n, "ai-writes/period")
			b.ReportMetric(float64(counts.aiReads)/n, "ai-reads/period")
			b.ReportMetric(float64(counts.watches)/n, "watches/period")
			b.ReportMetric(float64(counts.leaseReads)/n, "lease-reads/period")
			b.ReportMetric(float64(counts.leaseWrites)/n, "lease-writes/period")
			b.ReportMetric(float64(counts.other)/n, "other/period")
			b.ReportMetric(float64(counts.total)/n, "requests/period")
			b.ReportMetric(float64(counts.conflicts)/n, "conflicts/period")
			b.ReportMetric(float64(len(writesBetween(rec.times(ns), from, to)))/n, "heartbeats/period")
		})
	}
}

// runSeed runs the seed design's loop for replicas replicas until the
// benchmark ends: every period each replica starts a goroutine that GETs
// the AddonInstance and then updates its status, and waits time.After(period).
func runSeed(b *testing.B, kubeconfig, ns string, period time.Duration, replicas int) {
	b.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	b.Cleanup(func() { cancel(); wg.Wait() })
	for range replicas {
		c, err := client.New(cfg, client.Options{Scheme: testenv.Scheme()})
		if err != nil {
			b.Fatal(err)
		}
		wg.Go(func() {
			for {
				wg.Go(func() {
					ai := &addonsv1alpha1.AddonInstance{}
					if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "addon-instance"}, ai); err != nil {
						return
					}
					ai.Status.LastHeartbeatTime = metav1.Now()
					_ = c.Status().Update(ctx, ai)
				})
				select {
				case <-ctx.Done():
					return
				case <-time.After(period):
				}
			}
		})
	}
}

func writesBetween(writes []time.Time, from, to time.Time) []time.Time {
	var out []time.Time
	for _, w := range writes {
		if !w.Before(from) && w.Before(to) {
			out = append(out, w)
		}
	}
	return out
}

// requestCounts are one user's requests in a time window.
type requestCounts struct {
	aiWrites, aiReads, watches, leaseReads, leaseWrites, other, total, conflicts int
}

// auditEvent is the part of an audit.k8s.io/v1 Event that is counted.
type auditEvent struct {
	AuditID string `json:"auditID"`
	Verb    string `json:"verb"`
	User    struct {
		Username string `json:"username"`
	} `json:"user"`
	ObjectRef *struct {
		Resource    string `json:"resource"`
		Subresource string `json:"subresource"`
	} `json:"objectRef"`
	ResponseStatus *struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
	RequestReceived metav1.MicroTime `json:"requestReceivedTimestamp"`
}

// countRequests reads the audit log once it holds an event received after
// to, and counts user's requests received in [from, to), each once (a watch
// logs more than one stage).
func countRequests(b *testing.B, path, user string, from, to time.Time) requestCounts {
	b.Helper()
	var c requestCounts
	pollUntil(b, 100*time.Millisecond, 30*time.Second, "audit events after the window", func() bool {
		c = requestCounts{}
		seen := map[string]bool{}
		later := false
		f, err := os.Open(path)
		if err != nil {
			return false
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 0, 1<<20), 16<<20)
		for sc.Scan() {
			var ev auditEvent
			if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
				continue
			}
			t := ev.RequestReceived.Time
			if !t.Before(to) {
				later = true
			}
			if ev.User.Username != user || t.Before(from) || !t.Before(to) || seen[ev.AuditID] {
				continue
			}
			seen[ev.AuditID] = true
			c.total++
			if ev.ResponseStatus != nil && ev.ResponseStatus.Code == 409 {
				c.conflicts++
			}
			resource := ""
			if ev.ObjectRef != nil {
				resource = ev.ObjectRef.Resource
			}
			switch {
			case ev.Verb == "watch":
				c.watches++
			case resource == "addoninstances" && (ev.Verb == "get" || ev.Verb == "list"):
				c.aiReads++
			case resource == "addoninstances" && (ev.Verb == "update" || ev.Verb == "patch"):
				c.aiWrites++
			case resource == "leases" && ev.Verb == "get":
				c.leaseReads++
			case resource == "leases":
				c.leaseWrites++
			default:
				c.other++
			}
		}
		return later
	})
	return c
}
