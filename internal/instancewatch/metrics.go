package instancewatch

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/addon-heartbeat/addon-heartbeat/internal/promslot"
)

// Metric names. Every replica of the webhook exports them (each watches
// every AddonInstance); alert rules aggregate over the replicas.
const (
	MetricLastHeartbeat  = "addon_heartbeat_instance_last_heartbeat_timestamp_seconds"
	MetricPeriod         = "addon_heartbeat_instance_period_seconds"
	MetricReporterPeriod = "addon_heartbeat_instance_reporter_period_seconds"
	MetricCreated        = "addon_heartbeat_instance_created_timestamp_seconds"
	MetricPeriodInvalid  = "addon_heartbeat_instance_period_invalid"
)

const (
	// collectTimeout bounds one scrape's listing (from memory: it never
	// waits in practice).
	collectTimeout   = 5 * time.Second
	metricsHelpWatch = " From the webhook's watch of AddonInstances, so it is there whether or not any reporter runs."
)

// The labels are the reporters' own (pkg/heartbeat), so that the two join.
var instanceLabels = []string{"namespace", "addon_instance"}

var (
	descLastHeartbeat = prometheus.NewDesc(MetricLastHeartbeat,
		"Unix time of the AddonInstance's status.lastHeartbeatTime; absent before its first heartbeat."+metricsHelpWatch,
		instanceLabels, nil)
	descPeriod = prometheus.NewDesc(MetricPeriod,
		"The AddonInstance's spec.heartbeatUpdatePeriod: the addon-operator reports a heartbeat older than 3 of these as timed out."+metricsHelpWatch,
		instanceLabels, nil)
	descReporterPeriod = prometheus.NewDesc(MetricReporterPeriod,
		"The period the heartbeat reporter follows for the AddonInstance: the requested one, or the reporter's 1s floor when it asks for less (0s included)."+metricsHelpWatch,
		instanceLabels, nil)
	descCreated = prometheus.NewDesc(MetricCreated,
		"Unix time the AddonInstance was created."+metricsHelpWatch,
		instanceLabels, nil)
	descPeriodInvalid = prometheus.NewDesc(MetricPeriodInvalid,
		"1 when the AddonInstance's spec.heartbeatUpdatePeriod is not a duration (then it has no period series)."+metricsHelpWatch,
		instanceLabels, nil)
)

// Lister returns every AddonInstance the webhook knows of.
type Lister func(ctx context.Context) ([]Instance, error)

// ErrNotSynced is returned by a Lister whose cache has not synced yet.
var ErrNotSynced = errors.New("the AddonInstance cache has not synced yet")

// CacheLister lists the AddonInstances of c (set up with CacheOptions),
// without waiting for the cache: before it has synced, ErrNotSynced, so that
// a scrape neither blocks nor reports a partial list.
func CacheLister(c cache.Cache) Lister {
	return func(ctx context.Context) ([]Instance, error) {
		inf, err := c.GetInformer(ctx, &Object{}, cache.BlockUntilSynced(false))
		if err != nil {
			return nil, fmt.Errorf("getting the AddonInstance informer: %w", err)
		}
		if !inf.HasSynced() {
			return nil, ErrNotSynced
		}
		list := &ObjectList{}
		// Read only: the cached objects need no copy.
		if err := c.List(ctx, list, client.UnsafeDisableDeepCopy); err != nil {
			return nil, fmt.Errorf("listing AddonInstances from the cache: %w", err)
		}
		out := make([]Instance, 0, len(list.Items))
		for i := range list.Items {
			out = append(out, FromObject(&list.Items[i]))
		}
		return out, nil
	}
}

// Collector exports the gauges of every AddonInstance at each scrape, from
// the Lister in its Slot: a deleted AddonInstance's series go with it. One
// Collector is registered per process; each webhook run sets its Lister.
type Collector struct {
	promslot.Slot[Lister]
}

var _ prometheus.Collector = &Collector{}

// Describe sends the gauges' descriptors.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descLastHeartbeat, descPeriod, descReporterPeriod, descCreated, descPeriodInvalid} {
		ch <- d
	}
}

// Collect sends the gauges of every AddonInstance; none while the Lister
// fails (an unsynced cache at start-up, for example).
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	l, ok := c.Get()
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), collectTimeout)
	defer cancel()
	instances, err := l(ctx)
	if err != nil {
		return
	}
	for _, m := range Metrics(instances) {
		ch <- m
	}
}

// Metrics are the gauges of instances.
func Metrics(instances []Instance) []prometheus.Metric {
	var out []prometheus.Metric
	gauge := func(d *prometheus.Desc, v float64, in Instance) {
		out = append(out, prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, in.Namespace, in.Name))
	}
	for _, in := range instances {
		gauge(descCreated, unixSeconds(in.Created), in)
		if !in.LastHeartbeat.IsZero() {
			gauge(descLastHeartbeat, unixSeconds(in.LastHeartbeat), in)
		}
		p, err := in.Periods()
		if err != nil {
			gauge(descPeriodInvalid, 1, in)
			continue
		}
		gauge(descPeriodInvalid, 0, in)
		gauge(descPeriod, p.Requested.Seconds(), in)
		gauge(descReporterPeriod, p.Followed.Seconds(), in)
	}
	return out
}

func unixSeconds(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }
