package election

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
)

// Config of an Elector.
type Config struct {
	// Leases are its requests to the API server (NewLeases).
	Leases Leases
	// Lease is the election Lease (LeaseName of the AddonInstance).
	Lease types.NamespacedName
	// Identity is its holderIdentity: unique to each process (the pod
	// name). Processes that share one anyway are told apart by a token of
	// each process on the Lease (ProcessAnnotation): neither takes the
	// other's hold before it expires, and the one that finds the other's
	// renewal stops leading.
	Identity string
	// Instance names the AddonInstance it elects the writer for
	// (InstanceAnnotation).
	Instance string
	// Clock; clock.RealClock when nil.
	Clock clock.WithTicker
	// Log gets its few lines (the start of a campaign, at V(1); a hold
	// under its own identity by another process).
	Log logr.Logger
	// LogError logs a failed try; the caller rate-limits. Log.Error when
	// nil.
	LogError func(err error, msg string, keysAndValues ...any)
	// ReadPeriod reads the period the terms follow (the AddonInstance's
	// heartbeatUpdatePeriod), before each take; fresh says the work was
	// never done (no heartbeat was ever written, or there is no
	// AddonInstance). Required.
	ReadPeriod func(ctx context.Context) (period time.Duration, fresh bool, err error)
	// OnTry is told of each try at the Lease; nil for none.
	OnTry func(Result)
}

// New builds an Elector. It does no I/O.
func New(cfg Config) *Elector {
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Log.GetSink() == nil {
		cfg.Log = logr.Discard()
	}
	if cfg.LogError == nil {
		log := cfg.Log
		cfg.LogError = func(err error, msg string, kv ...any) { log.Error(err, msg, kv...) }
	}
	return &Elector{cfg: cfg, leases: cfg.Leases, key: cfg.Lease, identity: cfg.Identity,
		process: string(uuid.NewUUID()), instance: cfg.Instance, clock: cfg.Clock}
}

// Key is the election Lease.
func (e *Elector) Key() types.NamespacedName { return e.key }

// HoldEnd is, while this process leads, when its hold ends by its own
// clock: the send time of its last successful write of the Lease plus the
// renew deadline. It keeps the monotonic reading of the clock, so that a
// step of the wall clock does not move it.
func (e *Elector) HoldEnd() time.Time { return e.validUntil }

// ErrLost is what Renew returns when another holder has the Lease (or a
// process with this identity, or the Lease is gone): the term ends at once.
var ErrLost = errors.New("the Lease has another holder")

