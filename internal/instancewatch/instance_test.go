package instancewatch

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"
)

// stored is an AddonInstance as the API server sends it, with what the
// webhook must not keep: conditions, managed fields, labels, annotations.
const stored = `
apiVersion: addons.managed.openshift.io/v1alpha1
kind: AddonInstance
metadata:
  name: addon-instance
  namespace: my-addon
  uid: 6a0c6b4e-1f4e-4c1e-9a4e-2f0d8c1b7e11
  resourceVersion: "42"
  generation: 3
  creationTimestamp: "2026-12-01T10:00:00Z"
  labels: {team: a}
  annotations: {note: "a long annotation"}
  managedFields:
  - manager: addon-operator
    operation: Update
    fieldsType: FieldsV1
    fieldsV1: {"f:spec": {"f:heartbeatUpdatePeriod": {}}}
spec:
  heartbeatUpdatePeriod: 100ms
  markedForDeletion: false
status:
  lastHeartbeatTime: "2026-12-01T10:05:00Z"
  observedGeneration: 3
  conditions:
  - type: addons.managed.openshift.io/Healthy
    status: "True"
    reason: ReceivingHeartbeats
    message: a message
    lastTransitionTime: "2026-12-01T10:00:05Z"
`

// object decodes an AddonInstance as the webhook's client does: with the
// webhook's scheme, into Object.
func object(t *testing.T, y string) *Object {
	t.Helper()
	j, err := yaml.YAMLToJSON([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	s := runtime.NewScheme()
	if err := AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	obj, _, err := serializer.NewCodecFactory(s).UniversalDeserializer().Decode(j, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return obj.(*Object)
}

// The decoded and cached copy holds exactly what Instance reads, and reads
// the same.
func TestSlim(t *testing.T) {
	full := object(t, stored)
	if full.Name != "addon-instance" || len(full.ManagedFields) == 0 || full.Labels["team"] != "a" {
		t.Fatalf("decoded %+v", full)
	}
	out, err := Slim(full)
	if err != nil {
		t.Fatal(err)
	}
	slim := out.(*Object)
	want := &Object{
		TypeMeta: metav1.TypeMeta{APIVersion: "addons.managed.openshift.io/v1alpha1", Kind: "AddonInstance"},
		ObjectMeta: metav1.ObjectMeta{
			Name: "addon-instance", Namespace: "my-addon", UID: "6a0c6b4e-1f4e-4c1e-9a4e-2f0d8c1b7e11",
			ResourceVersion: "42", Generation: 3, CreationTimestamp: metav1.NewTime(time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)),
		},
		Spec:   ObjectSpec{HeartbeatUpdatePeriod: "100ms"},
		Status: ObjectStatus{LastHeartbeatTime: "2026-12-01T10:05:00Z"},
	}
	if diff := cmp.Diff(want, slim); diff != "" {
		t.Errorf("slim copy (-want +got):\n%s", diff)
	}
	in := FromObject(slim)
	if diff := cmp.Diff(FromObject(full), in); diff != "" {
		t.Errorf("the slim copy reads differently (-full +slim):\n%s", diff)
	}
	wantIn := Instance{Namespace: "my-addon", Name: "addon-instance", UID: "6a0c6b4e-1f4e-4c1e-9a4e-2f0d8c1b7e11",
		Created: time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC), Period: "100ms", LastHeartbeat: time.Date(2026, 12, 1, 10, 5, 0, 0, time.UTC)}
	if !in.Created.Equal(wantIn.Created) || !in.LastHeartbeat.Equal(wantIn.LastHeartbeat) || in.Period != wantIn.Period || in.UID != wantIn.UID {
		t.Errorf("read %+v, want %+v", in, wantIn)
	}
	// A copy is a copy.
	cp := full.DeepCopyObject().(*Object)
	cp.Labels["team"] = "b"
	if full.Labels["team"] != "a" {
		t.Error("DeepCopyObject shares the labels")
	}
	// Anything else passes through.
	if got, _ := Slim("not an object"); got != "not an object" {
		t.Errorf("Slim changed a non-object: %v", got)
	}
}

// A period the CRD stores but Go cannot parse decodes (and is reported by
// Check); a lastHeartbeatTime that is not a time reads as none.
func TestObjectOddFields(t *testing.T) {
	o := object(t, `
apiVersion: addons.managed.openshift.io/v1alpha1
kind: AddonInstance
metadata: {name: a, namespace: b}
spec: {heartbeatUpdatePeriod: 1d}
status: {lastHeartbeatTime: yesterday}
`)
	in := FromObject(o)
	if in.Period != "1d" || !in.LastHeartbeat.IsZero() {
		t.Errorf("read %+v, want period 1d and no heartbeat", in)
	}
}

func TestCheck(t *testing.T) {
	tests := map[string]struct {
		period     string
		wantReason string
		wantParts  []string
	}{
		"the CRD default":     {period: "10s"},
		"the floor":           {period: "1s"},
		"a long period":       {period: "1h"},
		"just below":          {period: "999ms", wantReason: ReasonPeriodBelowFloor, wantParts: []string{"is 999ms", "floor of 1s", "every 1s", "(2.997s)"}},
		"100ms":               {period: "100ms", wantReason: ReasonPeriodBelowFloor, wantParts: []string{"is 100ms", "floor of 1s", "every 1s", "3 requested periods (300ms)", "timed out", "at least 1s"}},
		"zero":                {period: "0s", wantReason: ReasonPeriodBelowFloor, wantParts: []string{"is 0s", "every 1s", "(0s)"}},
		"negative":            {period: "-5s", wantReason: ReasonPeriodBelowFloor, wantParts: []string{"is -5s", "every 1s"}},
		"absent, read as 0s":  {period: "", wantReason: ReasonPeriodBelowFloor, wantParts: []string{"is 0s"}},
		"not a duration":      {period: "ten seconds", wantReason: ReasonPeriodInvalid, wantParts: []string{`"ten seconds" is not a duration`, "10s or 1m"}},
		"a day (Go has no d)": {period: "1d", wantReason: ReasonPeriodInvalid, wantParts: []string{`"1d"`}},
		"a huge value": {period: strings.Repeat("x", 5000), wantReason: ReasonPeriodInvalid,
			wantParts: []string{strings.Repeat("x", maxQuoted) + "... (4936 bytes more)"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			f, bad := Check(Instance{Namespace: "ns", Name: "addon-instance", Period: tc.period})
			if bad != (tc.wantReason != "") || f.Reason != tc.wantReason {
				t.Fatalf("Check = %+v, %v; want reason %q", f, bad, tc.wantReason)
			}
			for _, p := range tc.wantParts {
				if !strings.Contains(f.Note, p) {
					t.Errorf("note %q does not say %q", f.Note, p)
				}
			}
			// The API server refuses a note over 1 KiB.
			if len(f.Note) > 1024 {
				t.Errorf("note of %d bytes", len(f.Note))
			}
		})
	}
}

// An Event's name is the same for the same finding, different for another
// period or another AddonInstance of the same name, and valid for the
// longest AddonInstance name.
func TestEventName(t *testing.T) {
	in := Instance{Namespace: "ns", Name: "addon-instance", UID: "u1", Period: "100ms"}
	f, _ := Check(in)
	now := time.Now()
	name := func(in Instance) string {
		f, _ := Check(in)
		return Event(in, f, "webhook-0", now).Name
	}
	a := Event(in, f, "webhook-0", now)
	if b := Event(in, f, "webhook-1", now.Add(time.Hour)); b.Name != a.Name {
		t.Errorf("another replica, later: name %s, want %s", b.Name, a.Name)
	}
	other := in
	other.Period = "0s"
	recreated := in
	recreated.UID = "u2"
	if name(other) == a.Name || name(recreated) == a.Name {
		t.Errorf("names %s, %s and %s must differ", a.Name, name(other), name(recreated))
	}
	if !strings.HasPrefix(a.Name, "addon-instance.") {
		t.Errorf("name %s does not start with the AddonInstance's", a.Name)
	}
	long := in
	long.Name = strings.Repeat("a", 200) + "." + strings.Repeat("b", 52)
	for _, n := range []string{a.Name, name(long)} {
		if errs := validation.IsDNS1123Subdomain(n); len(errs) > 0 {
			t.Errorf("name %q: %v", n, errs)
		}
	}
	if a.Type != "Warning" || a.Regarding.Kind != "AddonInstance" || a.Regarding.UID != "u1" || a.Regarding.Name != "addon-instance" ||
		a.ReportingController != ReportingController || a.ReportingInstance != "webhook-0" || a.Note != f.Note {
		t.Errorf("event %+v", a)
	}
}

func TestMetrics(t *testing.T) {
	created := time.Unix(1_800_000_000, 0)
	instances := []Instance{
		{Namespace: "a", Name: "addon-instance", Created: created, Period: "10s", LastHeartbeat: created.Add(90 * time.Second)},
		{Namespace: "b", Name: "addon-instance", Created: created, Period: "100ms"},
		{Namespace: "c", Name: "addon-instance", Created: created, Period: "soon", LastHeartbeat: created.Add(time.Second)},
	}
	var c Collector
	release := c.Set(func(context.Context) ([]Instance, error) { return instances, nil })
	const want = `
# HELP addon_heartbeat_instance_created_timestamp_seconds Unix time the AddonInstance was created. From the webhook's watch of AddonInstances, so it is there whether or not any reporter runs.
# TYPE addon_heartbeat_instance_created_timestamp_seconds gauge
addon_heartbeat_instance_created_timestamp_seconds{addon_instance="addon-instance",namespace="a"} 1.8e+09
addon_heartbeat_instance_created_timestamp_seconds{addon_instance="addon-instance",namespace="b"} 1.8e+09
addon_heartbeat_instance_created_timestamp_seconds{addon_instance="addon-instance",namespace="c"} 1.8e+09
# HELP addon_heartbeat_instance_last_heartbeat_timestamp_seconds Unix time of the AddonInstance's status.lastHeartbeatTime; absent before its first heartbeat. From the webhook's watch of AddonInstances, so it is there whether or not any reporter runs.
# TYPE addon_heartbeat_instance_last_heartbeat_timestamp_seconds gauge
addon_heartbeat_instance_last_heartbeat_timestamp_seconds{addon_instance="addon-instance",namespace="a"} 1.80000009e+09
addon_heartbeat_instance_last_heartbeat_timestamp_seconds{addon_instance="addon-instance",namespace="c"} 1.800000001e+09
# HELP addon_heartbeat_instance_period_invalid 1 when the AddonInstance's spec.heartbeatUpdatePeriod is not a duration (then it has no period series). From the webhook's watch of AddonInstances, so it is there whether or not any reporter runs.
# TYPE addon_heartbeat_instance_period_invalid gauge
addon_heartbeat_instance_period_invalid{addon_instance="addon-instance",namespace="a"} 0
addon_heartbeat_instance_period_invalid{addon_instance="addon-instance",namespace="b"} 0
addon_heartbeat_instance_period_invalid{addon_instance="addon-instance",namespace="c"} 1
# HELP addon_heartbeat_instance_period_seconds The AddonInstance's spec.heartbeatUpdatePeriod: the addon-operator reports a heartbeat older than 3 of these as timed out. From the webhook's watch of AddonInstances, so it is there whether or not any reporter runs.
# TYPE addon_heartbeat_instance_period_seconds gauge
addon_heartbeat_instance_period_seconds{addon_instance="addon-instance",namespace="a"} 10
addon_heartbeat_instance_period_seconds{addon_instance="addon-instance",namespace="b"} 0.1
# HELP addon_heartbeat_instance_reporter_period_seconds The period the heartbeat reporter follows for the AddonInstance: the requested one, or the reporter's 1s floor when it asks for less (0s included). From the webhook's watch of AddonInstances, so it is there whether or not any reporter runs.
# TYPE addon_heartbeat_instance_reporter_period_seconds gauge
addon_heartbeat_instance_reporter_period_seconds{addon_instance="addon-instance",namespace="a"} 10
addon_heartbeat_instance_reporter_period_seconds{addon_instance="addon-instance",namespace="b"} 1
`
	if err := testutil.CollectAndCompare(&c, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
	// Without a lister (the run ended), and while it fails, nothing.
	release()
	if n := testutil.CollectAndCount(&c); n != 0 {
		t.Errorf("%d series after the run ended", n)
	}
	c.Set(func(context.Context) ([]Instance, error) { return nil, ErrNotSynced })
	if n := testutil.CollectAndCount(&c); n != 0 {
		t.Errorf("%d series before the cache synced", n)
	}
	if err := prometheus.NewPedanticRegistry().Register(&c); err != nil {
		t.Errorf("the collector's descriptors: %v", err)
	}
}
