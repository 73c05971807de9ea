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

// errLeaseLost means another holder has the Lease: the term ends at once.
var errLeaseLost = errors.New("the Lease has another holder")

// leaseLock is this process's side of the election Lease, in the style of
// client-go's leader election but paced by the heartbeat: the leader renews
// the Lease in the same tick as each heartbeat (one Lease write per period,
// not one per retry period), and standbys only read it.
//
// Expiry is judged as client-go does, by the local time at which this
// process last saw the holder's record change, never by comparing clocks
// across machines.
type leaseLock struct {
	kube     *kube
	key      types.NamespacedName
	identity string
	clock    clock.PassiveClock

	// lease is the last version read or written.
	lease *coordinationv1.Lease
	// observedAt is when the record (holder, renewal, duration) last changed
	// as seen by this process.
	observedAt time.Time
	// validUntil is, while leading, when this process's hold ends by its own
	// clock: the send time of its last successful write plus RenewDeadline.
	validUntil time.Time
}

// observe records a version of the Lease read at now.
func (l *leaseLock) observe(lease *coordinationv1.Lease, now time.Time) {
	if l.lease == nil || !apiequality.Semantic.DeepEqual(l.lease.Spec, lease.Spec) {
		l.observedAt = now
	}
	l.lease = lease
}

// heldByOther reports whether another holder's term is still running at now.
func (l *leaseLock) heldByOther(now time.Time) bool {
	spec := l.lease.Spec
	holder := ptr.Deref(spec.HolderIdentity, "")
	if holder == "" || holder == l.identity {
		return false
	}
	return now.Before(l.observedAt.Add(l.duration()))
}

// duration is how long the holder's record is good for: exact for the period
// the holder announced, else the whole seconds of the record.
func (l *leaseLock) duration() time.Duration {
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
	if ptr.Deref(spec.HolderIdentity, "") != l.identity {
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
}

// tryAcquire reads the Lease once and takes it when it is free, expired or
// already this process's. It reports whether this process now holds it; an
// error is one of the API server's.
func (l *leaseLock) tryAcquire(ctx context.Context, period time.Duration) (bool, error) {
	now := l.clock.Now()
	lease, err := l.kube.getLease(ctx, l.key)
	if apierrors.IsNotFound(err) {
		lease = &coordinationv1.Lease{ObjectMeta: leaseMeta(l.key)}
		l.record(lease, period, now)
		created, err := l.kube.createLease(ctx, lease)
		if apierrors.IsAlreadyExists(err) {
			return false, nil // another replica was faster; the next check sees it
		}
		if err != nil {
			return false, fmt.Errorf("creating Lease %s: %w", l.key, err)
		}
		l.took(created, period, now)
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading Lease %s: %w", l.key, err)
	}
	l.observe(lease, now)
	if l.heldByOther(now) {
		return false, nil
	}
	next := lease.DeepCopy()
	l.record(next, period, now)
	updated, err := l.kube.updateLease(ctx, next)
	if apierrors.IsConflict(err) {
		return false, nil // taken or renewed meanwhile; the next check sees it
	}
	if err != nil {
		return false, fmt.Errorf("taking Lease %s: %w", l.key, err)
	}
	l.took(updated, period, now)
	return true, nil
}

// took records a successful write of this process's hold, sent at sent.
func (l *leaseLock) took(lease *coordinationv1.Lease, period time.Duration, sent time.Time) {
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
		if gerr != nil {
			return fmt.Errorf("reading Lease %s after a conflict: %w", l.key, gerr)
		}
		l.observe(fresh, now)
		if ptr.Deref(fresh.Spec.HolderIdentity, "") != l.identity {
			return errLeaseLost
		}
		next = fresh.DeepCopy()
		l.record(next, period, now)
		updated, err = l.kube.updateLease(ctx, next)
	}
	if apierrors.IsNotFound(err) {
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
		if lease == nil || ptr.Deref(lease.Spec.HolderIdentity, "") != l.identity {
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

// wait is how long a standby waits before it looks at the Lease again: one
// check interval, or until the holder's term runs out when that is sooner,
// so that a Lease left to expire is taken as it expires rather than up to a
// check interval later. While the holder renews, the term never runs out
// before the next regular check sees the renewal, so this adds no reads.
func (l *leaseLock) wait(fallback time.Duration) time.Duration {
	d := checkInterval(l.period(fallback))
	if l.lease == nil {
		return d
	}
	now := l.clock.Now()
	if !l.heldByOther(now) {
		return d
	}
	// A millisecond past the end, so that the next look finds it over.
	return min(d, l.observedAt.Add(l.duration()).Sub(now)+time.Millisecond)
}

// checkInterval is how long a standby waits between two reads of the Lease:
// the retry period for the period the holder announced, less up to 10% so
// that standbys started together drift apart (never more, which would
// stretch the takeover bound).
func checkInterval(period time.Duration) time.Duration {
	r := Timings(period).RetryPeriod
	return r - time.Duration(rand.Int64N(int64(r)/10+1))
}
