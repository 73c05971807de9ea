package heartbeat

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	addonsv1alpha1 "github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/internal/addonsv1alpha1"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/election"
)

// Start runs the Reporter until ctx ends: it campaigns for the AddonInstance's
// Lease and, while it leads, heartbeats. Losing the Lease ends the term and
// the Reporter campaigns again; when ctx ends it stops heartbeating first and
// then releases the Lease, so that a standby takes over at once. Start returns
// nil on a clean stop and an error only for a second Start.
func (r *Reporter) Start(ctx context.Context) error {
	if !r.started.CompareAndSwap(false, true) {
		return errors.New("heartbeat: Reporter already started")
	}
	r.activity.mark(r.clock.Now())
	r.running.Store(true)
	defer func() {
		r.running.Store(false)
		if r.health != nil {
			r.health.close()
		}
	}()
	r.log.Info("starting heartbeat reporter", "identity", r.opts.Identity,
		"lease", r.leaseKey.String(), "leaderElection", !r.opts.DisableLeaderElection)
	if r.opts.DisableLeaderElection {
		for ctx.Err() == nil {
			r.lead(ctx, nil)
		}
		return nil
	}
	log := r.log.WithValues("lease", r.leaseKey.String())
	e := r.newElector(log)
	for ctx.Err() == nil {
		if !e.Campaign(ctx, r.period()) {
			continue // ctx is done: the loop ends
		}
		log.Info("acquired the Lease", "identity", r.opts.Identity)
		r.lead(ctx, e)
		if ctx.Err() != nil {
			r.releaseLease(log, e)
			continue // ctx is done: the loop ends
		}
		// The term ended with ctx still running: the Lease was lost, and
		// the next campaign reads the AddonInstance again.
		e.Yield()
	}
	r.log.Info("heartbeat reporter stopped")
	return nil
}

// newElector is the election of this Reporter's AddonInstance, on its
// clock: a campaign reads the AddonInstance's period before each take
// (probe), and each try is a sign of life (Healthz) and a sample of
// addon_heartbeat_election_attempts_total.
func (r *Reporter) newElector(log logr.Logger) *election.Elector {
	return election.New(election.Config{
		Leases:   election.NewLeases(r.kube.leases, FieldManager),
		Lease:    r.leaseKey,
		Identity: r.opts.Identity,
		Instance: r.opts.Name,
		Clock:    r.clock,
		Log:      log,
		LogError: func(err error, msg string, kv ...any) { r.limiter.logError(log, err, msg, kv...) },
		ReadPeriod: func(ctx context.Context) (time.Duration, bool, error) {
			return r.probe(ctx)
		},
		OnTry: func(res election.Result) {
			r.activity.mark(r.clock.Now())
			r.metrics.elections.WithLabelValues(string(res)).Inc()
		},
	})
}

// releaseLease hands the Lease back after the last heartbeat of a term, so
// that a standby takes over at its next check.
func (r *Reporter) releaseLease(log logr.Logger, e *election.Elector) {
	if !r.releaseOnCancel {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), WriteTimeout(e.Period(DefaultPeriod)))
	defer cancel()
	if err := e.Release(ctx); err != nil {
		log.Error(err, "releasing the Lease failed: a standby takes over when it expires")
		return
	}
	log.Info("released the Lease")
}

// probe reads the AddonInstance once, to pick election timings before
// leading (standbys watch nothing else; once a leader has announced its
// period on the Lease they pace their looks by that). fresh reports a first
// install: the AddonInstance has never had a heartbeat (no
// status.lastHeartbeatTime), or does not exist. When it cannot be read (err)
// the period is the last one this process saw, or DefaultPeriod, and fresh
// is false.
func (r *Reporter) probe(ctx context.Context) (period time.Duration, fresh bool, err error) {
	ai, err := r.kube.getInstance(ctx, r.key)
	switch {
	case err == nil:
		r.knownPeriod.Store(int64(instancePeriod(ai)))
		return instancePeriod(ai), ai.Status.LastHeartbeatTime.IsZero(), nil
	case apierrors.IsNotFound(err):
		return r.period(), true, nil
	case ctx.Err() != nil:
	case apierrors.IsForbidden(err):
		r.limiter.logError(r.log, err, "reading the AddonInstance is forbidden: bind the reporter role to this ServiceAccount")
	default:
		r.limiter.logError(r.log, err, "reading the AddonInstance failed")
	}
	return r.period(), false, fmt.Errorf("reading AddonInstance %s: %w", r.key, err)
}

