package heartbeat

import (
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"
)

// The addon-operator judges lastHeartbeatTime by its own clock: a heartbeat
// older than 3 periods by that clock is a timeout. A reporter on a node whose
// clock is behind by more than about 2 periods would make a healthy addon
// time out; one whose clock is ahead would hide a dead addon for as long. The
// serverClock estimates the offset of the API server's clock (the cluster's
// reference, which the operator's clock follows) from the Date header of the
// API server's responses, so that such a node writes server time instead.

// Bounds of the serverClock's estimator.
const (
	// clockSamples is the most samples the estimate keeps: a fixed ring, so
	// memory is bounded whatever the request rate (24 KiB). It holds
	// clockMaxAge of a leader's samples at the 1 s floor (two requests a
	// period), so that the narrow samples of a probe (see probeAt) count for
	// as long as their age allows at any period.
	clockSamples = 1024
	// clockMaxAge is how old (by local time) a sample may be and still count:
	// the two clocks drift apart, so old samples stop being evidence.
	clockMaxAge = 5 * time.Minute
	// clockDriftPPM is the drift between the clocks the samples allow for:
	// a sample's interval widens by this rate as it ages (as NTP's dispersion
	// does), 15 ms at clockMaxAge. Clocks that drift apart faster (an
	// undisciplined clock, a daemon slewing at up to 500 ppm) make the window
	// disagree sooner and start again more often: less narrow, still right.
	clockDriftPPM = 50
	// clockStepMin is the least jump of the offset counted as a clock step:
	// once the samples since a disagreement prove that the offset moved by
	// more than this from the window before it (more than drift within
	// clockMaxAge explains, even at 500 ppm), that counts as one step.
	// Smaller disagreements (drift, API server replicas whose clocks differ
	// by some milliseconds) start the window again all the same, uncounted.
	clockStepMin = 250 * time.Millisecond
	// clockTolerance is the offset the serverClock lives with: Now corrects
	// local time only when the offset is provably larger. NTP keeps clocks
	// within a few milliseconds of each other, which can be provable (the
	// interval narrows to about a round trip) yet matters nothing to a
	// heartbeat judged against 3 periods (3 s at the least); below the
	// tolerance the reporter writes its local time exactly, as it would
	// without the serverClock.
	clockTolerance = 50 * time.Millisecond
	// clockMaxSkew bounds a sample's offset, so that a nonsensical Date cannot
	// overflow a Duration; a node that boots at the Unix epoch without a
	// real-time clock is still within it until 2070.
	clockMaxSkew = 100 * 365 * 24 * time.Hour
	// httpDateResolution is the resolution of the Date header (RFC 7231
	// IMF-fixdate): the server stamps the time truncated to the second.
	httpDateResolution = time.Second
	// clockNarrowWidth is the widest interval a correction lives with
	// before probes narrow it (see probeAt): a correction errs by up to the
	// interval's width toward local time, and lastHeartbeatTime by up to a
	// second more (it is stored to the second), which a heartbeat judged
	// against 3 periods of 1 s cannot afford after a failover (1.75
	// periods) when the width is the second a fixed-phase leader's samples
	// leave it at.
	clockNarrowWidth = 100 * time.Millisecond
	// clockProbes bounds one run of probes: each halves the interval (less a
	// round trip), so that a second comes down to clockNarrowWidth in four;
	// the rest are for slow round trips.
	clockProbes = 8
	// clockProbeEvery spaces runs of probes: the samples of one count for
	// clockMaxAge, so a run every half of that keeps a narrow interval.
	clockProbeEvery = clockMaxAge / 2
)

