package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/addon-heartbeat/addon-heartbeat/internal/localcluster"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/election"
)

// BenchmarkFailover kills the leading reporter of a three-replica addon
// BENCH_FAILOVER_KILLS (20) times with SIGKILL and as many with SIGTERM, at
// BENCH_FAILOVER_PERIOD (2s), each at a random point of the heartbeat
// period, starting a new replica each time so that two stand by. Per kill it
// records, as multiples of the period:
//   - gap: the longest interval between consecutive heartbeats from the
//     last one before the signal to the second one after it (what the
//     addon-operator sees; 1.0 in steady state, timed out at 3.0);
//   - takeover: from the signal to the new leader's first heartbeat write,
//     by its own heartbeats_sent counter (polled every 10ms);
//   - visible: from the signal to the first heartbeat a watch sees. A write
//     in the same second as the old leader's last one changes nothing
//     (lastHeartbeatTime has one-second resolution), so it is invisible and
//     the next one, a period later, is the first seen.
//
// It reports their distributions (min, median, p90, max).
func BenchmarkFailover(b *testing.B) {
	period := envDuration(b, "BENCH_FAILOVER_PERIOD", 2*time.Second)
	kills := envInt(b, "BENCH_FAILOVER_KILLS", 20)
	e := startEnv(b, "")
	rec := e.recordHeartbeats(b)
	rnd := rand.New(rand.NewPCG(1, 2))
	for _, v := range []struct {
		name string
		sig  syscall.Signal
	}{{"SIGKILL", syscall.SIGKILL}, {"SIGTERM", syscall.SIGTERM}} {
		name, sig := v.name, v.sig
		b.Run(name, func(b *testing.B) {
			ns := "failover-" + strings.ToLower(name)
			e.createNamespace(b, ns)
			e.createAddonInstance(b, ns, period)
			d := e.createAddon(b, ns, "operator", "addon", 3)
			var reps []*localcluster.Reporter
			next := 0
			start := func() {
				r := e.startReporter(b, d, fmt.Sprintf("operator-pod-%d", next))
				next++
				if err := localcluster.WaitReady(context.Background(), r.Process, "http://127.0.0.1:"+strconv.Itoa(r.HealthPort)+"/readyz"); err != nil {
					b.Fatal(err)
				}
				reps = append(reps, r)
			}
			for range 3 {
				start()
			}
			rec.waitWrites(b, ns, 2, time.Minute)
			var gaps, takeovers, visible []time.Duration
			for range kills {
				leader := leaderOf(b, e, ns, reps)
				// Signal at a random point of the period after a heartbeat.
				rec.waitWrites(b, ns, 1, 3*period)
				last := rec.times(ns)
				at := last[len(last)-1].Add(time.Duration(rnd.Int64N(int64(period))))
				time.Sleep(time.Until(at))
				before := rec.count(ns)
				survivors := slices.DeleteFunc(slices.Clone(reps), func(r *localcluster.Reporter) bool { return r == leader })
				from := time.Now()
				if err := leader.Signal(sig); err != nil {
					b.Fatal(err)
				}
				// The survivors have never led: the first to count a
				// heartbeat is the new leader.
				pollUntil(b, 10*time.Millisecond, 10*period, "the new leader's first heartbeat", func() bool {
					for _, r := range survivors {
						if n, err := r.Metric("addon_heartbeat_heartbeats_sent_total"); err == nil && n > 0 {
							return true
						}
					}
					return false
				})
				takeovers = append(takeovers, time.Since(from))
				select {
				case <-leader.Done():
				case <-time.After(15 * time.Second):
					b.Fatalf("%s did not exit within 15s of %s", leader.Name, sig)
				}
				reps = slices.DeleteFunc(reps, func(r *localcluster.Reporter) bool { return r == leader })
				start()
				rec.waitAll(b, []string{ns}, map[string]int{ns: before}, 2, 10*period)
				w := rec.times(ns)
				first, second := w[before], w[before+1]
				gaps = append(gaps, maxInterval(w, from, second))
				visible = append(visible, first.Sub(from))
				if t := takeovers[len(takeovers)-1]; sig == syscall.SIGTERM && t > period/2 {
					// A released Lease is taken within a retry period; this
					// one was not released. Show how the leader stopped.
					b.Logf("SIGTERM of %s: new leader's first heartbeat after %s; the end of its log:\n%s",
						leader.Name, t.Round(time.Millisecond), logTail(leader.LogPath, 25))
				}
			}
			slices.Sort(gaps)
			slices.Sort(takeovers)
			slices.Sort(visible)
			p := float64(period)
			b.ReportMetric(0, "ns/op")
			b.ReportMetric(float64(kills), "kills")
			for _, s := range []struct {
				name string
				d    []time.Duration
			}{{"gap", gaps}, {"takeover", takeovers}, {"visible", visible}} {
				b.ReportMetric(float64(s.d[0])/p, s.name+"-min/period")
				b.ReportMetric(float64(percentile(s.d, 50))/p, s.name+"-median/period")
				b.ReportMetric(float64(percentile(s.d, 90))/p, s.name+"-p90/period")
				b.ReportMetric(float64(s.d[len(s.d)-1])/p, s.name+"-max/period")
			}
		})
	}
}

// leaderOf returns the reporter process that holds the addon's Lease.
func leaderOf(b *testing.B, e *env, ns string, reps []*localcluster.Reporter) *localcluster.Reporter {
	b.Helper()
	var found *localcluster.Reporter
	pollUntil(b, 50*time.Millisecond, 30*time.Second, "a running leader in "+ns, func() bool {
		var l coordinationv1.Lease
		if err := e.cluster.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: election.LeaseName("addon-instance")}, &l); err != nil {
			return false
		}
		if l.Spec.HolderIdentity == nil {
			return false
		}
		for _, r := range reps {
			if *l.Spec.HolderIdentity == strings.TrimPrefix(r.Name, "reporter ") {
				found = r
				return true
			}
		}
		return false
	})
	return found
}

// logTail is the last n lines of a log file.
func logTail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
