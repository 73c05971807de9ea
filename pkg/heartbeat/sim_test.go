//go:build go1.25

// The module says go 1.22 (the oldest Go it builds with), whose timers
// signal on asynchronous channels; testing/synctest needs the synchronous
// ones of Go 1.23 and later.
//
//go:debug asynctimerchan=0

package heartbeat

import (
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"

	addonsv1alpha1 "github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/internal/addonsv1alpha1"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/election"
)

// The election simulation: TestSim runs the real Reporter (New and Start,
// two or three replicas of one AddonInstance) inside a testing/synctest
// bubble per schedule, against the in-process API server of simapi_test.go,
// under faults drawn from the schedule's seed, and checks invariants on the
// server's own record of what it applied (server time is the bubble's time).
//
// A schedule (simSchedule, from its seed alone) is: 2 or 3 replicas, a period
// (1s, 2s, 5s, 10s or 30s), a length of 30 to 60 periods, a constant clock
// skew for some replicas (up to ±3 periods), sometimes a stale holder of the
// Lease at the start, and a timeline of faults, one every 1 to 6 periods:
//
//   - kill: a replica (the leader, more often than not) is cancelled without
//     releasing the Lease (a crash: from that instant it sends nothing; what it
//     had on its way reaches the server or not), or stopped cleanly (it
//     releases the Lease); it starts again after 0 to 4 periods, with the
//     same identity (a container restart) or a new one (a new pod), and
//     sometimes a new skew (a clock step is modelled only here, at a
//     restart: a running replica's skew never changes, so its monotonic
//     clock never jumps, as a real one never does);
//   - partition: one replica cut off for 0.5 to 4.5 periods, its requests
//     refused at once or blackholed (they hang until the client gives up or
//     45s pass; its watches go silent);
//   - storm: for 0.5 to 3.5 periods every request fails with probability
//     5%, 20% or 50% (503 or a refused connection before the server applies
//     it, a reset connection after), and requests, answers and watch events
//     are delayed by up to a tenth, half or (5% of them) two periods;
//   - watch: one replica's streams (or everyone's) closed cleanly, reset,
//     broken with an error, stalled for 0.2 to 2.2 periods, or expired (the
//     server compacts history up to some point of the last period and closes
//     them: resuming from before it gets 410);
//   - period: spec.heartbeatUpdatePeriod changed by the operator;
//   - delete: the Lease deleted;
//   - and all along, an operator-like writer that every 5 to 15s writes
//     Healthy from a copy up to 3s stale (its conflicts are retried).
//
// Outside storms, requests and watch events are delayed by up to a hundredth
// of a period each way.
//
// Invariants, checked on the server's record after the schedule:
//
//  1. Safety (checkSafety): a change of writer waits for the end of the
//     previous writer's hold. For consecutive heartbeat writes (status writes
//     by a Reporter that move lastHeartbeatTime, in the order the server
//     applied them) by different processes A then B, B's write is applied no
//     earlier than the end of A's hold: the server time at which A's last
//     Lease write applied before B's write was applied, plus the renew
//     deadline for the period that write announced (election.Timings(p).RenewDeadline,
//     1.5p). That is the longest A may lead on that renewal: A sets its hold
//     to end at the renewal's send time plus the renew deadline by its own
//     clock (leaseLock.took), and the send time is before the server applied
//     it; a standby waits a whole lease duration (1.75p) from when it saw the
//     renewal, after the server applied it. When A's last Lease write was its
//     release, the hold ended with it. A crash does not end the hold (the
//     server cannot tell a crashed leader from a slow one, and neither can
//     a standby), nor does a deletion of the Lease ("safety (Lease
//     deleted)" when one fell inside the hold). Allowed by design, and
//     counted as a note: a standby honours no hold longer than the lease
//     duration of the spec's own period (the bound on a forged Lease), so
//     after the spec's period was shortened it may take the Lease that long
//     after a renewal announced on the longer period. Also a note: a
//     heartbeat sent inside its writer's hold and applied after it (slowed
//     past the margin the timings leave, or applied after its client gave
//     up), when the Lease then names another holder: what the chart's
//     fencing policy refuses on the API server.
//  2. Liveness (checkLiveness): the server-time gap between consecutive
//     heartbeat writes (any status write by a Reporter; from the start of the
//     schedule to the first; from the last to the end) is at most 2 periods,
//     the bound doc.go and election.Timings promise a killed leader's successor (one
//     lease duration, 1.75 periods, from the last renewal, which follows the
//     last heartbeat, plus the watch's delay and the successor's start; in
//     steady state a gap is one period). The period is the largest the
//     spec asked for in the gap or in the 2 longest periods of the schedule
//     before it. A gap is checked only when some process could keep the
//     promise: no storm within 2 periods before it or during it, and some
//     process X running since 1.5 periods before it and through it, without
//     a partition (for a blackhole, until its last hung request returned) or
//     a watch fault of its own in that time (X may be the leader). Kills,
//     clean stops, restarts, Lease deletions, period changes and the
//     operator's writes do not exempt a gap; nor does a partition of the
//     leader when another process is ready. A storm lasts, for this, until
//     the last request that arrived during it returned, plus half a period
//     for its watch events. Allowed, and counted as a note: a gap in which a
//     third process took the Lease and failed before its first heartbeat, if
//     the next heartbeat came within 2 periods of that take (two leaders
//     failed in one gap; the promise is per failure).
//  3. Operator rule (in checkLiveness): in the gaps liveness checks, the
//     server time minus the lastHeartbeatTime stored never exceeds 3 periods
//     (the operator's HeartbeatTimeout), whatever the writer's clock skew:
//     heartbeats are written in the API server's time (serverClock).
//  4. No goroutine of the bubble outlives the schedule (checkLeaks), no
//     panic (it would crash the test binary), and the protocol: a Reporter's
//     status write never changes the spec nor Healthy, and it sends no request
//     the simulation does not serve.
//
// Violations with the signature of a bug the simulation found and reported
// (simKnownBugs) are listed by the known-bugs subtest, which skips, instead
// of failing their schedule; -sim.strict fails on them too.
//
// Determinism: synctest fixes time, but not the order in which goroutines
// runnable at the same instant run, and the Reporter draws jitter (retry
// intervals, watch timeouts, conflict back-off, its process token) from the
// global math/rand. The schedule depends only on the seed, and each request's
// faults only on the seed and the position of the request among its
// process's requests of the same kind (simProc.draw), and each watch event's
// delay on its place in its stream, so that another interleaving changes as
// little as it can; a failing seed usually, not always, fails again: replay
// it with -sim.seed=S (with -count=N to retry), and -sim.log for its whole
// event log.
//
// The simulation replaces client-go's global error handlers for its duration
// (see TestSim), and it skews a Reporter's clocks through its fields
// (simSkew): a clock the Reporter gains later must be added there, or that
// clock stays unskewed.
//
// Flags: -sim.schedules=N runs seeds -sim.first.. (1..N) instead of the
// corpus (seeds 1..simCorpus), -sim.seed=S one seed, -sim.strict fails on
// known bugs, -sim.log
// prints each schedule's event log, -sim.progress=FILE appends a line per
// schedule started and ended (to find the seed of a panic or a hang).
var (
	simSchedules = flag.Int("sim.schedules", 0, "run the election simulation for seeds 1..N instead of the corpus")
	simFirst     = flag.Int("sim.first", 1, "first seed of -sim.schedules")
	simSeed      = flag.Uint64("sim.seed", 0, "replay the election simulation for this seed only")
	simStrict    = flag.Bool("sim.strict", false, "fail the simulation on violations with the signature of a reported bug too")
	simLog       = flag.Bool("sim.log", false, "print the event log of every simulated schedule")
	simProgress  = flag.String("sim.progress", "", "append a line per simulated schedule started and ended to this file")
)

