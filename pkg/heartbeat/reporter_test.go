package heartbeat

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	addonsv1alpha1 "github.com/openshift/addon-operator/apis/addons/v1alpha1"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/annotations"
)

const (
	sentTotal = "addon_heartbeat_heartbeats_sent_total"
	failTotal = "addon_heartbeat_heartbeats_failed_total"
	conflicts = "addon_heartbeat_conflicts_retried_total"
	isLeader  = "addon_heartbeat_is_leader"
	// electionAttempts counts a standby's attempts on the Lease by result.
	electionAttempts = "addon_heartbeat_election_attempts_total"
)

// onGrid checks that heartbeats fall on a fixed schedule, first + k x period
// (±300ms), which is what "no drift" means. lastHeartbeatTime has second
// precision, so a heartbeat written in the same second as the one before
// can be invisible (an identical status is not a new version); at most one
// such merge is allowed.
func onGrid(t *testing.T, bs []beat, period time.Duration) {
	t.Helper()
	const tolerance = 300 * time.Millisecond
	var offsets []time.Duration
	for i, b := range bs {
		d := b.at.Sub(bs[0].at)
		offsets = append(offsets, d)
		k := int((d + period/2) / period)
		if off := d - time.Duration(k)*period; off < -tolerance || off > tolerance {
			t.Errorf("heartbeat %d at %s is %s off the %s schedule (all: %v)", i, d, off, period, offsets)
		}
		if k < i || k > i+1 {
			t.Errorf("heartbeat %d falls on tick %d of the %s schedule (all: %v)", i, k, period, offsets)
		}
	}
}

// within fails unless d is within tolerance of want.
func within(t *testing.T, what string, d, want, tolerance time.Duration) {
	t.Helper()
	if d < want-tolerance || d > want+tolerance {
		t.Errorf("%s = %s, want %s ± %s", what, d, want, tolerance)
	}
}

func TestHeartbeatsArriveAtTheSpecPeriodAndFollowItsChanges(t *testing.T) {
	ns := newNamespace(t)
	createInstance(t, ns, "addon-instance", 2*time.Second)
	rec := record(t, ns, "addon-instance")
	started := time.Now()
	rn := startReporter(t, adminCfg, Options{Namespace: ns, Identity: "only"})

	bs := rec.waitBeats(t, 5, 20*time.Second)
	if first := bs[0].at.Sub(started); first > time.Second {
		t.Errorf("first heartbeat %s after start, want it at once", first)
	}
	onGrid(t, bs[:5], 2*time.Second)
	// lastHeartbeatTime itself (second precision) moves by the period.
	within(t, "lastHeartbeatTime over the first five", bs[4].hb.Sub(bs[0].hb), bs[4].at.Sub(bs[0].at).Round(2*time.Second), time.Second)

	// The operator shortens the period: followed within one (new) period.
	ai := getInstance(t, ns, "addon-instance")
	ai.Spec.HeartbeatUpdatePeriod = metav1.Duration{Duration: time.Second}
	if err := k8s.Update(t.Context(), ai); err != nil {
		t.Fatal(err)
	}
	changed := time.Now()
	n := len(rec.snapshot())
	bs = rec.waitBeats(t, n+6, 15*time.Second)
	after := beatsAfter(bs, changed)
	if first := after[0].at.Sub(changed); first > 1300*time.Millisecond {
		t.Errorf("first heartbeat %s after the period change, want within the new period", first)
	}
	// The first may still be on the old schedule (a tick due as the change
	// arrived); from the next one on, the new schedule holds.
	onGrid(t, after[1:], time.Second)

	// And lengthened again.
	ai = getInstance(t, ns, "addon-instance")
	ai.Spec.HeartbeatUpdatePeriod = metav1.Duration{Duration: 3 * time.Second}
	if err := k8s.Update(t.Context(), ai); err != nil {
		t.Fatal(err)
	}
	changed = time.Now()
	n = len(rec.snapshot())
	bs = rec.waitBeats(t, n+3, 15*time.Second)
	after = beatsAfter(bs, changed)
	if first := after[0].at.Sub(changed); first > 3300*time.Millisecond {
		t.Errorf("first heartbeat %s after the period change, want within one period", first)
	}
	onGrid(t, after, 3*time.Second)
	if f := rn.metric(t, failTotal); f != 0 {
		t.Errorf("%v failed heartbeats", f)
	}
}