// Elector is this process's side of the election Lease, in the style of
// client-go's leader election but paced by its caller: the leader renews the
// Lease when it has done its work for the period (one Lease write per
// period, not one per retry period), and standbys watch it (one event per
// renewal, no reads). Create it with New.
//
// Expiry is judged as client-go does, by the local time at which this
// process last saw the holder's record change, never by comparing clocks
// across machines.
type Elector struct {
	cfg      Config
	leases   Leases
	key      types.NamespacedName
	identity string
	// process tells this process from others with the same identity (an
	// earlier run of it, or a second process misconfigured with the same
	// Config.Identity): ProcessAnnotation on the records it writes.
	process string
	// instance is the AddonInstance this Lease elects for
	// (InstanceAnnotation).
	instance string
	clock    clock.WithTicker

	// lease is the last version read or written.
	lease *coordinationv1.Lease
	// observedAt is when the record (holder, renewal, duration) last changed
	// as seen by this process.
	observedAt time.Time
	// validUntil is, while leading, when this process's hold ends by its own
	// clock: the send time of its last successful write plus RenewDeadline.
	validUntil time.Time
	// maxDuration bounds how long a holder's record is honoured, whatever
	// it claims: the lease duration for the AddonInstance's own period (see
	// Campaign). Zero: no bound.
	maxDuration time.Duration
	// fence is when the term of the holder of a Lease that was deleted (or
	// deleted and made again) ends: that holder may still be finishing a
	// heartbeat it began before the deletion, so no new term starts before
	// this, whatever the new Lease says.
	// It is kept as the record's sighting and claim, not as an instant,
	// so that it follows the bound (maxDuration) as that is read again:
	// a bound from before a longer period was announced must not end it
	// early.
	fence fenceRecord
	// vacantSince is when this process first saw the vacant Lease object
	// vacantID (made and never held: by the webhook, or by a process that
	// found the Lease missing) without having watched, in one unbroken view,
	// the record before it go: by a read, or as the first event of a watch
	// that could not resume from a version seen. Such a sighting cannot tell
	// whether a hold came and went unseen since the last record seen (this
	// process was partitioned, its watch broke, or it started after a
	// deletion); any such hold was on an object deleted before this one was
	// made, so its holder renewed it last before this sighting, and it
	// ended within a renew deadline of that. No term starts before
	// vacancyWait from then. Sightings of the same object (the same UID and
	// version: not written since) do not move it.
	//
	// vacancyKnown is set instead when the view was unbroken: a watch
	// resumed from the last version seen brought the deletion of the record
	// seen before (whose holder fence covers) and everything since, in
	// order. A missing Lease is never taken as it is: it is made vacant
	// (awaiting) and judged as that object once the watch brings it, after
	// every record before it.
	vacantSince  time.Time
	vacancyKnown bool
	vacantID     string
	// awaiting is the UID of the vacant Lease this process made, until a
	// watch event or a read brings it; awaitAny when its try to make it
	// found one made by another.
	awaiting types.UID
	// lastVersion is the resourceVersion of the last version of the Lease
	// seen, its deletion included: a watch resumes from it, and then misses
	// nothing. Empty after a read that found no Lease.
	lastVersion string
	// behindSince is when a take met a newer version than the one seen
	// (zero: not behind). The watch that runs from the version seen brings
	// the newer ones, and with them every record in between, so the
	// process waits for it rather than read (a read would be a sighting
	// with a gap, see vacantSince); it reads only when the watch brings
	// nothing within a retry period. Any version seen ends it.
	behindSince time.Time
	// unbroken says whether the next watch event continues this process's
	// view without a gap: false from a read until the first event of a watch
	// opened from no version (it reports what exists when it starts, not
	// what came and went since the read).
	unbroken bool
	// vacancyWait: see vacancyWait.
	vacancyWait time.Duration
	// yielded is set when this process's term ended with its own record
	// still on the Lease: it could not heartbeat, or renew, within its
	// hold. It then waits that record out as any standby does instead of
	// taking it back at once, so that a replica that can write gets the
	// Lease first (see yield).
	yielded bool
}

// vacant reports whether lease holds no record of a hold: missing, or made
// (by the webhook) and never held. A released Lease has a renewal time and
// is not vacant: its last holder wrote the release after its last heartbeat.
func vacant(lease *coordinationv1.Lease) bool {
	return lease == nil || ptr.Deref(lease.Spec.HolderIdentity, "") == "" && lease.Spec.RenewTime == nil
}

// observe records a version of the Lease a watch brought at now (nil: a
// deletion), and version, the event's resourceVersion. A watch resumed from
// the last version seen brings every record in order: a vacancy after a
// record seen is that record's holder's (fence).
func (e *Elector) observe(lease *coordinationv1.Lease, version string, now time.Time) {
	e.see(lease, now, e.unbroken)
	e.unbroken = true
	if version != "" {
		e.lastVersion = version
	}
}

// observeRead records a version of the Lease read at now (nil: none).
func (e *Elector) observeRead(lease *coordinationv1.Lease, now time.Time) {
	e.see(lease, now, false)
	e.awaiting = ""
	e.lastVersion = ""
	if lease != nil {
		e.lastVersion = lease.ResourceVersion
	}
	// A watch from the version read continues from it; without one (no
	// Lease), its first event reports the state it starts from.
	e.unbroken = lease != nil
}

