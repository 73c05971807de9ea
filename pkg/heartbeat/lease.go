package heartbeat

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
)

// PeriodAnnotation on the election Lease holds the heartbeat period the
// leader follows, so that standbys pace their checks by it without reading
// the AddonInstance.
const PeriodAnnotation = "addon-heartbeat.io/period"

// InstanceAnnotation on the election Lease names the AddonInstance it elects
// the writer for. The holder sets it with every renewal; the chart's fencing
// policy (a ValidatingAdmissionPolicy with the Lease as its param) reads it
// to find the Lease of the AddonInstance whose status is written, since
// LeaseName's hash suffix cannot be computed in CEL.
const InstanceAnnotation = "addon-heartbeat.io/addon-instance"

// ProcessAnnotation on the election Lease is a random token of the holding
// process, fresh at each start: two processes given the same Identity tell
// each other apart by it (see Options.Identity).
const ProcessAnnotation = "addon-heartbeat.io/holder-process"

// errLeaseLost means another holder has the Lease: the term ends at once.
var errLeaseLost = errors.New("the Lease has another holder")

// leaseLock is this process's side of the election Lease, in the style of
// client-go's leader election but paced by the heartbeat: the leader renews
// the Lease in the same tick as each heartbeat (one Lease write per period,
// not one per retry period), and standbys watch it (one event per renewal,
// no reads).
//
// Expiry is judged as client-go does, by the local time at which this
// process last saw the holder's record change, never by comparing clocks
// across machines.
type leaseLock struct {
	kube     *kube
	key      types.NamespacedName
	identity string
	// process tells this process from others with the same identity (an
	// earlier run of it, or a second process misconfigured with the same
	// Options.Identity): ProcessAnnotation on the records it writes.
	process string
	// instance is the AddonInstance this Lease elects for
	// (InstanceAnnotation).
	instance string
	clock    clock.PassiveClock

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
	// Reporter.boundHold). Zero: no bound.
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
func (l *leaseLock) observe(lease *coordinationv1.Lease, version string, now time.Time) {
	l.see(lease, now, l.unbroken)
	l.unbroken = true
	if version != "" {
		l.lastVersion = version
	}
}

// observeRead records a version of the Lease read at now (nil: none).
func (l *leaseLock) observeRead(lease *coordinationv1.Lease, now time.Time) {
	l.see(lease, now, false)
	l.awaiting = ""
	l.lastVersion = ""
	if lease != nil {
		l.lastVersion = lease.ResourceVersion
	}
	// A watch from the version read continues from it; without one (no
	// Lease), its first event reports the state it starts from.
	l.unbroken = lease != nil
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
func (l *leaseLock) see(lease *coordinationv1.Lease, now time.Time, unbroken bool) {
	if l.lease != nil && (lease == nil || lease.UID != l.lease.UID) {
		// The Lease is gone, or is another object of the same name: the
		// holder of the one gone keeps its term to the end (see fence).
		if l.recordHeld() {
			if f := (fenceRecord{from: l.observedAt, claim: l.claimed()}); !l.fenceEnd(l.fence).After(l.fenceEnd(f)) {
				l.fence = f
			}
		}
	}
	l.behindSince = time.Time{}
	if lease != nil && (lease.UID == l.awaiting || l.awaiting == awaitAny) {
		l.awaiting = ""
	}
	id := vacancyID(lease)
	switch {
	case !vacant(lease):
		l.vacantSince, l.vacancyKnown, l.vacantID = time.Time{}, false, ""
	case unbroken && !vacant(l.lease):
		// The record seen went, in view: its holder is fenced.
		l.vacantSince, l.vacancyKnown, l.vacantID = time.Time{}, true, id
	case unbroken && (l.vacancyKnown || !l.vacantSince.IsZero()):
		// The same vacancy, still in view.
		l.vacantID = id
	case lease == nil:
		// Missing, seen with a gap: nothing to judge until the object
		// made in its place is seen.
		l.vacantSince, l.vacancyKnown, l.vacantID = time.Time{}, false, ""
	case id == l.vacantID && (l.vacancyKnown || !l.vacantSince.IsZero()):
		// The same object as judged, not written since: no hold came
		// and went in between.
	default:
		l.vacantSince, l.vacancyKnown, l.vacantID = now, false, id
	}
	if lease == nil || l.lease == nil || !apiequality.Semantic.DeepEqual(l.lease.Spec, lease.Spec) ||
		lease.Annotations[ProcessAnnotation] != l.lease.Annotations[ProcessAnnotation] {
		l.observedAt = now
	}
	l.lease = lease
}

// fenceRecord is the record of a Lease gone: when it was seen and the
// duration it claimed.
type fenceRecord struct {
	from  time.Time
	claim time.Duration
}

// fenceEnd is when the hold of a record gone ends, bounded as a live one.
func (l *leaseLock) fenceEnd(f fenceRecord) time.Time {
	if f.from.IsZero() {
		return time.Time{}
	}
	d := f.claim
	if l.maxDuration > 0 {
		d = min(d, l.maxDuration)
	}
	return f.from.Add(d)
}

// recordHeld reports whether the last record seen is a hold by another
// holder.
func (l *leaseLock) recordHeld() bool {
	return l.lease != nil && ptr.Deref(l.lease.Spec.HolderIdentity, "") != "" && (l.yielded || !l.ownedBy(l.lease))
}

// yield is called when a term ends while the process runs on. When the last
// record is still this process's own, the term ended because it failed to
// heartbeat or renew within its hold (a renewal follows only a heartbeat
// written): its own record then counts as another's until it expires, as
// every standby judges it, and a retry period more, so that a standby that
// can write takes it first. Taking it back at once would keep a replica that
// cannot write (its ServiceAccount may not, or its requests fail) in the
// Lease forever while another could write. A lone replica takes its record
// back half a period after it expires (2.25 periods after its last
// heartbeat), once its requests go through again.
func (l *leaseLock) yield() {
	l.yielded = l.lease != nil && l.ownedBy(l.lease)
}

// heldByOther reports whether another holder's term is still running at now.
func (l *leaseLock) heldByOther(now time.Time) bool {
	_, held := l.otherHoldEnd(now)
	return held
}

// otherHoldEnd is when another holder's term ends, if one is running at now:
// the record's (never while there is no Lease), or the fence of a Lease that
// was deleted. Another holder is another identity, or this identity written
// by another process (see ownedBy).
func (l *leaseLock) otherHoldEnd(now time.Time) (time.Time, bool) {
	var end time.Time
	if l.recordHeld() {
		end = l.observedAt.Add(l.duration())
		if l.yielded && l.ownedBy(l.lease) {
			// Its own record, given up: a retry period more, so that a
			// standby that can write (it looks as the record expires)
			// takes it first.
			end = end.Add(Timings(l.period(DefaultPeriod)).RetryPeriod)
		}
	}
	if f := l.fenceEnd(l.fence); f.After(end) {
		end = f
	}
	if !l.vacantSince.IsZero() && l.vacancyWait > 0 {
		if v := l.vacantSince.Add(l.vacancyWait); v.After(end) {
			end = v
		}
	}
	return end, now.Before(end)
}

// ownedBy reports whether the record of lease is this process's own hold: its
// identity, written by this process. A record of this identity without
// ProcessAnnotation was written by an earlier version, which did not set
// it, and counts as this process's, as it did then.
func (l *leaseLock) ownedBy(lease *coordinationv1.Lease) bool {
	if ptr.Deref(lease.Spec.HolderIdentity, "") != l.identity {
		return false
	}
	p, ok := lease.Annotations[ProcessAnnotation]
	return !ok || p == l.process
}

// heldBySameIdentity reports whether the record is held under this
// process's identity by another process.
func (l *leaseLock) heldBySameIdentity() bool {
	return l.lease != nil && ptr.Deref(l.lease.Spec.HolderIdentity, "") == l.identity && !l.ownedBy(l.lease)
}

// duration is how long the holder's record is good for: what it claims (see
// claimed), but never more than maxDuration.
func (l *leaseLock) duration() time.Duration {
	d := l.claimed()
	if l.maxDuration > 0 {
		d = min(d, l.maxDuration)
	}
	return d
}

// claimed is the duration the holder's record claims: exact for the period
// the holder announced, else the whole seconds of the record.
func (l *leaseLock) claimed() time.Duration {
	if l.lease == nil {
		return 0
	}
	if p, err := time.ParseDuration(l.lease.Annotations[PeriodAnnotation]); err == nil {
		return Timings(p).LeaseDuration
	}
	return time.Duration(ptr.Deref(l.lease.Spec.LeaseDurationSeconds, 0)) * time.Second
}

// period is the heartbeat period the holder announced, or fallback.
func (l *leaseLock) period(fallback time.Duration) time.Duration {
	if l.lease != nil {
		if p, err := time.ParseDuration(l.lease.Annotations[PeriodAnnotation]); err == nil {
			return clampPeriod(p)
		}
	}
	return fallback
}

// record fills spec and the period annotation for a hold by this process
// that starts or continues at now.
func (l *leaseLock) record(lease *coordinationv1.Lease, period time.Duration, now time.Time) {
	t := Timings(period)
	spec := &lease.Spec
	if !l.ownedBy(lease) {
		if ptr.Deref(spec.HolderIdentity, "") != "" {
			spec.LeaseTransitions = ptr.To(ptr.Deref(spec.LeaseTransitions, 0) + 1)
		}
		spec.HolderIdentity = ptr.To(l.identity)
		spec.AcquireTime = &metav1.MicroTime{Time: now}
	}
	spec.LeaseDurationSeconds = ptr.To(leaseSeconds(t.LeaseDuration))
	spec.RenewTime = &metav1.MicroTime{Time: now}
	if lease.Annotations == nil {
		lease.Annotations = map[string]string{}
	}
	lease.Annotations[PeriodAnnotation] = period.String()
	if l.instance != "" {
		lease.Annotations[InstanceAnnotation] = l.instance
	}
	if l.process != "" {
		lease.Annotations[ProcessAnnotation] = l.process
	}
}

// acquire takes the Lease when the last version seen (nil: there is none)
// is free, expired or already this process's, and reports whether this
// process now holds it. When the write meets another (a replica was faster,
// the Lease was deleted, or the version seen was stale because a watch
// lags), this process's view is behind: it waits for the watch to bring
// what it missed, in order, and reads the Lease only when nothing comes
// within a retry period (see behind). An error is one of the API server's.
func (l *leaseLock) acquire(ctx context.Context, period time.Duration) (bool, error) {
	now := l.clock.Now()
	if !l.behindSince.IsZero() {
		if now.Sub(l.behindSince) < checkInterval(period) {
			return false, nil
		}
		if err := l.refresh(ctx); err != nil {
			return false, err
		}
	}
	if l.lease == nil {
		// Made at once, even while a fence runs, so that it is there
		// (and seen) when the fence ends.
		return false, l.makeVacant(ctx)
	}
	if l.heldByOther(now) {
		return false, nil
	}
	next := l.lease.DeepCopy()
	l.record(next, period, now)
	taken, err := l.kube.updateLease(ctx, next)
	switch {
	case err == nil:
		l.took(taken, period, now)
		return true, nil
	case apierrors.IsConflict(err), apierrors.IsNotFound(err):
		l.behindSince = now
		return false, nil
	default:
		return false, fmt.Errorf("taking Lease %s: %w", l.key, err)
	}
}

// awaitAny, as leaseLock.awaiting, waits for whichever Lease object the watch
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
func (l *leaseLock) makeVacant(ctx context.Context) error {
	if l.awaiting != "" {
		return nil // on its way
	}
	lease := &coordinationv1.Lease{ObjectMeta: leaseMeta(l.key)}
	if l.instance != "" {
		// Named for the fencing policy from the start: with no holder,
		// it admits no heartbeat until a take.
		lease.Annotations = map[string]string{InstanceAnnotation: l.instance}
	}
	made, err := l.kube.createLease(ctx, lease)
	switch {
	case err == nil:
		l.awaiting = made.UID
		return nil
	case apierrors.IsAlreadyExists(err):
		// Made by another process (or the webhook) meanwhile: the watch
		// brings it after everything before it. A read would see it
		// sooner, but as a sighting with a gap (see vacantSince), which
		// would throw away a vacancy known from the watch.
		l.awaiting = awaitAny
		return nil
	case apierrors.IsForbidden(err):
		// The zero-code reporter role has no create (RBAC cannot limit
		// it by name): the webhook creates the Lease when it binds the
		// role, and the watch brings it.
		return fmt.Errorf("the election Lease %s does not exist yet and this reporter may not create it; "+
			"it is made by whoever provisions the reporter's RBAC (the webhook, once the AddonInstance exists): %w", l.key, err)
	default:
		return fmt.Errorf("making Lease %s: %w", l.key, err)
	}
}

// refresh reads the Lease into the lock.
func (l *leaseLock) refresh(ctx context.Context) error {
	lease, err := l.kube.getLease(ctx, l.key)
	if apierrors.IsNotFound(err) {
		l.observeRead(nil, l.clock.Now())
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading Lease %s: %w", l.key, err)
	}
	l.observeRead(lease, l.clock.Now())
	return nil
}

// took records a successful write of this process's hold, sent at sent.
func (l *leaseLock) took(lease *coordinationv1.Lease, period time.Duration, sent time.Time) {
	l.yielded = false
	l.lease = lease
	l.observedAt = sent
	l.validUntil = sent.Add(Timings(period).RenewDeadline)
}

// renew extends this process's hold for period. errLeaseLost means another
// holder has taken it; any other error leaves the hold as it was (valid
// until validUntil).
func (l *leaseLock) renew(ctx context.Context, period time.Duration) error {
	now := l.clock.Now()
	next := l.lease.DeepCopy()
	l.record(next, period, now)
	updated, err := l.kube.updateLease(ctx, next)
	if apierrors.IsConflict(err) {
		// Someone wrote the Lease since: read it to learn whether it is
		// still this process's (a label edit) or taken.
		fresh, gerr := l.kube.getLease(ctx, l.key)
		if apierrors.IsNotFound(gerr) {
			// Deleted (a PUT over a deleted object conflicts).
			l.observeRead(nil, l.clock.Now())
			return errLeaseLost
		}
		if gerr != nil {
			return fmt.Errorf("reading Lease %s after a conflict: %w", l.key, gerr)
		}
		l.observeRead(fresh, now)
		if l.heldBySameIdentity() {
			return fmt.Errorf("%w: another process with the identity %q wrote it (each process needs an identity of its own)",
				errLeaseLost, l.identity)
		}
		if !l.ownedBy(fresh) {
			return errLeaseLost
		}
		next = fresh.DeepCopy()
		l.record(next, period, now)
		updated, err = l.kube.updateLease(ctx, next)
	}
	if apierrors.IsNotFound(err) {
		l.observeRead(nil, l.clock.Now())
		return errLeaseLost
	}
	if err != nil {
		return fmt.Errorf("renewing Lease %s: %w", l.key, err)
	}
	l.took(updated, period, now)
	return nil
}

// release hands the Lease back so that a standby takes it at its next check
// instead of waiting for it to expire: no holder, a one-second duration. It
// retries conflicts against a fresh read while the Lease is still ours.
func (l *leaseLock) release(ctx context.Context) error {
	lease := l.lease
	for attempt := 0; attempt < 3; attempt++ {
		if lease == nil || !l.ownedBy(lease) {
			return nil
		}
		next := lease.DeepCopy()
		now := metav1.MicroTime{Time: l.clock.Now()}
		next.Spec.HolderIdentity = nil
		next.Spec.LeaseDurationSeconds = ptr.To[int32](1)
		next.Spec.RenewTime = &now
		next.Spec.AcquireTime = &now
		updated, err := l.kube.updateLease(ctx, next)
		if err == nil {
			l.lease = updated
			l.validUntil = time.Time{}
			return nil
		}
		if !apierrors.IsConflict(err) {
			return fmt.Errorf("releasing Lease %s: %w", l.key, err)
		}
		if lease, err = l.kube.getLease(ctx, l.key); err != nil {
			return fmt.Errorf("reading Lease %s to release it: %w", l.key, err)
		}
	}
	return fmt.Errorf("releasing Lease %s: still conflicting after 3 attempts", l.key)
}

// wait is how long a standby waits for news of the Lease before it tries
// again: until the holder's term runs out (a millisecond past it, so that
// the next look finds it over), or one check interval after a try that
// failed. News (the watch's next event) ends the wait sooner.
func (l *leaseLock) wait(fallback time.Duration) time.Duration {
	now := l.clock.Now()
	if end, held := l.otherHoldEnd(now); held {
		return end.Sub(now) + time.Millisecond
	}
	return checkInterval(l.period(fallback))
}

// checkInterval is how long a standby waits to try again after a try that
// failed: the retry period for the period the holder announced, less up to
// 10% so that standbys started together drift apart.
func checkInterval(period time.Duration) time.Duration {
	r := Timings(period).RetryPeriod
	return r - time.Duration(rand.Int64N(int64(r)/10+1))
}
