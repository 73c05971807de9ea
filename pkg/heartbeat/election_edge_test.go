package heartbeat

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// heldLease is a Lease record of holder, renewed at renewed, for period.
func heldLease(uid, holder, process string, period time.Duration, renewed time.Time) *coordinationv1.Lease {
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid), Name: "l", Namespace: "ns",
		Annotations: map[string]string{PeriodAnnotation: period.String()}}}
	if process != "" {
		l.Annotations[ProcessAnnotation] = process
	}
	if holder != "" {
		l.Spec.HolderIdentity = ptr.To(holder)
		l.Spec.RenewTime = &metav1.MicroTime{Time: renewed}
	}
	return l
}

// A Lease deleted under its holder (by an admin, or by a namespace cleanup
// racing the addon) must not start a new term at once: the holder may be
// sending the heartbeat it renewed for just before. A standby that saw the
// record honours it to its end, whether the Lease stays gone or comes back as
// a new object with no holder (the webhook makes it again).
func TestADeletedLeaseKeepsItsHoldersTermToTheEnd(t *testing.T) {
	const period = time.Second
	hold := Timings(period).LeaseDuration
	for name, after := range map[string]*coordinationv1.Lease{
		"gone":            nil,
		"made again":      heldLease("uid-2", "", "", period, time.Time{}),
		"made again held": heldLease("uid-2", "pod-c", "", period, time.Time{}),
	} {
		t.Run(name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(time.Now())
			t0 := clk.Now()
			// No kube: a request would panic, and none may be sent.
			l := &leaseLock{identity: "pod-b", process: "p-b", clock: clk}
			l.observe(heldLease("uid-1", "pod-a", "p-a", period, t0), t0)
			clk.Step(100 * time.Millisecond)
			l.observe(after, clk.Now())
			if !l.heldByOther(clk.Now()) {
				t.Fatal("the term of the deleted Lease's holder is over at once")
			}
			if held, err := l.acquire(context.Background(), period); held || err != nil {
				t.Fatalf("acquire = %v, %v while the old holder's term runs", held, err)
			}
			want := hold - 100*time.Millisecond + time.Millisecond // the old term's end
			if after != nil && after.Spec.HolderIdentity != nil {
				want = hold + time.Millisecond // the new holder's, seen now, ends later
			}
			if got := l.wait(period); got != want {
				t.Errorf("wait %s, want %s", got, want)
			}
			clk.SetTime(t0.Add(hold))
			if after == nil || after.Spec.HolderIdentity == nil {
				if l.heldByOther(clk.Now()) {
					t.Error("still held once the old term is over")
				}
			}
		})
	}
	t.Run("own hold", func(t *testing.T) {
		// The process whose own Lease was deleted knows its term has
		// ended (it stopped writing first): it may take the Lease again.
		clk := clocktesting.NewFakeClock(time.Now())
		l := &leaseLock{identity: "pod-a", process: "p-a", clock: clk}
		l.observe(heldLease("uid-1", "pod-a", "p-a", period, clk.Now()), clk.Now())
		l.observe(nil, clk.Now())
		if l.heldByOther(clk.Now()) {
			t.Error("its own deleted hold fences the holder itself")
		}
	})
}