func TestNeverWritesHealthyNorTheSpec(t *testing.T) {
	ns := newNamespace(t)
	before := createInstance(t, ns, "addon-instance", time.Second)
	rec := record(t, ns, "addon-instance")
	startReporter(t, adminCfg, Options{Namespace: ns, Identity: "only", DeploymentHealth: true})
	rec.waitBeats(t, 6, 15*time.Second)

	after := getInstance(t, ns, "addon-instance")
	if after.Generation != before.Generation {
		t.Errorf("generation %d -> %d: the spec changed", before.Generation, after.Generation)
	}
	if diff := cmp.Diff(before.Spec, after.Spec); diff != "" {
		t.Errorf("spec changed:\n%s", diff)
	}
	for _, v := range rec.allVersions() {
		if meta.FindStatusCondition(v.Status.Conditions, ConditionHealthy) != nil {
			t.Fatalf("version %s has a Healthy condition: %+v", v.ResourceVersion, v.Status.Conditions)
		}
		for _, c := range v.Status.Conditions {
			if c.ObservedGeneration != v.Generation {
				t.Errorf("condition %s observedGeneration %d, generation %d", c.Type, c.ObservedGeneration, v.Generation)
			}
		}
	}
	for _, mf := range after.ManagedFields {
		if mf.Manager == FieldManager && (mf.Subresource != "status" || strings.Contains(string(mf.FieldsV1.Raw), `"f:spec"`)) {
			t.Errorf("the reporter owns fields outside the status: %+v", mf)
		}
	}
}

// operator mimics the addon-operator: it sets Healthy with a full
// Status().Update from its cached (often stale) copy and retries its own
// conflicts against a fresh read.
func operator(ctx context.Context, ns, name string, every time.Duration, conflictsSeen *atomic.Int64) {
	key := client.ObjectKey{Namespace: ns, Name: name}
	cached := &addonsv1alpha1.AddonInstance{}
	_ = k8s.Get(ctx, key, cached)
	writes := 0
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		for attempt := 0; attempt < 10 && ctx.Err() == nil; attempt++ {
			obj := cached.DeepCopy()
			// Each write is a real change (a no-op update would not
			// move the resourceVersion and could not conflict with ours).
			writes++
			meta.SetStatusCondition(&obj.Status.Conditions, metav1.Condition{
				Type: ConditionHealthy, Status: metav1.ConditionTrue,
				Reason:  addonsv1alpha1.AddonInstanceHealthyReasonReceivingHeartbeats.String(),
				Message: fmt.Sprintf("heartbeats arrive (check %d)", writes),
			})
			err := k8s.Status().Update(ctx, obj, client.FieldOwner("addon-operator"))
			if err == nil {
				cached = obj
				break
			}
			if apierrors.IsConflict(err) {
				conflictsSeen.Add(1)
			}
			_ = k8s.Get(ctx, key, cached)
		}
	}
}

