package heartbeat

import (
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"k8s.io/client-go/rest"
	clocktesting "k8s.io/utils/clock/testing"
)

// clockSim plays an API server whose clock is offset from a fake local
// clock, for a serverClock that reads that local clock.
type clockSim struct {
	local *clocktesting.FakeClock
	// offset is the server's clock minus the local one.
	offset time.Duration
	// drift is how much faster the server's clock runs, in parts per million.
	drift float64
	rng   *rand.Rand
}

func newClockSim(offset time.Duration, seed uint64) *clockSim {
	// Half a second past a whole one, so that no phase is special.
	start := time.Date(2026, time.March, 1, 12, 0, 0, 5e8, time.UTC)
	return &clockSim{local: clocktesting.NewFakeClock(start), offset: offset, rng: rand.New(rand.NewPCG(seed, 1))}
}

func (s *clockSim) server() time.Time { return s.local.Now().Add(s.offset) }

// exchange is one request, gap after the last, that takes rtt; the server
// stamps its Date halfway.
func (s *clockSim) exchange(c *serverClock, gap, rtt time.Duration) {
	s.step(gap)
	sent := s.local.Now()
	s.step(rtt / 2)
	date := s.server().UTC().Format(http.TimeFormat)
	s.step(rtt - rtt/2)
	c.observe(sent, s.local.Now(), http.Header{"Date": {date}})
}

func (s *clockSim) step(d time.Duration) {
	s.local.Step(d)
	s.offset += time.Duration(float64(d) * s.drift / 1e6)
}

// varied makes n requests 1-3 s apart at random phases of the second, each
// taking 1-20 ms.
func (s *clockSim) varied(c *serverClock, n int) {
	for range n {
		s.exchange(c, time.Second+time.Duration(s.rng.Int64N(int64(2*time.Second))),
			time.Millisecond+time.Duration(s.rng.Int64N(int64(19*time.Millisecond))))
	}
}

// stepLocal steps the local clock by d; the server's clock goes on.
func (s *clockSim) stepLocal(d time.Duration) {
	s.local.SetTime(s.local.Now().Add(d))
	s.offset -= d
}