// Two processes with one identity (a crashed process's restart, or a
// misconfiguration): the record written by the other is another holder's,
// until it expires. A record of an earlier version, which wrote no process
// token, stays this identity's own.
func TestARecordOfTheSameIdentityByAnotherProcessIsAnotherHolders(t *testing.T) {
	const period = time.Second
	clk := clocktesting.NewFakeClock(time.Now())
	t0 := clk.Now()
	l := &leaseLock{identity: "twin", process: "p-2", clock: clk}
	l.observe(heldLease("uid-1", "twin", "p-1", period, t0), t0)
	if !l.heldByOther(t0) || !l.heldBySameIdentity() {
		t.Fatal("another process's hold under this identity is taken as this process's own")
	}
	if !l.heldByOther(t0.Add(Timings(period).LeaseDuration - time.Millisecond)) {
		t.Error("the other process's hold ends early")
	}
	if l.heldByOther(t0.Add(Timings(period).LeaseDuration)) {
		t.Error("the other process's hold outlives its lease duration")
	}
	l.observe(heldLease("uid-1", "twin", "", period, t0), t0)
	if l.heldByOther(t0) || l.heldBySameIdentity() {
		t.Error("a record of this identity without a process token is not this process's own")
	}
	// Taking it over records this process, as a new acquisition.
	next := heldLease("uid-1", "twin", "p-1", period, t0)
	next.Spec.AcquireTime = &metav1.MicroTime{Time: t0}
	l.record(next, period, t0.Add(time.Minute))
	if got := next.Annotations[ProcessAnnotation]; got != "p-2" {
		t.Errorf("process %q, want p-2", got)
	}
	if !next.Spec.AcquireTime.Equal(&metav1.MicroTime{Time: t0.Add(time.Minute)}) || ptr.Deref(next.Spec.LeaseTransitions, 0) != 1 {
		t.Errorf("acquire time %s, transitions %d: a new process's hold is a new acquisition",
			next.Spec.AcquireTime, ptr.Deref(next.Spec.LeaseTransitions, 0))
	}
}

// The end of the hold keeps Go's monotonic clock reading: stored as wall
// nanoseconds, as it was, the leader compared it with the wall clock, and
// an NTP step back kept it leading (IsLeader, is_leader) after a standby,
// judging by its own clock, had taken over. A wall step cannot be made in
// a test process, so this checks what decides it: the deadline read back
// is the very instant stored, monotonic reading included.
func TestTheHoldsEndKeepsTheMonotonicClockReading(t *testing.T) {
	at := time.Now().Add(1500 * time.Millisecond)
	if !strings.Contains(at.String(), "m=+") {
		t.Fatal("time.Now has no monotonic reading here")
	}
	var tm term
	tm.setDeadline(at)
	if got := tm.holdEnd(); got != at { //nolint:gocritic // == compares the monotonic reading too, which is the point
		t.Errorf("hold end %s, want %s: the monotonic reading is lost", got, at)
	}
}

// A heartbeat whose write meets conflicts retries only while the hold it
// was renewed for runs: once it has ended, no retry is sent.
func TestConflictRetriesStopWhenTheHoldEnds(t *testing.T) {
	ns := newNamespace(t)
	ai := createInstance(t, ns, "addon-instance", time.Minute)
	var puts atomic.Int64
	cfg := rest.CopyConfig(adminCfg)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			if requestKind(req) != "update addoninstances/status" {
				return rt.RoundTrip(req)
			}
			puts.Add(1)
			return &http.Response{StatusCode: http.StatusConflict, Request: req,
				Header: http.Header{"Content-Type": []string{"application/json"}},
				Body: io.NopCloser(strings.NewReader(`{"kind":"Status","apiVersion":"v1","status":"Failure",` +
					`"reason":"Conflict","code":409,"message":"the object has been modified"}`)),
			}, nil
		})
	}
	r, err := New(cfg, Options{Namespace: ns, Identity: "pod-a", Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name     string
		heldFor  int // calls of held that answer true
		wantPuts int64
	}{
		{"ended before the first attempt", 0, 0},
		{"ended after a conflict", 1, 1},
		{"ended after three conflicts", 3, 3},
	} {
		t.Run(c.name, func(t *testing.T) {
			puts.Store(0)
			calls := 0
			held := func() bool { calls++; return calls <= c.heldFor }
			_, _, err := r.write(t.Context(), ai, nil, held)
			if !errors.Is(err, errHoldEnded) {
				t.Errorf("write returned %v, want %v", err, errHoldEnded)
			}
			if got := puts.Load(); got != c.wantPuts {
				t.Errorf("%d status writes sent, want %d", got, c.wantPuts)
			}
		})
	}
}