func TestAnOperatorWritingHealthyNeverLosesItAndHeartbeatsKeepArriving(t *testing.T) {
	ns := newNamespace(t)
	createInstance(t, ns, "addon-instance", time.Second)
	rec := record(t, ns, "addon-instance")
	// Whether the reporter's write meets a newer version by chance depends
	// on how fresh its cache is at that instant; to make its conflict path
	// certain, the operator also writes while each of the reporter's first
	// three status PUTs is on its way, so those PUTs carry a stale version.
	var interleaved atomic.Int64
	cfg := rest.CopyConfig(adminCfg)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			if req.Method == http.MethodPut && strings.HasSuffix(req.URL.Path, "/status") && interleaved.Load() < 3 {
				interleaved.Add(1)
				if err := operatorWrite(req.Context(), ns, "addon-instance", "written while the reporter's PUT was on its way"); err != nil {
					t.Errorf("interleaved operator write: %v", err)
				}
			}
			return rt.RoundTrip(req)
		})
	}
	rn := startReporter(t, cfg, Options{Namespace: ns, Identity: "only", DeploymentHealth: true})
	rec.waitBeats(t, 1, 10*time.Second)

	ctx, stopOperator := context.WithCancel(t.Context())
	var opConflicts atomic.Int64
	opDone := make(chan struct{})
	go func() {
		defer close(opDone)
		operator(ctx, ns, "addon-instance", 20*time.Millisecond, &opConflicts)
	}()
	eventually(t, 5*time.Second, "the operator's Healthy", func() (bool, error) {
		return meta.IsStatusConditionTrue(getInstance(t, ns, "addon-instance").Status.Conditions, ConditionHealthy), nil
	})
	healthySince := len(rec.allVersions())
	n := len(rec.snapshot())
	sentBefore, since := rn.metric(t, sentTotal), time.Now()
	bs := rec.waitBeats(t, n+8, 20*time.Second)
	stopOperator()
	<-opDone
	sent, elapsed := rn.metric(t, sentTotal)-sentBefore, time.Since(since)
	if ticks := elapsed.Seconds(); sent < ticks-1 || sent > ticks+1 {
		t.Errorf("%v heartbeats written in %s at a 1s period", sent, elapsed)
	}

	// Every version after Healthy first appeared still has it, and ours.
	versions := rec.allVersions()
	for _, v := range versions[healthySince:] {
		if !meta.IsStatusConditionTrue(v.Status.Conditions, ConditionHealthy) {
			t.Fatalf("version %s lost Healthy: %+v", v.ResourceVersion, v.Status.Conditions)
		}
		if meta.FindStatusCondition(v.Status.Conditions, ConditionDegraded) == nil {
			t.Fatalf("version %s lost Degraded: %+v", v.ResourceVersion, v.Status.Conditions)
		}
	}
	// lastHeartbeatTime has second precision: a heartbeat delayed by
	// conflict retries into the next second can merge with the one after.
	for _, g := range gaps(bs[n:]) {
		if g > 2300*time.Millisecond {
			t.Errorf("heartbeat gap %s under concurrent writes (period 1s)", g)
		}
	}
	// The operator here writes 50 times a second (the real one every 10s),
	// so a write can still run out of retries on a loaded machine; it is
	// retried within the period, which the count above proves.
	if f := rn.metric(t, failTotal); f > 2 {
		t.Errorf("%v heartbeats failed; conflicts must be retried", f)
	}
	ours := rn.metric(t, conflicts)
	t.Logf("%d status versions, operator conflicts %d, reporter conflicts retried %v, heartbeats sent %v, failed %v",
		len(versions), opConflicts.Load(), ours, sent, rn.metric(t, failTotal))
	if ours < 3 {
		t.Errorf("%v reporter conflicts retried; the three interleaved operator writes must each cause one", ours)
	}
	if opConflicts.Load() == 0 {
		t.Errorf("the operator never met a conflict in %d of its writes; the reporter's heartbeats must move the version under it", len(versions))
	}
}

