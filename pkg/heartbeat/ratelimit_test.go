//go:build go1.25

package heartbeat

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	clocktesting "k8s.io/utils/clock/testing"
)

func TestErrorLimiterLogsEachDistinctErrorOncePerInterval(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Unix(0, 0))
	l := newErrorLimiter(clk, time.Minute)
	var lines []string
	log := funcr.New(func(prefix, args string) { lines = append(lines, args) }, funcr.Options{})
	forbidden := errors.New(`leases "x" is forbidden`)
	other := errors.New("connection refused")

	for range 10 {
		l.logError(log, forbidden, "heartbeat forbidden")
	}
	l.logError(log, other, "heartbeat failed")
	if len(lines) != 2 {
		t.Fatalf("logged %d lines, want 2 (one per distinct error): %v", len(lines), lines)
	}
	clk.SetTime(clk.Now().Add(61 * time.Second))
	l.logError(log, forbidden, "heartbeat forbidden")
	if len(lines) != 3 || !strings.Contains(lines[2], `"repeatedSinceLastLog"=9`) {
		t.Fatalf("after the interval: %v", lines)
	}
}

func TestRateLimitedSinkPassesInfoAndLimitsErrors(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Unix(0, 0))
	var lines []string
	base := funcr.New(func(prefix, args string) { lines = append(lines, prefix+" "+args) }, funcr.Options{})
	log := rateLimited(base, newErrorLimiter(clk, time.Minute)).WithName("watch").WithValues("reflector", "x")
	err := errors.New("forbidden")
	for range 5 {
		log.Info("attempting")
		log.Error(err, "failed to list")
	}
	if len(lines) != 6 {
		t.Fatalf("logged %d lines, want 5 infos and 1 error: %v", len(lines), lines)
	}
	if !strings.Contains(lines[1], "watch") || !strings.Contains(lines[1], `"reflector"="x"`) {
		t.Errorf("name or values lost: %q", lines[1])
	}
	if got := rateLimited(logr.Discard(), newErrorLimiter(clk, time.Minute)); got.GetSink() != nil {
		t.Errorf("a discarding logger became %v", got)
	}
}