// checkNow checks that c.Now() is within the interval's width of server
// time, between local time and server time (the correction never
// overshoots), and that the interval holds the true offset.
func checkNow(t *testing.T, c *serverClock, s *clockSim) {
	t.Helper()
	est, unc, known := c.Offset()
	if !known {
		t.Fatal("offset unknown")
	}
	if d := s.offset - est; d > unc || d < -unc {
		t.Errorf("offset %v, want within %v ± %v", s.offset, est, unc)
	}
	now, local, server := c.Now(), s.local.Now(), s.server()
	// Corrected, Now errs by at most the interval's width; uncorrected
	// (the offset is not provably beyond the tolerance), by the offset,
	// which is at most the tolerance and that width.
	within := 2 * unc
	if now.Equal(local) {
		within += clockTolerance
	}
	if d := server.Sub(now); d > within || d < -within {
		t.Errorf("Now() is %v from server time, want within %v", d, within)
	}
	if lo, hi := minTime(local, server), maxTime(local, server); now.Before(lo) || now.After(hi) {
		t.Errorf("Now() %v is not between local %v and server %v time", now, local, server)
	}
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func TestServerClockSynced(t *testing.T) {
	tests := map[string]time.Duration{
		"same clock":       0,
		"5ms ahead (NTP)":  5 * time.Millisecond,
		"5ms behind (NTP)": -5 * time.Millisecond,
		"40ms ahead":       40 * time.Millisecond,
	}
	for name, offset := range tests {
		t.Run(name, func(t *testing.T) {
			s := newClockSim(offset, 1)
			c := newServerClock(s.local)
			if got := c.Now(); got != s.local.Now() {
				t.Fatalf("Now() = %v before any sample, want local %v", got, s.local.Now())
			}
			for i := range 200 {
				s.varied(c, 1)
				if got := c.Now(); got != s.local.Now() {
					_, unc, _ := c.Offset()
					t.Fatalf("sample %d: Now() = %v, want exactly local %v (uncertainty %v)", i, got, s.local.Now(), unc)
				}
			}
			checkNow(t, c, s)
		})
	}
}

func TestServerClockSkew(t *testing.T) {
	const period = 10 * time.Second
	tests := map[string]time.Duration{
		"+30s":                30 * time.Second,
		"-30s":                -30 * time.Second,
		"+3 periods":          3*period + 370*time.Millisecond,
		"-3 periods":          -3*period - 370*time.Millisecond,
		"+400ms":              400 * time.Millisecond,
		"-1h":                 -time.Hour,
		"booted at the epoch": time.Date(2026, time.March, 1, 12, 0, 0, 0, time.UTC).Sub(time.Unix(0, 0)),
	}
	for name, offset := range tests {
		t.Run(name, func(t *testing.T) {
			s := newClockSim(offset, 2)
			c := newServerClock(s.local)
			var uncs []string
			for i := 1; i <= 40; i++ {
				s.varied(c, 1)
				checkNow(t, c, s)
				if i == 1 || i == 5 || i == 10 || i == 20 || i == 40 {
					_, unc, _ := c.Offset()
					uncs = append(uncs, fmt.Sprintf("%d:%v", i, unc))
				}
			}
			t.Logf("uncertainty after n samples: %s; Now() - server = %v", strings.Join(uncs, " "), c.Now().Sub(s.server()))
			if _, unc, _ := c.Offset(); unc > 100*time.Millisecond {
				t.Errorf("uncertainty %v after 40 samples, want below 100ms", unc)
			}
			if c.steps != 0 {
				t.Errorf("%d steps detected, want none", c.steps)
			}
		})
	}
}

// Requests at the same phase of the second (a ticker's) do not narrow the
// interval, but Now stays within it.
func TestServerClockFixedPhase(t *testing.T) {
	s := newClockSim(-30*time.Second-250*time.Millisecond, 3)
	c := newServerClock(s.local)
	for range 40 {
		s.exchange(c, 10*time.Second, 5*time.Millisecond)
		checkNow(t, c, s)
	}
	_, unc, _ := c.Offset()
	t.Logf("uncertainty after 40 samples 10s apart: %v; Now() - server = %v", unc, c.Now().Sub(s.server()))
	if unc < 400*time.Millisecond || unc > 510*time.Millisecond {
		t.Errorf("uncertainty %v, want about half a second", unc)
	}
}

// Probes at the instants probeAt names narrow the interval a fixed-phase
// leader leaves at about a second down to clockNarrowWidth, within a run of
// clockProbes, whatever the offset's phase; then no more are asked for. A
// clock the serverClock does not correct is never probed.
func TestServerClockProbesNarrowACorrection(t *testing.T) {
	for _, offset := range []time.Duration{-3*time.Second - 250*time.Millisecond, -7*time.Second - 900*time.Millisecond,
		2*time.Second + 40*time.Millisecond, 45*time.Second + 600*time.Millisecond} {
		t.Run(offset.String(), func(t *testing.T) {
			s := newClockSim(offset, 4)
			c := newServerClock(s.local)
			for range 20 {
				s.exchange(c, time.Second, 5*time.Millisecond)
			}
			if _, unc, _ := c.Offset(); unc < 400*time.Millisecond {
				t.Fatalf("uncertainty %v at a fixed phase, want about half a second to start from", unc)
			}
			probes := 0
			for ; probes < clockProbes; probes++ {
				at, ok := c.probeAt(s.local.Now())
				if !ok {
					break
				}
				if d := at.Sub(s.local.Now()); d < clockProbeLead || d > clockProbeLead+time.Second {
					t.Fatalf("probe %s ahead, want within a second after %s", d, clockProbeLead)
				}
				s.exchange(c, at.Sub(s.local.Now()), 5*time.Millisecond)
				checkNow(t, c, s)
			}
			_, unc, _ := c.Offset()
			t.Logf("%d probes: uncertainty %v; Now() - server = %v", probes, unc, c.Now().Sub(s.server()))
			if 2*unc > clockNarrowWidth+time.Millisecond {
				t.Errorf("interval %v wide after %d probes, want at most %v", 2*unc, probes, clockNarrowWidth)
			}
			if _, ok := c.probeAt(s.local.Now()); ok {
				t.Error("a probe still asked for with the interval narrow")
			}
			// The leader's fixed-phase samples keep it narrow.
			for range 100 {
				s.exchange(c, time.Second, 5*time.Millisecond)
			}
			if _, u, _ := c.Offset(); 2*u > clockNarrowWidth+time.Millisecond {
				t.Errorf("interval %v wide 100 periods later", 2*u)
			}
		})
	}
	t.Run("synced", func(t *testing.T) {
		s := newClockSim(20*time.Millisecond, 5)
		c := newServerClock(s.local)
		for range 20 {
			s.exchange(c, time.Second, 5*time.Millisecond)
		}
		if at, ok := c.probeAt(s.local.Now()); ok {
			t.Errorf("a probe at %v for a clock within the tolerance", at)
		}
	})
}

func TestServerClockStep(t *testing.T) {
	tests := map[string]struct {
		step      time.Duration
		wantSteps uint64
	}{
		"local clock back 2 minutes":  {step: -2 * time.Minute, wantSteps: 1},
		"local clock ahead 2 minutes": {step: 2 * time.Minute, wantSteps: 1},
		"local clock back 3 periods":  {step: -30 * time.Second, wantSteps: 1},
		"local clock ahead 3 periods": {step: 30 * time.Second, wantSteps: 1},
		"local clock ahead 1s":        {step: time.Second, wantSteps: 1},
		"local clock back 500ms":      {step: -500 * time.Millisecond, wantSteps: 1},
		// Not a step: drift or API servers' clocks could differ that much.
		"local clock ahead 100ms": {step: 100 * time.Millisecond, wantSteps: 0},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s := newClockSim(0, 4)
			c := newServerClock(s.local)
			s.varied(c, 40)
			checkNow(t, c, s)
			s.stepLocal(tc.step)
			s.varied(c, 1)
			if tc.step > 2*time.Second || tc.step < -2*time.Second {
				// More than a sample's width: the first sample after it
				// proves it, and the window starts again from that sample.
				if c.steps != 1 || c.n != 1 {
					t.Errorf("%d steps, a window of %d samples after the step; want 1 and 1", c.steps, c.n)
				}
				checkNow(t, c, s)
			}
			// A small step is seen only once a sample disagrees, and the
			// window starts again then.
			s.varied(c, 80)
			checkNow(t, c, s)
			if _, unc, _ := c.Offset(); unc > 100*time.Millisecond {
				t.Errorf("uncertainty %v 80 samples after the step, want below 100ms", unc)
			}
			if c.steps != tc.wantSteps {
				t.Errorf("%d steps detected, want %d", c.steps, tc.wantSteps)
			}
		})
	}
}