// lead is one term of leadership: it watches the AddonInstance (and the
// Deployments in zero-code mode) and heartbeats until ctx ends or, with a
// lock, the Lease is lost. Each heartbeat first renews the Lease.
func (r *Reporter) lead(ctx context.Context, lock *election.Elector) {
	r.leadMu.Lock()
	defer r.leadMu.Unlock()
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()

	t := &term{r: r, lock: lock, end: cancel, earlier: make(chan struct{}, 1)}
	t.startGuards(ctx, &wg)
	kick := make(chan struct{}, 1)
	informers, err := t.startWatches(ctx, &wg, kick)
	if err != nil {
		r.limiter.logError(r.log, err, "setting up the watch failed")
		r.sleep(ctx, time.Second)
		return
	}
	// Wait briefly for the first lists so that the first heartbeat has
	// health to report; within the first half period, so that the hold
	// taken just now is renewed in time by that heartbeat.
	syncCtx, stopSync := context.WithTimeout(ctx, WriteTimeout(r.period()))
	synced := make([]toolscache.InformerSynced, len(informers))
	for i, inf := range informers {
		synced[i] = inf.HasSynced
	}
	toolscache.WaitForCacheSync(syncCtx.Done(), synced...)
	stopSync()

	r.leading.Store(true)
	r.metrics.leader.Set(1)
	defer func() {
		r.leading.Store(false)
		r.metrics.leader.Set(0)
	}()
	r.log.Info("leading: sending heartbeats", "identity", r.opts.Identity)
	defer r.log.Info("stopped leading", "identity", r.opts.Identity)

	(&loop{clock: r.clock, observe: t.observe, beat: t.beat, kick: kick}).run(ctx)
}

// startGuards starts, for the term, the end of leadership when the hold runs
// out, and the probes of the API server's clock while a correction needs
// them.
func (t *term) startGuards(ctx context.Context, wg *sync.WaitGroup) {
	if t.lock != nil {
		// Stop leading when the hold runs out even if no heartbeat is due
		// to notice: is_leader must not outlive the Lease. Renewals only
		// move the deadline; the timer re-arms itself when it fires early.
		t.setDeadline(t.lock.HoldEnd())
		wg.Add(1)
		go func() {
			defer wg.Done()
			t.watchDeadline(ctx)
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		t.probeClock(ctx)
	}()
}

// startWatches starts the term's informers: the AddonInstance's, whose
// changes send on kick, and in zero-code mode the Deployments'. It returns
// them, not yet synced.
func (t *term) startWatches(ctx context.Context, wg *sync.WaitGroup, kick chan<- struct{}) ([]toolscache.SharedIndexInformer, error) {
	r := t.r
	signal := func(any) {
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	// client-go's reflectors log through the context's logger; rate-limit
	// it like our own errors.
	informerCtx := klog.NewContext(ctx, rateLimited(r.log.WithName("watch"), r.limiter))
	t.instance = r.kube.instanceInformer(r.key)
	informers := []toolscache.SharedIndexInformer{t.instance}
	if r.opts.DeploymentHealth {
		var err error
		if t.deployments, err = r.kube.deploymentInformer(r.key.Namespace); err != nil {
			return nil, err
		}
		informers = append(informers, t.deployments)
	}
	// No resync: an update is a change of the AddonInstance (see resyncCheck).
	if _, err := t.instance.AddEventHandlerWithResyncPeriod(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    signal,
		UpdateFunc: func(_, o any) { signal(o) },
		DeleteFunc: signal,
	}, 0); err != nil {
		return nil, err
	}
	for i, inf := range informers {
		what := "AddonInstance " + r.key.String()
		if i > 0 {
			what = "Deployments in " + r.key.Namespace
		}
		if err := inf.SetWatchErrorHandler(func(_ *toolscache.Reflector, err error) { r.watchError(what, err) }); err != nil {
			return nil, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			runInformer(informerCtx, inf)
		}()
	}
	return informers, nil
}

// watchError logs a failed list or watch of what: forbidden ones
// rate-limited with what to do; the rest as client-go's default handler
// does (a watch that expired or ended is normal), rate-limited too. (That
// handler's signature differs between the client-go releases the SDK
// supports, so it is not called.)
func (r *Reporter) watchError(what string, err error) {
	switch {
	case apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err):
		r.limiter.logError(r.log, err, "watching is forbidden: bind the reporter role to this ServiceAccount", "type", what)
	case apierrors.IsResourceExpired(err) || apierrors.IsGone(err) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		r.log.V(4).Info("watch closed", "type", what, "err", err.Error())
	default:
		r.limiter.logError(r.log, err, "watch failed", "type", what)
	}
}

