package heartbeat

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	clocktesting "k8s.io/utils/clock/testing"
)

// loopHarness runs a loop on a fake clock and records when it beats.
type loopHarness struct {
	t      *testing.T
	clock  *clocktesting.FakeClock
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
	observed atomic.Int32
}

func newLoopHarness(t *testing.T, tg target) *loopHarness {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	h := &loopHarness{t: t, clock: clocktesting.NewFakeClock(start), start: start,
		kick: make(chan struct{}, 1), results: make(chan beatResult, 100)}
	h.target.Store(tg)
	return h
}

func (h *loopHarness) loop() *loop {
	return &loop{
		clock: h.clock,
		observe: func() target {
			h.observed.Add(1)
			return h.target.Load().(target)
		},
		beat: func(ctx context.Context) beatResult {
			n := h.inFlight.Add(1)
			if n > h.maxIn.Load() {
				h.maxIn.Store(n)
			}
			defer h.inFlight.Add(-1)
			h.mu.Lock()
			h.beats = append(h.beats, h.clock.Since(h.start))
			h.mu.Unlock()
			if h.work > 0 {
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
	go func() { done <- l.run(ctx) }()
	return func() error {
		cancel()
		return <-done
	}
}

// advance moves the fake clock forward in steps, each once the loop waits,
// until d after the start. The first call fires the loop's immediate timer.
func (h *loopHarness) advance(d, step time.Duration) {
	h.waitIdle()
	h.clock.Step(0)
	for h.clock.Since(h.start) < d {
		h.waitIdle()
		h.clock.Step(step)
	}
	h.waitIdle()
}

func (h *loopHarness) waitIdle() {
	deadline := time.Now().Add(5 * time.Second)
	for !h.clock.HasWaiters() {
		if time.Now().After(deadline) {
			h.t.Fatalf("loop never waited on its timer")
		}
		time.Sleep(time.Millisecond)
	}
}

func (h *loopHarness) beatTimes() []time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]time.Duration(nil), h.beats...)
}

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

func sameTimes(t *testing.T, got, want []time.Duration, tolerance time.Duration) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("beats at %v, want %v", got, want)
	}
	for i := range got {
		if d := got[i] - want[i]; d < -tolerance || d > tolerance {
			t.Fatalf("beats at %v, want %v (±%s)", got, want, tolerance)
		}
	}
}

func TestLoopBeatsAtOnceThenOnAFixedScheduleWithoutDrift(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	h := newLoopHarness(t, target{present: true, period: time.Second})
	h.work = ms(300) // every write takes 300ms: the schedule must not move
	stop := h.run(h.loop())
	h.advance(ms(3950), ms(50))
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	sameTimes(t, h.beatTimes(), []time.Duration{0, ms(1000), ms(2000), ms(3000)}, 0)
	if h.maxIn.Load() != 1 {
		t.Errorf("%d writes in flight at once", h.maxIn.Load())
	}
}

func TestLoopSkipsMissedTicksInsteadOfBursting(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	h := newLoopHarness(t, target{present: true, period: time.Second})
	h.work = ms(2500) // a write that outlasts two periods
	stop := h.run(h.loop())
	h.advance(ms(3100), ms(50))
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	// 0 (ends at 2.5s), then the next tick on the grid: 3s (ends 5.5s).
	sameTimes(t, h.beatTimes(), []time.Duration{0, ms(3000)}, 0)
}

func TestLoopBacksOffAfterFailuresButKeepsTheSchedule(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	h := newLoopHarness(t, target{present: true, period: 2 * time.Second})
	for range 5 {
		h.results <- beatFailed
	}
	stop := h.run(h.loop())
	h.advance(ms(4050), ms(50))
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	// Backoff from max(100ms, period/10) = 200ms, doubling: failures at 0,
	// 0.2s, 0.6s, 1.4s; the next retry (1.4s + 1.6s) would be after the tick
	// at 2s, so the tick comes first; after the fifth failure the backoff is
	// capped at one period, which is the tick at 4s, where it succeeds.
	sameTimes(t, h.beatTimes(), []time.Duration{0, ms(200), ms(600), ms(1400), ms(2000), ms(4000)}, 0)
}

func TestLoopFollowsAPeriodChangeWithinOnePeriod(t *testing.T) {
	tests := map[string]struct {
		from, to time.Duration
		changeAt time.Duration
		want     []time.Duration
	}{
		"shorter, next tick still ahead": {
			from: 4 * time.Second, to: time.Second, changeAt: ms(4200),
			// last tick 4s, next at 4s+1s = 5s, then every second.
			want: []time.Duration{0, ms(4000), ms(5000), ms(6000), ms(7000)},
		},
		"shorter, next tick already passed: beat at once": {
			from: 4 * time.Second, to: time.Second, changeAt: ms(5500),
			want: []time.Duration{0, ms(4000), ms(5500), ms(6500)},
		},
		"longer": {
			from: time.Second, to: 3 * time.Second, changeAt: ms(1500),
			// last tick 1s, next 1s+3s = 4s, then 7s.
			want: []time.Duration{0, ms(1000), ms(4000), ms(7000)},
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
			h := newLoopHarness(t, target{present: true, period: tt.from})
			stop := h.run(h.loop())
			h.advance(tt.changeAt, ms(50))
			before := h.observed.Load()
			h.target.Store(target{present: true, period: tt.to})
			h.kick <- struct{}{}
			waitFor(t, func() bool { return h.observed.Load() > before })
			h.advance(ms(7050), ms(50))
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			sameTimes(t, h.beatTimes(), tt.want, ms(50))
		})
	}
}

func TestLoopBeatsAtOnceWhenTheInstanceAppears(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	h := newLoopHarness(t, target{present: false, period: 10 * time.Second})
	h.results <- beatWaiting
	stop := h.run(h.loop())
	h.advance(ms(2500), ms(50))
	before := h.observed.Load()
	h.target.Store(target{present: true, period: 10 * time.Second})
	h.kick <- struct{}{}
	waitFor(t, func() bool { return h.observed.Load() > before })
	h.advance(ms(3000), ms(50))
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	sameTimes(t, h.beatTimes(), []time.Duration{0, ms(2500)}, ms(50))
}

func TestLoopEndsTheTermWhenTheTimingsNoLongerFit(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	h := newLoopHarness(t, target{present: true, period: 10 * time.Second})
	l := h.loop()
	l.restart = func(p time.Duration) bool { return timingsStale(10*time.Second, p) }
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- l.run(ctx) }()
	h.waitIdle()
	h.target.Store(target{present: true, period: 2 * time.Second})
	h.kick <- struct{}{}
	select {
	case err := <-done:
		if !errors.Is(err, errRestart) {
			t.Fatalf("run = %v, want errRestart", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("loop did not end its term")
	}
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
	h.waitIdle()
	h.clock.Step(ms(1))
	<-entered
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5s")
		}
		time.Sleep(time.Millisecond)
	}
}