// Clocks drifting apart (here at 200 ppm, an NTP daemon slewing) are
// followed by dropping the old samples, not counted as steps.
func TestServerClockDrift(t *testing.T) {
	for _, ppm := range []float64{200, -200} {
		t.Run(fmt.Sprint(ppm, "ppm"), func(t *testing.T) {
			s := newClockSim(2*time.Second, 5)
			s.drift = ppm
			c := newServerClock(s.local)
			start := s.offset
			for range 600 { // 20 minutes
				s.varied(c, 1)
				est, unc, _ := c.Offset()
				// The window may keep samples up to clockMaxAge old, which
				// the drift moved by up to 60ms.
				if d := s.offset - est; d > unc+60*time.Millisecond || d < -unc-60*time.Millisecond {
					t.Fatalf("offset %v, estimate %v ± %v", s.offset, est, unc)
				}
			}
			t.Logf("offset drifted by %v; estimate off by %v", s.offset-start, func() time.Duration { est, _, _ := c.Offset(); return s.offset - est }())
			if c.steps != 0 {
				t.Errorf("%d steps detected, want none", c.steps)
			}
		})
	}
}

func TestServerClockSlowResponse(t *testing.T) {
	s := newClockSim(30*time.Second, 6)
	c := newServerClock(s.local)

	// A slow first response: a wide interval, a correction only as far as it
	// proves.
	s.exchange(c, time.Second, 20*time.Second)
	checkNow(t, c, s)
	if _, unc, _ := c.Offset(); unc < 10*time.Second {
		t.Errorf("uncertainty %v after a 20s response, want above 10s", unc)
	}

	s.varied(c, 40)
	checkNow(t, c, s)
	c.mu.Lock()
	lo, hi := c.lo, c.hi
	c.mu.Unlock()
	// A slow response later narrows nothing: the interval only widens by
	// the drift allowed for the samples' 21 s more of age.
	s.exchange(c, time.Second, 20*time.Second)
	if c.lo > lo || c.hi < hi || lo-c.lo > 2*time.Millisecond || c.hi-hi > 2*time.Millisecond {
		t.Errorf("a slow response moved the interval from [%v, %v] to [%v, %v]", lo, hi, c.lo, c.hi)
	}
	checkNow(t, c, s)
}