// runInformer runs inf until ctx ends. Its reflector logs through ctx's
// logger where client-go can (RunWithContext, since v0.33); an older one
// logs through klog's global logger.
func runInformer(ctx context.Context, inf toolscache.SharedIndexInformer) {
	if c, ok := inf.(interface{ RunWithContext(context.Context) }); ok {
		c.RunWithContext(ctx)
		return
	}
	inf.Run(ctx.Done())
}

// period is the last period this process saw, DefaultPeriod before any.
func (r *Reporter) period() time.Duration {
	if p := time.Duration(r.knownPeriod.Load()); p > 0 {
		return p
	}
	return DefaultPeriod
}

func (r *Reporter) sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-r.clock.After(d):
	}
}

// term is the leader's view of the cluster for one term.
type term struct {
	r           *Reporter
	lock        *election.Elector         // nil without leader election
	deadline    atomic.Pointer[time.Time] // end of the hold (see setDeadline)
	end         context.CancelFunc
	instance    toolscache.SharedIndexInformer
	deployments toolscache.SharedIndexInformer
	lostOnce    sync.Once
	// earlier tells watchDeadline that the deadline moved earlier
	// (capacity 1).
	earlier chan struct{}
	// written is the last version this term wrote, and writtenOver the
	// versions that write replaced (touched by the heartbeat loop only).
	written     *addonsv1alpha1.AddonInstance
	writtenOver []string
}

// setDeadline moves the end of the hold. It keeps the time.Time whole, with
// the monotonic reading the clock gave it: stored as Unix nanoseconds it
// would be compared by the wall clock, and after an NTP step back the
// leader (IsLeader, is_leader) would outlive a hold a standby has already
// taken over. A deadline moved earlier (a renewal on a shorter period whose
// outcome is unknown, see election.Elector.Renew) re-arms watchDeadline.
func (t *term) setDeadline(at time.Time) {
	if prev := t.deadline.Swap(&at); prev != nil && at.Before(*prev) {
		select {
		case t.earlier <- struct{}{}:
		default:
		}
	}
}

// holdEnd is the end of the hold (see setDeadline).
func (t *term) holdEnd() time.Time { return *t.deadline.Load() }

// probeClock narrows the estimate of the API server's clock while it
// corrects local time (see serverClock.probeAt): after a status write says
// so (clockKick), a run of up to clockProbes requests, each at the instant
// the estimate names; at most one run every clockProbeEvery. A clock in sync
// is never probed.
func (t *term) probeClock(ctx context.Context) {
	r := t.r
	var last time.Time // the end of the last run
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.clockKick:
		}
		if !last.IsZero() && r.clock.Since(last) < clockProbeEvery {
			continue
		}
		for range clockProbes {
			now := r.clock.Now()
			at, ok := r.serverClock.probeAt(now)
			if !ok {
				break
			}
			select {
			case <-ctx.Done():
				return
			case <-r.clock.After(at.Sub(now)):
			}
			pctx, cancel := context.WithTimeout(ctx, time.Second)
			// What counts is the Date of the answer, which the transport
			// records; a failed request is a failed probe, and the run
			// goes on.
			_ = r.kube.version(pctx)
			cancel()
			last = r.clock.Now()
		}
	}
}

// watchDeadline ends the term when the hold runs out.
func (t *term) watchDeadline(ctx context.Context) {
	clk := t.r.clock
	timer := clk.NewTimer(t.holdEnd().Sub(clk.Now()))
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C():
		case <-t.earlier:
		}
		left := t.holdEnd().Sub(clk.Now())
		if left <= 0 {
			t.lost("could not renew the Lease in time")
			return
		}
		resetTimer(timer, left)
	}
}