// operatorWrite is one fresh read-modify-write of Healthy, as the operator
// does, through the test's own client.
func operatorWrite(ctx context.Context, ns, name, message string) error {
	ai := &addonsv1alpha1.AddonInstance{}
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, ai); err != nil {
		return err
	}
	meta.SetStatusCondition(&ai.Status.Conditions, metav1.Condition{
		Type: ConditionHealthy, Status: metav1.ConditionTrue,
		Reason:  addonsv1alpha1.AddonInstanceHealthyReasonReceivingHeartbeats.String(),
		Message: message + " " + time.Now().Format(time.RFC3339Nano),
	})
	return k8s.Status().Update(ctx, ai, client.FieldOwner("addon-operator"))
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestOneWriterPerInstanceAndTakeover(t *testing.T) {
	tests := map[string]struct {
		release bool
	}{
		"leader stops (SIGTERM) and releases the Lease": {release: true},
		"leader dies (SIGKILL) and the Lease expires":   {release: false},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			const period = 2 * time.Second
			ns := newNamespace(t)
			createInstance(t, ns, "addon-instance", period)
			rec := record(t, ns, "addon-instance")
			keep := func(r *Reporter) { r.releaseOnCancel = tt.release }
			a := startReporter(t, adminCfg, Options{Namespace: ns, Identity: "pod-a"}, keep)
			b := startReporter(t, adminCfg, Options{Namespace: ns, Identity: "pod-b"}, keep)
			rec.waitBeats(t, 4, 20*time.Second)

			leader, standby := a, b
			if b.IsLeader() {
				leader, standby = b, a
			}
			if !leader.IsLeader() || standby.IsLeader() {
				t.Fatalf("leaders: a=%v b=%v, want exactly one", a.IsLeader(), b.IsLeader())
			}
			if leader.metric(t, sentTotal) < 3 || standby.metric(t, sentTotal) != 0 {
				t.Fatalf("heartbeats sent: leader %v, standby %v: want only the leader to write",
					leader.metric(t, sentTotal), standby.metric(t, sentTotal))
			}
			if leader.metric(t, isLeader) != 1 || standby.metric(t, isLeader) != 0 {
				t.Errorf("is_leader gauges: leader %v, standby %v", leader.metric(t, isLeader), standby.metric(t, isLeader))
			}
			lease := &coordinationv1.Lease{}
			if err := k8s.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: LeaseName("addon-instance")}, lease); err != nil {
				t.Fatal(err)
			}
			if got := ptr.Deref(lease.Spec.HolderIdentity, ""); got != leader.opts.Identity {
				t.Errorf("Lease holder %q, want %q", got, leader.opts.Identity)
			}

			stopped := time.Now()
			leader.stop(t)
			sentByOld := leader.metric(t, sentTotal)
			// The standby's first write may land in the same second as the
			// old leader's last one (lastHeartbeatTime has second
			// precision), so the takeover is timed on its own counter.
			eventually(t, 3*period, "the standby's first heartbeat", func() (bool, error) {
				return standby.metric(t, sentTotal) >= 1, nil
			})
			takeover := time.Since(stopped)
			n := len(rec.snapshot())
			bs := rec.waitBeats(t, n+2, 20*time.Second)
			if !standby.IsLeader() {
				t.Errorf("the standby is not leading")
			}
			if leader.metric(t, sentTotal) != sentByOld {
				t.Errorf("the stopped leader kept writing")
			}
			worst := time.Duration(0)
			for _, g := range gaps(bs) {
				worst = max(worst, g)
			}
			t.Logf("the standby wrote %s after the leader stopped; largest gap between heartbeats %s (operator timeout %s)",
				takeover, worst, 3*period)
			if worst >= 3*period {
				t.Errorf("heartbeat gap %s >= 3 x period", worst)
			}
			// The watch brings the release: the standby takes over at once,
			// not at its next look.
			if tt.release && takeover > period/2 {
				t.Errorf("takeover after a release took %s, want under half a period", takeover)
			}
		})
	}
}

func newDeployment(t *testing.T, ns, name string, replicas int32, annots map[string]string) *appsv1.Deployment {
	t.Helper()
	labels := map[string]string{"app": name}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: annots},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(replicas),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "example.com/addon:v1"}}},
			},
		},
	}
	if err := k8s.Create(t.Context(), d); err != nil {
		t.Fatal(err)
	}
	return d
}