func TestServerClockMalformedDate(t *testing.T) {
	tests := map[string][]string{
		"missing":          nil,
		"empty":            {""},
		"garbage":          {"yesterday"},
		"RFC 3339":         {"2026-03-01T12:00:00Z"},
		"unknown day name": {"Xyz, 01 Mar 2026 12:00:00 GMT"},
		"unknown month":    {"Sun, 01 Mrz 2026 12:00:00 GMT"},
		"day 32":           {"Sun, 32 Mar 2026 12:00:00 GMT"},
		"29 February 2026": {"Sun, 29 Feb 2026 12:00:00 GMT"},
		"day 00":           {"Sun, 00 Mar 2026 12:00:00 GMT"},
		"hour 24":          {"Sun, 01 Mar 2026 24:00:00 GMT"},
		"minute 60":        {"Sun, 01 Mar 2026 12:60:00 GMT"},
		"second 61":        {"Sun, 01 Mar 2026 12:00:61 GMT"},
		"not GMT":          {"Sun, 01 Mar 2026 12:00:00 UTC"},
		"sign in a number": {"Sun, +1 Mar 2026 12:00:00 GMT"},
		"far future":       {"Sun, 01 Mar 9999 12:00:00 GMT"},
	}
	for name, date := range tests {
		t.Run(name, func(t *testing.T) {
			s := newClockSim(0, 7)
			c := newServerClock(s.local)
			h := http.Header{}
			if date != nil {
				h["Date"] = date
			}
			c.observe(s.local.Now(), s.local.Now(), h)
			if _, _, known := c.Offset(); known || c.samples != 0 {
				t.Errorf("Date %q was recorded", date)
			}
			if got := c.Now(); got != s.local.Now() {
				t.Errorf("Now() = %v, want local %v", got, s.local.Now())
			}
		})
	}
}

