package heartbeat

import (
	"errors"
	"math"

	"github.com/prometheus/client_golang/prometheus"
)

// Failure reasons, the "reason" label of the failures counter.
const (
	failConflict    = "conflict"
	failForbidden   = "forbidden"
	failNotFound    = "not_found"
	failTimeout     = "timeout"
	failUnavailable = "unavailable"
	failOther       = "other"
	// failHoldEnded: the write was not sent, the Lease's hold having ended.
	failHoldEnded = "hold_ended"
	// failFenced: the fencing policy refused the write: the Lease names
	// another holder, or none (see IsFenced).
	failFenced = "fenced"
)

// metrics are one Reporter's Prometheus series, labelled with its
// AddonInstance's namespace and name.
type metrics struct {
	sent        prometheus.Counter
	failed      *prometheus.CounterVec
	lastSuccess prometheus.Gauge
	latency     prometheus.Observer
	leader      prometheus.Gauge
	conflicts   prometheus.Counter
	elections   *prometheus.CounterVec
	// asked is the period the AddonInstance asks for, and used the one
	// heartbeats follow: they differ when the spec is below the floor.
	asked, used prometheus.Gauge
	// clockOffset is the estimate of the API server's clock minus the local
	// one, clockUncertainty its half-width (+Inf until known), and
	// clockSteps counts the jumps of that offset (see serverClock).
	clockOffset, clockUncertainty prometheus.Gauge
	clockSteps                    prometheus.Counter
}

// Results of an attempt to take the election Lease, the "result" label.
const (
	electionAcquired = "acquired"
	electionHeld     = "held_by_other"
	electionError    = "error"
	// electionWaiting: neither held nor taken: the missing Lease is being
	// made, or the process waits for its watch to bring a newer version.
	electionWaiting = "waiting"
)

var instanceLabels = []string{"namespace", "addon_instance"}

func newMetrics(reg prometheus.Registerer, namespace, name string) (*metrics, error) {
	sent := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "addon_heartbeat_heartbeats_sent_total",
		Help: "Heartbeats written to the AddonInstance status.",
	}, instanceLabels)
	failed := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "addon_heartbeat_heartbeats_failed_total",
		Help: "Heartbeats that could not be written, by reason (conflict, forbidden, not_found, timeout, unavailable, other).",
	}, append(instanceLabels, "reason"))
	last := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "addon_heartbeat_last_success_timestamp_seconds",
		Help: "Unix time of the last heartbeat written.",
	}, instanceLabels)
	latency := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "addon_heartbeat_write_duration_seconds",
		Help:    "Duration of one heartbeat status write, conflict retries included.",
		Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10},
	}, instanceLabels)
	leader := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "addon_heartbeat_is_leader",
		Help: "1 while this process is the one writer for the AddonInstance.",
	}, instanceLabels)
	conflicts := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "addon_heartbeat_conflicts_retried_total",
		Help: "Status write conflicts retried against fresh state.",
	}, instanceLabels)
	elections := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "addon_heartbeat_election_attempts_total",
		Help: "Looks at the election Lease by a standby (each change its watch brings, a hold running out, a retry), by result (acquired, held_by_other, waiting, error).",
	}, append(instanceLabels, "result"))

	asked := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "addon_heartbeat_period_requested_seconds",
		Help: "The AddonInstance's spec.heartbeatUpdatePeriod, as the leader last saw it.",
	}, instanceLabels)
	used := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "addon_heartbeat_period_seconds",
		Help: "The period the leader heartbeats at: the requested one, or the 1s floor when it asks for less (0 included).",
	}, instanceLabels)

	clockOffset := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "addon_heartbeat_clock_offset_seconds",
		Help: "The API server's clock minus this node's wall clock, estimated from the Date of its responses (the midpoint of the interval they prove); heartbeats correct by it when it is provably more than 50ms.",
	}, instanceLabels)
	clockUncertainty := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "addon_heartbeat_clock_offset_uncertainty_seconds",
		Help: "Half-width of the interval addon_heartbeat_clock_offset_seconds lies in (+Inf while no response carried a Date).",
	}, instanceLabels)
	clockSteps := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "addon_heartbeat_clock_steps_total",
		Help: "Jumps of more than 250ms of the offset to the API server's clock (a step of this node's clock, or of the server's), after which its estimate starts again.",
	}, instanceLabels)

	var err error
	register := func(c prometheus.Collector) prometheus.Collector {
		if e := reg.Register(c); e != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(e, &are) {
				return are.ExistingCollector
			}
			err = errors.Join(err, e)
		}
		return c
	}
	sent = register(sent).(*prometheus.CounterVec)
	failed = register(failed).(*prometheus.CounterVec)
	last = register(last).(*prometheus.GaugeVec)
	latency = register(latency).(*prometheus.HistogramVec)
	leader = register(leader).(*prometheus.GaugeVec)
	conflicts = register(conflicts).(*prometheus.CounterVec)
	elections = register(elections).(*prometheus.CounterVec)
	asked = register(asked).(*prometheus.GaugeVec)
	used = register(used).(*prometheus.GaugeVec)
	clockOffset = register(clockOffset).(*prometheus.GaugeVec)
	clockUncertainty = register(clockUncertainty).(*prometheus.GaugeVec)
	clockSteps = register(clockSteps).(*prometheus.CounterVec)
	if err != nil {
		return nil, err
	}
	l := prometheus.Labels{"namespace": namespace, "addon_instance": name}
	failedCurried, err := failed.CurryWith(l)
	if err != nil {
		return nil, err
	}
	electionsCurried, err := elections.CurryWith(l)
	if err != nil {
		return nil, err
	}
	uncertainty := clockUncertainty.With(l)
	uncertainty.Set(math.Inf(1))
	return &metrics{
		sent:        sent.With(l),
		failed:      failedCurried,
		lastSuccess: last.With(l),
		latency:     latency.With(l),
		leader:      leader.With(l),
		conflicts:   conflicts.With(l),
		elections:   electionsCurried,
		asked:       asked.With(l),
		used:        used.With(l),

		clockOffset:      clockOffset.With(l),
		clockUncertainty: uncertainty,
		clockSteps:       clockSteps.With(l),
	}, nil
}