// simCorpus is the number of seeds make test runs (1..simCorpus): about 20s
// with -race on 2 cores.
const simCorpus = 100

// simRegressions are seeds beyond the corpus on which the simulation found a
// bug, now fixed; make test runs them with the corpus. (A seed fixes the
// schedule, not every interleaving, so one usually, not always, reproduces
// its bug; -sim.schedules runs them all again anyway.)
var simRegressions = []uint64{
	229,  // a take judged on a read of the spec answered after the record it judged (slow answer)
	400,  // a take on the period known before, when the read of the spec failed
	427,  // a new leader failing before its first heartbeat, itself the next writer (a note)
	575,  // a vacancy known from the watch thrown away by a read after a conflicting make
	669,  // a late delivery after the writer's hold (what fencing refuses)
	1555, // a vacancy known from the watch thrown away by a read after a take met a deletion
	2875, // an old leader inside its own longer hold, taken on the bound of a shortened period (a note)
	7255, // a renewal on a shorter period applied though its answer was lost: the hold it gave was kept
	7809, // as 7255
	8447, // a lone leader whose renewal answered late waited a retry period past its own record
}

// simKnownBugs are the bugs the simulation found and reported, by the name a
// violation's signature gives it (simViolation.known). Violations with such a
// signature are reported by the known-bugs subtest rather than failing their
// schedule, unless -sim.strict. Remove an entry once its bug is fixed: the
// schedules that show it are in the corpus and then fail on it again.
// None is open: renewal-without-heartbeat, deleted-lease and stale-bound
// are fixed, and their signatures fail their schedules again.
var simKnownBugs = map[string]string{}

// simKnown is name when it is a reported bug still open (in simKnownBugs),
// else empty: the signature of a fixed bug fails its schedule again.
func simKnown(name string) string {
	if _, ok := simKnownBugs[name]; ok {
		return name
	}
	return ""
}

// simPeriods are the periods a schedule starts with or changes to.
var simPeriods = []time.Duration{time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second, 30 * time.Second}

// simSchedule is everything a seed decides before the run.
type simSchedule struct {
	seed     uint64
	replicas int
	period   time.Duration
	length   time.Duration
	skews    []time.Duration
	// stale: the Lease exists at the start, held by a process that is gone.
	stale   bool
	actions []simAction
}

type simAction struct {
	at     time.Duration
	kind   string // kill, restart, partition, storm, watch, period, delete
	target int    // a replica; -1: the leader; -2 (watch): every process
	dur    time.Duration
	mode   string // partition: refuse, blackhole; watch: eof, reset, error, stall, expire; kill: crash, stop
	// restart:
	sameIdentity bool
	skew         time.Duration
	newSkew      bool
	period       time.Duration
	rate         float64
}

func (a simAction) String() string {
	target := fmt.Sprintf("replica %d", a.target)
	switch a.target {
	case -1:
		target = "the leader"
	case -2:
		target = "every process"
	}
	switch a.kind {
	case "kill":
		return fmt.Sprintf("kill (%s) %s, down %s", a.mode, target, a.dur)
	case "restart":
		return fmt.Sprintf("restart replica %d (same identity %v, skew %s)", a.target, a.sameIdentity, a.skew)
	case "partition":
		return fmt.Sprintf("partition (%s) %s for %s", a.mode, target, a.dur)
	case "storm":
		return fmt.Sprintf("storm for %s, failure rate %.2f", a.dur, a.rate)
	case "watch":
		return fmt.Sprintf("watch fault %s on %s (%s)", a.mode, target, a.dur)
	case "period":
		return fmt.Sprintf("period changed to %s", a.period)
	}
	return a.kind
}

func newSimSchedule(seed uint64) simSchedule {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	s := simSchedule{seed: seed, replicas: 2 + rng.IntN(2), period: simPeriods[rng.IntN(len(simPeriods))]}
	p := s.period
	s.length = time.Duration(30+rng.IntN(31)) * p
	skew := func() time.Duration {
		return time.Duration((rng.Float64()*6 - 3) * float64(p)).Round(time.Millisecond)
	}
	for range s.replicas {
		d := time.Duration(0)
		if rng.Float64() < 0.3 {
			d = skew()
		}
		s.skews = append(s.skews, d)
	}
	s.stale = rng.Float64() < 0.2
	target := func() int {
		if rng.Float64() < 0.6 {
			return -1
		}
		return rng.IntN(s.replicas)
	}
	frac := func(lo, hi float64) time.Duration { return time.Duration((lo + rng.Float64()*(hi-lo)) * float64(p)) }
	cur := p
	for t := frac(2, 5); t < s.length-3*p; t += frac(1, 6) {
		a := simAction{at: t}
		switch w := rng.IntN(100); {
		case w < 25:
			a.kind, a.mode, a.target = "kill", "crash", target()
			if rng.Float64() < 0.3 {
				a.mode = "stop"
			}
			a.dur = frac(0, 4)
			if rng.Float64() < 0.15 {
				a.dur = 0
			}
			a.sameIdentity = rng.Float64() < 0.5
			if rng.Float64() < 0.3 {
				a.newSkew, a.skew = true, skew()
			}
		case w < 37:
			a.kind, a.target, a.dur, a.mode = "partition", target(), frac(0.5, 4.5), "refuse"
			if rng.Float64() < 0.5 {
				a.mode = "blackhole"
			}
		case w < 47:
			a.kind, a.dur, a.rate = "storm", frac(0.5, 3.5), []float64{0.05, 0.2, 0.5}[rng.IntN(3)]
		case w < 72:
			a.kind, a.target = "watch", target()
			if rng.Float64() < 0.2 {
				a.target = -2
			}
			a.mode = []string{"eof", "reset", "error", "stall", "expire"}[rng.IntN(5)]
			a.dur = frac(0.2, 2.2)
		case w < 88:
			a.kind = "period"
			for a.period = cur; a.period == cur; {
				a.period = simPeriods[rng.IntN(len(simPeriods))]
			}
			cur = a.period
		default:
			a.kind = "delete"
		}
		s.actions = append(s.actions, a)
	}
	return s
}

// simClock is a process's clock: the bubble's, off by a constant skew. A
// time.Now().Add(skew) keeps the monotonic reading, so durations measured on
// it are exact, as they are on a real clock that is merely set wrong.
type simClock struct {
	clock.RealClock
	skew time.Duration
}

func (c simClock) Now() time.Time                  { return time.Now().Add(c.skew) }
func (c simClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

// simSkew puts a Reporter on a skewed clock: every clock it reads (see
// drivenClock.drive for the same fields).
func simSkew(r *Reporter, c simClock) {
	r.clock = c
	r.limiter.clock = c
	r.serverClock.local = c
}

// simProc is one process (one incarnation of a replica).
type simProc struct {
	replica, gen int
	identity     string
	skew         time.Duration
	seed         uint64
	rep          *Reporter
	cancel       context.CancelFunc
	done         chan struct{}
	logs         *simLogs
	dead         atomic.Bool
	started      time.Time
	stopped      time.Time // zero while running (touched by the root goroutine only)

	rngMu sync.Mutex
	rngs  map[string]*rand.Rand
}

func (p *simProc) String() string {
	if p == nil {
		return "operator"
	}
	return fmt.Sprintf("r%d.%d(%s)", p.replica, p.gen, p.identity)
}

func (p *simProc) rand(kind string) *rand.Rand {
	if p.rngs == nil {
		p.rngs = map[string]*rand.Rand{}
	}
	r, ok := p.rngs[kind]
	if !ok {
		r = rand.New(rand.NewPCG(p.seed, simRandSeed(p.seed, kind)))
		p.rngs[kind] = r
	}
	return r
}

// draw fills d for the next request of kind.
func (p *simProc) draw(kind string, d *simDraw) {
	p.rngMu.Lock()
	defer p.rngMu.Unlock()
	r := p.rand(kind)
	for i := range d.u {
		d.u[i] = r.Float64()
	}
}

// streamRand is the source of the event delays of the next stream of kind.
func (p *simProc) streamRand(kind string) *rand.Rand {
	p.rngMu.Lock()
	defer p.rngMu.Unlock()
	r := p.rand(kind + "/events")
	return rand.New(rand.NewPCG(r.Uint64(), r.Uint64()))
}

// running reports whether the process ran at t.
func (p *simProc) running(t time.Time) bool {
	return !t.Before(p.started) && (p.stopped.IsZero() || t.Before(p.stopped))
}

// simLogs keeps a process's log lines with their server time.
type simLogs struct {
	mu    sync.Mutex
	start time.Time
	lines []simLogEntry
}

func (l *simLogs) logger(p *simProc) logr.Logger {
	return funcr.New(func(prefix, args string) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.lines = append(l.lines, simLogEntry{at: time.Since(l.start), what: p.String() + " log: " + prefix + " " + args})
	}, funcr.Options{Verbosity: 1})
}