// A deleted Lease on the real API server: the standby that watched it
// waits for the old holder's term to end instead of making the Lease again
// at once; the old holder, finding its Lease gone at its next renewal,
// stops, and there is never a second writer.
func TestAStandbyDoesNotTakeADeletedLeaseBeforeItsHoldersTermEnds(t *testing.T) {
	const period = time.Second
	ns := newNamespace(t)
	createInstance(t, ns, "addon-instance", period)
	rec := record(t, ns, "addon-instance")
	clk := newDrivenClock(t)
	t0 := clk.Now()
	leader := startReporter(t, adminCfg, Options{Namespace: ns, Identity: "pod-a"}, clk.drive)
	clk.beatAt(t, rec, t0)
	standby := startReporter(t, adminCfg, Options{Namespace: ns, Identity: "pod-b"}, clk.drive)
	// The standby has seen pod-a's hold (renewed at t0) when it waits
	// for its end.
	end := t0.Add(Timings(period).LeaseDuration + time.Millisecond)
	clk.awaitArmed(t, end, "the standby waiting for the holder's term to end")

	if err := k8s.Delete(t.Context(), leaseOf(t, ns, "addon-instance")); err != nil {
		t.Fatal(err)
	}
	// The standby sees the deletion and goes on waiting for the same end,
	// without making the Lease.
	standby.awaitMetric(t, electionAttempts, 2, "result", electionHeld)
	clk.awaitArmed(t, end, "the standby waiting, after the deletion, for the old term to end")
	var lease coordinationv1.Lease
	if err := k8s.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: LeaseName("addon-instance")}, &lease); err == nil {
		t.Fatalf("the Lease was made again at once, held by %q", ptr.Deref(lease.Spec.HolderIdentity, ""))
	}
	if standby.IsLeader() || standby.metric(t, sentTotal) != 0 {
		t.Fatal("the standby leads while the deleted Lease's holder may still write")
	}
	// The leader's next renewal finds the Lease gone: that heartbeat is not
	// written, and it campaigns again (its own term is over, so it may
	// make the Lease at once).
	clk.fire(t, t0.Add(period), "the leader's next tick")
	eventually(t, driveTimeout, "the leader leading again on a new Lease", func() (bool, error) {
		err := k8s.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: LeaseName("addon-instance")}, &lease)
		return err == nil && ptr.Deref(lease.Spec.HolderIdentity, "") == "pod-a" && leader.IsLeader(), nil
	})
	if standby.IsLeader() || standby.metric(t, sentTotal) != 0 {
		t.Error("the standby wrote a heartbeat")
	}
}

