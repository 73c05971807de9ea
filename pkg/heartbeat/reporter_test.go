//go:build go1.25

package heartbeat

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	addonsv1alpha1 "github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/internal/addonsv1alpha1"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/annotations"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/election"
)

const (
	sentTotal = "addon_heartbeat_heartbeats_sent_total"
	failTotal = "addon_heartbeat_heartbeats_failed_total"
	conflicts = "addon_heartbeat_conflicts_retried_total"
	isLeader  = "addon_heartbeat_is_leader"
	// electionAttempts counts a standby's attempts on the Lease by result.
	electionAttempts = "addon_heartbeat_election_attempts_total"
)

// Heartbeats fall on origin + k x period exactly, and follow a change of the
// period through the API server. The Reporter runs on a driven clock: the
// test moves it only to the deadline the schedule promises, once the Reporter
// has armed exactly that deadline, so every time compared here is exact and
// none depends on how loaded the machine is. (The loop's own schedule, with
// slow and failing writes, is tested in loop_test.go.)
func TestHeartbeatsFallOnTheSpecPeriodsScheduleAndFollowItsChanges(t *testing.T) {
	ns, rec, clk, t0 := drivenAddon(t, 2*time.Second)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	rn := startReporter(t, adminCfg, Options{Namespace: ns, Identity: "only"}, clk.drive)
	var want []float64
	beats := func(secs ...float64) {
		t.Helper()
		for _, s := range secs {
			clk.beatAt(t, rec, at(s))
			want = append(want, s)
		}
	}

	// The first at once (the clock has not moved), then every 2s. The
	// next tick armed says the last beat is done, its renewal included.
	beats(0, 2, 4, 6)
	clk.awaitArmed(t, at(8), "the tick after 6s")

	// The operator lengthens the period to 3s at 7s: a heartbeat at once,
	// whose renewal holds the Lease for the new period (the hold from the
	// tick at 6s would end at 9s, before 6s + 3s), then every 3s from there.
	clk.setTime(at(7))
	setPeriod(t, ns, "addon-instance", 3*time.Second)
	beats(7, 10, 13)
	if p := leaseOf(t, ns, "addon-instance").Annotations[election.PeriodAnnotation]; p != "3s" {
		t.Errorf("Lease announces period %q after the change, want 3s", p)
	}

	// And shortens it to 1s at 13.5s: the next heartbeat is one new period
	// after the last one (14s), not the old schedule's 16s.
	clk.awaitArmed(t, at(16), "the tick after 13s")
	clk.setTime(at(13.5))
	setPeriod(t, ns, "addon-instance", time.Second)
	beats(14, 15, 16)

	var got []float64
	for _, b := range rec.snapshot() {
		got = append(got, b.hb.Sub(t0).Seconds())
	}
	if !slices.Equal(got, want) {
		t.Errorf("heartbeats at %v s, want exactly %v", got, want)
	}
	// One term throughout: no period change cost the Lease.
	if n := rn.metric(t, electionAttempts, "result", string(election.Acquired)); n != 1 {
		t.Errorf("the Lease was acquired %v times, want once:\n%s", n, rn.logs)
	}
	if f := rn.metric(t, failTotal); f != 0 {
		t.Errorf("%v failed heartbeats", f)
	}
}

// setPeriod sets an AddonInstance's heartbeatUpdatePeriod, as the operator
// does.
func setPeriod(t *testing.T, ns, name string, period time.Duration) {
	t.Helper()
	ai := getInstance(t, ns, name)
	ai.Spec.HeartbeatUpdatePeriod = metav1.Duration{Duration: period}
	if err := k8s.Update(t.Context(), ai); err != nil {
		t.Fatal(err)
	}
}

// leaseOf reads the election Lease of an AddonInstance.
func leaseOf(t *testing.T, ns, instance string) *coordinationv1.Lease {
	t.Helper()
	lease := &coordinationv1.Lease{}
	if err := k8s.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: election.LeaseName(instance)}, lease); err != nil {
		t.Fatal(err)
	}
	return lease
}