// serverClock estimates offset = API server's clock - local wall clock from
// the Date headers of the API server's responses, and corrects local time by
// it (Now) when it provably matters. Create it with newServerClock and record
// responses by wrapping the client's transport with wrap. It is safe for
// concurrent use; recording a response takes a lock for a pass over at most
// clockSamples samples and allocates nothing.
//
// Each response bounds the offset: the server stamped Date at a server time
// in [Date, Date+1s), while local time was in [sent, received], so
// offset ∈ [Date - received, Date + 1s - sent]. The estimate is the
// intersection of the intervals of the window: the samples since the last
// disagreement (at most clockSamples, none older than clockMaxAge, each
// widened by clockDriftPPM of its age). Samples stamped at different
// sub-second phases narrow it well below a second, to about a round trip; a
// slow response gives a wide interval, which narrows nothing. Requests at a
// fixed phase of the second (a ticker's) do not narrow it: it stays about a
// second wide.
//
// A sample that disagrees with the window (the intersection would be empty:
// a clock stepped, or drifted faster than allowed) starts the window again
// from itself alone, so that the interval holds the offset again at once.
// When the samples since then prove the offset moved by more than
// clockStepMin from the window before, that is counted as a step (of the
// local clock, or of the server's). A step smaller than the samples' width
// may go unseen by the first samples after it, which agree with the window:
// until one disagrees, the interval may be off by up to that step.
type serverClock struct {
	local clock.PassiveClock
	// correction is what Now adds to local time (nanoseconds), kept apart
	// so that Now takes no lock.
	correction atomic.Int64

	mu   sync.Mutex // guards what follows
	ring [clockSamples]clockSample
	head int // index in ring of the newest sample
	n    int // samples in the window: ring[head], ring[head-1], ...
	// lo and hi bound the offset: the intersection of the window, when n > 0.
	lo, hi time.Duration
	// steps counts the detected clock steps; stepsReported is the part of
	// them already added to the metrics.
	steps, stepsReported uint64
	// before is the window a disagreement ended, while the samples since
	// have not yet shown whether the offset stepped from it: it is what
	// steps are measured from.
	before struct {
		pending bool
		lo, hi  time.Duration
		at      int64 // the local wall time of its newest sample
	}
	// samples counts the responses whose Date was recorded.
	samples uint64
}

// clockSample is what one response proves.
type clockSample struct {
	// lo and hi bound the offset.
	lo, hi time.Duration
	// at is the local wall time the response arrived (Unix nanoseconds),
	// for the sample's age.
	at int64
}

// newServerClock returns a serverClock that reads local time from local
// (clock.RealClock{} in production) and knows no offset yet.
func newServerClock(local clock.PassiveClock) *serverClock {
	return &serverClock{local: local}
}

// Now is the time to write (lastHeartbeatTime, condition times): local time,
// corrected by the offset only when the offset is provably larger than
// clockTolerance, i.e. when the whole interval [lo, hi] lies beyond it on one
// side of zero. A cluster whose clocks are synced writes exactly its local
// time (the same time.Time local.Now() returns, monotonic reading included).
//
// The correction is the interval's edge nearest zero, not its midpoint: the
// smallest offset the responses prove. So the time written lies between
// local time and server time, never past server time: a node that is behind
// never writes a time in the server's future (which would hide a dead addon
// for as long), and a node that is ahead writes less far in the future than
// its clock. Its error is at most the interval's width (2 x uncertainty: about
// a round trip once samples at varied phases narrowed it, about 1 s at most),
// against the midpoint's half-width. That costs at most a second of the
// operator's 3-period margin, where the skew this corrects cost more than 2
// periods. And the correction moves continuously as the interval narrows or
// slides, instead of jumping by half the width when the interval starts or
// stops crossing zero.
func (c *serverClock) Now() time.Time {
	t := c.local.Now()
	if d := time.Duration(c.correction.Load()); d != 0 {
		return t.Add(d)
	}
	return t
}

// probeAt is the local time at which a request would split the interval in
// two, when a correction applies (the offset is provably beyond
// clockTolerance) and the interval is wider than clockNarrowWidth; ok is
// false otherwise. Requests at a fixed phase of the second (a leader's, each
// period) leave the interval about a second wide; one timed for when the
// server's second turns over if the offset were the interval's midpoint is
// stamped either before that turn (the offset is at most the midpoint) or
// after it (at least the midpoint, less the round trip), as htpdate times its
// requests. It is at least clockProbeLead from now.
func (c *serverClock) probeAt(now time.Time) (at time.Time, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == 0 || c.correction.Load() == 0 || c.hi-c.lo <= clockNarrowWidth {
		return time.Time{}, false
	}
	mid := c.lo + (c.hi-c.lo)/2
	// now in server time, by the midpoint, and its next turn of a second.
	turn := now.Round(0).Add(mid + clockProbeLead).Truncate(time.Second).Add(time.Second)
	return now.Add(turn.Sub(now.Round(0).Add(mid))), true
}