// simSpan is a fault that lasted a while (a partition, a storm, a watch
// fault), for the liveness check.
type simSpan struct {
	proc     *simProc // nil: every process
	from, to time.Time
	what     string
}

type simPeriodAt struct {
	at     time.Time
	period time.Duration
}

// simRun is one schedule running in its bubble.
type simRun struct {
	t       *testing.T
	sched   simSchedule
	srv     *simServer
	start   time.Time
	end     time.Time
	procs   []*simProc // every process, in start order
	current []*simProc // per replica: the running process, or nil
	gens    []int
	ids     []string
	skews   []time.Duration
	spans   []simSpan
	periods []simPeriodAt
	deletes []time.Time
	pending []simAction // restarts to come
	opDone  chan struct{}
	result  simResult
}

// simResult is what one schedule counted and found.
type simResult struct {
	seed           uint64
	periods        float64
	heartbeats     int
	writerChanges  int
	takeovers      int
	faults         map[string]int
	checkedGaps    int
	maxGap         float64 // in periods, of the gaps checked
	maxAge         float64 // server time - lastHeartbeatTime, in periods, where checked
	lateWrites     int     // heartbeat writes applied after their writer's hold
	violations     []simViolation
	notes          []simViolation // what the invariants allow by design, counted
	requests       int
	operatorWrites int
	operatorTO     int // the operator judged HeartbeatTimeout
}

type simViolation struct {
	invariant string
	at        time.Time
	what      string
	// known names the reported bug whose signature this violation has
	// (simKnownBugs), or is empty.
	known string
}

const (
	simNS   = "sim"
	simName = "addon-instance"
)

func (s *simRun) now() time.Duration { return time.Since(s.start) }

func (s *simRun) logf(format string, args ...any) { s.srv.Logf(format, args...) }

// startProc starts a new process for replica i.
func (s *simRun) startProc(i int, sameIdentity bool) {
	s.gens[i]++
	gen := s.gens[i]
	if s.ids[i] == "" || !sameIdentity {
		// A new pod; the same identity is a container restart.
		s.ids[i] = fmt.Sprintf("pod-%d", i)
		if gen > 0 {
			s.ids[i] = fmt.Sprintf("pod-%d-%d", i, gen)
		}
	}
	id := s.ids[i]
	p := &simProc{replica: i, gen: gen, identity: id, skew: s.skews[i], done: make(chan struct{}),
		logs: &simLogs{start: s.start}, started: time.Now(),
		seed: simRandSeed(s.sched.seed, "proc", fmt.Sprint(i), fmt.Sprint(gen))}
	cfg := &rest.Config{Host: "http://sim", Transport: &simTransport{srv: s.srv, proc: p}}
	r, err := New(cfg, Options{Namespace: simNS, Name: simName, Identity: id,
		Registerer: prometheus.NewRegistry(), Logger: p.logs.logger(p)})
	if err != nil {
		s.t.Fatal(err)
	}
	simSkew(r, simClock{skew: p.skew})
	r.releaseOnCancel = false
	p.rep = r
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	go func() {
		defer close(p.done)
		if err := r.Start(ctx); err != nil {
			s.srv.Logf("%s: Start returned %v", p, err)
		}
	}()
	s.procs = append(s.procs, p)
	s.current[i] = p
	s.logf("start %s, skew %s", p, p.skew)
}

// stopProc ends a process: a crash (nothing more is sent from now on), or a
// clean stop (it releases the Lease).
func (s *simRun) stopProc(p *simProc, clean bool) {
	if clean {
		p.rep.releaseOnCancel = true // before cancel, which orders it before the Reporter's read
		p.cancel()
		<-p.done
		p.dead.Store(true)
	} else {
		p.dead.Store(true)
		p.cancel()
		<-p.done
	}
	p.stopped = time.Now()
	s.current[p.replica] = nil
	s.logf("stopped %s (clean %v)", p, clean)
}

// target resolves an action's target to a running process (nil: none).
func (s *simRun) target(t int) *simProc {
	if t >= 0 {
		return s.current[t]
	}
	s.srv.mu.Lock()
	holder := ""
	if s.srv.lease != nil {
		holder = ptr.Deref(s.srv.lease.Spec.HolderIdentity, "")
	}
	s.srv.mu.Unlock()
	for _, p := range s.current {
		if p != nil && p.identity == holder {
			return p
		}
	}
	return nil
}

func (s *simRun) do(a simAction) {
	s.logf("action: %s", a)
	now := time.Now()
	switch a.kind {
	case "kill":
		p := s.target(a.target)
		if p == nil {
			s.logf("no process to kill")
			return
		}
		s.srv.count("kill-" + a.mode)
		replica := p.replica
		s.stopProc(p, a.mode == "stop")
		if a.newSkew {
			s.skews[replica] = a.skew
		}
		s.pending = append(s.pending, simAction{at: s.now() + a.dur, kind: "restart", target: replica,
			sameIdentity: a.sameIdentity, skew: s.skews[replica]})
	case "restart":
		if s.current[a.target] == nil {
			s.srv.count("restart")
			s.startProc(a.target, a.sameIdentity)
		}
	case "partition":
		p := s.target(a.target)
		if p == nil {
			return
		}
		s.srv.count("partition-" + a.mode)
		until := now.Add(a.dur)
		s.spans = append(s.spans, simSpan{proc: p, from: now, to: until, what: "partition " + a.mode})
		s.srv.mu.Lock()
		s.srv.partitions[p] = simPartition{until: until, blackhole: a.mode == "blackhole"}
		for _, st := range s.srv.streamsOf(p) {
			if a.mode == "blackhole" {
				st.stall(until)
			} else {
				st.stop(errSimReset)
			}
		}
		s.srv.mu.Unlock()
	case "storm":
		s.srv.count("storm")
		s.spans = append(s.spans, simSpan{from: now, to: now.Add(a.dur), what: "storm"})
		s.srv.mu.Lock()
		s.srv.storm = simStorm{until: now.Add(a.dur), failRate: a.rate}
		s.srv.mu.Unlock()
	case "watch":
		var p *simProc
		if a.target != -2 {
			if p = s.target(a.target); p == nil {
				return
			}
		}
		s.srv.count("watch-" + a.mode)
		to := now
		if a.mode == "stall" {
			to = now.Add(a.dur)
		}
		s.spans = append(s.spans, simSpan{proc: p, from: now, to: to, what: "watch " + a.mode})
		s.srv.mu.Lock()
		if a.mode == "expire" {
			// Compact up to the version current some time in the last
			// period.
			back := now.Add(-time.Duration(float64(s.srv.period()) * float64(a.dur) / float64(3*s.sched.period)))
			for _, v := range s.srv.rvAt {
				if !v.at.After(back) {
					s.srv.compacted = v.rv
				}
			}
		}
		for _, st := range s.srv.streamsOf(p) {
			switch a.mode {
			case "eof", "expire":
				st.stop(io.EOF)
			case "reset":
				st.stop(errSimReset)
			case "error":
				st.stop(errSimStream)
			case "stall":
				st.stall(to)
			}
		}
		s.srv.mu.Unlock()
	case "period":
		s.srv.count("period-change")
		s.periods = append(s.periods, simPeriodAt{at: now, period: a.period})
		s.srv.mu.Lock()
		ai := s.srv.ai.DeepCopy()
		ai.Spec.HeartbeatUpdatePeriod = metav1.Duration{Duration: a.period}
		ai.Generation++
		s.srv.putAI(ai, "spec")
		s.srv.mu.Unlock()
	case "delete":
		s.srv.mu.Lock()
		if s.srv.lease != nil {
			s.srv.stats.fault("lease-deleted")
			s.srv.putLease(nil, nil, "delete")
			s.deletes = append(s.deletes, now)
		}
		s.srv.mu.Unlock()
	}
}