func TestServerClockDateFormats(t *testing.T) {
	want := time.Date(2026, time.March, 1, 12, 34, 56, 0, time.UTC)
	tests := map[string]string{
		"IMF-fixdate":       "Sun, 01 Mar 2026 12:34:56 GMT",
		"RFC 850":           "Sunday, 01-Mar-26 12:34:56 GMT",
		"asctime":           "Sun Mar  1 12:34:56 2026",
		"wrong day of week": "Mon, 01 Mar 2026 12:34:56 GMT", // checked for syntax only, as by http.ParseTime
	}
	for name, v := range tests {
		t.Run(name, func(t *testing.T) {
			got, ok := parseHTTPDate(v)
			if !ok || !got.Equal(want) {
				t.Errorf("parseHTTPDate(%q) = %v, %v; want %v", v, got, ok, want)
			}
		})
	}
}

// The wrapper records every response of a real HTTP server through
// rest.Config.Wrap, and changes nothing of the exchange.
func TestServerClockTransport(t *testing.T) {
	const period = 10 * time.Second
	for name, skew := range map[string]time.Duration{"+3 periods": 3 * period, "-3 periods": -3 * period} {
		t.Run(name, func(t *testing.T) {
			s := newClockSim(skew, 9)
			c := newServerClock(s.local)
			var rtt time.Duration // read by the handler while the client waits
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body, _ := io.ReadAll(r.Body)
				s.step(rtt / 2)
				w.Header().Set("Date", s.server().UTC().Format(http.TimeFormat))
				w.Header().Set("X-Echo", r.Method+" "+r.Header.Get("X-Test")+" "+string(body))
				s.step(rtt - rtt/2)
				switch r.URL.Path {
				case "/fail":
					w.WriteHeader(http.StatusInternalServerError)
				case "/watch":
					w.WriteHeader(http.StatusOK)
					w.(http.Flusher).Flush()
					for i := range 3 {
						<-time.After(10 * time.Millisecond)
						fmt.Fprintf(w, "event %d\n", i)
						w.(http.Flusher).Flush()
					}
				default:
					fmt.Fprint(w, "ok")
				}
			}))
			defer srv.Close()

			cfg := &rest.Config{Host: srv.URL}
			cfg.Wrap(c.wrap)
			hc, err := rest.HTTPClientFor(cfg)
			if err != nil {
				t.Fatal(err)
			}
			do := func(method, path string) *http.Response {
				t.Helper()
				req, err := http.NewRequestWithContext(t.Context(), method, srv.URL+path, strings.NewReader("payload"))
				if err != nil {
					t.Fatal(err)
				}
				req.Header.Set("X-Test", "header")
				resp, err := hc.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				if got, want := resp.Header.Get("X-Echo"), method+" header payload"; got != want {
					t.Errorf("the server saw %q, want %q", got, want)
				}
				return resp
			}

			for i := range 40 {
				s.step(time.Second + time.Duration(s.rng.Int64N(int64(2*time.Second))))
				rtt = time.Millisecond + time.Duration(s.rng.Int64N(int64(19*time.Millisecond)))
				path := "/ok"
				if i%4 == 0 {
					path = "/fail" // error statuses count too
				}
				resp := do(http.MethodPost, path)
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if want := map[string]string{"/ok": "ok", "/fail": ""}[path]; string(body) != want {
					t.Errorf("body %q, want %q", body, want)
				}
				if c.samples != uint64(i+1) {
					t.Fatalf("%d samples after %d responses", c.samples, i+1)
				}
				checkNow(t, c, s)
			}
			_, unc, _ := c.Offset()
			t.Logf("uncertainty after 40 responses: %v; Now() - server = %v", unc, c.Now().Sub(s.server()))
			if unc > 100*time.Millisecond {
				t.Errorf("uncertainty %v after 40 responses, want below 100ms", unc)
			}

			// A watch counts once, when its headers arrive; its body is
			// passed through.
			resp := do(http.MethodGet, "/watch")
			if c.samples != 41 {
				t.Errorf("%d samples once the watch's headers arrived, want 41", c.samples)
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || string(body) != "event 0\nevent 1\nevent 2\n" {
				t.Errorf("watch body %q, %v", body, err)
			}
			if c.samples != 41 {
				t.Errorf("%d samples after the watch ended, want 41", c.samples)
			}
		})
	}
}

