package bench

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	addonsv1alpha1 "github.com/openshift/addon-operator/apis/addons/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/addon-heartbeat/addon-heartbeat/internal/instancewatch"
	"github.com/addon-heartbeat/addon-heartbeat/internal/localcluster"
)

// beforeInstanceWatch is the last commit whose webhook watched
// AddonInstances as metadata only; the one after it also watches their
// period and last heartbeat for the per-AddonInstance gauges.
const beforeInstanceWatch = "2f4a617902ccd7200bfe7777b2a9173e1115cf33"

// BenchmarkWebhookRSSManyAddonInstances fills a control plane with
// BENCH_RSS_INSTANCES (1,000) AddonInstances in 100 namespaces, each with a
// heartbeat and four conditions whose messages are as long as the reporter
// writes them (heartbeat.MaxMessage, 4,096 bytes), then runs the webhook of
// BENCH_BEFORE_REF (beforeInstanceWatch) and of this checkout in turn, each
// until it has synced (its RBAC controller bound a probe addon; this
// checkout's also exports every AddonInstance's gauges), and reports the
// resident memory of each after 10s of steady state and at its peak. This
// checkout's is also measured before the AddonInstances exist.
func BenchmarkWebhookRSSManyAddonInstances(b *testing.B) {
	n := envInt(b, "BENCH_RSS_INSTANCES", 1000)
	before, after, c := rssRun(b, beforeInstanceWatch)
	// Synced: every AddonInstance's gauges exported, at 10s each.
	measure := func(name, bin string, gauges int) (peak, steady int64) {
		var synced func(w *localcluster.Webhook) bool
		if gauges > 0 {
			synced = func(w *localcluster.Webhook) bool {
				v, err := w.Metric(instancewatch.MetricReporterPeriod)
				return err == nil && v >= float64(gauges)*10
			}
		}
		return webhookRSS(b, c, name, bin, nil, synced)
	}
	_, emptySteady := measure("empty", after, 1)
	start := time.Now()
	fillInstances(b, c.Client, n)
	b.Logf("created %d AddonInstances in %s", n, time.Since(start).Round(time.Second))
	beforePeak, beforeSteady := measure("before", before, 0)
	// Every AddonInstance of the fill, and the three probes, at 10s each.
	afterPeak, afterSteady := measure("after", after, n+3)
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(float64(n), "addoninstances")
	b.ReportMetric(float64(emptySteady)/mib, "empty-rss-MiB")
	b.ReportMetric(float64(beforePeak)/mib, "before-peak-MiB")
	b.ReportMetric(float64(beforeSteady)/mib, "before-rss-MiB")
	b.ReportMetric(float64(afterPeak)/mib, "after-peak-MiB")
	b.ReportMetric(float64(afterSteady)/mib, "after-rss-MiB")
	b.ReportMetric(float64(afterSteady-beforeSteady)/float64(n), "added-B/instance")
}

// fillInstances creates n AddonInstances (ten a namespace) with the status a
// reporter writes: a heartbeat and conditions with the longest messages.
func fillInstances(b *testing.B, c client.Client, n int) {
	b.Helper()
	ctx := context.Background()
	const perNamespace = 10
	for i := range (n + perNamespace - 1) / perNamespace {
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("addon-%03d", i)}}); err != nil {
			b.Fatal(err)
		}
	}
	message := strings.Repeat("m", 4096)
	inParallel(b, n, func(i int) error {
		ai := &addonsv1alpha1.AddonInstance{
			ObjectMeta: metav1.ObjectMeta{Namespace: fmt.Sprintf("addon-%03d", i/perNamespace), Name: fmt.Sprintf("addon-instance-%d", i%perNamespace)},
			Spec:       addonsv1alpha1.AddonInstanceSpec{HeartbeatUpdatePeriod: metav1.Duration{Duration: 10 * time.Second}},
		}
		if err := c.Create(ctx, ai); err != nil {
			return err
		}
		now := metav1.Now()
		ai.Status.LastHeartbeatTime = now
		for _, typ := range []string{"Degraded", "Installed", "Healthy", "ReadyToBeDeleted"} {
			ai.Status.Conditions = append(ai.Status.Conditions, metav1.Condition{
				Type: "addons.managed.openshift.io/" + typ, Status: metav1.ConditionFalse, Reason: "Bench",
				Message: message, LastTransitionTime: now,
			})
		}
		return c.Status().Update(ctx, ai)
	})
}