// clockProbeLead is the least time before a probe: so that it is not due
// before it can be sent.
const clockProbeLead = 10 * time.Millisecond

// Offset is the estimate of the API server's clock minus the local wall
// clock: the midpoint of the interval the samples prove, and its half-width.
// The offset lies within estimate ± uncertainty (given a server that stamps
// Date truthfully). known is false, and the durations 0, until a response
// carried a valid Date.
func (c *serverClock) Offset() (estimate, uncertainty time.Duration, known bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == 0 {
		return 0, 0, false
	}
	return c.lo + (c.hi-c.lo)/2, (c.hi - c.lo + 1) / 2, true
}

// clockSkew is the serverClock's state for the caller to log: it logs when
// large changes.
type clockSkew struct {
	// offset and uncertainty are Offset's.
	offset, uncertainty time.Duration
	// correction is what Now adds to local time.
	correction time.Duration
	// known is false until a response carried a valid Date.
	known bool
	// large says the offset is provably more than half a period (either
	// way). The operator times a heartbeat out 3 periods after it, and the
	// heartbeat is up to 1 period old when judged, so a skew of about 2
	// periods times a healthy addon out (or, ahead, hides a dead one that
	// long) without the correction. Half a period is a quarter of that
	// headroom: said before it hurts, and far above the milliseconds of
	// synced clocks (5 s at the default 10 s period, 0.5 s at the 1 s floor),
	// so it means the node's time keeping is broken.
	large bool
}

// skew reports the offset against period (the period heartbeats follow).
func (c *serverClock) skew(period time.Duration) clockSkew {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == 0 {
		return clockSkew{}
	}
	corr := time.Duration(c.correction.Load())
	return clockSkew{
		offset:      c.lo + (c.hi-c.lo)/2,
		uncertainty: (c.hi - c.lo + 1) / 2,
		correction:  corr,
		known:       true,
		large:       corr > period/2 || corr < -period/2,
	}
}

// updateMetrics sets the clock series of m: the offset (the estimate), its
// uncertainty (+Inf while unknown) and the steps detected since the last
// update added to the steps counter.
func (c *serverClock) updateMetrics(m *metrics) {
	c.mu.Lock()
	steps := c.steps - c.stepsReported
	c.stepsReported = c.steps
	c.mu.Unlock()
	if est, unc, known := c.Offset(); known {
		m.clockOffset.Set(est.Seconds())
		m.clockUncertainty.Set(unc.Seconds())
	}
	if steps > 0 {
		m.clockSteps.Add(float64(steps))
	}
}

// wrap returns rt recording the Date of every response in c; for
// rest.Config.Wrap. Everything else passes through unchanged.
func (c *serverClock) wrap(rt http.RoundTripper) http.RoundTripper {
	return &serverClockTransport{clock: c, next: rt}
}

// serverClockTransport records the sample of every response that arrives, an
// error status included (the server stamped it all the same), but not a
// transport error. A watch counts once, when its headers arrive: RoundTrip
// returns then, and the body that streams after proves nothing more.
type serverClockTransport struct {
	clock *serverClock
	next  http.RoundTripper
}

func (t *serverClockTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	sent := t.clock.local.Now()
	resp, err := t.next.RoundTrip(req)
	if err == nil && resp != nil {
		t.clock.observe(sent, t.clock.local.Now(), resp.Header)
	}
	return resp, err
}

// WrappedRoundTripper lets client-go's utilities (k8s.io/apimachinery's
// utilnet.RoundTripperWrapper) reach the transport beneath.
func (t *serverClockTransport) WrappedRoundTripper() http.RoundTripper { return t.next }

// observe records a response sent and received at those local times with
// header h. A missing or malformed Date is ignored, and so is a response
// received before it was sent (the local clock stepped back meanwhile).
func (c *serverClock) observe(sent, received time.Time, h http.Header) {
	v := h["Date"]
	if len(v) == 0 {
		return
	}
	date, ok := parseHTTPDate(v[0])
	if !ok {
		return
	}
	c.record(sent, received, date)
}

