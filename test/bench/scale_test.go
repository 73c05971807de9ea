package bench

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/addon-heartbeat/addon-heartbeat/internal/localcluster"
)

// BenchmarkScale runs BENCH_SCALE_INSTANCES (200) addons, each in its own
// namespace with its AddonInstance at BENCH_SCALE_PERIOD (5s) and one
// reporter process, against one local API server. Once every AddonInstance
// heartbeats it measures for BENCH_SCALE_DURATION (100s): the oldest any
// heartbeat got (the longest interval between two writes to one
// AddonInstance, the open ends of the window included) as a multiple of the
// period, and the CPU of kube-apiserver, etcd and all the reporters.
func BenchmarkScale(b *testing.B) {
	n := envInt(b, "BENCH_SCALE_INSTANCES", 200)
	period := envDuration(b, "BENCH_SCALE_PERIOD", 5*time.Second)
	duration := envDuration(b, "BENCH_SCALE_DURATION", 100*time.Second)
	e := startEnv(b, "")
	rec := e.recordHeartbeats(b)
	nss := make([]string, n)
	var reps []*localcluster.Reporter
	b.Cleanup(func() { stopAll(b, reps) })
	setupStart := time.Now()
	for i := range n {
		ns := fmt.Sprintf("scale-%03d", i)
		nss[i] = ns
		e.createNamespace(b, ns)
		e.createAddonInstance(b, ns, period)
		d := e.createAddon(b, ns, "operator", "addon", 1)
		r, err := e.cluster.StartReporter(context.Background(), e.bins["reporter"], d, ns+"-operator-0", nil)
		if err != nil {
			b.Fatal(err)
		}
		reps = append(reps, r)
	}
	rec.waitAll(b, nss, nil, 2, 5*time.Minute)
	b.Logf("%d addons running and heartbeating %s after the first was created", n, time.Since(setupStart).Round(time.Second))

	pids := []int{e.cluster.ControlPlane.APIServer().Pid(), e.cluster.ControlPlane.Etcd().Pid()}
	for _, r := range reps {
		pids = append(pids, r.Pid())
	}
	cpu0 := make([]time.Duration, len(pids))
	for i, pid := range pids {
		cpu0[i] = mustCPU(b, pid)
	}
	from := time.Now()
	time.Sleep(duration)
	to := time.Now()
	cpu := make([]time.Duration, len(pids))
	for i, pid := range pids {
		cpu[i] = mustCPU(b, pid) - cpu0[i]
	}
	var rss int64
	for _, r := range reps {
		rss += mustRSS(b, r.Pid())
	}

	var longest []time.Duration
	writes := 0
	for _, ns := range nss {
		w := rec.times(ns)
		longest = append(longest, maxInterval(w, from, to))
		writes += len(writesBetween(w, from, to))
	}
	slices.Sort(longest)
	window := to.Sub(from).Seconds()
	var reportersCPU time.Duration
	for _, c := range cpu[2:] {
		reportersCPU += c
	}
	p := float64(period)
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(float64(n), "addons")
	b.ReportMetric(float64(longest[len(longest)-1])/p, "max-age/period")
	b.ReportMetric(float64(percentile(longest, 99))/p, "p99-instance-max-age/period")
	b.ReportMetric(float64(percentile(longest, 50))/p, "median-instance-max-age/period")
	b.ReportMetric(float64(writes)/float64(n)/(window/period.Seconds()), "heartbeats/period/addon")
	b.ReportMetric(cpu[0].Seconds()/window, "apiserver-cores")
	b.ReportMetric(ms(cpu[0])/float64(writes), "apiserver-cpu-ms/heartbeat")
	b.ReportMetric(cpu[1].Seconds()/window, "etcd-cores")
	b.ReportMetric(reportersCPU.Seconds()/window, "reporters-cores")
	b.ReportMetric(float64(rss)/float64(n)/mib, "reporter-rss-MiB")
	b.ReportMetric(window, "window-s")
}

// stopAll stops reporter processes together: SIGTERM to each, then waits.
func stopAll(b *testing.B, reps []*localcluster.Reporter) {
	var wg sync.WaitGroup
	for _, r := range reps {
		wg.Go(func() {
			if err := r.Stop(15 * time.Second); err != nil {
				b.Errorf("stopping %s: %v (log %s)", r.Name, err, r.LogPath)
			}
		})
	}
	wg.Wait()
}
