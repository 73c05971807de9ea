package instancewatch

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	addonsv1alpha1 "github.com/openshift/addon-operator/apis/addons/v1alpha1"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/config"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/addon-heartbeat/addon-heartbeat/internal/logging"
)

// replica is one webhook replica's share of this package: a manager with
// leader election, its gauges in a registry of its own.
type replica struct {
	name    string
	gauges  *prometheus.Registry
	elected <-chan struct{}
	stop    func()
}

func startReplica(t *testing.T, name, leaseNamespace string) *replica {
	t.Helper()
	log, err := logging.New(logging.LevelError)
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:                        webhookScheme(t),
		Logger:                        log,
		Metrics:                       metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress:        "0",
		LeaderElection:                true,
		LeaderElectionID:              "instancewatch-test",
		LeaderElectionNamespace:       leaseNamespace,
		LeaderElectionReleaseOnCancel: true,
		Cache:                         cache.Options{ByObject: CacheOptions()},
		Controller:                    ctrlconfig.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	collector := &Collector{}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(collector)
	ctx, cancel := context.WithCancel(context.Background())
	if err := Setup(ctx, mgr, collector, name, log); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	r := &replica{name: name, gauges: reg, elected: mgr.Elected()}
	stopped := false
	r.stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("replica %s stopped with %v", name, err)
		}
	}
	t.Cleanup(r.stop)
	return r
}

// series are a replica's gauges as "metric namespace" -> value, for the
// AddonInstances of the given namespaces.
func (r *replica) series(t *testing.T, namespaces ...string) map[string]float64 {
	t.Helper()
	mfs, err := r.gauges.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			ns := label(m, "namespace")
			for _, want := range namespaces {
				if ns == want {
					out[mf.GetName()+" "+ns] = m.GetGauge().GetValue()
				}
			}
		}
	}
	return out
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// events are the Events recorded in ns, as "reason: note".
func events(ctx context.Context, ns string) ([]string, error) {
	var list eventsv1.EventList
	if err := k8s.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return nil, err
	}
	var out []string
	for _, e := range list.Items {
		out = append(out, e.Reason+": "+e.Note)
	}
	sort.Strings(out)
	return out, nil
}

// reconciles is how many reconciles of the period Events succeeded in this
// process, all managers together.
func reconciles(t *testing.T) float64 {
	t.Helper()
	mfs, err := crmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() != "controller_runtime_reconcile_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if label(m, "controller") == "addoninstance-period" && label(m, "result") == "success" {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n
}

// webhookScheme is the webhook's: the built-in types and Object.
func webhookScheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	return s
}

// unstructuredInstance is the AddonInstance of ns, for the test's client
// (whose scheme has the addon-operator's types, which cannot hold "1d").
func unstructuredInstance(ns string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(GVK)
	u.SetNamespace(ns)
	u.SetName("addon-instance")
	return u
}

func createInstance(t *testing.T, ns, period string) *unstructured.Unstructured {
	t.Helper()
	u := unstructuredInstance(ns)
	_ = unstructured.SetNestedField(u.Object, period, "spec", "heartbeatUpdatePeriod")
	if err := k8s.Create(t.Context(), u); err != nil {
		t.Fatal(err)
	}
	return u
}

func newNamespace(t *testing.T, prefix string) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"}}
	if err := k8s.Create(t.Context(), ns); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

func setPeriod(t *testing.T, ns, period string) {
	t.Helper()
	patch := fmt.Appendf(nil, `{"spec":{"heartbeatUpdatePeriod":%q}}`, period)
	u := unstructuredInstance(ns)
	if err := k8s.Patch(t.Context(), u, client.RawPatch("application/merge-patch+json", patch)); err != nil {
		t.Fatal(err)
	}
}