// fixedTransport answers every request with its response and error.
type fixedTransport struct {
	resp *http.Response
	err  error
}

func (f fixedTransport) RoundTrip(*http.Request) (*http.Response, error) { return f.resp, f.err }

func TestServerClockTransportError(t *testing.T) {
	s := newClockSim(time.Minute, 10)
	c := newServerClock(s.local)
	failed := errors.New("connection refused")
	resp := &http.Response{StatusCode: http.StatusBadGateway, Header: http.Header{"Date": {s.server().UTC().Format(http.TimeFormat)}}}
	rt := c.wrap(fixedTransport{resp, failed})
	req := httptest.NewRequest(http.MethodGet, "http://example.invalid/", nil)
	if got, err := rt.RoundTrip(req); got != resp || err != failed {
		t.Errorf("RoundTrip = %v, %v; want what the transport returned", got, err)
	}
	if c.samples != 0 {
		t.Errorf("a transport error was recorded")
	}
	ok := c.wrap(fixedTransport{resp: resp})
	if got, err := ok.RoundTrip(req); got != resp || err != nil {
		t.Errorf("RoundTrip = %v, %v; want what the transport returned", got, err)
	}
	if c.samples != 1 {
		t.Errorf("%d samples of a 502 response, want 1", c.samples)
	}
	if w, isWrapper := ok.(interface{ WrappedRoundTripper() http.RoundTripper }); !isWrapper || w.WrappedRoundTripper() == nil {
		t.Errorf("the wrapper does not unwrap")
	}
}

func TestServerClockConcurrent(t *testing.T) {
	s := newClockSim(-3*time.Second, 11)
	c := newServerClock(s.local)
	// Truthful samples, recorded from many goroutines in any order: all
	// hold the offset, so they always agree.
	type sample struct {
		sent, received time.Time
		h              http.Header
	}
	var samples []sample
	for range 800 {
		s.step(time.Duration(s.rng.Int64N(int64(300 * time.Millisecond))))
		sent := s.local.Now()
		s.step(time.Millisecond)
		h := http.Header{"Date": {s.server().UTC().Format(http.TimeFormat)}}
		s.step(time.Millisecond)
		samples = append(samples, sample{sent, s.local.Now(), h})
	}
	m, err := newMetrics(prometheus.NewRegistry(), "ns", "addon-instance")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := g; i < len(samples); i += 8 {
				c.observe(samples[i].sent, samples[i].received, samples[i].h)
				_ = c.Now()
			}
		})
	}
	for range 2 {
		wg.Go(func() {
			for range 500 {
				_ = c.Now()
				_, _, _ = c.Offset()
				_ = c.skew(10 * time.Second)
				c.updateMetrics(m)
			}
		})
	}
	wg.Wait()
	if c.samples != uint64(len(samples)) || c.steps != 0 {
		t.Errorf("%d samples and %d steps, want %d and none", c.samples, c.steps, len(samples))
	}
	checkNow(t, c, s)
}

func TestServerClockMetrics(t *testing.T) {
	m, err := newMetrics(prometheus.NewRegistry(), "ns", "addon-instance")
	if err != nil {
		t.Fatal(err)
	}
	value := func(c prometheus.Metric) float64 {
		var d dto.Metric
		if err := c.Write(&d); err != nil {
			t.Fatal(err)
		}
		if d.Counter != nil {
			return d.Counter.GetValue()
		}
		return d.Gauge.GetValue()
	}
	s := newClockSim(30*time.Second, 12)
	c := newServerClock(s.local)
	c.updateMetrics(m)
	if got := value(m.clockUncertainty); !math.IsInf(got, 1) {
		t.Errorf("uncertainty %v before any sample, want +Inf", got)
	}
	s.varied(c, 40)
	c.updateMetrics(m)
	est, unc, _ := c.Offset()
	if got := value(m.clockOffset); got != est.Seconds() {
		t.Errorf("offset gauge %v, want %v", got, est.Seconds())
	}
	if got := value(m.clockUncertainty); got != unc.Seconds() {
		t.Errorf("uncertainty gauge %v, want %v", got, unc.Seconds())
	}
	s.stepLocal(time.Minute)
	s.varied(c, 1)
	s.stepLocal(-time.Minute)
	s.varied(c, 1)
	c.updateMetrics(m)
	c.updateMetrics(m)
	if got := value(m.clockSteps); got != 2 {
		t.Errorf("steps counter %v, want 2", got)
	}
	s.stepLocal(time.Minute)
	s.varied(c, 1)
	c.updateMetrics(m)
	if got := value(m.clockSteps); got != 3 {
		t.Errorf("steps counter %v, want 3", got)
	}
}

