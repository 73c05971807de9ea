package admission

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/addon-heartbeat/addon-heartbeat/internal/promreg"
	"github.com/addon-heartbeat/addon-heartbeat/internal/version"
)

// Metrics are the webhook's own Prometheus metrics. Dry-run reviews carry
// dry_run="true", so that dashboards and alerts on real injections can leave
// them out.
type Metrics struct {
	Reviews  *prometheus.CounterVec
	Duration *prometheus.HistogramVec
}

// NewMetrics creates the metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		Reviews: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "addon_heartbeat_webhook_reviews_total",
			Help: "Admission reviews answered, by outcome (injected, unchanged, removed, denied, bad_request) and dry run.",
		}, []string{"outcome", "dry_run"}),
		Duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "addon_heartbeat_webhook_review_duration_seconds",
			Help: "Time to answer an admission review, from the first byte read to the response written, by outcome.",
			// Up to 30s, the longest timeoutSeconds a webhook can have, with
			// a bound at each common timeout, so that a p99 over the
			// configured one (an alert) can be told from the histogram.
			Buckets: []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 0.5, 1, 2, 3, 5, 10, 15, 20, 30},
		}, []string{"outcome"}),
	}
	var err error
	if m.Reviews, err = promreg.RegisterOrReuse(reg, m.Reviews); err != nil {
		return nil, err
	}
	if m.Duration, err = promreg.RegisterOrReuse(reg, m.Duration); err != nil {
		return nil, err
	}
	if _, err = promreg.RegisterOrReuse(reg, version.NewCollector("webhook", version.Get())); err != nil {
		return nil, err
	}
	return m, nil
}

func (m *Metrics) observe(outcome string, dryRun bool, d time.Duration) {
	if m == nil {
		return
	}
	m.Reviews.WithLabelValues(outcome, strconv.FormatBool(dryRun)).Inc()
	m.Duration.WithLabelValues(outcome).Observe(d.Seconds())
}
