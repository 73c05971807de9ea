//go:build go1.25

package heartbeat

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"
)

// drivenClock is the fake clock for tests that run Reporters against the real
// API server but must not depend on how fast this machine is: it knows the
// deadline of every timer armed on it, so a test waits until a Reporter has
// armed exactly the deadline its schedule promises, and only then moves the
// clock there. Every time a test compares is then a fake time it chose, and
// exact; real time only bounds how long the test waits before it fails.
//
// Moving the clock in fixed steps whenever something is armed would not do:
// a goroutine that reads Now() and then arms a timer while the test moves the
// clock gets a deadline shifted by however long it was descheduled. Here the
// arming and its deadline are recorded under the same lock as every move.
type drivenClock struct {
	t  *testing.T
	mu sync.Mutex // held across every arming and every move
	fc *clocktesting.FakeClock
	// armed are the deadlines of timers and Afters not yet fired or stopped.
	armed map[any]time.Time
}

// driveTimeout bounds how long, in real time, a test waits for a Reporter to
// arm a deadline or write a heartbeat; it decides no time a test compares.
const driveTimeout = 20 * time.Second

// newDrivenClock starts at a whole second (lastHeartbeatTime has second
// precision, so heartbeats on a whole-second schedule are compared exactly).
func newDrivenClock(t *testing.T) *drivenClock {
	start := time.Now().Truncate(time.Second)
	return &drivenClock{t: t, fc: clocktesting.NewFakeClock(start), armed: map[any]time.Time{}}
}

// drivenAddon makes what a driven test starts from: a namespace with the
// AddonInstance "addon-instance" at period, a recorder of its heartbeats,
// and a driven clock with its start.
func drivenAddon(t *testing.T, period time.Duration) (ns string, rec *recorder, clk *drivenClock, t0 time.Time) {
	t.Helper()
	ns = newNamespace(t)
	createInstance(t, ns, "addon-instance", period)
	rec = record(t, ns, "addon-instance")
	clk = newDrivenClock(t)
	return ns, rec, clk, clk.Now()
}

// drive puts a Reporter on the clock (a tweak for startReporter).
func (c *drivenClock) drive(r *Reporter) {
	r.clock = c
	r.limiter.clock = c
	// Heartbeats in the driven time: a serverClock that no response
	// reaches (the real API server's Date is real time, which the driven
	// clock leaves behind as the test advances it).
	r.serverClock = newServerClock(c)
}

func (c *drivenClock) Now() time.Time                  { return c.fc.Now() }
func (c *drivenClock) Since(t time.Time) time.Duration { return c.fc.Since(t) }
func (c *drivenClock) Sleep(d time.Duration)           { <-c.After(d) }
func (c *drivenClock) Tick(d time.Duration) <-chan time.Time {
	c.t.Error("the Reporter uses Tick, which the driven clock does not track")
	return nil
}

func (c *drivenClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := c.fc.After(d)
	c.armed[ch] = c.fc.Now().Add(d)
	return ch
}

func (c *drivenClock) NewTimer(d time.Duration) clock.Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	tm := &drivenTimer{Timer: c.fc.NewTimer(d), c: c}
	c.armed[tm] = c.fc.Now().Add(d)
	return tm
}

func (c *drivenClock) AfterFunc(d time.Duration, f func()) clock.Timer {
	c.t.Error("the Reporter uses AfterFunc, which the driven clock does not track")
	return c.fc.AfterFunc(d, f)
}

func (c *drivenClock) NewTicker(d time.Duration) clock.Ticker {
	c.t.Error("the Reporter uses a ticker, which the driven clock does not track")
	return c.fc.NewTicker(d)
}

type drivenTimer struct {
	clock.Timer
	c *drivenClock
}

func (t *drivenTimer) Reset(d time.Duration) bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	active := t.Timer.Reset(d)
	t.c.armed[t] = t.c.fc.Now().Add(d)
	return active
}

func (t *drivenTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	delete(t.c.armed, t)
	return t.Timer.Stop()
}