// record adds the sample of a response sent and received at those local
// times, stamped date by the server.
func (c *serverClock) record(sent, received, date time.Time) {
	// Wall clock readings only: Date has no monotonic reading, and the
	// local ones' must not decide the difference.
	sent, received = sent.Round(0), received.Round(0)
	if received.Before(sent) {
		return
	}
	s := clockSample{
		lo: date.Sub(received),
		hi: date.Add(httpDateResolution).Sub(sent),
		at: received.UnixNano(),
	}
	if s.lo < -clockMaxSkew || s.hi > clockMaxSkew {
		return
	}
	c.add(s)
}

func (c *serverClock) add(s clockSample) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.samples++
	// The window's samples that stay in the ring once s takes the oldest
	// place, newest first.
	older := min(c.n, len(c.ring)-1)
	prevLo, prevHi, prevAt := c.lo, c.hi, c.ring[c.head].at
	c.head = (c.head + 1) % len(c.ring)
	c.ring[c.head] = s

	lo, hi, n := s.lo, s.hi, 1
	for k := 1; k <= older; k++ {
		o := &c.ring[(c.head-k+len(c.ring))%len(c.ring)]
		age := s.at - o.at
		if age > int64(clockMaxAge) {
			break
		}
		w := drift(age)
		nlo, nhi := max(lo, o.lo-w), min(hi, o.hi+w)
		if nlo > nhi {
			// Disagreement: start again from s alone, and measure steps
			// from the window before (the first one, if that was itself a
			// passing window).
			if !c.before.pending {
				c.before.pending = true
				c.before.lo, c.before.hi, c.before.at = prevLo, prevHi, prevAt
			}
			lo, hi, n = s.lo, s.hi, 1
			break
		}
		lo, hi, n = nlo, nhi, k+1
	}
	c.n, c.lo, c.hi = n, lo, hi

	if b := &c.before; b.pending {
		age := s.at - b.at
		w := drift(age)
		switch {
		case age > int64(clockMaxAge) || age < -int64(clockMaxAge):
			b.pending = false
		case lo > b.hi+w+clockStepMin || hi < b.lo-w-clockStepMin:
			c.steps++
			b.pending = false
		}
	}

	var corr time.Duration
	switch {
	case lo > clockTolerance:
		corr = lo
	case hi < -clockTolerance:
		corr = hi
	}
	c.correction.Store(int64(corr))
}

// drift is how far the clocks may drift apart in age (nanoseconds, either
// way): clockDriftPPM of it.
func drift(age int64) time.Duration {
	if age < 0 {
		age = -age
	}
	return time.Duration(age / (1e6 / clockDriftPPM))
}

// parseHTTPDate parses an HTTP-date (RFC 7231 section 7.1.1.1) in any of
// its three formats. (http.ParseTime takes about 200ns and allocates
// nothing for the IMF-fixdate every current server sends.)
func parseHTTPDate(v string) (time.Time, bool) {
	t, err := http.ParseTime(v)
	return t, err == nil
}

// noteClock exports the offset to the API server's clock and logs when it
// becomes large (see clockSkew.large) or small again: once each way, so a
// node whose clock is off says so without repeating it every period. Called
// after each status write, which brought a sample.
func (r *Reporter) noteClock() {
	r.serverClock.updateMetrics(r.metrics)
	select {
	case r.clockKick <- struct{}{}:
	default:
	}
	s := r.serverClock.skew(r.period())
	if s.large == r.clockSaidLarge.Load() {
		return
	}
	r.clockSaidLarge.Store(s.large)
	kv := []any{"offset", s.offset.Round(time.Millisecond).String(), "uncertainty", s.uncertainty.Round(time.Millisecond).String(),
		"correction", s.correction.Round(time.Millisecond).String()}
	if s.large {
		r.log.Info("this node's clock differs from the API server's by more than half a heartbeat period: "+
			"heartbeats are written in the API server's time; fix the node's time synchronization", kv...)
	} else {
		r.log.Info("this node's clock agrees with the API server's again", kv...)
	}
}
