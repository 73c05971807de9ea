package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	addonsv1alpha1 "github.com/openshift/addon-operator/apis/addons/v1alpha1"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/addon-heartbeat/addon-heartbeat/internal/instancewatch"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat"
)

// floorLogLine is what the reporter logs, once per value, for a period
// below its floor (pkg/heartbeat notePeriod).
const floorLogLine = "asks for a heartbeat period below the reporter's floor"

// Must show (impossible periods): for 0s and 100ms, the reporter keeps
// heartbeating at its 1s floor and says so once in its log and in its
// metrics, and the webhook records exactly one Event on the AddonInstance,
// also after a restart of the webhook.
func TestPeriodBelowFloor(t *testing.T) {
	// Each with a Deployment of its own name: a reporter's log file is named
	// after its pod.
	periods := map[string]time.Duration{"zero": 0, "tenth": 100 * time.Millisecond}
	namespaces := map[string]string{}
	for name, period := range periods {
		t.Run(name, func(t *testing.T) {
			ns := newNamespace(t, "floor")
			namespaces[name] = ns
			createAddonInstance(t, ns, "addon-instance", period)
			var stored addonsv1alpha1.AddonInstance
			if err := cluster.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "addon-instance"}, &stored); err != nil {
				t.Fatal(err)
			}
			if got := stored.Spec.HeartbeatUpdatePeriod.Duration; got != period {
				t.Fatalf("the API server stored period %s, want %s", got, period)
			}
			rec := recordHeartbeats(t, ns, "addon-instance")
			d := createInjected(t, addonDeployment(ns, "operator-"+name, 1, nil))
			setAvailable(t, d, 1)
			r := startReporters(t, d, 1)[0]

			// Heartbeats continue, at the floor: never faster, no gap of 3.
			rec.waitWrites(t, 1, 20*time.Second)
			from, count := time.Now(), rec.Count()
			rec.waitWrites(t, 5, 20*time.Second)
			to := time.Now()
			if n, most := rec.Count()-count, int(to.Sub(from)/heartbeat.MinPeriod)+1; n > most {
				t.Errorf("%d heartbeats in %s, want at most %d at the %s floor", n, to.Sub(from), most, heartbeat.MinPeriod)
			}
			if g := rec.MaxGap(from, to); g >= 3*heartbeat.MinPeriod {
				t.Errorf("a gap of %s between heartbeats", g)
			}
			for metric, want := range map[string]float64{
				"addon_heartbeat_period_requested_seconds": period.Seconds(),
				"addon_heartbeat_period_seconds":           heartbeat.MinPeriod.Seconds(),
			} {
				if v, err := r.Metric(metric); err != nil || v != want {
					t.Errorf("%s = %v (%v), want %v", metric, v, err, want)
				}
			}
			data, err := os.ReadFile(r.LogPath)
			if err != nil {
				t.Fatal(err)
			}
			if n := strings.Count(string(data), floorLogLine); n != 1 {
				t.Errorf("the reporter logged %q %d times, want once (log %s)", floorLogLine, n, r.LogPath)
			}
			awaitOneEvent(t, ns, period)
		})
	}

	// A new webhook process looks at every AddonInstance again, and finds
	// each Event recorded.
	if err := webhook.Stop(15 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := webhook.Restart(t.Context()); err != nil {
		t.Fatal(err)
	}
	var all addonsv1alpha1.AddonInstanceList
	if err := cluster.Client.List(t.Context(), &all); err != nil {
		t.Fatal(err)
	}
	var last float64
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		n, err := periodReconciles(ctx)
		last = n
		return err == nil && n >= float64(len(all.Items)), nil
	})
	if err != nil {
		t.Fatalf("the restarted webhook looked at %v of %d AddonInstances", last, len(all.Items))
	}
	for name, ns := range namespaces {
		awaitOneEvent(t, ns, periods[name])
	}
}

// awaitOneEvent waits for the Event on ns's AddonInstance, and checks that
// it is the only one.
func awaitOneEvent(t *testing.T, ns string, period time.Duration) {
	t.Helper()
	var found []eventsv1.Event
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		var list eventsv1.EventList
		if err := cluster.Client.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return false, nil
		}
		found = found[:0]
		for _, e := range list.Items {
			if e.Reason == instancewatch.ReasonPeriodBelowFloor {
				found = append(found, e)
			}
		}
		return len(found) > 0, nil
	})
	if err != nil {
		t.Fatalf("no %s Event in %s", instancewatch.ReasonPeriodBelowFloor, ns)
	}
	if len(found) != 1 {
		t.Fatalf("%d Events in %s, want 1: %+v", len(found), ns, found)
	}
	e := found[0]
	wantNote := fmt.Sprintf("spec.heartbeatUpdatePeriod is %s, below the heartbeat reporter's floor of 1s", period)
	if e.Type != "Warning" || e.Regarding.Kind != "AddonInstance" || e.Regarding.Name != "addon-instance" ||
		!strings.HasPrefix(e.Note, wantNote) || !strings.Contains(e.Note, "3 requested periods") {
		t.Errorf("Event %s %s on %s %s: %s", e.Type, e.Reason, e.Regarding.Kind, e.Regarding.Name, e.Note)
	}
}

// periodReconciles is how many AddonInstances the webhook process has
// looked at for period Events (controller-runtime's reconcile counter).
func periodReconciles(ctx context.Context) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, webhook.MetricsURL, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return 0, err
	}
	var n float64
	for _, m := range mfs["controller_runtime_reconcile_total"].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["controller"] == "addoninstance-period" && labels["result"] == "success" {
			n += m.GetCounter().GetValue()
		}
	}
	return n, nil
}