func TestServerClockSkewLarge(t *testing.T) {
	tests := map[string]struct {
		offset  time.Duration
		period  time.Duration
		samples int
		want    bool
	}{
		"synced":                     {offset: 0, period: 10 * time.Second, samples: 40, want: false},
		"4s behind, 10s period":      {offset: 4 * time.Second, period: 10 * time.Second, samples: 40, want: false},
		"6s behind, 10s period":      {offset: 6 * time.Second, period: 10 * time.Second, samples: 40, want: true},
		"6s ahead, 10s period":       {offset: -6 * time.Second, period: 10 * time.Second, samples: 40, want: true},
		"700ms behind, 1s period":    {offset: 700 * time.Millisecond, period: time.Second, samples: 40, want: true},
		"700ms behind, 10s period":   {offset: 700 * time.Millisecond, period: 10 * time.Second, samples: 40, want: false},
		"not proven: 5.2s, 1 sample": {offset: 5200 * time.Millisecond, period: 10 * time.Second, samples: 1, want: false},
		"unknown":                    {offset: time.Hour, period: 10 * time.Second, samples: 0, want: false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s := newClockSim(tc.offset, 13)
			c := newServerClock(s.local)
			s.varied(c, tc.samples)
			got := c.skew(tc.period)
			if got.large != tc.want {
				t.Errorf("skew = %+v, want large %v", got, tc.want)
			}
			est, unc, known := c.Offset()
			if got.known != known || got.offset != est || got.uncertainty != unc || got.correction != c.Now().Sub(s.local.Now()) {
				t.Errorf("skew = %+v, want Offset's %v ± %v (%v) and Now's correction %v", got, est, unc, known, c.Now().Sub(s.local.Now()))
			}
		})
	}
}

func TestServerClockNoAllocation(t *testing.T) {
	s := newClockSim(30*time.Second, 14)
	c := newServerClock(s.local)
	s.varied(c, 100)
	resp := &http.Response{StatusCode: http.StatusOK, Header: http.Header{"Date": {s.server().UTC().Format(http.TimeFormat)}}}
	rt := c.wrap(fixedTransport{resp: resp})
	req := httptest.NewRequest(http.MethodGet, "http://example.invalid/", nil)
	if n := testing.AllocsPerRun(1000, func() { _, _ = rt.RoundTrip(req); _ = c.Now() }); n != 0 {
		t.Errorf("%v allocations per response, want none", n)
	}
}

func BenchmarkServerClockRoundTrip(b *testing.B) {
	s := newClockSim(30*time.Second, 15)
	c := newServerClock(s.local)
	s.varied(c, 100)
	resp := &http.Response{StatusCode: http.StatusOK, Header: http.Header{"Date": {s.server().UTC().Format(http.TimeFormat)}}}
	rt := c.wrap(fixedTransport{resp: resp})
	req := httptest.NewRequest(http.MethodGet, "http://example.invalid/", nil)
	b.ReportAllocs()
	for b.Loop() {
		_, _ = rt.RoundTrip(req)
	}
}
