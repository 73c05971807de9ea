//go:build go1.25

package heartbeat

import (
	"errors"
	"fmt"
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
	"k8s.io/utils/ptr"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/election"
)

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

// A deleted Lease on the real API server: the standby that watched it makes
// it again at once but vacant, and takes it only when the old holder's term
// ends; the old holder writes the heartbeat its hold still covers, finds its
// Lease gone at the renewal after it, and stops. There is never a second
// writer inside a hold, and the gap is the old term's.
func TestAStandbyDoesNotTakeADeletedLeaseBeforeItsHoldersTermEnds(t *testing.T) {
	const period = time.Second
	ns, rec, clk, t0 := drivenAddon(t, period)
	leader := startReporter(t, adminCfg, Options{Namespace: ns, Identity: "pod-a"}, clk.drive)
	clk.beatAt(t, rec, t0)
	standby := startReporter(t, adminCfg, Options{Namespace: ns, Identity: "pod-b"}, clk.drive)
	// The standby has seen pod-a's hold (renewed at t0) when it waits
	// for its end.
	end := t0.Add(election.Timings(period).LeaseDuration + time.Millisecond)
	clk.awaitArmed(t, end, "the standby waiting for the holder's term to end")
	clk.awaitArmed(t, t0.Add(period), "the leader's next tick")

	deleted := leaseOf(t, ns, "addon-instance")
	if err := k8s.Delete(t.Context(), deleted); err != nil {
		t.Fatal(err)
	}
	// The standby sees the deletion and makes the Lease again, with no
	// holder, and goes on waiting for the same end.
	var lease coordinationv1.Lease
	key := types.NamespacedName{Namespace: ns, Name: election.LeaseName("addon-instance")}
	eventually(t, driveTimeout, "the Lease made again", func() (bool, error) {
		err := k8s.Get(t.Context(), key, &lease)
		return err == nil && lease.UID != deleted.UID, nil
	})
	if h := ptr.Deref(lease.Spec.HolderIdentity, ""); h != "" || lease.Spec.RenewTime != nil {
		t.Fatalf("the Lease was made again held by %q: a hold may not start inside the deleted one's", h)
	}
	if got := lease.Annotations[election.InstanceAnnotation]; got != "addon-instance" {
		t.Errorf("the Lease made again names instance %q, want addon-instance (for the fencing policy)", got)
	}
	clk.awaitArmed(t, end, "the standby waiting, after the deletion, for the old term to end")
	if standby.IsLeader() || standby.metric(t, sentTotal) != 0 {
		t.Fatal("the standby leads while the deleted Lease's holder may still write")
	}
	// The leader's next tick: its hold runs to t0 + 1.5 periods, so it
	// writes that heartbeat; the renewal after it finds its Lease gone.
	clk.beatAt(t, rec, t0.Add(period))
	eventually(t, driveTimeout, "the leader stopping", func() (bool, error) { return !leader.IsLeader(), nil })
	// The standby takes the Lease when the old term ends, not before.
	clk.fireUntil(t, end, "the standby's first heartbeat", func() bool { return standby.metric(t, sentTotal) == 1 })
	if !standby.IsLeader() || standby.metric(t, sentTotal) != 1 {
		t.Errorf("standby: leading %v, %v heartbeats; want it leading after one", standby.IsLeader(), standby.metric(t, sentTotal))
	}
	if got := ptr.Deref(leaseOf(t, ns, "addon-instance").Spec.HolderIdentity, ""); got != "pod-b" {
		t.Errorf("holder %q, want pod-b", got)
	}
	if got := leader.metric(t, sentTotal); got != 2 {
		t.Errorf("the old leader wrote %v heartbeats, want 2: none after its Lease was found gone", got)
	}
}