// vacancyID identifies a vacant object: unwritten since, it is the same.
func vacancyID(lease *coordinationv1.Lease) string {
	if lease == nil {
		return ""
	}
	return string(lease.UID) + "/" + lease.ResourceVersion
}

// see records a version of the Lease seen at now (nil: there is none), by a
// watch that continues this process's view without a gap (unbroken) or
// otherwise (a read, or a watch's first report).
func (e *Elector) see(lease *coordinationv1.Lease, now time.Time, unbroken bool) {
	if e.lease != nil && (lease == nil || lease.UID != e.lease.UID) {
		// The Lease is gone, or is another object of the same name: the
		// holder of the one gone keeps its term to the end (see fence).
		if e.recordHeld() {
			if f := (fenceRecord{from: e.observedAt, claim: e.claimed()}); !e.fenceEnd(e.fence).After(e.fenceEnd(f)) {
				e.fence = f
			}
		}
	}
	e.behindSince = time.Time{}
	if lease != nil && (lease.UID == e.awaiting || e.awaiting == awaitAny) {
		e.awaiting = ""
	}
	id := vacancyID(lease)
	switch {
	case !vacant(lease):
		e.vacantSince, e.vacancyKnown, e.vacantID = time.Time{}, false, ""
	case unbroken && !vacant(e.lease):
		// The record seen went, in view: its holder is fenced.
		e.vacantSince, e.vacancyKnown, e.vacantID = time.Time{}, true, id
	case unbroken && (e.vacancyKnown || !e.vacantSince.IsZero()):
		// The same vacancy, still in view.
		e.vacantID = id
	case lease == nil:
		// Missing, seen with a gap: nothing to judge until the object
		// made in its place is seen.
		e.vacantSince, e.vacancyKnown, e.vacantID = time.Time{}, false, ""
	case id == e.vacantID && (e.vacancyKnown || !e.vacantSince.IsZero()):
		// The same object as judged, not written since: no hold came
		// and went in between.
	default:
		e.vacantSince, e.vacancyKnown, e.vacantID = now, false, id
	}
	if lease == nil || e.lease == nil || !apiequality.Semantic.DeepEqual(e.lease.Spec, lease.Spec) ||
		lease.Annotations[ProcessAnnotation] != e.lease.Annotations[ProcessAnnotation] {
		e.observedAt = now
	}
	e.lease = lease
}

// fenceRecord is the record of a Lease gone: when it was seen and the
// duration it claimed.
type fenceRecord struct {
	from  time.Time
	claim time.Duration
}

// fenceEnd is when the hold of a record gone ends, bounded as a live one.
func (e *Elector) fenceEnd(f fenceRecord) time.Time {
	if f.from.IsZero() {
		return time.Time{}
	}
	d := f.claim
	if e.maxDuration > 0 {
		d = min(d, e.maxDuration)
	}
	return f.from.Add(d)
}

// recordHeld reports whether the last record seen is a hold by another
// holder.
func (e *Elector) recordHeld() bool {
	return e.lease != nil && ptr.Deref(e.lease.Spec.HolderIdentity, "") != "" && (e.yielded || !e.ownedBy(e.lease))
}

// yieldGrace is how long past the expiry of its own record a process that
// gave it up (Yield) waits before it takes it back: a tenth of a period,
// time for a standby's watch to bring the record, its read of the period
// and its take, and little enough that a lone process that failed is back
// within 1.85 periods of its last heartbeat, under the 2 the design
// promises.
func yieldGrace(period time.Duration) time.Duration { return max(period, MinPeriod) / 10 }

// Yield is called when a term ends while the process runs on. When the last
// record is still this process's own, the term ended because it failed to
// heartbeat or renew within its hold (a renewal follows only a heartbeat
// written): its own record then counts as another's until it expires, as
// every standby judges it, and a tenth of a period more (yieldGrace), so
// that a standby that can write takes it first. Taking it back at once would
// keep a replica that cannot write (its ServiceAccount may not, or its
// requests fail) in the Lease forever while another could write.
func (e *Elector) Yield() {
	e.yielded = e.lease != nil && e.ownedBy(e.lease)
}