// lost ends the term: the Lease is no longer this process's.
func (t *term) lost(why string) {
	t.lostOnce.Do(func() {
		t.r.log.Info("lost the Lease: stopping heartbeats", "reason", why)
		t.end()
	})
}

// current reads the AddonInstance from the watch cache: nil when it does not
// exist or the watch has not synced yet. The cached object is shared: copy it
// before changing it.
func (t *term) current() *addonsv1alpha1.AddonInstance {
	if !t.instance.HasSynced() {
		return nil
	}
	obj, ok, err := t.instance.GetStore().GetByKey(t.r.key.String())
	if err != nil || !ok {
		return nil
	}
	ai, _ := obj.(*addonsv1alpha1.AddonInstance)
	return ai
}

// maxWrittenOver bounds the versions remembered as replaced by this term's
// own writes: a watch that lags further than that many heartbeats costs one
// conflict and a read.
const maxWrittenOver = 16

// wrote records a successful write of written over base, which replaced the
// versions over. When base was this term's own last write (the watch had not
// brought it), the versions that write replaced are still ones the watch
// may hold: they are kept, so that a watch lagging by several writes still
// leads to the newest version rather than to a conflict.
func (t *term) wrote(base, written *addonsv1alpha1.AddonInstance, over []string) {
	if base != nil && base == t.written {
		over = append(slices.Clone(t.writtenOver), over...)
		if n := len(over); n > maxWrittenOver {
			over = over[n-maxWrittenOver:]
		}
	}
	t.written, t.writtenOver = written, over
}

// newest is the version to write the next heartbeat over: the cached one,
// unless the watch has not yet brought this term's last write (the cache
// still holds a version that write replaced), where writing over the cache
// would only meet a conflict and cost a read.
func (t *term) newest(cached *addonsv1alpha1.AddonInstance) *addonsv1alpha1.AddonInstance {
	if t.written != nil && slices.Contains(t.writtenOver, cached.ResourceVersion) {
		return t.written
	}
	return cached
}

func (t *term) observe() target {
	ai := t.current()
	if ai != nil {
		t.r.knownPeriod.Store(int64(instancePeriod(ai)))
		t.r.notePeriod(ai)
	}
	if ai == nil {
		return target{period: instancePeriod(ai)}
	}
	return target{present: true, uid: ai.UID, period: instancePeriod(ai)}
}

// beat is one heartbeat of the loop: write, then renew the Lease.
//
// The order is what bounds the gap a failed leader leaves. A standby takes
// the Lease one lease duration after the last renewal it saw, so a renewal
// must never announce a heartbeat that was not written: renewed first, a
// leader killed (or cut off, or failing) between its renewal and its write
// would leave its last heartbeat a period before that renewal, a gap of a
// period plus a lease duration. Written first, the write goes out on the
// hold the previous renewal gave (a renew deadline, 1.5 periods, from that
// renewal: half a period to spare), and the renewal follows only a heartbeat
// that went through: whatever fails, the last renewal comes right after the
// last heartbeat and the gap is a lease duration (see election.Timings). A write that
// fails renews nothing: the hold runs out unless a retry within it
// succeeds, and a standby that can write takes over.
func (t *term) beat(ctx context.Context) beatResult {
	r := t.r
	r.activity.mark(r.clock.Now())
	ai := t.current()
	period := r.period() // the last one seen, while there is no AddonInstance
	if ai != nil {
		period = instancePeriod(ai)
	}
	if ai == nil {
		if !t.instance.HasSynced() {
			// No view of the AddonInstance yet: no heartbeat, so no
			// renewal either (see above).
			if !r.waiting {
				r.log.Info("waiting for the AddonInstance watch to sync")
				r.waiting = true
			}
			return beatFailed
		}
		// Nothing to heartbeat into: keep the Lease, so that the
		// first heartbeat goes out as soon as the AddonInstance exists.
		if t.lock != nil && !t.renew(ctx, period) {
			return beatFailed
		}
		if !r.waiting {
			r.log.Info("waiting for the AddonInstance to exist")
			r.waiting = true
		}
		return beatWaiting
	}
	if r.waiting {
		r.log.Info("AddonInstance found: sending heartbeats")
		r.waiting = false
	}
	wctx, cancel := context.WithTimeout(ctx, WriteTimeout(period))
	defer cancel()
	comps := t.components(wctx, period)

	start := r.clock.Now()
	base := t.newest(ai)
	written, over, err := r.write(wctx, base, comps, t.held)
	r.metrics.latency.Observe(r.clock.Since(start).Seconds())
	if err != nil {
		reason := failureReason(err)
		r.metrics.failed.WithLabelValues(reason).Inc()
		if reason == failNotFound {
			// Deleted since the cache saw it: the watch reports the
			// deletion, and the next beat finds nothing to write to.
			// Nothing to heartbeat into, as without an AddonInstance:
			// the Lease is kept.
			if t.lock != nil && !t.renew(ctx, period) {
				return beatFailed
			}
			return beatWaiting
		}
		r.failing = true
		switch reason {
		case failForbidden:
			r.limiter.logError(r.log, err, "heartbeat forbidden: bind the reporter role to this ServiceAccount", "reason", reason)
		case failFenced:
			r.limiter.logError(r.log, err, "heartbeat refused by the fencing policy: the Lease has another holder, or none", "reason", reason)
		default:
			r.limiter.logError(r.log, err, "heartbeat failed", "reason", reason)
		}
		return beatFailed
	}
	t.wrote(base, written, over)
	r.metrics.sent.Inc()
	r.metrics.lastSuccess.Set(float64(r.clock.Now().UnixNano()) / 1e9)
	if r.failing {
		r.log.Info("heartbeats resumed")
		r.failing = false
	}
	if t.lock != nil && !t.renew(ctx, period) {
		// The heartbeat is written; the retry writes another and renews.
		return beatFailed
	}
	return beatWritten
}

