//go:build go1.25

package heartbeat

import (
	"fmt"
	"math"
	"testing"
	"time"

	"k8s.io/utils/clock"
)

// skewedClock is the real clock set wrong by skew. Now keeps the monotonic
// reading, so durations measured on it are exact, as on a real node whose
// clock is merely set wrong.
type skewedClock struct {
	clock.RealClock
	skew time.Duration
}

func (c skewedClock) Now() time.Time                  { return time.Now().Add(c.skew) }
func (c skewedClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

// skew puts every clock of a Reporter on c (a tweak for startReporter).
func skew(c clock.WithTicker) func(*Reporter) {
	return func(r *Reporter) {
		r.clock = c
		r.limiter.clock = c
		r.serverClock.local = c
	}
}

// A reporter whose clock is 3 periods off either way writes heartbeats in
// the API server's time, so the operator's rule (a heartbeat at most 3
// periods old by its clock, which follows the server's) holds: written by the
// node's clock, each heartbeat would be 3 periods old (a timeout at once) or
// 3 periods in the future (a dead addon hidden for as long). The API server
// of the suite runs on this machine's clock, which the test reads as server
// time. The reporter exports the offset it found and says once that it is
// large.
func TestHeartbeatsAreInTheAPIServersTimeWhateverTheNodesClock(t *testing.T) {
	const period = 2 * time.Second
	for _, off := range []time.Duration{-3 * period, 0, 3 * period} {
		t.Run(fmt.Sprintf("node clock off by %s", off), func(t *testing.T) {
			ns := newNamespace(t)
			createInstance(t, ns, "addon-instance", period)
			rec := record(t, ns, "addon-instance")
			rn := startReporter(t, adminCfg, Options{Namespace: ns, Name: "addon-instance", Identity: "pod-a"},
				skew(skewedClock{skew: off}))
			beats := rec.waitBeats(t, 4, 20*time.Second)
			for _, b := range beats {
				// lastHeartbeatTime has second precision, and the offset is
				// known to within the Date header's second: a heartbeat is
				// written up to 1s before server time when the node is behind,
				// up to 1s after it when ahead, and stored truncated to the
				// second. Off by the skew, it would be 6s from server time.
				age := b.at.Sub(b.hb)
				if age < -1100*time.Millisecond || age > 2500*time.Millisecond {
					t.Errorf("heartbeat %s seen at %s: %s old by server time, want within [-1.1s, 2.5s]",
						b.hb.Format(time.RFC3339), b.at.Format(time.RFC3339Nano), age)
				}
				if age+period > 3*period {
					t.Errorf("heartbeat %s would time out before the next one (3 x %s rule)", b.hb.Format(time.RFC3339), period)
				}
			}
			est := rn.metric(t, "addon_heartbeat_clock_offset_seconds")
			unc := rn.metric(t, "addon_heartbeat_clock_offset_uncertainty_seconds")
			if want := -off.Seconds(); math.Abs(est-want) > unc+0.1 || unc > 1 {
				t.Errorf("addon_heartbeat_clock_offset_seconds = %.3f ± %.3f, want %.3f", est, unc, want)
			}
			said := rn.logs.count("differs from the API server's")
			if off != 0 && said != 1 {
				t.Errorf("the log says %d times that the clock is off, want once:\n%s", said, rn.logs)
			}
			if off == 0 && said != 0 {
				t.Errorf("the log says the clock is off with a synced clock:\n%s", rn.logs)
			}
		})
	}
}