// setTime moves the clock to at, firing whatever is due by then.
func (c *drivenClock) setTime(at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if at.Before(c.fc.Now()) {
		c.t.Fatalf("the driven clock only moves forward: %s is before %s", at, c.fc.Now())
	}
	for k, d := range c.armed {
		if !d.After(at) {
			delete(c.armed, k)
		}
	}
	c.fc.SetTime(at)
}

// isArmed reports whether something is armed for exactly at.
func (c *drivenClock) isArmed(at time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, d := range c.armed {
		if d.Equal(at) {
			return true
		}
	}
	return false
}

// deadlines lists what is armed, relative to from, for failure messages.
func (c *drivenClock) deadlines(from time.Time) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []time.Duration
	for _, d := range c.armed {
		out = append(out, d.Sub(from))
	}
	slices.Sort(out)
	return fmt.Sprint(out)
}

// awaitArmed waits until something is armed for exactly at: a Reporter has
// reached the point of its schedule the test expects.
func (c *drivenClock) awaitArmed(t *testing.T, at time.Time, what string) {
	t.Helper()
	if !c.until(func() bool { return c.isArmed(at) }) {
		t.Fatalf("%s: nothing armed for %s within %s (now %s; armed, from now: %s)",
			what, at.Format(time.StampMilli), driveTimeout, c.Now().Format(time.StampMilli), c.deadlines(c.Now()))
	}
}

// fire waits until something is armed for exactly at and moves the clock
// there.
func (c *drivenClock) fire(t *testing.T, at time.Time, what string) {
	t.Helper()
	c.awaitArmed(t, at, what)
	c.setTime(at)
}

// fireUntil fires the clock at at, again whenever something is armed for at
// anew (the loop re-arms for the same instant when its AddonInstance appears
// only after its first tick), until done holds. The clock never moves past
// at.
func (c *drivenClock) fireUntil(t *testing.T, at time.Time, what string, done func() bool) {
	t.Helper()
	ok := c.until(func() bool {
		if done() {
			return true
		}
		if c.isArmed(at) {
			c.setTime(at)
		}
		return false
	})
	if !ok {
		t.Fatalf("%s at %s: not within %s (now %s; armed, from now: %s)",
			what, at.Format(time.StampMilli), driveTimeout, c.Now().Format(time.StampMilli), c.deadlines(c.Now()))
	}
}

// until polls cond in real time until it holds or driveTimeout passes.
func (c *drivenClock) until(cond func() bool) bool {
	err := wait.PollUntilContextTimeout(c.t.Context(), 2*time.Millisecond, driveTimeout, true,
		func(context.Context) (bool, error) { return cond(), nil })
	return err == nil
}

// beatAt fires the clock at at until rec has seen the heartbeat written
// then (lastHeartbeatTime is at, to the second), and returns it.
func (c *drivenClock) beatAt(t *testing.T, rec *recorder, at time.Time) beat {
	t.Helper()
	var got beat
	c.fireUntil(t, at, "a heartbeat", func() bool {
		for _, b := range rec.snapshot() {
			if b.hb.Equal(at.Truncate(time.Second)) {
				got = b
				return true
			}
		}
		return false
	})
	return got
}

// fireNextUntil moves the clock to the earliest deadline armed, again and
// again (whatever armed it), until done holds or limit would be passed. It
// is for schedules a test cannot name to the millisecond (jittered retries).
func (c *drivenClock) fireNextUntil(t *testing.T, limit time.Time, what string, done func() bool) {
	t.Helper()
	ok := c.until(func() bool {
		if done() {
			return true
		}
		c.mu.Lock()
		var next time.Time
		for _, d := range c.armed {
			if next.IsZero() || d.Before(next) {
				next = d
			}
		}
		c.mu.Unlock()
		if !next.IsZero() && !next.After(limit) {
			c.setTime(next)
		}
		return false
	})
	if !ok {
		t.Fatalf("%s: not by %s within %s (now %s; armed, from now: %s)",
			what, limit.Format(time.StampMilli), driveTimeout, c.Now().Format(time.StampMilli), c.deadlines(c.Now()))
	}
}