// Two processes given one identity do not both lead: the second waits as a
// standby while the first renews, and says why; and a leader that finds its
// identity renewed by another process stops at once.
func TestTwoProcessesWithOneIdentityNeverBothLead(t *testing.T) {
	const period = time.Second
	t.Run("the second waits", func(t *testing.T) {
		ns := newNamespace(t)
		createInstance(t, ns, "addon-instance", period)
		rec := record(t, ns, "addon-instance")
		clk := newDrivenClock(t)
		t0 := clk.Now()
		first := startReporter(t, adminCfg, Options{Namespace: ns, Identity: "twin"}, clk.drive)
		clk.beatAt(t, rec, t0)
		second := startReporter(t, adminCfg, Options{Namespace: ns, Identity: "twin"}, clk.drive)
		clk.awaitArmed(t, t0.Add(Timings(period).LeaseDuration+time.Millisecond), "the second process waiting")
		for k := 1; k <= 3; k++ {
			clk.beatAt(t, rec, t0.Add(time.Duration(k)*period))
			if second.IsLeader() || second.metric(t, sentTotal) != 0 {
				t.Fatalf("period %d: the second process with the identity leads too", k)
			}
		}
		if !first.IsLeader() {
			t.Error("the first process stopped leading")
		}
		if second.logs.count("held under this process's identity by another process") != 1 {
			t.Errorf("the second process did not say why it waits, once:\n%s", second.logs)
		}
	})
	t.Run("the leader stops", func(t *testing.T) {
		ns := newNamespace(t)
		createInstance(t, ns, "addon-instance", period)
		rec := record(t, ns, "addon-instance")
		clk := newDrivenClock(t)
		t0 := clk.Now()
		rn := startReporter(t, adminCfg, Options{Namespace: ns, Identity: "twin"}, clk.drive)
		clk.beatAt(t, rec, t0)
		// Another process with this identity renews the Lease.
		lease := leaseOf(t, ns, "addon-instance")
		lease.Annotations[ProcessAnnotation] = "another-process"
		lease.Spec.RenewTime = &metav1.MicroTime{Time: clk.Now()}
		if err := k8s.Update(t.Context(), lease); err != nil {
			t.Fatal(err)
		}
		clk.fire(t, t0.Add(period), "the next tick")
		eventually(t, driveTimeout, "the leader stopping", func() (bool, error) { return !rn.IsLeader(), nil })
		if got := rn.metric(t, sentTotal); got != 1 {
			t.Errorf("%v heartbeats, want only the first", got)
		}
		if rn.logs.count("another process with the identity") == 0 {
			t.Errorf("the leader did not say why it stopped:\n%s", rn.logs)
		}
	})
}

// The liveness check fails when the loop is stuck, and only then: here a
// heartbeat blocks (on the SDK state's lock, held by the test) while the
// clock runs past the window; released, the Reporter tries again and the
// check passes.
func TestLivenessFailsOnlyWhenTheLoopIsStuck(t *testing.T) {
	const period = time.Second
	ns := newNamespace(t)
	createInstance(t, ns, "addon-instance", period)
	rec := record(t, ns, "addon-instance")
	clk := newDrivenClock(t)
	t0 := clk.Now()
	rn := startReporter(t, adminCfg, Options{Namespace: ns, Identity: "pod-a"}, clk.drive)
	if err := rn.Healthz(nil); err != nil {
		t.Fatalf("liveness failed at start: %v", err)
	}
	clk.beatAt(t, rec, t0)
	clk.beatAt(t, rec, t0.Add(period))
	if err := rn.Healthz(nil); err != nil {
		t.Fatalf("liveness failed while heartbeating: %v", err)
	}
	// Stick the next heartbeat, then let the clock run past the window.
	rn.mu.Lock()
	locked := true
	defer func() {
		if locked {
			rn.mu.Unlock()
		}
	}()
	stuckAt := t0.Add(2 * period)
	clk.fire(t, stuckAt, "the stuck tick")
	// It has renewed the Lease (it marked its try just before) and is now
	// stuck on the lock.
	eventually(t, driveTimeout, "the stuck heartbeat's renewal", func() (bool, error) {
		rt := leaseOf(t, ns, "addon-instance").Spec.RenewTime
		return rt != nil && rt.Equal(&metav1.MicroTime{Time: stuckAt}), nil
	})
	clk.setTime(stuckAt.Add(LivenessWindow(period) - time.Millisecond))
	if err := rn.Healthz(nil); err != nil {
		t.Fatalf("liveness failed within the window: %v", err)
	}
	clk.setTime(stuckAt.Add(LivenessWindow(period) + time.Millisecond))
	err := rn.Healthz(nil)
	if err == nil || !strings.Contains(err.Error(), "stuck") {
		t.Fatalf("liveness %v with the loop stuck past the window", err)
	}
	rn.mu.Unlock()
	locked = false
	eventually(t, driveTimeout, "liveness passing once the loop runs again", func() (bool, error) {
		return rn.Healthz(nil) == nil, nil
	})
}
