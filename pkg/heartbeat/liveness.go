package heartbeat

import (
	"fmt"
	"net/http"
	"sync/atomic"
	"time"
)

// livenessSlack is added to the liveness window for what a step of the loop
// may take on top of its schedule: one bounded write and a busy node.
const livenessSlack = maxWriteTimeout

// LivenessWindow is how long a running Reporter may go without trying
// anything, a heartbeat as the leader or a look at the Lease as a standby,
// before Healthz fails: three periods and livenessSlack. Either role tries at
// least once a lease duration (1.75 periods) and a failing try is retried
// within a period, whatever the API server does, so only a wedged Reporter
// goes that long.
func LivenessWindow(period time.Duration) time.Duration {
	return 3*clampPeriod(period) + livenessSlack
}

// activity is when the Reporter last tried to heartbeat or to take the
// Lease, kept with its monotonic clock reading.
type activity struct{ at atomic.Pointer[time.Time] }

func (a *activity) mark(now time.Time) { a.at.Store(&now) }

// Healthz is a liveness check, in the shape of controller-runtime's
// healthz.Checker (mgr.AddHealthzCheck("heartbeat", r.Healthz)), as
// client-go's HealthzAdaptor is for its election: it fails when the
// Reporter has been started and has neither written nor tried to, as
// leader or standby, within LivenessWindow of the last period it saw. It
// never fails because the API server is down, or because this process is
// a standby: failed tries are tries. Before Start, and after it returns, it
// passes.
func (r *Reporter) Healthz(*http.Request) error {
	if !r.running.Load() {
		return nil
	}
	last := r.activity.at.Load()
	if last == nil {
		return nil
	}
	window := LivenessWindow(r.period())
	if idle := r.clock.Since(*last); idle > window {
		return fmt.Errorf("heartbeat: nothing tried for %s (more than %s, three periods and %s): the loop is stuck",
			idle.Round(time.Second), window, livenessSlack)
	}
	return nil
}