// setAvailability writes a Deployment's status as the controller-manager would.
func setAvailability(t *testing.T, d *appsv1.Deployment, available int32) {
	t.Helper()
	fresh := &appsv1.Deployment{}
	if err := k8s.Get(t.Context(), client.ObjectKeyFromObject(d), fresh); err != nil {
		t.Fatal(err)
	}
	want := ptr.Deref(fresh.Spec.Replicas, 1)
	status := corev1.ConditionFalse
	reason := "MinimumReplicasUnavailable"
	if available >= want {
		status, reason = corev1.ConditionTrue, "MinimumReplicasAvailable"
	}
	fresh.Status = appsv1.DeploymentStatus{
		ObservedGeneration: fresh.Generation, Replicas: want, AvailableReplicas: available, ReadyReplicas: available,
		Conditions: []appsv1.DeploymentCondition{{Type: appsv1.DeploymentAvailable, Status: status, Reason: reason,
			LastUpdateTime: metav1.Now(), LastTransitionTime: metav1.Now()}},
	}
	if err := k8s.Status().Update(t.Context(), fresh); err != nil {
		t.Fatal(err)
	}
}

// waitCondition waits until the AddonInstance's condition has this status,
// reason and (if not empty) message.
func waitCondition(t *testing.T, ns, name, condType string, status metav1.ConditionStatus, reason, message string) {
	t.Helper()
	var last *metav1.Condition
	err := func() error {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		for ctx.Err() == nil {
			ai := &addonsv1alpha1.AddonInstance{}
			if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, ai); err == nil {
				last = meta.FindStatusCondition(ai.Status.Conditions, condType)
				if last != nil && last.Status == status && last.Reason == reason && (message == "" || last.Message == message) {
					return nil
				}
				if last == nil && status == "" {
					return nil
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
		return ctx.Err()
	}()
	if err != nil {
		t.Fatalf("condition %s: want %s/%s %q, last %+v", condType, status, reason, message, last)
	}
}

func TestDeploymentAvailabilityDrivesDegradedAndInstalled(t *testing.T) {
	ns := newNamespace(t)
	createInstance(t, ns, "addon-instance", time.Second)
	inject := map[string]string{annotations.Inject: "true"}
	op := newDeployment(t, ns, "addon-operator", 3, inject)
	web := newDeployment(t, ns, "addon-web", 1, map[string]string{annotations.Inject: "true", annotations.AddonInstance: "addon-instance"})
	newDeployment(t, ns, "other-addon", 1, map[string]string{annotations.Inject: "true", annotations.AddonInstance: "other"})
	newDeployment(t, ns, "not-injected", 1, nil)
	setAvailability(t, op, 1)

	health := &atomic.Int32{}
	health.Store(http.StatusOK)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(int(health.Load()))
	}))
	defer srv.Close()
	startReporter(t, adminCfg, Options{Namespace: ns, Identity: "only", DeploymentHealth: true, HealthURL: srv.URL + "/healthz"})

	// other-addon and not-injected are not ours and are never named.
	waitCondition(t, ns, "addon-instance", ConditionDegraded, metav1.ConditionTrue, ReasonDeploymentUnavailable,
		"addon-operator 1/3 available; addon-web 0/1 available")
	waitCondition(t, ns, "addon-instance", ConditionInstalled, metav1.ConditionFalse, "Blocked",
		"waiting for addon-operator, addon-web to become available")

	setAvailability(t, op, 3)
	waitCondition(t, ns, "addon-instance", ConditionInstalled, metav1.ConditionFalse, "Blocked",
		"waiting for addon-web to become available")
	setAvailability(t, web, 1)
	waitCondition(t, ns, "addon-instance", ConditionDegraded, metav1.ConditionFalse, ReasonAllComponentsAvailable,
		"available: addon-operator, addon-web, health-url")
	waitCondition(t, ns, "addon-instance", ConditionInstalled, metav1.ConditionTrue, "SetupComplete", "")

	// Losing a replica degrades the addon but does not undo the installation.
	setAvailability(t, op, 2)
	waitCondition(t, ns, "addon-instance", ConditionDegraded, metav1.ConditionTrue, ReasonDeploymentUnavailable,
		"addon-operator 2/3 available")
	waitCondition(t, ns, "addon-instance", ConditionInstalled, metav1.ConditionTrue, "SetupComplete", "")

	// The health URL fails too: both are named.
	health.Store(http.StatusServiceUnavailable)
	waitCondition(t, ns, "addon-instance", ConditionDegraded, metav1.ConditionTrue, ReasonMultipleComponentsUnavailable,
		"addon-operator 2/3 available; health check "+srv.URL+"/healthz returned 503 Service Unavailable")
	setAvailability(t, op, 3)
	waitCondition(t, ns, "addon-instance", ConditionDegraded, metav1.ConditionTrue, ReasonHealthCheckFailed,
		"health check "+srv.URL+"/healthz returned 503 Service Unavailable")
}

