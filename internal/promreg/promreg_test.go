package promreg

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestRegisterOrReuse(t *testing.T) {
	reg := prometheus.NewRegistry()
	opts := prometheus.CounterOpts{Name: "things_total", Help: "Things."}
	first, err := RegisterOrReuse(reg, prometheus.NewCounter(opts))
	if err != nil {
		t.Fatal(err)
	}
	second, err := RegisterOrReuse(reg, prometheus.NewCounter(opts))
	if err != nil {
		t.Fatalf("second registration: %v", err)
	}
	if first != second {
		t.Error("the second registration did not return the first collector")
	}
	// Same name, another type: not reusable, the registry's error stands.
	if _, err := RegisterOrReuse(reg, prometheus.NewGauge(prometheus.GaugeOpts{Name: "things_total", Help: "Things."})); err == nil {
		t.Error("a gauge under a counter's name was accepted")
	}
}
