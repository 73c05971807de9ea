package webhook

import (
	"testing"

	"github.com/addon-heartbeat/addon-heartbeat/internal/version"
)

// The running webhook says which build it is on /metrics.
func TestBuildInfoMetric(t *testing.T) {
	mf, ok := scrape(t)[version.BuildInfoName]
	if !ok || len(mf.GetMetric()) != 1 {
		t.Fatalf("/metrics has no single %s: %v", version.BuildInfoName, mf)
	}
	labels := map[string]string{}
	for _, l := range mf.GetMetric()[0].GetLabel() {
		labels[l.GetName()] = l.GetValue()
	}
	own := version.Get()
	if labels["component"] != "webhook" || labels["version"] != own.Version || labels["goversion"] != own.GoVersion ||
		mf.GetMetric()[0].GetGauge().GetValue() != 1 {
		t.Errorf("%s: labels %v value %v; want component webhook, version %s", version.BuildInfoName, labels, mf.GetMetric()[0].GetGauge().GetValue(), own.Version)
	}
}