func TestMarkedForDeletionDrivesReadyToBeDeleted(t *testing.T) {
	tests := map[string]struct {
		ack        annotations.DeleteAckMode
		wantStatus metav1.ConditionStatus
		wantReason string
	}{
		"auto":   {annotations.DeleteAckAuto, metav1.ConditionTrue, "AddonReadyToBeDeleted"},
		"manual": {annotations.DeleteAckManual, metav1.ConditionFalse, "AddonNotReadyToBeDeleted"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			ns := newNamespace(t)
			createInstance(t, ns, "addon-instance", time.Second)
			rec := record(t, ns, "addon-instance")
			rn := startReporter(t, adminCfg, Options{Namespace: ns, Identity: "only", DeleteAck: tt.ack})
			rec.waitBeats(t, 2, 10*time.Second)
			if c := meta.FindStatusCondition(getInstance(t, ns, "addon-instance").Status.Conditions, ConditionReadyToBeDeleted); c != nil {
				t.Fatalf("ReadyToBeDeleted before deletion was asked: %+v", c)
			}

			ai := getInstance(t, ns, "addon-instance")
			ai.Spec.MarkedForDeletion = true
			if err := k8s.Update(t.Context(), ai); err != nil {
				t.Fatal(err)
			}
			waitCondition(t, ns, "addon-instance", ConditionReadyToBeDeleted, tt.wantStatus, tt.wantReason, "")

			if tt.ack == annotations.DeleteAckManual {
				// Stays False over several heartbeats until the addon says so.
				n := len(rec.snapshot())
				for _, b := range rec.waitBeats(t, n+3, 10*time.Second)[n:] {
					if meta.IsStatusConditionTrue(b.obj.Status.Conditions, ConditionReadyToBeDeleted) {
						t.Fatalf("ReadyToBeDeleted=True with delete-ack manual and no acknowledgement")
					}
				}
				if err := rn.SetCondition(metav1.Condition{Type: "ReadyToBeDeleted", Status: metav1.ConditionTrue,
					Reason: "AddonReadyToBeDeleted", Message: "data exported"}); err != nil {
					t.Fatal(err)
				}
				waitCondition(t, ns, "addon-instance", ConditionReadyToBeDeleted, metav1.ConditionTrue, "AddonReadyToBeDeleted", "data exported")
			}

			// Deletion cancelled: the acknowledgement is withdrawn.
			rn.RemoveCondition(ConditionReadyToBeDeleted)
			ai = getInstance(t, ns, "addon-instance")
			ai.Spec.MarkedForDeletion = false
			if err := k8s.Update(t.Context(), ai); err != nil {
				t.Fatal(err)
			}
			waitCondition(t, ns, "addon-instance", ConditionReadyToBeDeleted, "", "", "")
		})
	}
}