// Two replicas with leader election on a real API server: both export the
// gauges of every AddonInstance (and drop a deleted one's), while one Event
// per impossible period is recorded, once per value, also across a change
// of leader.
func TestGaugesAndPeriodEvents(t *testing.T) {
	leases := newNamespace(t, "webhook")
	zero, tenth, fine, invalid := newNamespace(t, "zero"), newNamespace(t, "tenth"), newNamespace(t, "fine"), newNamespace(t, "invalid")
	createInstance(t, zero, "0s")
	createInstance(t, tenth, "100ms")
	createInstance(t, fine, "10s")
	createInstance(t, invalid, "1d")

	first := startReplica(t, "replica-0", leases)
	<-first.elected
	second := startReplica(t, "replica-1", leases)

	wantGauges := map[string]float64{
		MetricPeriod + " " + zero: 0, MetricReporterPeriod + " " + zero: 1, MetricPeriodInvalid + " " + zero: 0,
		MetricPeriod + " " + tenth: 0.1, MetricReporterPeriod + " " + tenth: 1, MetricPeriodInvalid + " " + tenth: 0,
		MetricPeriod + " " + fine: 10, MetricReporterPeriod + " " + fine: 10, MetricPeriodInvalid + " " + fine: 0,
		MetricPeriodInvalid + " " + invalid: 1,
	}
	for _, r := range []*replica{first, second} {
		await(t, r.name+" exporting every AddonInstance's periods", func(context.Context) (bool, string) {
			got := r.series(t, zero, tenth, fine, invalid)
			for k := range got {
				if strings.HasPrefix(k, MetricCreated) {
					delete(got, k) // checked below
				}
			}
			return fmt.Sprint(got) == fmt.Sprint(wantGauges), fmt.Sprint(got)
		})
	}

	wantEvents := map[string][]string{
		zero:    {ReasonPeriodBelowFloor + ": spec.heartbeatUpdatePeriod is 0s, below the heartbeat reporter's floor of 1s"},
		tenth:   {ReasonPeriodBelowFloor + ": spec.heartbeatUpdatePeriod is 100ms, below the heartbeat reporter's floor of 1s"},
		invalid: {ReasonPeriodInvalid + `: spec.heartbeatUpdatePeriod "1d" is not a duration`},
		fine:    nil,
	}
	checkEvents := func(what string, want map[string][]string) {
		t.Helper()
		for ns, prefixes := range want {
			await(t, what+" in "+ns, func(ctx context.Context) (bool, string) {
				got, err := events(ctx, ns)
				if err != nil || len(got) != len(prefixes) {
					return false, fmt.Sprint(got, err)
				}
				for i, p := range prefixes {
					if !strings.HasPrefix(got[i], p) {
						return false, fmt.Sprint(got)
					}
				}
				return true, ""
			})
		}
	}
	checkEvents("one Event per impossible period", wantEvents)
	if got, _ := events(t.Context(), zero); !strings.Contains(got[0], "3 requested periods (0s)") {
		t.Errorf("the Event does not say what the addon-operator judges by: %s", got[0])
	}

	// A new leader looks at every AddonInstance again and finds each Event
	// recorded: still one each.
	before := reconciles(t)
	first.stop()
	<-second.elected
	await(t, "the new leader looking at the 4 AddonInstances", func(context.Context) (bool, string) {
		n := reconciles(t)
		return n >= before+4, fmt.Sprint(n - before)
	})
	checkEvents("still one Event after a change of leader", wantEvents)

	// Once per value: a new value is recorded, an old one again is not.
	before = reconciles(t)
	setPeriod(t, tenth, "0s")
	checkEvents("an Event for the new value", map[string][]string{tenth: {
		ReasonPeriodBelowFloor + ": spec.heartbeatUpdatePeriod is 0s",
		ReasonPeriodBelowFloor + ": spec.heartbeatUpdatePeriod is 100ms",
	}})
	setPeriod(t, tenth, "100ms")
	setPeriod(t, tenth, "10s")
	await(t, "the leader looking at the two changes", func(context.Context) (bool, string) {
		n := reconciles(t)
		return n >= before+3, fmt.Sprint(n - before)
	})
	checkEvents("no Event for a value recorded before, nor for a valid one", map[string][]string{tenth: {
		ReasonPeriodBelowFloor + ": spec.heartbeatUpdatePeriod is 0s",
		ReasonPeriodBelowFloor + ": spec.heartbeatUpdatePeriod is 100ms",
	}})

	// A heartbeat shows in the gauges; a deleted AddonInstance's series go.
	beat := metav1.NewTime(time.Now().Add(-time.Minute).Truncate(time.Second))
	var ai addonsv1alpha1.AddonInstance
	if err := k8s.Get(t.Context(), client.ObjectKey{Namespace: fine, Name: "addon-instance"}, &ai); err != nil {
		t.Fatal(err)
	}
	ai.Status.LastHeartbeatTime = beat
	if err := k8s.Status().Update(t.Context(), &ai); err != nil {
		t.Fatal(err)
	}
	if err := k8s.Delete(t.Context(), &addonsv1alpha1.AddonInstance{ObjectMeta: metav1.ObjectMeta{Namespace: zero, Name: "addon-instance"}}); err != nil {
		t.Fatal(err)
	}
	await(t, "the heartbeat exported and the deleted AddonInstance's series gone", func(context.Context) (bool, string) {
		got := second.series(t, zero, fine)
		created := got[MetricCreated+" "+fine]
		ok := got[MetricLastHeartbeat+" "+fine] == float64(beat.Unix()) && len(second.series(t, zero)) == 0 &&
			created >= float64(ai.CreationTimestamp.Unix()) && created < float64(time.Now().Unix()+1)
		return ok, fmt.Sprint(got)
	})
}
