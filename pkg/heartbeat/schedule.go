package heartbeat

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"time"

	addonsv1alpha1 "github.com/openshift/addon-operator/apis/addons/v1alpha1"
)

const (
	// DefaultPeriod applies when spec.heartbeatUpdatePeriod is zero (the CRD
	// defaults it to the same value).
	DefaultPeriod = addonsv1alpha1.DefaultAddonInstanceHeartbeatUpdatePeriod
	// MinPeriod is the shortest period the reporter follows: a smaller spec
	// value is raised to it so that a typo cannot turn the reporter into a
	// load test of the API server.
	MinPeriod = time.Second
	// maxWriteTimeout bounds one status write, conflict retries included.
	maxWriteTimeout = 10 * time.Second
	// maxHealthTimeout bounds the health URL check.
	maxHealthTimeout = 2 * time.Second
	// minBackoff is the shortest wait after a failed heartbeat.
	minBackoff = 100 * time.Millisecond
)

// Period is the heartbeat period an AddonInstance asks for: its
// spec.heartbeatUpdatePeriod, DefaultPeriod when unset, at least MinPeriod.
func Period(ai *addonsv1alpha1.AddonInstance) time.Duration {
	if ai == nil {
		return DefaultPeriod
	}
	return clampPeriod(ai.Spec.HeartbeatUpdatePeriod.Duration)
}

// clampPeriod is the period heartbeats follow for a requested one: the floor
// for anything below it, 0 included (an explicit 0s is stored as it is: the
// CRD default applies only to an absent field). The addon-operator then
// judges by the requested period and times the addon out whatever it does;
// heartbeating as often as the reporter allows comes closest.
func clampPeriod(p time.Duration) time.Duration {
	return max(p, MinPeriod)
}

// WriteTimeout bounds one heartbeat (health check and status write with its
// conflict retries): half a period, at most 10s, so that a slow API server
// delays a heartbeat but never makes two overlap.
func WriteTimeout(period time.Duration) time.Duration {
	return min(period/2, maxWriteTimeout)
}

// healthTimeout bounds the health URL check: a quarter period, at most 2s.
func healthTimeout(period time.Duration) time.Duration {
	return min(period/4, maxHealthTimeout)
}

// nextTick is the first scheduled tick (origin + k x period, k >= 1) after
// now. Ticks missed while a write or a backoff took long are skipped, not
// caught up in a burst.
func nextTick(origin time.Time, period time.Duration, now time.Time) time.Time {
	if now.Before(origin) {
		return origin.Add(period)
	}
	k := now.Sub(origin)/period + 1
	return origin.Add(k * period)
}

// lastTick is the latest scheduled tick at or before now.
func lastTick(origin time.Time, period time.Duration, now time.Time) time.Time {
	if now.Before(origin) {
		return origin
	}
	return origin.Add(now.Sub(origin) / period * period)
}

// nextBackoff doubles the wait after each consecutive failure, from
// max(100ms, period/10) up to one period.
func nextBackoff(prev, period time.Duration) time.Duration {
	if prev <= 0 {
		return min(max(minBackoff, period/10), period)
	}
	return min(prev*2, period)
}

// LeaseTimings are the leader election settings for one heartbeat period.
type LeaseTimings struct {
	// LeaseDuration is how long a standby waits, after it last saw the
	// Lease renewed, before it takes the Lease over.
	LeaseDuration time.Duration
	// RenewDeadline is how long the leader keeps leading without a
	// successful renewal; shorter than LeaseDuration so that it has stopped
	// writing before any standby may start.
	RenewDeadline time.Duration
	// RetryPeriod is how soon a standby tries again after a try that
	// failed (an error, or another replica was faster) when no news of the
	// Lease comes first.
	RetryPeriod time.Duration
}

// Timings derives the leader election settings from the heartbeat period P.
// Each tick the leader writes its heartbeat and then renews the Lease, so it
// writes the Lease once per period and every renewal comes right after a
// heartbeat that went through (see term.beat); the settings are:
//
//   - renew deadline 1.5P: the hold a renewal gives. The next heartbeat goes
//     out a period after the renewal, on that hold, with half a period to
//     spare for its conflict retries and for a retry after a failed write;
//   - lease duration 1.75P: how long a standby waits after it last saw the
//     Lease renewed. It exceeds the renew deadline by P/4, so that a
//     heartbeat sent at the very end of a hold and slow to arrive still
//     lands before a successor's: a write slowed by up to 0.75P (the time
//     from its tick to the end of the standby's wait) lands in order, and one
//     slowed by more is what the chart's fencing policy refuses;
//   - retry period (after a failed try) P/2.
//
// A leader killed (or cut off, or unable to write) renewed the Lease last
// right after its last heartbeat. Standbys watch the Lease, see that renewal
// as it happens and take the Lease one lease duration later: the gap is
// 1.75P plus the watch's delay and the new leader's start and first write,
// under 2P when the API server answers in a few hundredths of a period, and
// under the operator's 3P while the watch lags by up to a period. A watch
// that lags so much that a standby misses renewals only delays a takeover:
// its try meets a conflict, it reads the Lease and waits again. A leader
// that stops cleanly releases the Lease and a standby takes it as the watch
// brings the release.
//
// The Lease's spec.leaseDurationSeconds holds the lease duration rounded up
// to whole seconds, for other readers; replicas judge expiry by the exact
// duration for the period announced on the Lease (PeriodAnnotation).
func Timings(period time.Duration) LeaseTimings {
	period = clampPeriod(period)
	lease := period * 7 / 4
	return LeaseTimings{
		LeaseDuration: lease,
		RenewDeadline: lease - period/4,
		RetryPeriod:   period / 2,
	}
}

// leaseSeconds is a lease duration as spec.leaseDurationSeconds stores it:
// whole seconds, rounded up so that a reader of that field never judges a
// Lease expired before its holder does.
func leaseSeconds(d time.Duration) int32 {
	return int32((d + time.Second - 1) / time.Second)
}

// LeaseName is the Lease that elects the one writer for an AddonInstance:
// "addon-heartbeat-<instance>", shortened with a hash suffix when it would
// exceed 63 characters so that it is also a valid label value.
func LeaseName(instance string) string {
	const prefix = "addon-heartbeat-"
	name := prefix + instance
	if len(name) <= 63 {
		return name
	}
	sum := sha256.Sum256([]byte(instance))
	suffix := hex.EncodeToString(sum[:])[:10]
	return strings.TrimRight(name[:63-len(suffix)-1], ".-") + "-" + suffix
}