// Two processes given one identity do not both lead: the second waits as a
// standby while the first renews, and says why; and a leader that finds its
// identity renewed by another process stops at once.
func TestTwoProcessesWithOneIdentityNeverBothLead(t *testing.T) {
	const period = time.Second
	t.Run("the second waits", func(t *testing.T) {
		ns, rec, clk, t0 := drivenAddon(t, period)
		first := startReporter(t, adminCfg, Options{Namespace: ns, Identity: "twin"}, clk.drive)
		clk.beatAt(t, rec, t0)
		second := startReporter(t, adminCfg, Options{Namespace: ns, Identity: "twin"}, clk.drive)
		clk.awaitArmed(t, t0.Add(election.Timings(period).LeaseDuration+time.Millisecond), "the second process waiting")
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
		ns, rec, clk, t0 := drivenAddon(t, period)
		rn := startReporter(t, adminCfg, Options{Namespace: ns, Identity: "twin"}, clk.drive)
		clk.beatAt(t, rec, t0)
		clk.awaitArmed(t, t0.Add(period), "the next tick")
		// Another process with this identity renews the Lease.
		lease := leaseOf(t, ns, "addon-instance")
		lease.Annotations[election.ProcessAnnotation] = "another-process"
		lease.Spec.RenewTime = &metav1.MicroTime{Time: clk.Now()}
		if err := k8s.Update(t.Context(), lease); err != nil {
			t.Fatal(err)
		}
		// The next tick writes on the hold the last renewal gave, and the
		// renewal after it finds the other process's record.
		clk.beatAt(t, rec, t0.Add(period))
		eventually(t, driveTimeout, "the leader stopping", func() (bool, error) { return !rn.IsLeader(), nil })
		if got := rn.metric(t, sentTotal); got != 2 {
			t.Errorf("%v heartbeats, want two: none after the renewal that found the other process", got)
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
	ns, rec, clk, t0 := drivenAddon(t, period)
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
	// It has marked its try and is now stuck on the lock, before any
	// request.
	eventually(t, driveTimeout, "the stuck heartbeat's start", func() (bool, error) {
		at := rn.activity.at.Load()
		return at != nil && at.Equal(stuckAt), nil
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

// A leader killed at any point of its beat is replaced within a lease
// duration (1.75 periods) of its last heartbeat, under the 2 periods the
// design promises: each renewal follows a heartbeat that went through, so
// the hold a standby waits out never starts after the last heartbeat. (With
// the renewal first, a leader killed between its renewal and its write left
// a period plus a lease duration.) Two Reporters on one driven clock: the
// leader dies at its third tick, at the request named, and the standby's
// first heartbeat falls exactly one lease duration after the last renewal it
// saw, plus the millisecond its look waits past it.
func TestAKilledLeaderIsReplacedWithinTwoPeriodsWhereverItDies(t *testing.T) {
	const period = 2 * time.Second
	tm := election.Timings(period)
	tests := map[string]struct {
		// The leader dies when it sends this request of its third tick
		// (the request never arrives), or, with after, once its answer
		// has come.
		kind  string
		after bool
		// The tick of the last heartbeat, and of the last renewal.
		lastBeat, lastRenewal int
	}{
		"before its write":              {kind: "update addoninstances/status", lastBeat: 1, lastRenewal: 1},
		"between its write and renewal": {kind: "update leases", lastBeat: 2, lastRenewal: 1},
		"after its renewal":             {kind: "update leases", after: true, lastBeat: 2, lastRenewal: 2},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			ns, rec, clk, t0 := drivenAddon(t, period)
			tick := func(k int) time.Time { return t0.Add(time.Duration(k) * period) }

			var writes atomic.Int32
			var leader atomic.Pointer[running]
			kill := func() { leader.Load().cancel() }
			cfg := rest.CopyConfig(adminCfg)
			cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
				return roundTripFunc(func(req *http.Request) (*http.Response, error) {
					kind := requestKind(req)
					due := kind == tt.kind && (kind == "update leases" && writes.Load() == 3 ||
						kind == "update addoninstances/status" && writes.Load() == 2)
					if due && !tt.after {
						kill()
						return nil, errors.New("killed")
					}
					resp, err := rt.RoundTrip(req)
					if kind == "update addoninstances/status" && err == nil && resp.StatusCode == http.StatusOK {
						writes.Add(1)
					}
					if due {
						kill()
					}
					return resp, err
				})
			}
			keep := func(r *Reporter) { r.releaseOnCancel = false }
			leader.Store(startReporter(t, cfg, Options{Namespace: ns, Identity: "pod-a"}, keep, clk.drive))
			clk.beatAt(t, rec, tick(0))
			standby := startReporter(t, adminCfg, Options{Namespace: ns, Identity: "pod-b"}, clk.drive)
			// Its first look (a read) is done before the next tick: a read
			// that straddled it would date the record of tick 0 at tick 1,
			// arm the wait the test awaits below, and then see the renewal
			// of tick 1 (a change) only after tick 2, waiting from there.
			clk.awaitArmed(t, tick(0).Add(tm.LeaseDuration+time.Millisecond), "the standby's first look at the Lease")
			clk.beatAt(t, rec, tick(1))
			clk.awaitArmed(t, tick(1).Add(tm.LeaseDuration+time.Millisecond), "the standby's wait after the renewal")
			clk.fire(t, tick(2), "the tick the leader dies at")
			eventually(t, driveTimeout, "the leader dead", func() (bool, error) { return leader.Load().exited(), nil })

			last := tick(tt.lastBeat)
			newest := func() time.Time { b := rec.snapshot(); return b[len(b)-1].hb }
			eventually(t, driveTimeout, "the last heartbeat seen", func() (bool, error) { return !newest().Before(last), nil })
			if got := newest(); !got.Equal(last) {
				t.Fatalf("the last heartbeat written is at %s, want %s", got.Sub(t0), last.Sub(t0))
			}
			first := tick(tt.lastRenewal).Add(tm.LeaseDuration + time.Millisecond)
			clk.fireUntil(t, first, "the standby's first heartbeat", func() bool { return standby.metric(t, sentTotal) == 1 })
			gap := first.Sub(last)
			t.Logf("last heartbeat at %s, the successor's first at %s: a gap of %.2f periods",
				last.Sub(t0), first.Sub(t0), float64(gap)/float64(period))
			if gap >= 2*period {
				t.Errorf("gap %s, want under 2 periods (%s)", gap, 2*period)
			}
			eventually(t, driveTimeout, "the successor's first heartbeat seen", func() (bool, error) {
				return newest().After(last), nil
			})
			if got := newest(); !got.Equal(first.Truncate(time.Second)) {
				t.Errorf("the successor's first heartbeat is at %s, want %s", got.Sub(t0), first.Truncate(time.Second).Sub(t0))
			}
		})
	}
}

// A standby takes the Lease only on a read of the AddonInstance made after
// the record it judges: the period it then announces, and the bound it
// judged the other's hold by, are the spec's. When that read fails it does
// not take the Lease on the period it knew before (the default, if it never
// read one), which other replicas may no longer follow: it tries again at
// the retry pace, and takes once a read succeeds.
func TestNoTakeWithoutAFreshReadOfThePeriod(t *testing.T) {
	const period = time.Second
	ns, rec, clk, t0 := drivenAddon(t, period)
	keep := func(r *Reporter) { r.releaseOnCancel = false }
	leader := startReporter(t, adminCfg, Options{Namespace: ns, Identity: "pod-a"}, keep, clk.drive)
	clk.beatAt(t, rec, t0)
	clk.awaitArmed(t, t0.Add(period), "the leader's next tick")

	var failReads atomic.Bool
	failReads.Store(true)
	standby := startReporter(t, failing(adminCfg, "get addoninstances", &failReads), Options{Namespace: ns, Identity: "pod-b"}, clk.drive)
	leader.stop(t) // killed: the Lease stays its until it expires
	// Well past the hold (1.75 periods), five failed reads later, the
	// standby has not taken the Lease.
	clk.fireNextUntil(t, t0.Add(10*period), "five failed reads", func() bool {
		return standby.metric(t, electionAttempts, "result", string(election.Failed)) >= 5
	})
	if !clk.Now().After(t0.Add(election.Timings(period).LeaseDuration)) {
		t.Fatalf("five reads failed by %s, before the hold ended: the test moved too little", clk.Now().Sub(t0))
	}
	if standby.IsLeader() || standby.metric(t, sentTotal) != 0 {
		t.Fatal("the standby took the Lease without reading the period")
	}
	if got := ptr.Deref(leaseOf(t, ns, "addon-instance").Spec.HolderIdentity, ""); got != "pod-a" {
		t.Fatalf("holder %q while the standby cannot read the period, want pod-a still", got)
	}
	// Reads work again: it takes the Lease on the spec's period.
	failReads.Store(false)
	clk.fireNextUntil(t, t0.Add(20*period), "the standby's first heartbeat", func() bool {
		return standby.metric(t, sentTotal) >= 1
	})
	if got := leaseOf(t, ns, "addon-instance").Annotations[election.PeriodAnnotation]; got != period.String() {
		t.Errorf("the take announces period %q, want the spec's %s", got, period)
	}
}

// A leader that cannot write (its ServiceAccount may not, or its requests
// fail) renews nothing, so its hold runs out; it then waits out its own
// record as any standby does, and a replica that can write takes the Lease
// when that record expires. Before, the failing leader took its own record
// back at once, and kept a working standby out for as long as it failed.
func TestALeaderThatCannotWriteGivesTheLeaseToOneThatCan(t *testing.T) {
	const period = time.Second
	tm := election.Timings(period)
	ns, rec, clk, t0 := drivenAddon(t, period)
	var failWrites atomic.Bool
	cannot := startReporter(t, failing(adminCfg, "update addoninstances/status", &failWrites), Options{Namespace: ns, Identity: "pod-a"}, clk.drive)
	clk.beatAt(t, rec, t0)
	working := startReporter(t, adminCfg, Options{Namespace: ns, Identity: "pod-b"}, clk.drive)
	takeover := t0.Add(tm.LeaseDuration + time.Millisecond)
	clk.awaitArmed(t, takeover, "the standby's wait after the renewal")
	failWrites.Store(true)
	// Its write at the next tick fails, and so do its retries within the
	// hold (to 1.5 periods); nothing renews it, and its term ends.
	clk.fire(t, t0.Add(period), "the failing leader's next tick")
	clk.fireNextUntil(t, t0.Add(tm.RenewDeadline), "the failing leader's term ending", func() bool {
		return !cannot.IsLeader() && cannot.metric(t, failTotal) >= 1
	})
	// It waits out its own record, and a tenth of a period more, without
	// taking it back at once.
	clk.awaitArmed(t, t0.Add(tm.LeaseDuration+period/10+time.Millisecond), "the failing replica's wait")
	// When its record expires, the working replica takes the Lease.
	clk.fireUntil(t, takeover, "the working replica's first heartbeat", func() bool {
		return working.metric(t, sentTotal) >= 1
	})
	if cannot.IsLeader() || cannot.metric(t, sentTotal) != 1 {
		t.Errorf("the failing replica: leading %v, %v heartbeats", cannot.IsLeader(), cannot.metric(t, sentTotal))
	}
	if got := ptr.Deref(leaseOf(t, ns, "addon-instance").Spec.HolderIdentity, ""); got != "pod-b" {
		t.Errorf("holder %q, want pod-b", got)
	}
}

// failing is cfg whose requests of kind (see requestKind) fail before they
// are sent while on is set.
func failing(cfg *rest.Config, kind string, on *atomic.Bool) *rest.Config {
	out := rest.CopyConfig(cfg)
	out.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			if on.Load() && requestKind(req) == kind {
				return nil, fmt.Errorf("%s: failed by the test", kind)
			}
			return rt.RoundTrip(req)
		})
	}
	return out
}
