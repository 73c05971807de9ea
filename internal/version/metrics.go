package version

import "github.com/prometheus/client_golang/prometheus"

// BuildInfoName is the metric both binaries export: always 1, its labels
// say which build is running, as Prometheus' own <program>_build_info does.
const BuildInfoName = "addon_heartbeat_build_info"

// NewCollector is the build_info metric of component (webhook or reporter).
func NewCollector(component string, i Info) prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: BuildInfoName,
		Help: "The running build: version, revision, Go version and platform, with value 1.",
		ConstLabels: prometheus.Labels{
			"component": component, "version": i.Version, "revision": i.Revision,
			"goversion": i.GoVersion, "platform": i.Platform,
		},
	})
	g.Set(1)
	return g
}
