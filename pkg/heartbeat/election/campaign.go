package election

import (
	"context"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// Result is what one try at the Lease came to (Config.OnTry).
type Result string

const (
	// Acquired: this process now holds the Lease.
	Acquired Result = "acquired"
	// HeldByOther: another holder's term runs.
	HeldByOther Result = "held_by_other"
	// Waiting: neither held nor taken: the missing Lease is being made, or
	// the process waits for its watch to bring a newer version.
	Waiting Result = "waiting"
	// Failed: a request failed (Config.LogError has it).
	Failed Result = "error"
)

// requestTimeout bounds each request of a campaign, so that an API server
// that stops answering delays the next try, never stops tries.
const requestTimeout = 10 * time.Second

// Campaign is one stretch as a standby: it takes the Lease when it is free,
// released or expired, and returns true once this process holds it (false
// when ctx ends). period is the last period known, for the timings until
// ReadPeriod gives one.
//
// It reads the Lease once and then watches it from that version: each
// renewal comes as an event, so a standby reads nothing while the leader
// renews, sees a release at once and judges expiry from the moment of the
// last renewal. The watch is closed while this process leads. Errors (the
// read or the watch failing) count as failed tries and are retried at the
// election's own pace, not a reflector's back-off, so a standby is back
// within a retry period of the API server.
func (e *Elector) Campaign(ctx context.Context, period time.Duration) bool {
	var w watch.Interface
	defer func() {
		if w != nil {
			w.Stop()
		}
	}()
	read := true // read the Lease before (re)opening the watch
	var opened time.Time
	e.maxDuration = Timings(period).LeaseDuration
	var probed time.Time // when the period was last read; zero: not yet
	sameIdentitySaid, campaignSaid := false, false
	for ctx.Err() == nil {
		var err error
		if w == nil {
			w, err = e.watch(ctx, read)
			opened = e.clock.Now()
		}
		if probed.IsZero() || err == nil && !e.heldByOther(e.clock.Now()) && probed.Before(e.observedAt) {
			// A take is judged on the period as read after the record it
			// judges was seen: the bound on another's hold (maxDuration),
			// the wait for a vacancy (vacancyWait) and the period the
			// take announces all follow it, and it may have changed (a
			// longer one is announced by the holder's renewal right after
			// it sees it, and a bound from before would end that hold
			// early). Once per record: a standby waiting out a live
			// holder reads nothing; one about to take reads once. The
			// read shows the period as of some instant after it was sent:
			// it is as fresh as its sending, not its answer (which a slow
			// API server may give long after a record it judges).
			sent := e.clock.Now()
			rctx, cancel := context.WithTimeout(ctx, requestTimeout)
			p, fresh, perr := e.cfg.ReadPeriod(rctx)
			cancel()
			switch {
			case perr == nil:
				period, probed = p, sent
				e.maxDuration = Timings(period).LeaseDuration
				e.vacancyWait = vacancyWait(period, fresh)
			case err == nil:
				// No take on an older read: the hold it would announce,
				// and the bounds it would judge by, may be on a period
				// the others no longer follow. Try again at the retry
				// pace.
				err = perr
			}
			if !campaignSaid {
				e.cfg.Log.V(1).Info("campaigning", "identity", e.identity, "timings", Timings(period))
				campaignSaid = true
			}
		}
		held := false
		if err == nil {
			actx, cancel := context.WithTimeout(ctx, requestTimeout)
			held, err = e.acquire(actx, period)
			cancel()
		}
		wait := e.wait(period)
		switch {
		case err != nil:
			if ctx.Err() != nil {
				return false
			}
			e.try(Failed)
			e.cfg.LogError(err, "leader election failed")
			wait = checkInterval(e.Period(period))
		case held:
			e.try(Acquired)
			return true
		case !e.heldByOther(e.clock.Now()):
			e.try(Waiting)
		default:
			e.try(HeldByOther)
			if e.heldBySameIdentity() && !sameIdentitySaid {
				// An earlier run of this process that did not release the
				// Lease (it crashed), or a second process given this
				// identity: either way wait for that hold to end.
				e.cfg.Log.Info("the Lease is held under this process's identity by another process: "+
					"an earlier run of it, or a second process with the same identity (each needs its own); "+
					"waiting for that hold to end", "identity", e.identity)
				sameIdentitySaid = true
			}
		}
		if open, ok := awaitLease(ctx, w, e, e.clock.After(wait)); !open {
			if w != nil {
				w.Stop()
				// One that ends as soon as it opens is not reopened at once.
				if e.clock.Since(opened) < Timings(period).RetryPeriod {
					select {
					case <-ctx.Done():
					case <-e.clock.After(checkInterval(e.Period(period))):
					}
				}
			}
			// A watch the API server closed resumes from the last version
			// seen; one that failed starts again from a read.
			w, read = nil, !ok
		}
	}
	return false
}

func (e *Elector) try(r Result) {
	if e.cfg.OnTry != nil {
		e.cfg.OnTry(r)
	}
}

// watch opens a watch on the Lease from the last version seen, after
// reading the Lease when read is set.
func (e *Elector) watch(ctx context.Context, read bool) (watch.Interface, error) {
	if read {
		rctx, cancel := context.WithTimeout(ctx, requestTimeout)
		err := e.refresh(rctx)
		cancel()
		if err != nil {
			return nil, err
		}
	}
	w, err := e.leases.Watch(ctx, e.key, e.lastVersion)
	if err != nil {
		return nil, fmt.Errorf("watching Lease %s: %w", e.key, err)
	}
	return w, nil
}

// awaitLease waits for the watch's next event and records it in e, or for
// timeout or ctx. open is false when the watch has ended (or there is none),
// and ok then says whether it ended cleanly (closed by the API server)
// rather than on an error.
func awaitLease(ctx context.Context, w watch.Interface, e *Elector, timeout <-chan time.Time) (open, ok bool) {
	if w == nil {
		select {
		case <-ctx.Done():
		case <-timeout:
		}
		return false, false
	}
	select {
	case <-ctx.Done():
		return true, true
	case <-timeout:
		return true, true
	case ev, more := <-w.ResultChan():
		if !more {
			return false, true
		}
		switch ev.Type {
		case watch.Added, watch.Modified:
			if lease, isLease := ev.Object.(*coordinationv1.Lease); isLease {
				e.observe(lease, lease.ResourceVersion, e.clock.Now())
			}
			return true, true
		case watch.Deleted:
			version := ""
			if lease, isLease := ev.Object.(*coordinationv1.Lease); isLease {
				version = lease.ResourceVersion
			}
			e.observe(nil, version, e.clock.Now())
			return true, true
		case watch.Bookmark:
			return true, true
		default: // watch.Error: the version is too old, or a server error
			return false, false
		}
	}
}

// vacancyWait is how long a process that sees a vacant Lease (made, never
// held), without having watched the record before it go, waits from then
// before it takes it (see Elector.vacantSince): a hold that came and went
// unseen may still run. Its holder's renewal of a Lease now gone fails and
// it stops, so that hold ends within the renew deadline of its last
// renewal, which came before the deletion and so before the vacant Lease
// was made and seen: a lease duration of the period (the one it follows)
// from then has outlasted it.
//
// A first install (fresh: the work was never done, for a heartbeat no
// lastHeartbeatTime was ever written) waits nothing, so that the first
// term starts at once: with nothing ever written there is no term whose
// writes could be overlapped but one that took a Lease made moments before
// and lost it to a deletion before its first write, and that one writes at
// most that once (on the hold of its take) and stops at the renewal after
// it: an overlap of one write, in the first seconds of an install, against
// making every first install wait a lease duration.
func vacancyWait(period time.Duration, fresh bool) time.Duration {
	if fresh {
		return 0
	}
	return Timings(period).LeaseDuration
}