// operator is the addon-operator's stand-in: every 5 to 15s it judges the
// heartbeat from a copy of the AddonInstance up to 3s old and writes Healthy
// with a full status update from that copy, retrying conflicts against a
// fresher copy.
func (s *simRun) operator(ctx context.Context) {
	defer close(s.opDone)
	rng := rand.New(rand.NewPCG(s.sched.seed, simRandSeed(s.sched.seed, "operator")))
	for {
		wait := time.NewTimer(5*time.Second + time.Duration(rng.Float64()*float64(10*time.Second)))
		select {
		case <-ctx.Done():
			wait.Stop()
			return
		case <-wait.C:
		}
		lag := time.Duration(rng.Float64() * float64(3*time.Second))
		for attempt := 0; attempt < 5; attempt++ {
			if s.operatorOnce(lag, rng) {
				break
			}
			lag = 0
			time.Sleep(100*time.Millisecond + time.Duration(rng.Float64()*float64(900*time.Millisecond)))
		}
	}
}

// operatorOnce is one reconcile; false on a conflict.
func (s *simRun) operatorOnce(lag time.Duration, rng *rand.Rand) bool {
	srv := s.srv
	srv.mu.Lock()
	defer srv.mu.Unlock()
	var seen *addonsv1alpha1.AddonInstance
	for _, v := range srv.aiVersions {
		if !v.at.After(time.Now().Add(-lag)) {
			seen = v.ai
		}
	}
	if seen == nil {
		return true
	}
	ai := seen.DeepCopy()
	now := time.Now()
	status, reason := metav1.ConditionTrue, "ReceivingHeartbeats"
	switch last := ai.Status.LastHeartbeatTime.Time; {
	case last.IsZero():
		status, reason = metav1.ConditionUnknown, "PendingFirstHeartbeat"
	case now.After(last.Add(3 * ai.Spec.HeartbeatUpdatePeriod.Duration)):
		status, reason = metav1.ConditionUnknown, "HeartbeatTimeout"
		s.result.operatorTO++
	}
	prev := findCondition(ai.Status.Conditions, ConditionHealthy)
	if prev != nil && prev.Status == status && prev.Reason == reason && rng.Float64() < 0.7 {
		return true // nothing to write this time
	}
	cond := metav1.Condition{Type: ConditionHealthy, Status: status, Reason: reason,
		Message: "judged by the simulated operator", ObservedGeneration: ai.Generation,
		LastTransitionTime: metav1.NewTime(now.Truncate(time.Second))}
	if prev != nil && prev.Status == status {
		cond.LastTransitionTime = prev.LastTransitionTime
	}
	conds := slices.DeleteFunc(slices.Clone(ai.Status.Conditions), func(c metav1.Condition) bool { return c.Type == ConditionHealthy })
	ai.Status.Conditions = append(conds, cond)
	if ai.ResourceVersion != srv.ai.ResourceVersion {
		srv.stats.fault("operator-conflict")
		srv.logf("operator: conflict writing Healthy=%s over rv %s (now %s)", status, ai.ResourceVersion, srv.ai.ResourceVersion)
		return false
	}
	s.result.operatorWrites++
	srv.stats.fault("operator-write")
	srv.writeStatus(ai, nil, now, false, "addon-operator")
	srv.logf("operator: wrote Healthy=%s/%s", status, reason)
	return true
}

// run plays the schedule in the current bubble and checks it.
func (s *simRun) run() {
	sc := s.sched
	s.start = time.Now()
	s.srv = newSimServer(simNS, simName, sc.period)
	s.current = make([]*simProc, sc.replicas)
	s.gens = slices.Repeat([]int{-1}, sc.replicas)
	s.ids = make([]string, sc.replicas)
	s.skews = slices.Clone(sc.skews)
	s.periods = []simPeriodAt{{at: s.start, period: sc.period}}
	if sc.stale {
		s.srv.mu.Lock()
		now := metav1.MicroTime{Time: time.Now()}
		s.srv.putLease(&coordinationv1.Lease{
			TypeMeta:   metav1.TypeMeta{APIVersion: coordinationv1.SchemeGroupVersion.String(), Kind: "Lease"},
			ObjectMeta: metav1.ObjectMeta{Namespace: simNS, Name: election.LeaseName(simName), UID: "lease-stale", Annotations: map[string]string{election.PeriodAnnotation: sc.period.String()}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("gone-pod"), LeaseDurationSeconds: ptr.To(leaseDurationSeconds(election.Timings(sc.period).LeaseDuration)),
				AcquireTime: &now, RenewTime: &now},
		}, nil, "create")
		s.srv.mu.Unlock()
	}
	for i := range sc.replicas {
		s.startProc(i, true)
	}
	opCtx, stopOp := context.WithCancel(context.Background())
	s.opDone = make(chan struct{})
	go s.operator(opCtx)

	actions := slices.Clone(sc.actions)
	for {
		// The next action: of the schedule, or a restart it caused.
		slices.SortStableFunc(s.pending, func(a, b simAction) int { return int(a.at - b.at) })
		var a simAction
		switch {
		case len(s.pending) > 0 && (len(actions) == 0 || s.pending[0].at <= actions[0].at):
			a, s.pending = s.pending[0], s.pending[1:]
		case len(actions) > 0:
			a, actions = actions[0], actions[1:]
		default:
			a = simAction{at: sc.length, kind: "end"}
		}
		if a.at >= sc.length {
			break
		}
		time.Sleep(a.at - s.now())
		s.do(a)
	}
	time.Sleep(sc.length - s.now())
	s.end = time.Now()
	s.logf("end of the schedule")

	// Teardown: crash every process, stop the operator and the streams.
	for _, p := range s.current {
		if p != nil {
			p.dead.Store(true)
			p.cancel()
		}
	}
	for _, p := range s.current {
		if p != nil {
			<-p.done
			p.stopped = time.Now()
		}
	}
	stopOp()
	<-s.opDone
	s.srv.closeAll()
	s.checkLeaks()

	s.check()
}