// heldByOther reports whether another holder's term is still running at now.
func (e *Elector) heldByOther(now time.Time) bool {
	_, held := e.otherHoldEnd(now)
	return held
}

// otherHoldEnd is when another holder's term ends, if one is running at now:
// the record's (never while there is no Lease), or the fence of a Lease that
// was deleted. Another holder is another identity, or this identity written
// by another process (see ownedBy).
func (e *Elector) otherHoldEnd(now time.Time) (time.Time, bool) {
	var end time.Time
	if e.recordHeld() {
		end = e.observedAt.Add(e.duration())
		if e.yielded && e.ownedBy(e.lease) {
			// Its own record, given up: a little more (yieldGrace), so
			// that a standby that can write, which looks as the record
			// expires, takes it first.
			end = end.Add(yieldGrace(e.Period(MinPeriod)))
		}
	}
	if f := e.fenceEnd(e.fence); f.After(end) {
		end = f
	}
	if !e.vacantSince.IsZero() && e.vacancyWait > 0 {
		if v := e.vacantSince.Add(e.vacancyWait); v.After(end) {
			end = v
		}
	}
	return end, now.Before(end)
}

// ownedBy reports whether the record of lease is this process's own hold: its
// identity, written by this process. A record of this identity without
// ProcessAnnotation was written by an earlier version, which did not set
// it, and counts as this process's, as it did then.
func (e *Elector) ownedBy(lease *coordinationv1.Lease) bool {
	if ptr.Deref(lease.Spec.HolderIdentity, "") != e.identity {
		return false
	}
	p, ok := lease.Annotations[ProcessAnnotation]
	return !ok || p == e.process
}

// heldBySameIdentity reports whether the record is held under this
// process's identity by another process.
func (e *Elector) heldBySameIdentity() bool {
	return e.lease != nil && ptr.Deref(e.lease.Spec.HolderIdentity, "") == e.identity && !e.ownedBy(e.lease)
}

// duration is how long the holder's record is good for: what it claims (see
// claimed), but never more than maxDuration.
func (e *Elector) duration() time.Duration {
	d := e.claimed()
	if e.maxDuration > 0 {
		d = min(d, e.maxDuration)
	}
	return d
}

// claimed is the duration the holder's record claims: exact for the period
// the holder announced, else the whole seconds of the record.
func (e *Elector) claimed() time.Duration {
	if e.lease == nil {
		return 0
	}
	if p, err := time.ParseDuration(e.lease.Annotations[PeriodAnnotation]); err == nil {
		return Timings(p).LeaseDuration
	}
	return time.Duration(ptr.Deref(e.lease.Spec.LeaseDurationSeconds, 0)) * time.Second
}

// Period is the period the holder announced (at least MinPeriod), or
// fallback.
func (e *Elector) Period(fallback time.Duration) time.Duration {
	if e.lease != nil {
		if p, err := time.ParseDuration(e.lease.Annotations[PeriodAnnotation]); err == nil {
			return max(p, MinPeriod)
		}
	}
	return fallback
}

// record fills spec and the period annotation for a hold by this process
// that starts or continues at now.
func (e *Elector) record(lease *coordinationv1.Lease, period time.Duration, now time.Time) {
	t := Timings(period)
	spec := &lease.Spec
	if !e.ownedBy(lease) {
		if ptr.Deref(spec.HolderIdentity, "") != "" {
			spec.LeaseTransitions = ptr.To(ptr.Deref(spec.LeaseTransitions, 0) + 1)
		}
		spec.HolderIdentity = ptr.To(e.identity)
		spec.AcquireTime = &metav1.MicroTime{Time: now}
	}
	spec.LeaseDurationSeconds = ptr.To(leaseSeconds(t.LeaseDuration))
	spec.RenewTime = &metav1.MicroTime{Time: now}
	if lease.Annotations == nil {
		lease.Annotations = map[string]string{}
	}
	lease.Annotations[PeriodAnnotation] = period.String()
	if e.instance != "" {
		lease.Annotations[InstanceAnnotation] = e.instance
	}
	if e.process != "" {
		lease.Annotations[ProcessAnnotation] = e.process
	}
}

