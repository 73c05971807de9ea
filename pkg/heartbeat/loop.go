package heartbeat

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
)

// beatResult is what one heartbeat did.
type beatResult int

const (
	// beatWritten: the status write went through.
	beatWritten beatResult = iota
	// beatWaiting: nothing to write to yet (the AddonInstance does not exist
	// or its watch has not synced); not a failure.
	beatWaiting
	// beatFailed: the write failed; the loop backs off.
	beatFailed
)

// target is what the loop knows of its AddonInstance between heartbeats.
type target struct {
	present bool
	// uid tells a recreated AddonInstance from the one before it: a
	// deletion and a creation can reach the loop as one change.
	uid    types.UID
	period time.Duration
}

// loop is the one goroutine that schedules and performs heartbeats.
type loop struct {
	clock clock.Clock
	// observe reads the AddonInstance from the watch cache.
	observe func() target
	// beat performs one heartbeat.
	beat func(ctx context.Context) beatResult
	// kick is signalled (non-blocking, capacity 1) when the watched
	// AddonInstance changes.
	kick <-chan struct{}
}

// run heartbeats until ctx ends. Ticks fall on origin + k x period; after a
// failure it retries with a growing backoff but never later than the next
// scheduled tick.
func (l *loop) run(ctx context.Context) {
	now := l.clock.Now()
	cur := l.observe()
	origin, due := now, now
	var backoff time.Duration
	timer := l.clock.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.kick:
			t := l.observe()
			now := l.clock.Now()
			switch {
			case t.present && (!cur.present || t.uid != cur.uid):
				// (re)created, or the watch just synced: beat at once
				// (also over a retry still due for the deleted one).
				origin, due, backoff = now, now, 0
			case t.period != cur.period:
				last := lastTick(origin, cur.period, now)
				next := now
				switch {
				case t.period > cur.period:
					// Longer: beat at once. The hold taken at the last
					// tick, and the standbys' view of it, end on the old
					// period's terms (1.25 and 1.5 old periods), before
					// last + the new period; this beat renews the Lease
					// for the new period and announces it.
					origin = now
				case last.Add(t.period).After(now):
					origin, next = last, last.Add(t.period)
				default:
					origin = now
				}
				// A retry after a failed write stays due: a new period
				// must not postpone the heartbeat the operator is missing.
				if backoff == 0 || next.Before(due) {
					due = next
				}
			default:
				cur = t
				continue
			}
			cur = t
			resetTimer(timer, due.Sub(now))
		case <-timer.C():
			res := l.beat(ctx)
			if ctx.Err() != nil {
				return
			}
			// A change seen during the write is handled by the kick that
			// follows; until then the schedule stays as it was.
			now := l.clock.Now()
			next := nextTick(origin, cur.period, now)
			if res == beatFailed {
				backoff = nextBackoff(backoff, cur.period)
				if retry := now.Add(backoff); retry.Before(next) {
					next = retry
				}
			} else {
				backoff = 0
			}
			due = next
			resetTimer(timer, due.Sub(now))
		}
	}
}

// resetTimer re-arms a timer whether or not it fired.
func resetTimer(t clock.Timer, d time.Duration) {
	if !t.Stop() {
		select {
		case <-t.C():
		default:
		}
	}
	t.Reset(max(d, 0))
}