// checkLeaks waits for the bubble's other goroutines to end (what was on
// its way to the server may take up to two periods) and reports the ones
// that do not.
func (s *simRun) checkLeaks() {
	self := make([]byte, 256)
	self = self[:runtime.Stack(self, false)]
	header, _, _ := strings.Cut(string(self), "\n")
	_, bubble, ok := strings.Cut(header, "synctest bubble ")
	if !ok {
		s.t.Fatalf("not in a bubble: %s", header)
	}
	bubble = strings.TrimSuffix(bubble, "]:")
	tag := "synctest bubble " + bubble + "]"
	var leaked []string
	for range 10 {
		synctest.Wait()
		buf := make([]byte, 1<<20)
		for {
			n := runtime.Stack(buf, true)
			if n < len(buf) {
				buf = buf[:n]
				break
			}
			buf = make([]byte, 2*len(buf))
		}
		leaked = leaked[:0]
		for _, g := range strings.Split(string(buf), "\n\n") {
			first, _, _ := strings.Cut(g, "\n")
			// Not this goroutine, nor synctest's own.
			if strings.Contains(first, tag) && !strings.Contains(first, "running") &&
				!strings.Contains(g, "testing/synctest.Test(") && !strings.Contains(g, "synctest.testingSynctestTest(") {
				leaked = append(leaked, g)
			}
		}
		if len(leaked) == 0 {
			return
		}
		time.Sleep(time.Minute)
	}
	v := simViolation{invariant: "leak", at: time.Now(),
		what: fmt.Sprintf("%d goroutines of the bubble outlive the schedule:\n%s", len(leaked), strings.Join(leaked, "\n\n"))}
	s.result.violations = append(s.result.violations, v)
	// The bubble panics when this returns with them blocked: say which
	// schedule first.
	fmt.Fprintf(os.Stderr, "sim seed %d: %s\n", s.sched.seed, v.what)
}

// check evaluates the invariants on the server's record.
func (s *simRun) check() {
	srv := s.srv
	srv.mu.Lock()
	defer srv.mu.Unlock()
	res := &s.result
	res.seed = s.sched.seed
	res.faults = maps.Clone(srv.stats.faults)
	res.requests = srv.stats.requests
	for i, pa := range s.periods {
		to := s.end
		if i+1 < len(s.periods) {
			to = s.periods[i+1].at
		}
		res.periods += float64(to.Sub(pa.at)) / float64(Period(pa.period))
	}
	var last *simProc
	for _, hb := range srv.hbs {
		if hb.proc == nil {
			continue
		}
		res.heartbeats++
		if last != nil && hb.proc != last {
			res.writerChanges++
		}
		last = hb.proc
	}
	prevHolder := ""
	for _, w := range srv.leases {
		h := w.holder + "/" + w.process
		if w.holder != "" && prevHolder != "" && h != prevHolder {
			res.takeovers++
		}
		if w.holder != "" {
			prevHolder = h
		}
	}
	for _, p := range srv.protocol {
		res.violations = append(res.violations, simViolation{invariant: "protocol", at: s.end, what: p})
	}
	if srv.stats.unexpected > 0 {
		res.violations = append(res.violations, simViolation{invariant: "protocol", at: s.end,
			what: fmt.Sprintf("%d requests the simulation does not serve (see the log)", srv.stats.unexpected)})
	}
	s.checkSafety()
	s.checkLiveness()
}

// holdEnd is the end of p's hold as of server time t: its last Lease write
// applied before t, plus the renew deadline of the period it announced (or
// then, when it released the Lease). ok is false when p wrote none.
func (s *simRun) holdEnd(p *simProc, t time.Time) (end time.Time, w simLeaseWrite, ok bool) {
	for _, lw := range s.srv.leases {
		if !lw.at.Before(t) {
			break
		}
		if lw.proc == p {
			w, ok = lw, true
		}
	}
	if !ok {
		return time.Time{}, w, false
	}
	if w.holder != p.identity {
		return w.at, w, true // released
	}
	return w.at.Add(election.Timings(cmpOr(w.period, DefaultPeriod)).RenewDeadline), w, true
}

// fencedAt reports whether the chart's fencing policy refuses a heartbeat
// of p applied at t: the Lease then exists and names another holder, or
// none (the policy admits any write while there is no Lease).
func (s *simRun) fencedAt(p *simProc, t time.Time) bool {
	var last *simLeaseWrite
	for j := range s.srv.leases {
		if lw := &s.srv.leases[j]; lw.at.Before(t) {
			last = lw
		}
	}
	return last != nil && last.op != "delete" && last.holder != p.identity
}