// acquire takes the Lease when the last version seen (nil: there is none)
// is free, expired or already this process's, and reports whether this
// process now holds it. When the write meets another (a replica was faster,
// the Lease was deleted, or the version seen was stale because a watch
// lags), this process's view is behind: it waits for the watch to bring
// what it missed, in order, and reads the Lease only when nothing comes
// within a retry period (see behind). An error is one of the API server's.
func (e *Elector) acquire(ctx context.Context, period time.Duration) (bool, error) {
	now := e.clock.Now()
	if !e.behindSince.IsZero() {
		if now.Sub(e.behindSince) < checkInterval(period) {
			return false, nil
		}
		if err := e.refresh(ctx); err != nil {
			return false, err
		}
	}
	if e.lease == nil {
		// Made at once, even while a fence runs, so that it is there
		// (and seen) when the fence ends.
		return false, e.makeVacant(ctx)
	}
	if e.heldByOther(now) {
		return false, nil
	}
	next := e.lease.DeepCopy()
	e.record(next, period, now)
	taken, err := e.leases.Update(ctx, next)
	switch {
	case err == nil:
		e.took(taken, period, now)
		return true, nil
	case apierrors.IsConflict(err), apierrors.IsNotFound(err):
		e.behindSince = now
		return false, nil
	default:
		return false, fmt.Errorf("taking Lease %s: %w", e.key, err)
	}
}

// awaitAny, as Elector.awaiting, waits for whichever Lease object the watch
// brings next.
const awaitAny types.UID = "*"

// makeVacant makes the missing Lease, with no holder, for the watch to bring
// (awaiting). A missing Lease is never made held: a create cannot be
// conditioned on what came before, and a hold that came and went unseen (a
// Lease made, held and deleted while this process's view had a gap, or
// before the watch that follows a read began) may still run. Made vacant, it
// is judged as any vacant object once the watch brings it after every
// record before it; an update with its version then takes it, which fails
// if anyone wrote it since.
func (e *Elector) makeVacant(ctx context.Context) error {
	if e.awaiting != "" {
		return nil // on its way
	}
	lease := &coordinationv1.Lease{ObjectMeta: leaseMeta(e.key)}
	if e.instance != "" {
		// Named for the fencing policy from the start: with no holder,
		// it admits no heartbeat until a take.
		lease.Annotations = map[string]string{InstanceAnnotation: e.instance}
	}
	made, err := e.leases.Create(ctx, lease)
	switch {
	case err == nil:
		e.awaiting = made.UID
		return nil
	case apierrors.IsAlreadyExists(err):
		// Made by another process (or the webhook) meanwhile: the watch
		// brings it after everything before it. A read would see it
		// sooner, but as a sighting with a gap (see vacantSince), which
		// would throw away a vacancy known from the watch.
		e.awaiting = awaitAny
		return nil
	case apierrors.IsForbidden(err):
		// The zero-code reporter role has no create (RBAC cannot limit
		// it by name): the webhook creates the Lease when it binds the
		// role, and the watch brings it.
		return fmt.Errorf("the election Lease %s does not exist yet and this reporter may not create it; "+
			"it is made by whoever provisions the reporter's RBAC (the webhook, once the AddonInstance exists): %w", e.key, err)
	default:
		return fmt.Errorf("making Lease %s: %w", e.key, err)
	}
}

// refresh reads the Lease into the lock.
func (e *Elector) refresh(ctx context.Context) error {
	lease, err := e.leases.Get(ctx, e.key)
	if apierrors.IsNotFound(err) {
		e.observeRead(nil, e.clock.Now())
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading Lease %s: %w", e.key, err)
	}
	e.observeRead(lease, e.clock.Now())
	return nil
}

