package heartbeat

import (
	"time"

	addonsv1alpha1 "github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/internal/addonsv1alpha1"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/election"
)

const (
	// DefaultPeriod applies when spec.heartbeatUpdatePeriod is zero (the CRD
	// defaults it to the same value).
	DefaultPeriod = addonsv1alpha1.DefaultAddonInstanceHeartbeatUpdatePeriod
	// MinPeriod is the shortest period the reporter follows: a smaller spec
	// value is raised to it so that a typo cannot turn the reporter into a
	// load test of the API server. The election follows the same floor.
	MinPeriod = election.MinPeriod
	// maxWriteTimeout bounds one status write, conflict retries included.
	maxWriteTimeout = 10 * time.Second
	// maxHealthTimeout bounds the health URL check.
	maxHealthTimeout = 2 * time.Second
	// minBackoff is the shortest wait after a failed heartbeat.
	minBackoff = 100 * time.Millisecond
)

// Period is the heartbeat period the reporter follows for an AddonInstance
// whose spec.heartbeatUpdatePeriod is requested: at least MinPeriod.
func Period(requested time.Duration) time.Duration {
	return clampPeriod(requested)
}

// instancePeriod is the period ai asks for: DefaultPeriod when there is no
// AddonInstance (yet).
func instancePeriod(ai *addonsv1alpha1.AddonInstance) time.Duration {
	if ai == nil {
		return DefaultPeriod
	}
	return Period(ai.Spec.HeartbeatUpdatePeriod.Duration)
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