func cmpOr(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

func (s *simRun) checkSafety() {
	var prev *simHB
	for i := range s.srv.hbs {
		hb := &s.srv.hbs[i]
		if hb.proc == nil || !hb.moved {
			continue
		}
		if end, _, ok := s.holdEnd(hb.proc, hb.at); !ok || hb.at.After(end) {
			s.result.lateWrites++
		}
		if prev != nil && prev.proc != hb.proc {
			a := prev.proc
			end, w, ok := s.holdEnd(a, hb.at)
			if !ok {
				s.violate("safety", hb.at, fmt.Sprintf("%s wrote a heartbeat at %s without ever writing the Lease", a, s.rel(prev.at)))
			} else if hb.at.Before(end) {
				what := fmt.Sprintf("%s wrote a heartbeat at %s inside the hold of %s, which wrote the heartbeat before it at %s "+
					"and last wrote the Lease at %s (%s, period %s): its hold ends at %s",
					hb.proc, s.rel(hb.at), a, s.rel(prev.at), s.rel(w.at), w.op, w.period, s.rel(end))
				invariant := "safety"
				for _, d := range s.deletes {
					if !d.Before(w.at) && d.Before(hb.at) {
						what += fmt.Sprintf("; the Lease was deleted at %s", s.rel(d))
						invariant = "safety (Lease deleted)"
					}
				}
				if a.running(hb.at) {
					what += fmt.Sprintf("; %s was running", a)
				} else {
					what += fmt.Sprintf("; %s had stopped at %s", a, s.rel(a.stopped))
				}
				// The take that ended A's hold: the first Lease write after
				// A's last by another process (B, or one between them).
				var take *simLeaseWrite
				for j := range s.srv.leases {
					if lw := &s.srv.leases[j]; lw.proc != nil && lw.proc != a && lw.holder != "" && lw.at.After(w.at) {
						take = lw
						break
					}
				}
				if take != nil {
					spec := s.periodOver(take.at, take.at)
					// The spec's shortest period from the record to the take:
					// the taker's read of it came in between.
					read := s.periodUnder(w.at, take.at)
					what += fmt.Sprintf("; %s took the Lease at %s (%s after), announcing %s, when the spec's period was %s",
						take.proc, s.rel(take.at), take.at.Sub(w.at), take.period, spec)
					// By design a standby honours no hold longer than the
					// lease duration of the spec's own period (the bound on a
					// forged Lease): after the spec's period was shortened,
					// a hold announced on the longer one ends earlier.
					// The same bound holds a deleted Lease's holder to it (fence).
					if read < w.period && !take.at.Before(w.at.Add(election.Timings(read).LeaseDuration)) {
						invariant = "note: hold bounded by the shortened period"
					}
				}
				// B wrote inside its own hold, taken (by A, or one before A)
				// on the bound of a shortened period: B had announced a
				// longer one and had not yet followed the change (its watch
				// lagged, its requests failed), so its hold outlived the
				// bound every standby holds it to. By design, as above.
				if bEnd, bw, ok := s.holdEnd(hb.proc, hb.at); ok && invariant == "safety" && bw.holder == hb.proc.identity && !hb.at.After(bEnd) {
					for j := range s.srv.leases {
						lw := &s.srv.leases[j]
						if lw.proc == nil || lw.proc == hb.proc || lw.holder == "" || !lw.at.After(bw.at) || lw.at.After(hb.at) {
							continue
						}
						if read := s.periodUnder(bw.at, lw.at); read < bw.period && !lw.at.Before(bw.at.Add(election.Timings(read).LeaseDuration)) {
							what += fmt.Sprintf("; %s wrote inside its own hold (Lease written at %s, period %s), which %s took at %s on the bound of the shortened period %s",
								hb.proc, s.rel(bw.at), bw.period, lw.proc, s.rel(lw.at), read)
							invariant = "note: hold bounded by the shortened period"
						}
						break
					}
				}
				// Sent inside its writer's hold, applied after it: a request
				// slowed past the margin the timings leave (see election.Timings), or
				// applied after its client gave up. No client can hold a
				// request back once sent; the chart's fencing policy refuses
				// it on the API server, and does here if the Lease then
				// names another holder (fencedAt).
				if sendEnd, _, ok := s.holdEnd(hb.proc, hb.sentAt); ok && hb.sentAt.Before(sendEnd) && hb.at.After(sendEnd) &&
					s.fencedAt(hb.proc, hb.at) && !strings.HasPrefix(invariant, "note") {
					what += fmt.Sprintf("; it was sent at %s, inside its own hold (to %s), and applied %s after it",
						s.rel(hb.sentAt), s.rel(sendEnd), hb.at.Sub(sendEnd))
					invariant = "note: late delivery, refused by fencing"
				}
				known := ""
				switch {
				case invariant == "safety (Lease deleted)":
					known = "deleted-lease"
				case invariant == "safety" && take != nil && take.period > 0 &&
					take.period < s.periodOver(take.at, take.at) && !take.at.Before(w.at.Add(election.Timings(take.period).LeaseDuration)):
					known = "stale-bound"
				}
				known = simKnown(known)
				if strings.HasPrefix(invariant, "note") {
					s.result.notes = append(s.result.notes, simViolation{invariant: invariant, at: hb.at, what: what})
				} else {
					s.result.violations = append(s.result.violations, simViolation{invariant: invariant, at: hb.at, what: what, known: known})
				}
			}
		}
		prev = hb
	}
}

// periodOver is the largest period the spec asked for in [from, to].
func (s *simRun) periodOver(from, to time.Time) time.Duration {
	return slices.Max(append(s.periodsIn(from, to), 0))
}

// periodUnder is the smallest period the spec asked for in [from, to].
func (s *simRun) periodUnder(from, to time.Time) time.Duration {
	if ps := s.periodsIn(from, to); len(ps) > 0 {
		return slices.Min(ps)
	}
	return 0
}

// periodsIn are the periods the spec asked for in [from, to], as followed.
func (s *simRun) periodsIn(from, to time.Time) []time.Duration {
	var ps []time.Duration
	for i, pa := range s.periods {
		end := s.end.Add(time.Hour)
		if i+1 < len(s.periods) {
			end = s.periods[i+1].at
		}
		if pa.at.After(to) || !end.After(from) {
			continue
		}
		ps = append(ps, clampPeriod(pa.period))
	}
	return ps
}

// ready reports whether p ran and could reach the server, with no fault of
// its own, throughout [from, to].
func (s *simRun) ready(p *simProc, from, to time.Time, first bool) bool {
	if !first && p.started.After(from) || !p.stopped.IsZero() && p.stopped.Before(to) {
		return false
	}
	for _, sp := range s.spans {
		mine := sp.proc == p || sp.proc == nil && sp.what != "storm"
		if sp.what == "partition blackhole" {
			// Its requests hang until they time out, after it healed.
			if end := s.srv.blackholed[p]; end.After(sp.to) {
				sp.to = end
			}
		}
		if mine && !sp.to.Before(from) && !sp.from.After(to) {
			return false
		}
	}
	return true
}

func (s *simRun) checkLiveness() {
	type write struct {
		at  time.Time
		hbt time.Time
		by  *simProc
	}
	writes := []write{{at: s.start}}
	for _, hb := range s.srv.hbs {
		if hb.proc != nil {
			writes = append(writes, write{at: hb.at, hbt: hb.new, by: hb.proc})
		}
	}
	writes = append(writes, write{at: s.end})
	// The longest period of the schedule, to look back far enough.
	pmax := time.Duration(0)
	for _, pa := range s.periods {
		pmax = max(pmax, clampPeriod(pa.period))
	}
	var hbt time.Time
	var writer *simProc
	for i := 0; i+1 < len(writes); i++ {
		t1, t2 := writes[i].at, writes[i+1].at
		if i > 0 {
			hbt, writer = writes[i].hbt, writes[i].by
		}
		pw := s.periodOver(t1.Add(-2*pmax), t2)
		storm := false
		for _, sp := range s.spans {
			// A storm lasts until the last request that arrived during it
			// returned (its delays outlast it), and its watch events by up
			// to half a period more.
			to := sp.to
			if tail := s.srv.stormTails[sp.to]; tail.After(to) {
				to = tail
			}
			to = to.Add(s.periodOver(sp.from, to) / 2)
			if sp.what == "storm" && !to.Before(t1.Add(-2*pw)) && !sp.from.After(t2) {
				storm = true
			}
		}
		if storm {
			continue
		}
		first := i == 0
		from := t1.Add(-pw / 2).Add(-pw)
		if first {
			from = t1
		}
		var x *simProc
		for _, p := range s.procs {
			if s.ready(p, from, t2, first) {
				x = p
				break
			}
		}
		if x == nil {
			continue
		}
		s.result.checkedGaps++
		gap := t2.Sub(t1)
		s.result.maxGap = max(s.result.maxGap, float64(gap)/float64(pw))
		// A hold taken in the gap that came to nothing: a new leader that
		// failed before its first heartbeat (two leaders failed in one gap,
		// which the design does not bound by 2 periods, only each one's by
		// 2 periods from its last Lease write). That is any take in the gap
		// by a process other than the writer of the heartbeat before it
		// (which renews right after that heartbeat), but the last Lease
		// write of the writer of the heartbeat after it, which is the take
		// that heartbeat followed: an earlier take of its own was a term
		// that failed too.
		next := writes[i+1].by // nil: the end of the schedule
		var nextTake, failed *simLeaseWrite
		for j := range s.srv.leases {
			lw := &s.srv.leases[j]
			if lw.proc == next && lw.holder != "" && lw.at.After(t1) && lw.at.Before(t2) {
				nextTake = lw
			}
		}
		for j := range s.srv.leases {
			lw := &s.srv.leases[j]
			if lw.proc == nil || lw.holder == "" || !lw.at.After(t1) || !lw.at.Before(t2) {
				continue
			}
			if lw.proc != writer && lw != nextTake {
				failed = lw
			}
		}
		// Two holds at once after a Lease deletion (the known bug): the
		// deposed holder learns of the other one late, and a standby that
		// learns of a hold by reading it waits a whole lease duration from
		// then.
		afterDeletion := slices.ContainsFunc(s.result.violations, func(v simViolation) bool {
			return v.known == "deleted-lease" && !v.at.Before(t1.Add(-2*pw)) && !v.at.After(t2)
		})
		known, note := "", false
		switch {
		case failed != nil && t2.Sub(failed.at) <= 2*pw:
			note = true
		case afterDeletion, slices.ContainsFunc(s.deletes, func(d time.Time) bool { return d.After(t1) && d.Before(t2) }):
			// A process that finds the Lease missing without having
			// watched it go waits a lease duration first.
			known = "deleted-lease"
		}
		known = simKnown(known)
		if gap > 2*pw {
			v := simViolation{invariant: "liveness", at: t2, known: known,
				what: fmt.Sprintf("no heartbeat from %s to %s (%s, %.2f periods of %s) while %s was ready%s",
					s.rel(t1), s.rel(t2), gap, float64(gap)/float64(pw), pw, x, s.gapCause(t1, t2))}
			if note {
				v.invariant = "note: a new leader failed before its first heartbeat"
				s.result.notes = append(s.result.notes, v)
			} else {
				s.result.violations = append(s.result.violations, v)
			}
		}
		if hbt.IsZero() {
			continue
		}
		age := t2.Sub(hbt)
		s.result.maxAge = max(s.result.maxAge, float64(age)/float64(pw))
		if age > 3*pw {
			what := fmt.Sprintf("at %s the lastHeartbeatTime is %s old (%.2f periods of %s): written at %s by %s (skew %s) as %s%s",
				s.rel(t2), age, float64(age)/float64(pw), pw, s.rel(t1), writer, writer.skew, hbt.UTC().Format(time.RFC3339Nano),
				s.gapCause(t1, t2))
			if note {
				s.result.notes = append(s.result.notes, simViolation{invariant: "note: operator rule, after a new leader failed", at: t2, what: what})
			} else {
				s.result.violations = append(s.result.violations, simViolation{invariant: "operator rule", at: t2, what: what, known: known})
			}
		}
	}
}

// gapCause lists what happened to the Lease and the processes in (t1, t2):
// who wrote the Lease, who stopped.
func (s *simRun) gapCause(t1, t2 time.Time) string {
	var out string
	for _, w := range s.srv.leases {
		if w.at.After(t1) && w.at.Before(t2) {
			who := "the simulation"
			if w.proc != nil {
				who = w.proc.String()
			}
			out += fmt.Sprintf("; %s wrote the Lease at %s (%s, holder %q, period %s)", who, s.rel(w.at), w.op, w.holder, w.period)
		}
	}
	for _, p := range s.procs {
		if !p.stopped.IsZero() && p.stopped.After(t1) && p.stopped.Before(t2) {
			out += fmt.Sprintf("; %s stopped at %s", p, s.rel(p.stopped))
		}
	}
	return out
}

func (s *simRun) violate(invariant string, at time.Time, what string) {
	s.result.violations = append(s.result.violations, simViolation{invariant: invariant, at: at, what: what})
}

func (s *simRun) rel(t time.Time) string { return t.Sub(s.start).String() }

// eventLog is the server's log and the processes' logs around at (all of
// it when at is zero), in time order.
func (s *simRun) eventLog(at time.Time, before, after time.Duration) string {
	entries := slices.Clone(s.srv.log)
	for _, p := range s.procs {
		p.logs.mu.Lock()
		entries = append(entries, p.logs.lines...)
		p.logs.mu.Unlock()
	}
	slices.SortStableFunc(entries, func(a, b simLogEntry) int { return int(a.at - b.at) })
	var b strings.Builder
	for _, e := range entries {
		if !at.IsZero() && (e.at < at.Sub(s.start)-before || e.at > at.Sub(s.start)+after) {
			continue
		}
		fmt.Fprintf(&b, "%12s %s\n", e.at, e.what)
	}
	return b.String()
}

func (s *simSchedule) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d: %d replicas, period %s, length %s, skews %v, stale holder %v\n",
		s.seed, s.replicas, s.period, s.length, s.skews, s.stale)
	for _, a := range s.actions {
		fmt.Fprintf(&b, "  %10s %s\n", a.at, a)
	}
	return b.String()
}