func TestSDKConditionsAndHealth(t *testing.T) {
	ns := newNamespace(t)
	createInstance(t, ns, "addon-instance", time.Second)
	rn := startReporter(t, adminCfg, Options{Namespace: ns, Identity: "only"})
	if err := rn.SetCondition(metav1.Condition{Type: ConditionHealthy, Status: metav1.ConditionTrue, Reason: "Mine"}); err == nil {
		t.Fatal("SetCondition accepted Healthy")
	}
	if err := rn.SetHealth(Component{Name: "database", Reason: "ConnectionRefused", Message: "database unreachable"}); err != nil {
		t.Fatal(err)
	}
	if err := rn.SetCondition(metav1.Condition{Type: "example.com/Synced", Status: metav1.ConditionTrue, Reason: "Synced", Message: "ok"}); err != nil {
		t.Fatal(err)
	}
	waitCondition(t, ns, "addon-instance", ConditionDegraded, metav1.ConditionTrue, "ConnectionRefused", "database unreachable")
	waitCondition(t, ns, "addon-instance", ConditionInstalled, metav1.ConditionFalse, "Blocked", "waiting for database to become available")
	waitCondition(t, ns, "addon-instance", "example.com/Synced", metav1.ConditionTrue, "Synced", "ok")

	if err := rn.SetHealth(Component{Name: "database", Available: true}); err != nil {
		t.Fatal(err)
	}
	waitCondition(t, ns, "addon-instance", ConditionDegraded, metav1.ConditionFalse, ReasonAllComponentsAvailable, "available: database")
	waitCondition(t, ns, "addon-instance", ConditionInstalled, metav1.ConditionTrue, "SetupComplete", "")
	rn.RemoveCondition("example.com/Synced")
	waitCondition(t, ns, "addon-instance", "example.com/Synced", "", "", "")
}

func TestWaitsForTheInstanceAndResumesWhenItIsRecreated(t *testing.T) {
	ns := newNamespace(t)
	rec := record(t, ns, "addon-instance")
	rn := startReporter(t, adminCfg, Options{Namespace: ns, Identity: "only"})
	eventually(t, 10*time.Second, "leading without an AddonInstance", func() (bool, error) {
		return rn.IsLeader() && rn.logs.count("waiting for the AddonInstance to exist") == 1, nil
	})

	created := time.Now()
	createInstance(t, ns, "addon-instance", time.Second)
	bs := rec.waitBeats(t, 3, 10*time.Second)
	if d := bs[0].at.Sub(created); d > time.Second {
		t.Errorf("first heartbeat %s after the AddonInstance was created, want at once", d)
	}
	first := bs[0].uid

	if err := k8s.Delete(t.Context(), getInstance(t, ns, "addon-instance")); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "deletion seen", func() (bool, error) {
		err := k8s.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "addon-instance"}, &addonsv1alpha1.AddonInstance{})
		return apierrors.IsNotFound(err), nil
	})
	createInstance(t, ns, "addon-instance", time.Second)
	eventually(t, 10*time.Second, "heartbeats on the recreated AddonInstance", func() (bool, error) {
		n := 0
		for _, b := range rec.snapshot() {
			if b.uid != first {
				n++
			}
		}
		return n >= 2, nil
	})
	if rn.exited() {
		t.Fatal("the reporter stopped")
	}
}

