//go:build go1.25

package heartbeat

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"
)

// The loop tests observe only fake-clock times that the test itself decides:
// the fake clock moves only when the loop is idle on an armed timer whose
// deadline the test knows, and only to that deadline (or to a time before it
// where the test wants to change something); the only other mover is a beat's
// simulated write time, added by the beat itself in the loop's goroutine.
// Real time is used only to fail a test that would otherwise hang, never to
// decide when the fake clock moves.
//
// Stepping the fake clock in fixed increments whenever some timer is armed
// (as this harness used to) is not enough: the loop reads Now() and then re-arms its timer with a
// duration that the fake clock applies to its own time at Reset. If the test
// steps the clock in between (the old timer still counted as a waiter while
// the loop was handling a kick), the new deadline moved by however far the
// test had stepped meanwhile, i.e. by real scheduling delay.

// loopDeadline is how long, in real time, the harness waits for the loop to
// do something before it fails the test. It bounds hangs only; no time a test
// observes depends on it.
const loopDeadline = 10 * time.Second

// armingClock is the fake clock the loop runs on. It reports, on armed, the
// fake deadline each time the loop arms its timer: after that the loop only
// waits in its select, so the test may move the clock.
type armingClock struct {
	*clocktesting.FakeClock
	t     *testing.T
	armed chan time.Time
}

func (c *armingClock) NewTimer(d time.Duration) clock.Timer {
	tm := &armingTimer{Timer: c.FakeClock.NewTimer(d), c: c}
	c.report(d)
	return tm
}

// report sends the deadline of a timer armed d from now. The fake clock
// cannot move between the arming and this Now(): the test moves it only
// after it has received the report.
func (c *armingClock) report(d time.Duration) {
	select {
	case c.armed <- c.Now().Add(d):
	default:
		// The test did not consume earlier reports: the loop re-armed more
		// often than the test drove it to.
		c.t.Error("loop armed its timer more often than the test expected")
	}
}

type armingTimer struct {
	clock.Timer
	c *armingClock
}

func (t *armingTimer) Reset(d time.Duration) bool {
	active := t.Timer.Reset(d)
	t.c.report(d)
	return active
}

// loopHarness runs a loop on a fake clock and records when it beats.
type loopHarness struct {
	t      *testing.T
	clock  *armingClock
	start  time.Time
	kick   chan struct{}
	target atomic.Value // target
	// results are returned by successive beats (then beatWritten).
	results chan beatResult
	// work is fake time each beat takes.
	work time.Duration

	mu       sync.Mutex
	beats    []time.Duration
	inFlight atomic.Int32
	maxIn    atomic.Int32

	// deadline is the fake time the loop's timer is armed for, valid while
	// armed is set: the loop is idle until the clock reaches it or it is
	// kicked. Used by the test goroutine only.
	deadline time.Time
	armed    bool
}

func newLoopHarness(t *testing.T, tg target) *loopHarness {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	h := &loopHarness{t: t, start: start,
		clock: &armingClock{FakeClock: clocktesting.NewFakeClock(start), t: t,
			armed: make(chan time.Time, 100)},
		kick: make(chan struct{}, 1), results: make(chan beatResult, 100)}
	h.target.Store(tg)
	return h
}

func (h *loopHarness) loop() *loop {
	return &loop{
		clock: h.clock,
		observe: func() target {
			return h.target.Load().(target)
		},
		beat: func(ctx context.Context) beatResult {
			n := h.inFlight.Add(1)
			for m := h.maxIn.Load(); n > m; m = h.maxIn.Load() {
				if h.maxIn.CompareAndSwap(m, n) {
					break
				}
			}
			defer h.inFlight.Add(-1)
			// Exact: the clock stands at the deadline the test fired.
			h.mu.Lock()
			h.beats = append(h.beats, h.clock.Since(h.start))
			h.mu.Unlock()
			if h.work > 0 {
				// The loop's timer has fired and is not re-armed yet, so
				// this moves the clock without firing anything.
				h.clock.Step(h.work)
			}
			select {
			case r := <-h.results:
				return r
			default:
				return beatWritten
			}
		},
		kick: h.kick,
	}
}

// run starts the loop and returns a stop function that waits for it.
func (h *loopHarness) run(l *loop) (stop func() error) {
	ctx, cancel := context.WithCancel(h.t.Context())
	done := make(chan error, 1)
	go func() { l.run(ctx); done <- nil }()
	return func() error {
		cancel()
		select {
		case err := <-done:
			// Every arming must have been one the test drove: one per
			// fired timer or change, plus the first.
			if n := len(h.clock.armed); n > 0 {
				h.t.Errorf("loop armed its timer %d more times than the test drove it to", n)
			}
			return err
		case <-time.After(loopDeadline):
			h.t.Fatal("loop did not return after its context ended")
			return nil
		}
	}
}