// simTotals adds up the results of many schedules.
type simTotals struct {
	mu                                         sync.Mutex
	schedules                                  int
	periods                                    float64
	heartbeats, takeovers, writerChanges, reqs int
	checkedGaps, lateWrites                    int
	operatorWrites, operatorTimeouts           int
	faults                                     map[string]int
	violations                                 map[string]int
	failedSeeds                                []uint64
	seedsBy                                    map[string][]uint64
	knownSeeds                                 map[string][]uint64
	maxGap, maxAge                             float64
}

func (t *simTotals) add(r simResult) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.faults == nil {
		t.faults, t.violations = map[string]int{}, map[string]int{}
	}
	t.schedules++
	t.periods += r.periods
	t.heartbeats += r.heartbeats
	t.takeovers += r.takeovers
	t.writerChanges += r.writerChanges
	t.reqs += r.requests
	t.checkedGaps += r.checkedGaps
	t.lateWrites += r.lateWrites
	t.operatorWrites += r.operatorWrites
	t.operatorTimeouts += r.operatorTO
	t.maxGap = max(t.maxGap, r.maxGap)
	t.maxAge = max(t.maxAge, r.maxAge)
	for k, v := range r.faults {
		t.faults[k] += v
	}
	for _, v := range r.violations {
		if v.known != "" {
			t.violations[v.invariant+" [known bug "+v.known+"]"]++
		} else {
			t.violations[v.invariant]++
		}
	}
	for _, v := range r.notes {
		t.violations[v.invariant]++
	}
	if t.seedsBy == nil {
		t.seedsBy, t.knownSeeds = map[string][]uint64{}, map[string][]uint64{}
	}
	seen, failed := map[string]bool{}, false
	for _, v := range r.violations {
		key := v.invariant
		if v.known != "" {
			key += " [known bug " + v.known + "]"
			if !seen[v.known] {
				seen[v.known] = true
				t.knownSeeds[v.known] = append(t.knownSeeds[v.known], r.seed)
			}
		} else {
			failed = true
		}
		if !seen[key] {
			seen[key] = true
			t.seedsBy[key] = append(t.seedsBy[key], r.seed)
		}
	}
	if failed {
		t.failedSeeds = append(t.failedSeeds, r.seed)
	}
}

func (t *simTotals) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "schedules %d, simulated periods %.0f, requests %d, heartbeats %d, writer changes %d, takeovers %d, "+
		"gaps checked %d (longest %.2f periods), age of lastHeartbeatTime (any writer's skew), where checked, at most %.2f periods, heartbeats applied after their writer's hold %d, "+
		"operator writes %d (judged HeartbeatTimeout %d)\n",
		t.schedules, t.periods, t.reqs, t.heartbeats, t.writerChanges, t.takeovers, t.checkedGaps, t.maxGap, t.maxAge,
		t.lateWrites, t.operatorWrites, t.operatorTimeouts)
	fmt.Fprintf(&b, "faults:")
	for _, k := range slices.Sorted(maps.Keys(t.faults)) {
		fmt.Fprintf(&b, " %s %d,", k, t.faults[k])
	}
	fmt.Fprintf(&b, "\nviolations:")
	for _, k := range slices.Sorted(maps.Keys(t.violations)) {
		fmt.Fprintf(&b, " %s %d,", k, t.violations[k])
	}
	slices.Sort(t.failedSeeds)
	fmt.Fprintf(&b, " (failing seeds, known bugs aside: %v)\n", t.failedSeeds)
	for _, k := range slices.Sorted(maps.Keys(t.seedsBy)) {
		ss := slices.Sorted(slices.Values(t.seedsBy[k]))
		fmt.Fprintf(&b, "  %s: seeds %v\n", k, ss[:min(len(ss), 40)])
	}
	return b.String()
}

