package bench

import (
	"strings"
	"testing"
	"time"
)

// BenchmarkReporterFootprint runs one addon with two reporter processes
// (its leader and a standby) at a 1s period for BENCH_FOOTPRINT_DURATION
// (3m) and reports what each costs: the leader's resident memory (at the end
// and the highest seen), goroutines and heap in use, and its CPU time per
// heartbeat written (lease renewals included, as they are part of what a
// heartbeat costs); the standby's memory and CPU per period.
func BenchmarkReporterFootprint(b *testing.B) {
	duration := envDuration(b, "BENCH_FOOTPRINT_DURATION", 3*time.Minute)
	const period = time.Second
	e := startEnv(b, "")
	const ns = "footprint"
	e.createNamespace(b, ns)
	e.createAddonInstance(b, ns, period)
	rec := e.recordHeartbeats(b)
	d := e.createAddon(b, ns, "operator", "addon", 2)
	leader := e.startReporter(b, d, "operator-pod-0")
	// The first one leads; the RoleBinding may take a moment to appear.
	rec.waitWrites(b, ns, 2, time.Minute)
	standby := e.startReporter(b, d, "operator-pod-1")
	pollUntil(b, 100*time.Millisecond, 30*time.Second, "the standby's metrics", func() bool {
		_, err := standby.Metric("addon_heartbeat_is_leader")
		return err == nil
	})
	if v, err := leader.Metric("addon_heartbeat_is_leader"); err != nil || v != 1 {
		b.Fatalf("operator-pod-0 is not the leader (%v, %v)", v, err)
	}

	sent0, err := leader.Metric("addon_heartbeat_heartbeats_sent_total")
	if err != nil {
		b.Fatal(err)
	}
	cpu0 := mustCPU(b, leader.Pid())
	standbyCPU0 := mustCPU(b, standby.Pid())
	start := time.Now()
	var maxRSS, maxStandbyRSS int64
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for time.Since(start) < duration {
		<-tick.C
		maxRSS = max(maxRSS, mustRSS(b, leader.Pid()))
		maxStandbyRSS = max(maxStandbyRSS, mustRSS(b, standby.Pid()))
	}
	elapsed := time.Since(start)
	cpu1 := mustCPU(b, leader.Pid())
	standbyCPU1 := mustCPU(b, standby.Pid())
	rss := mustRSS(b, leader.Pid())
	standbyRSS := mustRSS(b, standby.Pid())
	sent1, err := leader.Metric("addon_heartbeat_heartbeats_sent_total")
	if err != nil {
		b.Fatal(err)
	}
	goroutines, err := leader.Metric("go_goroutines")
	if err != nil {
		b.Fatal(err)
	}
	heap, err := leader.Metric("go_memstats_heap_inuse_bytes")
	if err != nil {
		b.Fatal(err)
	}
	beats := sent1 - sent0
	if beats < 1 {
		b.Fatal("no heartbeat during the measurement")
	}
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(float64(rss)/mib, "rss-MiB")
	b.ReportMetric(float64(max(maxRSS, rss))/mib, "rss-max-MiB")
	// What the resident memory is made of: anonymous memory (heap, stacks,
	// runtime) and the pages of the binary it has touched.
	for _, f := range []string{"RssAnon", "RssFile"} {
		v, err := procStatus(leader.Pid(), f)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(v)/mib, strings.ToLower(f)+"-MiB")
	}
	b.ReportMetric(heap/mib, "heap-inuse-MiB")
	b.ReportMetric(goroutines, "goroutines")
	b.ReportMetric(ms(cpu1-cpu0)/beats, "cpu-ms/heartbeat")
	b.ReportMetric(beats/elapsed.Seconds()*period.Seconds(), "heartbeats/period")
	b.ReportMetric(float64(standbyRSS)/mib, "standby-rss-MiB")
	b.ReportMetric(float64(max(maxStandbyRSS, standbyRSS))/mib, "standby-rss-max-MiB")
	b.ReportMetric(ms(standbyCPU1-standbyCPU0)/(elapsed.Seconds()/period.Seconds()), "standby-cpu-ms/period")
	b.ReportMetric(elapsed.Seconds(), "window-s")
}

func mustCPU(b *testing.B, pid int) time.Duration {
	b.Helper()
	d, err := cpuTime(pid)
	if err != nil {
		b.Fatal(err)
	}
	return d
}

func mustRSS(b *testing.B, pid int) int64 {
	b.Helper()
	n, err := rssBytes(pid)
	if err != nil {
		b.Fatal(err)
	}
	return n
}