// waitIdle waits until the loop has armed its timer, and returns the fake
// deadline it is armed for. From then on the loop only waits.
func (h *loopHarness) waitIdle() time.Time {
	h.t.Helper()
	if h.armed {
		return h.deadline
	}
	timeout := time.NewTimer(loopDeadline)
	defer timeout.Stop()
	select {
	case h.deadline = <-h.clock.armed:
		h.armed = true
		return h.deadline
	case <-timeout.C:
		h.t.Fatal("loop never armed its timer")
		return time.Time{}
	}
}

// fire waits for the loop to arm its timer, then sets the fake clock to
// exactly that deadline, which fires the timer, and returns it.
func (h *loopHarness) fire() time.Time {
	h.t.Helper()
	d := h.waitIdle()
	if now := h.clock.Now(); d.Before(now) {
		h.t.Fatalf("loop armed its timer for %s, already past at %s", d.Sub(h.start), now.Sub(h.start))
	}
	h.armed = false
	h.clock.SetTime(d)
	return d
}

// advanceTo fires every timer the loop arms for at or before at (after the
// start), then sets the clock to at, unless a beat's work has already taken
// it further. It returns with the loop idle on a timer armed after at.
func (h *loopHarness) advanceTo(at time.Duration) {
	h.t.Helper()
	end := h.start.Add(at)
	for !h.waitIdle().After(end) {
		h.fire()
	}
	if end.After(h.clock.Now()) {
		h.clock.SetTime(end) // before the armed deadline: fires nothing
	}
}

// change makes the loop observe tg, and returns the deadline, after the
// start, that the loop re-arms its timer for in response. The loop must be
// idle (after advanceTo).
func (h *loopHarness) change(tg target) time.Duration {
	h.t.Helper()
	if !h.armed {
		h.t.Fatal("change while the loop is not idle")
	}
	h.target.Store(tg)
	h.armed = false
	h.kick <- struct{}{}
	return h.waitIdle().Sub(h.start)
}

func (h *loopHarness) beatTimes() []time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]time.Duration(nil), h.beats...)
}

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

// sameTimes compares beat times exactly: they are fake-clock times that only
// the test moved.
func sameTimes(t *testing.T, got, want []time.Duration) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("beats at %v, want %v", got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("beats at %v, want %v", got, want)
		}
	}
}

func TestLoopBeatsAtOnceThenOnAFixedScheduleWithoutDrift(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	h := newLoopHarness(t, target{present: true, period: time.Second})
	h.work = ms(300) // every write takes 300ms: the schedule must not move
	stop := h.run(h.loop())
	h.advanceTo(ms(3950))
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	sameTimes(t, h.beatTimes(), []time.Duration{0, ms(1000), ms(2000), ms(3000)})
	if h.maxIn.Load() != 1 {
		t.Errorf("%d writes in flight at once", h.maxIn.Load())
	}
}

func TestLoopSkipsMissedTicksInsteadOfBursting(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	h := newLoopHarness(t, target{present: true, period: time.Second})
	h.work = ms(2500) // a write that outlasts two periods
	stop := h.run(h.loop())
	h.advanceTo(ms(3100))
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	// 0 (ends at 2.5s), then the next tick on the grid: 3s (ends 5.5s).
	sameTimes(t, h.beatTimes(), []time.Duration{0, ms(3000)})
	// and the one after is 6s, not 5.5s + 1s.
	if d := h.waitIdle().Sub(h.start); d != ms(6000) {
		t.Errorf("next beat armed for %s, want 6s", d)
	}
}

func TestLoopBacksOffAfterFailuresButKeepsTheSchedule(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	h := newLoopHarness(t, target{present: true, period: 2 * time.Second})
	for range 5 {
		h.results <- beatFailed
	}
	stop := h.run(h.loop())
	h.advanceTo(ms(4050))
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	// Backoff from max(100ms, period/10) = 200ms, doubling: failures at 0,
	// 0.2s, 0.6s, 1.4s; the next retry (1.4s + 1.6s) would be after the tick
	// at 2s, so the tick comes first; after the fifth failure the backoff is
	// capped at one period, which is the tick at 4s, where it succeeds.
	sameTimes(t, h.beatTimes(), []time.Duration{0, ms(200), ms(600), ms(1400), ms(2000), ms(4000)})
}