func TestForbiddenIsLoggedClearlyRateLimitedAndRecovers(t *testing.T) {
	ns := newNamespace(t)
	createInstance(t, ns, "addon-instance", time.Second)
	rec := record(t, ns, "addon-instance")
	sa := "system:serviceaccount:" + ns + ":addon"
	cfg := rest.CopyConfig(adminCfg)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: sa, Groups: []string{"system:serviceaccounts", "system:authenticated"}}
	rn := startReporter(t, cfg, Options{Namespace: ns, Identity: "only", DeploymentHealth: true})

	// Several election attempts, each forbidden: logged once.
	eventually(t, 20*time.Second, "three forbidden election attempts", func() (bool, error) {
		return rn.metric(t, electionAttempts, "result", "error") >= 3, nil
	})
	if n := rn.logs.count("forbidden", `cannot get resource \"leases\"`); n != 1 {
		t.Errorf("the forbidden Lease read was logged %d times over %v attempts, want once:\n%s",
			n, rn.metric(t, electionAttempts, "result", "error"), rn.logs)
	}
	if n := rn.logs.count("reading the AddonInstance is forbidden"); n != 1 {
		t.Errorf("the forbidden AddonInstance read was logged %d times, want once", n)
	}
	if rn.exited() || rn.metric(t, sentTotal) != 0 {
		t.Fatalf("exited=%v sent=%v", rn.exited(), rn.metric(t, sentTotal))
	}

	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "addon-heartbeat-reporter"}, Rules: PolicyRules("addon-instance")}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "addon-heartbeat-reporter"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "addon"}},
	}
	for _, o := range []client.Object{role, binding} {
		if err := k8s.Create(t.Context(), o); err != nil {
			t.Fatal(err)
		}
	}
	granted := time.Now()
	bs := rec.waitBeats(t, 3, 30*time.Second)
	t.Logf("first heartbeat %s after the grant", bs[0].at.Sub(granted))
	if !meta.IsStatusConditionFalse(getInstance(t, ns, "addon-instance").Status.Conditions, ConditionDegraded) &&
		meta.FindStatusCondition(getInstance(t, ns, "addon-instance").Status.Conditions, ConditionDegraded) == nil {
		t.Errorf("no Degraded condition: the Deployment watch is not working under the minimal Role")
	}
	if f := rn.metric(t, failTotal); f != 0 {
		t.Errorf("%v heartbeats failed under the minimal Role:\n%s", f, rn.logs)
	}
}

func TestFootprintIsFlat(t *testing.T) {
	ns := newNamespace(t)
	createInstance(t, ns, "addon-instance", time.Second)
	for _, name := range []string{"a", "b", "c"} {
		setAvailability(t, newDeployment(t, ns, name, 1, map[string]string{annotations.Inject: "true"}), 1)
	}
	rec := record(t, ns, "addon-instance")
	runtime.GC()
	base := runtime.NumGoroutine()
	var ms0 runtime.MemStats
	runtime.ReadMemStats(&ms0)

	rn := startReporter(t, adminCfg, Options{Namespace: ns, Identity: "only", DeploymentHealth: true})
	rec.waitBeats(t, 3, 10*time.Second)
	g1 := runtime.NumGoroutine()
	n := len(rec.snapshot())
	rec.waitBeats(t, n+5, 15*time.Second)
	g2 := runtime.NumGoroutine()
	runtime.GC()
	var ms1 runtime.MemStats
	runtime.ReadMemStats(&ms1)
	t.Logf("reporter goroutines: %d after 3 heartbeats, %d after 8; live heap added by the reporter (after GC): %.2f MiB",
		g1-base, g2-base, (float64(ms1.HeapAlloc)-float64(ms0.HeapAlloc))/(1<<20))
	// A leak stays; a goroutine of the moment (an HTTP/2 stream, a timer
	// firing in client-go) ends within a heartbeat.
	settled := g2
	_ = wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, time.Second, true, func(context.Context) (bool, error) {
		settled = runtime.NumGoroutine()
		return settled <= g1, nil
	})
	if settled > g1 {
		t.Errorf("goroutines grew from %d to %d over 5 heartbeats (%d a second later)", g1, g2, settled)
	}
	rn.stop(t)
	eventually(t, 10*time.Second, "goroutines back to where they were", func() (bool, error) {
		return runtime.NumGoroutine() <= base+2, nil // the shared HTTP transport keeps idle connections
	})
}

func TestWithoutItsOwnElectionItCreatesNoLease(t *testing.T) {
	ns := newNamespace(t)
	createInstance(t, ns, "addon-instance", time.Second)
	rec := record(t, ns, "addon-instance")
	rn := startReporter(t, adminCfg, Options{Namespace: ns, Identity: "only", DisableLeaderElection: true})
	rec.waitBeats(t, 2, 10*time.Second)
	if !rn.IsLeader() || rn.metric(t, isLeader) != 1 {
		t.Errorf("a Reporter gated by its manager's election reports itself as not leading")
	}
	err := k8s.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: LeaseName("addon-instance")}, &coordinationv1.Lease{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("Lease lookup: %v, want NotFound", err)
	}
}