// TestSim runs the election simulation: the seed corpus, or the seeds the
// flags name.
func TestSim(t *testing.T) {
	seeds := []uint64{}
	switch {
	case *simSeed != 0:
		seeds = append(seeds, *simSeed)
	case *simSchedules > 0:
		for i := range *simSchedules {
			seeds = append(seeds, uint64(*simFirst+i))
		}
	default:
		for i := range simCorpus {
			seeds = append(seeds, uint64(i+1))
		}
		seeds = append(seeds, simRegressions...)
	}
	// client-go's global error handlers sleep by wall-clock differences
	// between calls (a 1ms rate limit): across bubbles, whose clocks differ,
	// that is a sleep of minutes in one of them. The simulation does without
	// that limit while it runs (no other test runs meanwhile: none of this
	// package is parallel).
	handlers := utilruntime.ErrorHandlers
	utilruntime.ErrorHandlers = handlers[:1:1]
	t.Cleanup(func() { utilruntime.ErrorHandlers = handlers })

	var progress *os.File
	if *simProgress != "" {
		f, err := os.OpenFile(*simProgress, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		progress = f
		defer f.Close()
	}
	var totals simTotals
	started := time.Now()
	// One parallel worker per CPU runs its share of the seeds in turn (a
	// parallel subtest per seed would park a goroutine per seed, which the
	// leak check's goroutine dump then reads through every time).
	workers := min(runtime.GOMAXPROCS(0), len(seeds))
	t.Run("schedules", func(t *testing.T) {
		for w := range workers {
			t.Run(fmt.Sprintf("w%d", w), func(t *testing.T) {
				t.Parallel()
				for i := w; i < len(seeds); i += workers {
					simOne(t, seeds[i], progress, &totals)
				}
			})
		}
	})
	t.Logf("election simulation, %s of wall time: %s", time.Since(started).Round(time.Millisecond), &totals)
	if *simSchedules > 0 || *simSeed != 0 {
		fmt.Printf("election simulation, %s of wall time:\n%s\n", time.Since(started).Round(time.Millisecond), &totals)
	}
	t.Run("known-bugs", func(t *testing.T) {
		totals.mu.Lock()
		known := maps.Clone(totals.knownSeeds)
		totals.mu.Unlock()
		if len(known) == 0 {
			return
		}
		var b strings.Builder
		for _, k := range slices.Sorted(maps.Keys(known)) {
			ss := slices.Sorted(slices.Values(known[k]))
			fmt.Fprintf(&b, "\n%s, in %d schedules (seeds %v): %s", k, len(ss), ss[:min(len(ss), 20)], simKnownBugs[k])
		}
		// Open bugs are listed, not skipped: the subtest runs and says what
		// it saw; make sim (-sim.strict) fails on them.
		if *simStrict {
			t.Error("violations with the signature of a reported bug:" + b.String())
		} else {
			t.Log("violations with the signature of a reported bug still open (-sim.strict fails on them):" + b.String())
		}
	})
}

// simOne runs the schedule of one seed as a subtest of t and adds it to
// totals.
func simOne(t *testing.T, seed uint64, progress *os.File, totals *simTotals) {
	t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
		if progress != nil {
			fmt.Fprintf(progress, "start %d\n", seed)
		}
		sched := newSimSchedule(seed)
		var res simResult
		var log, knownLog string
		synctest.Test(t, func(t *testing.T) {
			s := &simRun{t: t, sched: sched}
			s.run()
			res = s.result
			describe := func(v simViolation) string {
				tag := ""
				if v.known != "" {
					tag = " [known bug " + v.known + "]"
				}
				return fmt.Sprintf("\nVIOLATED %s%s at %s: %s\nevent log around it:\n%s", v.invariant, tag, s.rel(v.at), v.what,
					s.eventLog(v.at, 4*s.periodOver(v.at.Add(-time.Minute), v.at), s.sched.period))
			}
			for _, v := range res.violations {
				if v.known == "" || *simStrict {
					log += describe(v)
				} else {
					knownLog += describe(v)
				}
			}
			for _, v := range res.notes {
				knownLog += fmt.Sprintf("\n%s at %s: %s", v.invariant, s.rel(v.at), v.what)
			}
			if *simLog {
				t.Logf("%s\n%s", sched.String(), s.eventLog(time.Time{}, 0, 0))
			}
		})
		totals.add(res)
		if progress != nil {
			fmt.Fprintf(progress, "end %d violations %d\n", seed, len(res.violations))
		}
		if knownLog != "" && testing.Verbose() {
			t.Logf("known bugs (they fail with -sim.strict) and notes:\n%s%s", sched.String(), knownLog)
		}
		if log != "" {
			t.Errorf("replay with -run 'TestSim/schedules/w.*/seed=%d$' or -sim.seed=%d\n%s%s", seed, seed, sched.String(), log)
		}
	})
}

// simScenario runs one hand-made schedule in a bubble and returns it.
func simScenario(t *testing.T, sched simSchedule) *simRun {
	t.Helper()
	handlers := utilruntime.ErrorHandlers
	utilruntime.ErrorHandlers = handlers[:1:1]
	t.Cleanup(func() { utilruntime.ErrorHandlers = handlers })
	var s *simRun
	synctest.Test(t, func(t *testing.T) {
		s = &simRun{t: t, sched: sched}
		s.run()
		for _, v := range s.result.violations {
			t.Errorf("VIOLATED %s at %s: %s\nevent log:\n%s", v.invariant, s.rel(v.at), v.what, s.eventLog(time.Time{}, 0, 0))
		}
	})
	return s
}

// reporterBeats are the server times of the status writes by Reporters.
func (s *simRun) reporterBeats() []simHB {
	var out []simHB
	for _, hb := range s.srv.hbs {
		if hb.proc != nil {
			out = append(out, hb)
		}
	}
	return out
}

// Without faults the simulation is the steady state the design describes:
// one writer, a heartbeat every period from the first one on, and standbys
// that, once they watch the Lease, send nothing at all. (A check of the
// simulation itself: its API server serves what the Reporter needs.)
func TestSimCalm(t *testing.T) {
	const period = 2 * time.Second
	s := simScenario(t, simSchedule{seed: 1, replicas: 3, period: period, length: 40 * period, skews: make([]time.Duration, 3)})
	beats := s.reporterBeats()
	if len(beats) < 39 || len(beats) > 41 {
		t.Errorf("%d heartbeats in 40 periods", len(beats))
	}
	if first := beats[0].at.Sub(s.start); first > period/4 {
		t.Errorf("first heartbeat after %s", first)
	}
	for i := 1; i < len(beats); i++ {
		if gap := beats[i].at.Sub(beats[i-1].at); gap > period+period/10 || gap < period-period/10 {
			t.Errorf("gap %s at %s: want one period", gap, s.rel(beats[i].at))
		}
		if beats[i].proc != beats[0].proc {
			t.Errorf("heartbeat by %s at %s: the writer changed without a fault", beats[i].proc, s.rel(beats[i].at))
		}
	}
	for _, p := range s.procs {
		n := s.srv.stats.byProc[p]
		if p == beats[0].proc {
			if n < 80 || n > 90 {
				t.Errorf("the leader sent %d requests in 40 periods, want 2 per period and its start", n)
			}
		} else if n > 6 {
			t.Errorf("standby %s sent %d requests; want only its start (a read of the AddonInstance and of the Lease, a watch, a try)", p, n)
		}
	}
}

// A leader killed between two heartbeats is replaced 1.75 periods after its
// last renewal (which went with its last heartbeat): the gap is within the
// 2 periods doc.go promises.
func TestSimKilledLeaderIsReplacedWithinTwoPeriods(t *testing.T) {
	for _, period := range []time.Duration{time.Second, 10 * time.Second} {
		t.Run(period.String(), func(t *testing.T) {
			kill := 10*period + period/2
			s := simScenario(t, simSchedule{seed: 2, replicas: 2, period: period, length: 20 * period, skews: make([]time.Duration, 2),
				actions: []simAction{{at: kill, kind: "kill", mode: "crash", target: -1, dur: time.Hour}}})
			beats := s.reporterBeats()
			var before, after *simHB
			for i := range beats {
				if beats[i].at.Sub(s.start) < kill {
					before = &beats[i]
				} else if after == nil {
					after = &beats[i]
				}
			}
			if before == nil || after == nil || before.proc == after.proc {
				t.Fatalf("no takeover around the kill at %s: %v then %v", kill, before, after)
			}
			gap := after.at.Sub(before.at)
			if lo, hi := election.Timings(period).LeaseDuration, 2*period; gap < lo || gap > hi {
				t.Errorf("gap %s across the kill, want within [%s, %s]", gap, lo, hi)
			}
			t.Logf("gap %s (%.2f periods)", gap, float64(gap)/float64(period))
		})
	}
}

// leaseDurationSeconds is spec.leaseDurationSeconds for a lease duration:
// whole seconds, rounded up, as the election writes it.
func leaseDurationSeconds(d time.Duration) int32 {
	return int32((d + time.Second - 1) / time.Second)
}
