//go:build tools

// Package tools pins the Prometheus server and promtool that the tests run:
// `promtool check rules` / `promtool test rules` on the chart's rules
// (test/chart) and a real Prometheus scraping the webhook and the reporters
// (test/e2e). hack/prometheus-binaries.sh builds both from this module.
package tools

import (
	_ "github.com/prometheus/prometheus/cmd/prometheus"
	_ "github.com/prometheus/prometheus/cmd/promtool"
)
