package chart_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	addonsv1alpha1 "github.com/openshift/addon-operator/apis/addons/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/addon-heartbeat/addon-heartbeat/internal/chart"
	"github.com/addon-heartbeat/addon-heartbeat/internal/instancewatch"
	"github.com/addon-heartbeat/addon-heartbeat/internal/webhook"
)

// Two webhook replicas, as the chart's ServiceAccount with exactly the
// chart's roles (events: create, nothing more), record one Warning Event on
// each AddonInstance asking for 0s or 100ms. (internal/instancewatch checks
// that a valid period gets none, and a change of leader no second one.)
func TestPeriodEventsWithTheChartsRBAC(t *testing.T) {
	rel := chart.Release{Name: "events", Namespace: "events-system"}
	objs := install(t, rel, "")
	for range 2 {
		waitReady(t, startWebhook(t, objs, freePort(t), func(o *webhook.Options) {
			// The API server never calls these replicas; they only watch.
			o.CertDNSNames = []string{"127.0.0.1"}
		}))
	}
	want := map[string]int{"0s": 1, "100ms": 1}
	namespaces := map[string]string{}
	for period := range want {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "period-"}}
		if err := k8s.Create(t.Context(), ns); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = k8s.Delete(context.Background(), ns) })
		d, err := time.ParseDuration(period)
		if err != nil {
			t.Fatal(err)
		}
		ai := &addonsv1alpha1.AddonInstance{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "addon-instance"},
			Spec:       addonsv1alpha1.AddonInstanceSpec{HeartbeatUpdatePeriod: metav1.Duration{Duration: d}},
		}
		if err := k8s.Create(t.Context(), ai); err != nil {
			t.Fatal(err)
		}
		namespaces[period] = ns.Name
	}
	events := func(ctx context.Context, ns string) ([]eventsv1.Event, error) {
		var list eventsv1.EventList
		err := k8s.List(ctx, &list, client.InNamespace(ns))
		return list.Items, err
	}
	for _, period := range []string{"0s", "100ms"} {
		poll(t, "the Event for "+period, func(ctx context.Context) (bool, string) {
			got, err := events(ctx, namespaces[period])
			return err == nil && len(got) > 0, fmt.Sprint(got, err)
		})
	}
	for period, n := range want {
		got, err := events(t.Context(), namespaces[period])
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != n {
			t.Errorf("%s: %d Events, want %d: %+v", period, len(got), n, got)
			continue
		}
		for _, e := range got {
			if e.Type != corev1.EventTypeWarning || e.Reason != instancewatch.ReasonPeriodBelowFloor || e.Regarding.Name != "addon-instance" ||
				e.ReportingController != instancewatch.ReportingController {
				t.Errorf("%s: Event %+v", period, e)
			}
		}
	}
}
