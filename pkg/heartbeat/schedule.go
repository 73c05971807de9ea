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

func clampPeriod(p time.Duration) time.Duration {
	switch {
	case p <= 0:
		return DefaultPeriod
	case p < MinPeriod:
		return MinPeriod
	default:
		return p
	}
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
	LeaseDuration time.Duration
	RenewDeadline time.Duration
	RetryPeriod   time.Duration
}

// Timings derives the leader election settings from the heartbeat period P:
// lease duration P (whole seconds, at least 1s, as a Lease stores seconds),
// renew deadline 2/3 of it, retry period P/4 (at least 200ms).
//
// The operator times a heartbeat out after 3P. If a leader is killed without
// releasing its Lease, the gap it leaves is at most: P since its last
// heartbeat, plus up to one retry period before a standby sees the last
// renewal, plus the lease duration, plus one more retry period (with client-go's
// 1.2 jitter) before the standby tries again: P + 0.25P + P + 0.3P = 2.55P,
// plus one write. A leader that stops cleanly (SIGTERM) releases its Lease and
// a standby takes over within one retry period.
func Timings(period time.Duration) LeaseTimings {
	lease := max(period.Truncate(time.Second), time.Second)
	return LeaseTimings{
		LeaseDuration: lease,
		RenewDeadline: lease * 2 / 3,
		RetryPeriod:   max(period/4, 200*time.Millisecond),
	}
}

// timingsStale reports whether timings chosen for oldPeriod no longer
// guarantee a takeover within 3 x newPeriod. Longer periods are always
// covered; a period shorter than about 2/3 of the old one is not.
func timingsStale(oldPeriod, newPeriod time.Duration) bool {
	return newPeriod*3 < oldPeriod*2
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