func TestLoopFollowsAPeriodChangeWithinOnePeriod(t *testing.T) {
	tests := map[string]struct {
		from, to time.Duration
		changeAt time.Duration
		// next is the beat the loop schedules when it sees the change.
		next time.Duration
		want []time.Duration
	}{
		"shorter, next tick still ahead": {
			from: 4 * time.Second, to: time.Second, changeAt: ms(4200),
			// last tick 4s, next at 4s+1s = 5s, then every second.
			next: ms(5000),
			want: []time.Duration{0, ms(4000), ms(5000), ms(6000), ms(7000)},
		},
		"shorter, next tick already passed: beat at once": {
			from: 4 * time.Second, to: time.Second, changeAt: ms(5500),
			next: ms(5500),
			want: []time.Duration{0, ms(4000), ms(5500), ms(6500)},
		},
		"longer: beat at once, which renews the Lease for the new period": {
			from: time.Second, to: 3 * time.Second, changeAt: ms(1500),
			// Not at last tick + 3s = 4s: the hold from the tick at 1s
			// ends at 2.25s.
			next: ms(1500),
			want: []time.Duration{0, ms(1000), ms(1500), ms(4500)},
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
			h := newLoopHarness(t, target{present: true, period: tt.from})
			stop := h.run(h.loop())
			h.advanceTo(tt.changeAt)
			if next := h.change(target{present: true, period: tt.to}); next != tt.next {
				t.Errorf("after the change at %s the next beat is armed for %s, want %s", tt.changeAt, next, tt.next)
			}
			h.advanceTo(ms(7050))
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			sameTimes(t, h.beatTimes(), tt.want)
		})
	}
}

func TestLoopBeatsAtOnceWhenTheInstanceAppears(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	h := newLoopHarness(t, target{present: false, period: 10 * time.Second})
	h.results <- beatWaiting
	stop := h.run(h.loop())
	h.advanceTo(ms(2500))
	if next := h.change(target{present: true, period: 10 * time.Second}); next != ms(2500) {
		t.Errorf("after the instance appeared at 2.5s the next beat is armed for %s, want at once", next)
	}
	h.advanceTo(ms(3000))
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	sameTimes(t, h.beatTimes(), []time.Duration{0, ms(2500)})
}

// The AddonInstance is deleted and created anew while a retry for a write
// to the deleted one is pending, and the loop sees both as one change: it
// beats at once for the new one.
func TestLoopBeatsAtOnceWhenTheInstanceIsRecreated(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	h := newLoopHarness(t, target{present: true, uid: "first", period: 2 * time.Second})
	stop := h.run(h.loop())
	h.advanceTo(ms(1950))
	// The write at 2s goes to the instance just deleted and fails: a retry
	// is armed for max(100ms, period/10) later.
	h.results <- beatFailed
	h.fire()
	if at := h.waitIdle().Sub(h.start); at != ms(2200) {
		t.Fatalf("retry armed for %s, want 2.2s", at)
	}
	h.advanceTo(ms(2100))
	if next := h.change(target{present: true, uid: "second", period: 2 * time.Second}); next != ms(2100) {
		t.Errorf("after the instance was recreated at 2.1s the next beat is armed for %s, want at once", next)
	}
	h.advanceTo(ms(2150))
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	sameTimes(t, h.beatTimes(), []time.Duration{0, ms(2000), ms(2100)})
}

func TestLoopKeepsAPendingRetryWhenThePeriodChanges(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	h := newLoopHarness(t, target{present: true, period: 10 * time.Second})
	h.results <- beatFailed
	stop := h.run(h.loop())
	// The write at 0 fails: a retry after max(100ms, period/10) = 1s.
	h.fire()
	if at := h.waitIdle().Sub(h.start); at != time.Second {
		t.Fatalf("retry armed for %s, want 1s", at)
	}
	h.advanceTo(ms(500))
	// A shorter period whose next tick (0 + 5s) is later than the retry.
	if next := h.change(target{present: true, period: 5 * time.Second}); next != time.Second {
		t.Errorf("after a period change the retry moved from 1s to %s", next)
	}
	h.advanceTo(ms(10050))
	stop()
	// The retry succeeds at 1s; the schedule keeps its origin (0), now
	// every 5s.
	sameTimes(t, h.beatTimes(), []time.Duration{0, time.Second, 5 * time.Second, 10 * time.Second})
}

func TestLoopStopsPromptlyMidWrite(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	h := newLoopHarness(t, target{present: true, period: time.Second})
	entered := make(chan struct{})
	l := h.loop()
	l.beat = func(ctx context.Context) beatResult {
		close(entered)
		<-ctx.Done() // a write stuck on a dead API server
		return beatFailed
	}
	stop := h.run(l)
	h.fire()
	select {
	case <-entered:
	case <-time.After(loopDeadline):
		t.Fatal("the loop did not beat when its timer fired")
	}
	// stop fails the test if the loop does not return once ctx ends.
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}