// held reports whether the term's hold still runs (always, without leader
// election).
func (t *term) held() bool {
	return t.lock == nil || t.r.clock.Now().Before(t.lock.HoldEnd())
}

// renew extends the hold after a heartbeat (or, with no AddonInstance to
// write to, in its place), bounded like a write of its own. False means the
// hold was not extended.
func (t *term) renew(ctx context.Context, period time.Duration) bool {
	r := t.r
	ctx, cancel := context.WithTimeout(ctx, WriteTimeout(period))
	defer cancel()
	err := t.lock.Renew(ctx, period)
	switch {
	case err == nil:
		t.setDeadline(t.lock.HoldEnd())
		return true
	case errors.Is(err, election.ErrLost):
		t.lost(err.Error())
		return false
	}
	// A renewal whose outcome is unknown may have shortened the hold.
	t.setDeadline(t.lock.HoldEnd())
	reason := failureReason(err)
	r.metrics.failed.WithLabelValues(reason).Inc()
	r.failing = true
	r.limiter.logError(r.log, err, "renewing the Lease failed", "reason", reason)
	if !r.clock.Now().Before(t.lock.HoldEnd()) {
		t.lost("could not renew the Lease in time")
	}
	return false
}

// components evaluates every health source, sorted by name; nil when there
// is none to judge by (Degraded and Installed are then left alone).
func (t *term) components(ctx context.Context, period time.Duration) []Component {
	r := t.r
	var comps []Component
	known := false
	if t.deployments != nil {
		if !t.deployments.HasSynced() {
			return nil
		}
		// The store holds trimmed copies; DeploymentComponents only reads.
		objs := t.deployments.GetStore().List()
		deps := make([]appsv1.Deployment, 0, len(objs))
		for _, o := range objs {
			if d, ok := o.(*appsv1.Deployment); ok {
				deps = append(deps, *d)
			}
		}
		comps = append(comps, DeploymentComponents(deps, r.key.Namespace, r.key.Name)...)
		known = true
	}
	if r.health != nil {
		hctx, cancel := context.WithTimeout(ctx, healthTimeout(period))
		comps = append(comps, r.health.check(hctx))
		cancel()
		known = true
	}
	sdk, _, _ := r.sdkState()
	if len(sdk) > 0 {
		comps = append(comps, sdk...)
		known = true
	}
	if !known {
		return nil
	}
	slices.SortStableFunc(comps, func(a, b Component) int { return cmp.Compare(a.Name, b.Name) })
	return comps
}
