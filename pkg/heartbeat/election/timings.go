package election

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
)

// MinPeriod is the shortest period the election follows: a shorter one
// (announced on a Lease, or asked for) is followed at it.
const MinPeriod = time.Second

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
	period = max(period, MinPeriod)
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

// checkInterval is how long a standby waits to try again after a try that
// failed: the retry period for the period the holder announced, less up to
// 10% so that standbys started together drift apart.
func checkInterval(period time.Duration) time.Duration {
	r := Timings(period).RetryPeriod
	return r - time.Duration(rand.Int64N(int64(r)/10+1))
}

func (t LeaseTimings) String() string {
	return fmt.Sprintf("lease %s, renew %s, retry %s", t.LeaseDuration, t.RenewDeadline, t.RetryPeriod)
}