func TestNeverWritesHealthyNorTheSpec(t *testing.T) {
	ns := newNamespace(t)
	before := createInstance(t, ns, "addon-instance", time.Second)
	rec := record(t, ns, "addon-instance")
	startReporter(t, adminCfg, Options{Namespace: ns, Identity: "only", DeploymentHealth: true})
	rec.waitBeats(t, 6, 30*time.Second)

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
	key := types.NamespacedName{Namespace: ns, Name: name}
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
				Reason:  addonsv1alpha1.AddonInstanceHealthyReasonReceivingHeartbeats,
				Message: fmt.Sprintf("heartbeats arrive (check %d)", writes),
			})
			err := k8s.Status().Update(ctx, obj, fieldOwner("addon-operator"))
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

// The operator writes Healthy with full status updates from a stale cache
// while the reporter heartbeats: neither loses the other's condition and the
// reporter retries its conflicts. This one runs on the real clock (the
// reporter's conflict retries wait on it), so its time bound is the
// operator's own rule, no gap of 3 periods, which the product keeps on any
// machine: the reporter retries a conflict within the same period.
func TestAnOperatorWritingHealthyNeverLosesItAndHeartbeatsKeepArriving(t *testing.T) {
	const period = 2 * time.Second
	ns := newNamespace(t)
	createInstance(t, ns, "addon-instance", period)
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
	rec.waitBeats(t, 1, 30*time.Second)

	// An operator far busier than the real one (every 10s): its cached
	// copy is stale after each heartbeat, so its next write conflicts.
	ctx, stopOperator := context.WithCancel(t.Context())
	var opConflicts atomic.Int64
	opDone := make(chan struct{})
	go func() {
		defer close(opDone)
		operator(ctx, ns, "addon-instance", 100*time.Millisecond, &opConflicts)
	}()
	eventually(t, 30*time.Second, "the operator's Healthy", func() (bool, error) {
		return meta.IsStatusConditionTrue(getInstance(t, ns, "addon-instance").Status.Conditions, ConditionHealthy), nil
	})
	healthySince := len(rec.allVersions())
	n := len(rec.snapshot())
	sentBefore, since := rn.metric(t, sentTotal), time.Now()
	bs := rec.waitBeats(t, n+6, 60*time.Second)
	stopOperator()
	<-opDone
	sent, elapsed := rn.metric(t, sentTotal)-sentBefore, time.Since(since)
	// Never more often than the schedule (load can only delay a write).
	if ticks := elapsed.Seconds() / period.Seconds(); sent > ticks+1 {
		t.Errorf("%v heartbeats written in %s at a %s period", sent, elapsed, period)
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
	for _, g := range gaps(bs[n:]) {
		if g >= 3*period {
			t.Errorf("heartbeat gap %s under concurrent writes: the operator times out at 3 x %s", g, period)
		}
	}
	// No heartbeat ran out of conflict retries: each conflict was retried
	// against a fresh read within the write's deadline.
	if f := rn.metric(t, failTotal, "reason", failConflict); f != 0 {
		t.Errorf("%v heartbeats failed on conflicts; they must be retried", f)
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
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, ai); err != nil {
		return err
	}
	meta.SetStatusCondition(&ai.Status.Conditions, metav1.Condition{
		Type: ConditionHealthy, Status: metav1.ConditionTrue,
		Reason:  addonsv1alpha1.AddonInstanceHealthyReasonReceivingHeartbeats,
		Message: message + " " + time.Now().Format(time.RFC3339Nano),
	})
	return k8s.Status().Update(ctx, ai, fieldOwner("addon-operator"))
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// Two Reporters for one AddonInstance: only the Lease holder writes, and when
// it stops the other takes over, at once after a release (SIGTERM) and one
// lease duration after the last renewal when it dies holding the Lease
// (SIGKILL). Both run on one driven clock, so the takeover times are exact.
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
			tm := election.Timings(period)
			ns, rec, clk, t0 := drivenAddon(t, period)
			keep := func(r *Reporter) { r.releaseOnCancel = tt.release }
			a := startReporter(t, adminCfg, Options{Namespace: ns, Identity: "pod-a"}, keep, clk.drive)
			b := startReporter(t, adminCfg, Options{Namespace: ns, Identity: "pod-b"}, keep, clk.drive)

			// Three heartbeats, the standby watching each renewal: it then
			// waits for one lease duration after it (plus 1ms) to look
			// again.
			var last time.Time
			for k := range 3 {
				last = t0.Add(time.Duration(k) * period)
				clk.beatAt(t, rec, last)
				clk.awaitArmed(t, last.Add(tm.LeaseDuration+time.Millisecond), "the standby's wait after the renewal")
			}
			leader, standby := a, b
			if b.IsLeader() {
				leader, standby = b, a
			}
			if !leader.IsLeader() || standby.IsLeader() {
				t.Fatalf("leaders: a=%v b=%v, want exactly one", a.IsLeader(), b.IsLeader())
			}
			// The counter moves just after the write the recorder saw.
			leader.awaitMetric(t, sentTotal, 3)
			if standby.metric(t, sentTotal) != 0 {
				t.Fatalf("heartbeats sent: leader %v, standby %v: want 3 by the leader only",
					leader.metric(t, sentTotal), standby.metric(t, sentTotal))
			}
			if leader.metric(t, isLeader) != 1 || standby.metric(t, isLeader) != 0 {
				t.Errorf("is_leader gauges: leader %v, standby %v", leader.metric(t, isLeader), standby.metric(t, isLeader))
			}
			if got := ptr.Deref(leaseOf(t, ns, "addon-instance").Spec.HolderIdentity, ""); got != leader.opts.Identity {
				t.Errorf("Lease holder %q, want %q", got, leader.opts.Identity)
			}

			leader.stop(t)
			sentByOld := leader.metric(t, sentTotal)
			var first, next time.Time
			if tt.release {
				// The watch brings the release and the standby takes the
				// Lease and writes without the clock moving at all.
				first, next = last, last.Add(period)
				clk.fireUntil(t, first, "the standby's first heartbeat", func() bool {
					return standby.metric(t, sentTotal) >= 1
				})
			} else {
				// Nothing comes; its look one lease duration after the
				// last renewal finds the Lease expired.
				first = last.Add(tm.LeaseDuration + time.Millisecond)
				next = first.Add(period)
				clk.fire(t, first, "the standby's look at the expired Lease")
				clk.beatAt(t, rec, first)
			}
			if took := first.Sub(last); took >= 2*period {
				t.Errorf("takeover %s after the last heartbeat, want under 2 periods", took)
			}
			clk.beatAt(t, rec, next)
			standby.awaitMetric(t, sentTotal, 2)
			if !standby.IsLeader() {
				t.Errorf("the new leader is not leading")
			}
			if leader.metric(t, sentTotal) != sentByOld {
				t.Errorf("the stopped leader kept writing")
			}
			if got := ptr.Deref(leaseOf(t, ns, "addon-instance").Spec.HolderIdentity, ""); got != standby.opts.Identity {
				t.Errorf("Lease holder %q after the takeover, want %q", got, standby.opts.Identity)
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
	if err := k8s.Get(t.Context(), keyOf(d), fresh); err != nil {
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
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		for ctx.Err() == nil {
			ai := &addonsv1alpha1.AddonInstance{}
			if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, ai); err == nil {
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
			rec.waitBeats(t, 2, 30*time.Second)
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
				for _, b := range rec.waitBeats(t, n+3, 30*time.Second)[n:] {
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

// On a driven clock: the first heartbeat goes out the moment the
// AddonInstance appears (the clock does not move), and again when it is
// deleted and created anew.
func TestWaitsForTheInstanceAndResumesWhenItIsRecreated(t *testing.T) {
	ns := newNamespace(t)
	rec := record(t, ns, "addon-instance")
	clk := newDrivenClock(t)
	t0 := clk.Now()
	rn := startReporter(t, adminCfg, Options{Namespace: ns, Identity: "only"}, clk.drive)
	clk.fireUntil(t, t0, "leading without an AddonInstance", func() bool {
		return rn.IsLeader() && rn.logs.count("waiting for the AddonInstance to exist") == 1
	})

	createInstance(t, ns, "addon-instance", time.Second)
	first := clk.beatAt(t, rec, t0).uid
	clk.beatAt(t, rec, t0.Add(time.Second))

	if err := k8s.Delete(t.Context(), getInstance(t, ns, "addon-instance")); err != nil {
		t.Fatal(err)
	}
	eventually(t, driveTimeout, "deletion seen", func() (bool, error) {
		err := k8s.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: "addon-instance"}, &addonsv1alpha1.AddonInstance{})
		return apierrors.IsNotFound(err), nil
	})
	// Recreated inside the hold the last renewal gave (to 2.5s): the beat
	// due meanwhile (the tick at 2s, or one at once for the period the loop
	// falls back to without an AddonInstance) finds nothing to write to,
	// renews the Lease, and the next beats go to the new one.
	recreated := t0.Add(2200 * time.Millisecond)
	clk.setTime(recreated)
	createInstance(t, ns, "addon-instance", time.Second)
	for _, at := range []time.Time{recreated, recreated.Add(time.Second)} {
		if b := clk.beatAt(t, rec, at); b.uid == first {
			t.Errorf("the heartbeat at %s went to the deleted AddonInstance", at.Sub(t0))
		}
	}
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
	eventually(t, 60*time.Second, "three forbidden election attempts", func() (bool, error) {
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
	for _, o := range []object{role, binding} {
		if err := k8s.Create(t.Context(), o); err != nil {
			t.Fatal(err)
		}
	}
	// The role has no create on Leases: it waits for the Lease, and says so.
	eventually(t, 60*time.Second, "the reporter saying it may not create the Lease", func() (bool, error) {
		return rn.logs.count("may not create it") >= 1, nil
	})
	// As the webhook does when it binds the role.
	if err := k8s.Create(t.Context(), &coordinationv1.Lease{ObjectMeta: leaseObjectMeta(leaseKey(ns, "addon-instance"))}); err != nil {
		t.Fatal(err)
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
	rec.waitBeats(t, 3, 30*time.Second)
	g1 := runtime.NumGoroutine()
	n := len(rec.snapshot())
	rec.waitBeats(t, n+5, 30*time.Second)
	g2 := runtime.NumGoroutine()
	runtime.GC()
	var ms1 runtime.MemStats
	runtime.ReadMemStats(&ms1)
	t.Logf("reporter goroutines: %d after 3 heartbeats, %d after 8; live heap added by the reporter (after GC): %.2f MiB",
		g1-base, g2-base, (float64(ms1.HeapAlloc)-float64(ms0.HeapAlloc))/(1<<20))
	// A leak stays; a goroutine of the moment (an HTTP/2 stream, a timer
	// firing in client-go) ends soon after. Waiting longer for it cannot
	// hide a leak, so the wait is generous for a loaded machine.
	settled := g2
	_ = wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		settled = runtime.NumGoroutine()
		return settled <= g1, nil
	})
	if settled > g1 {
		t.Errorf("goroutines grew from %d to %d over 5 heartbeats (%d a second later)", g1, g2, settled)
	}
	rn.stop(t)
	eventually(t, 30*time.Second, "goroutines back to where they were", func() (bool, error) {
		return runtime.NumGoroutine() <= base+2, nil // the shared HTTP transport keeps idle connections
	})
}

func TestWithoutItsOwnElectionItCreatesNoLease(t *testing.T) {
	ns := newNamespace(t)
	createInstance(t, ns, "addon-instance", time.Second)
	rec := record(t, ns, "addon-instance")
	rn := startReporter(t, adminCfg, Options{Namespace: ns, Identity: "only", DisableLeaderElection: true})
	rec.waitBeats(t, 2, 30*time.Second)
	if !rn.IsLeader() || rn.metric(t, isLeader) != 1 {
		t.Errorf("a Reporter gated by its manager's election reports itself as not leading")
	}
	err := k8s.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: election.LeaseName("addon-instance")}, &coordinationv1.Lease{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("Lease lookup: %v, want NotFound", err)
	}
}