// took records a successful write of this process's hold, sent at sent.
func (e *Elector) took(lease *coordinationv1.Lease, period time.Duration, sent time.Time) {
	e.yielded = false
	e.lease = lease
	e.observedAt = sent
	e.validUntil = sent.Add(Timings(period).RenewDeadline)
}

// Renew extends this process's hold for period, to HoldEnd. ErrLost means another
// holder has taken it; any other error leaves the hold as it was (valid
// until validUntil).
func (e *Elector) Renew(ctx context.Context, period time.Duration) error {
	now := e.clock.Now()
	next := e.lease.DeepCopy()
	e.record(next, period, now)
	updated, err := e.leases.Update(ctx, next)
	if apierrors.IsConflict(err) {
		// Someone wrote the Lease since: read it to learn whether it is
		// still this process's (a label edit) or taken.
		fresh, gerr := e.leases.Get(ctx, e.key)
		if apierrors.IsNotFound(gerr) {
			// Deleted (a PUT over a deleted object conflicts).
			e.observeRead(nil, e.clock.Now())
			return ErrLost
		}
		if gerr != nil {
			// The first write conflicted: it was not applied.
			return fmt.Errorf("reading Lease %s after a conflict: %w", e.key, gerr)
		}
		e.observeRead(fresh, now)
		if e.heldBySameIdentity() {
			return fmt.Errorf("%w: another process with the identity %q wrote it (each process needs an identity of its own)",
				ErrLost, e.identity)
		}
		if !e.ownedBy(fresh) {
			return ErrLost
		}
		next = fresh.DeepCopy()
		e.record(next, period, now)
		updated, err = e.leases.Update(ctx, next)
	}
	if apierrors.IsNotFound(err) {
		e.observeRead(nil, e.clock.Now())
		return ErrLost
	}
	if err != nil {
		// The write may have been applied all the same (its answer was
		// lost, or came too late), and standbys then judge by it: the hold
		// ends no later than it would on that record, which is earlier
		// than the hold already given when the period announced is
		// shorter.
		if end := now.Add(Timings(period).RenewDeadline); end.Before(e.validUntil) {
			e.validUntil = end
		}
		return fmt.Errorf("renewing Lease %s: %w", e.key, err)
	}
	e.took(updated, period, now)
	return nil
}

// Release hands the Lease back so that a standby takes it at its next check
// instead of waiting for it to expire: no holder, a one-second duration. It
// retries conflicts against a fresh read while the Lease is still ours.
func (e *Elector) Release(ctx context.Context) error {
	lease := e.lease
	for attempt := 0; attempt < 3; attempt++ {
		if lease == nil || !e.ownedBy(lease) {
			return nil
		}
		next := lease.DeepCopy()
		now := metav1.MicroTime{Time: e.clock.Now()}
		next.Spec.HolderIdentity = nil
		next.Spec.LeaseDurationSeconds = ptr.To[int32](1)
		next.Spec.RenewTime = &now
		next.Spec.AcquireTime = &now
		updated, err := e.leases.Update(ctx, next)
		if err == nil {
			e.lease = updated
			e.validUntil = time.Time{}
			return nil
		}
		if !apierrors.IsConflict(err) {
			return fmt.Errorf("releasing Lease %s: %w", e.key, err)
		}
		if lease, err = e.leases.Get(ctx, e.key); err != nil {
			return fmt.Errorf("reading Lease %s to release it: %w", e.key, err)
		}
	}
	return fmt.Errorf("releasing Lease %s: still conflicting after 3 attempts", e.key)
}

// wait is how long a standby waits for news of the Lease before it tries
// again: until the holder's term runs out (a millisecond past it, so that
// the next look finds it over), or one check interval after a try that
// failed. News (the watch's next event) ends the wait sooner.
func (e *Elector) wait(fallback time.Duration) time.Duration {
	now := e.clock.Now()
	if end, held := e.otherHoldEnd(now); held {
		return end.Sub(now) + time.Millisecond
	}
	return checkInterval(e.Period(fallback))
}
