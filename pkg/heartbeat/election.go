package heartbeat

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	addonsv1alpha1 "github.com/openshift/addon-operator/apis/addons/v1alpha1"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/watch"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
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
		"lease", r.lock.key.String(), "leaderElection", !r.opts.DisableLeaderElection)
	if r.opts.DisableLeaderElection {
		for ctx.Err() == nil {
			r.lead(ctx, nil)
		}
		return nil
	}
	log := r.log.WithValues("lease", r.lock.key.String())
	for ctx.Err() == nil {
		if !r.campaign(ctx, log) {
			continue // ctx is done: the loop ends
		}
		log.Info("acquired the Lease", "identity", r.opts.Identity)
		r.lead(ctx, r.lock)
		if ctx.Err() != nil {
			r.releaseLease(log)
			continue // ctx is done: the loop ends
		}
		// The term ended with ctx still running: the Lease was lost, and
		// the next campaign reads the AddonInstance again.
		r.lock.yield()
	}
	r.log.Info("heartbeat reporter stopped")
	return nil
}

// campaign is one stretch as a standby: it takes the Lease when it is free,
// released or expired, and returns true once this process holds it (false
// when ctx ends). It reads the Lease once and then watches it from that
// version: each renewal comes as an event, so a standby reads nothing while
// the leader renews, sees a release at once and judges expiry from the
// moment of the last renewal. The watch is closed while this process leads.
// Errors (the read or the watch failing) count as failed election attempts
// and are retried at the election's own pace, not a reflector's back-off, so
// a standby is back within a retry period of the API server.
func (r *Reporter) campaign(ctx context.Context, log logr.Logger) bool {
	var w watch.Interface
	defer func() {
		if w != nil {
			w.Stop()
		}
	}()
	read := true // read the Lease before (re)opening the watch
	var opened time.Time
	period := r.period()
	r.lock.maxDuration = Timings(period).LeaseDuration
	var probed time.Time // when the AddonInstance was last read; zero: not yet
	sameIdentitySaid, campaignSaid := false, false
	for ctx.Err() == nil {
		var err error
		if w == nil {
			w, err = r.watchLease(ctx, read)
			opened = r.clock.Now()
		}
		if probed.IsZero() || err == nil && !r.lock.heldByOther(r.clock.Now()) && probed.Before(r.lock.observedAt) {
			// A take is judged on the AddonInstance as read after the
			// record it judges was seen: the bound on another's hold
			// (maxDuration), the wait for a Lease found missing
			// (vacancyWait) and the period the take announces all
			// follow the spec's period, which may have changed (a
			// longer one is announced by the holder's renewal right
			// after it sees it, and a bound from before would end that
			// hold early). Once per record: a standby waiting out a
			// live holder reads nothing; one about to take reads once.
			// The read shows the spec as of some instant after it was
			// sent: it is as fresh as its sending, not its answer (which
			// a slow API server may give long after a record it judges).
			sent := r.clock.Now()
			p, fresh, perr := r.probe(ctx)
			switch {
			case perr == nil:
				period, probed = p, sent
				r.lock.maxDuration = Timings(period).LeaseDuration
				r.lock.vacancyWait = vacancyWait(period, fresh)
			case err == nil:
				// No take on an older read: the hold it would
				// announce, and the bounds it would judge by, may be
				// on a period the others no longer follow. Try again
				// at the retry pace.
				err = perr
			}
			if !campaignSaid {
				log.V(1).Info("campaigning", "identity", r.opts.Identity, "timings", Timings(period))
				campaignSaid = true
			}
		}
		r.activity.mark(r.clock.Now())
		held := false
		if err == nil {
			// Bounded like a heartbeat, so that an API server that
			// stops answering delays the next try, never stops tries.
			actx, cancel := context.WithTimeout(ctx, maxWriteTimeout)
			held, err = r.lock.acquire(actx, period)
			cancel()
		}
		wait := r.lock.wait(period)
		switch {
		case err != nil:
			if ctx.Err() != nil {
				return false
			}
			r.metrics.elections.WithLabelValues(electionError).Inc()
			r.limiter.logError(log, err, "leader election failed")
			wait = checkInterval(r.lock.period(period))
		case held:
			r.metrics.elections.WithLabelValues(electionAcquired).Inc()
			return true
		case !r.lock.heldByOther(r.clock.Now()):
			// Not held, not taken: the Lease is being made, or this
			// process waits for its watch to catch up.
			r.metrics.elections.WithLabelValues(electionWaiting).Inc()
		default:
			r.metrics.elections.WithLabelValues(electionHeld).Inc()
			if r.lock.heldBySameIdentity() && !sameIdentitySaid {
				// An earlier run of this process that did not release the
				// Lease (it crashed), or a second process given this
				// identity: either way wait for that hold to end.
				log.Info("the Lease is held under this process's identity by another process: "+
					"an earlier run of it, or a second process with the same identity (each needs its own); "+
					"waiting for that hold to end", "identity", r.opts.Identity)
				sameIdentitySaid = true
			}
		}
		if open, ok := awaitLease(ctx, w, r.lock, r.clock.After(wait)); !open {
			if w != nil {
				w.Stop()
				// One that ends as soon as it opens is not reopened at once.
				if r.clock.Since(opened) < Timings(period).RetryPeriod {
					r.sleep(ctx, checkInterval(r.lock.period(period)))
				}
			}
			// A watch the API server closed resumes from the last version
			// seen; one that failed starts again from a read.
			w, read = nil, !ok
		}
	}
	return false
}

// watchLease opens a watch on the Lease from the last version the lock has
// seen, after reading the Lease into the lock when read is set.
func (r *Reporter) watchLease(ctx context.Context, read bool) (watch.Interface, error) {
	if read {
		rctx, cancel := context.WithTimeout(ctx, maxWriteTimeout)
		err := r.lock.refresh(rctx)
		cancel()
		if err != nil {
			return nil, err
		}
	}
	w, err := r.kube.watchLease(ctx, r.lock.key, r.lock.lastVersion)
	if err != nil {
		return nil, fmt.Errorf("watching Lease %s: %w", r.lock.key, err)
	}
	return w, nil
}

// awaitLease waits for the watch's next event and records it in lock, or
// for timeout or ctx. open is false when the watch has ended (or there is
// none), and ok then says whether it ended cleanly (closed by the API
// server) rather than on an error.
func awaitLease(ctx context.Context, w watch.Interface, lock *leaseLock, timeout <-chan time.Time) (open, ok bool) {
	if w == nil {
		select {
		case <-ctx.Done():
		case <-timeout:
		}
		return false, false
	}
	select {
	case <-ctx.Done():
		return true, true
	case <-timeout:
		return true, true
	case ev, more := <-w.ResultChan():
		if !more {
			return false, true
		}
		switch ev.Type {
		case watch.Added, watch.Modified:
			if lease, isLease := ev.Object.(*coordinationv1.Lease); isLease {
				lock.observe(lease, lease.ResourceVersion, lock.clock.Now())
			}
			return true, true
		case watch.Deleted:
			version := ""
			if lease, isLease := ev.Object.(*coordinationv1.Lease); isLease {
				version = lease.ResourceVersion
			}
			lock.observe(nil, version, lock.clock.Now())
			return true, true
		case watch.Bookmark:
			return true, true
		default: // watch.Error: the version is too old, or a server error
			return false, false
		}
	}
}

// releaseLease hands the Lease back after the last heartbeat of a term, so
// that a standby takes over at its next check.
func (r *Reporter) releaseLease(log logr.Logger) {
	if !r.releaseOnCancel {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), WriteTimeout(r.lock.period(DefaultPeriod)))
	defer cancel()
	if err := r.lock.release(ctx); err != nil {
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
	ctx, cancel := context.WithTimeout(ctx, maxWriteTimeout)
	defer cancel()
	ai, err := r.kube.getInstance(ctx, r.key)
	switch {
	case err == nil:
		r.knownPeriod.Store(int64(Period(ai)))
		return Period(ai), ai.Status.LastHeartbeatTime.IsZero(), nil
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

// vacancyWait is how long a process that finds the Lease missing, without
// having watched the record before it go, waits from then before it makes
// the Lease (see leaseLock.vacantSince): its last holder may be live, having
// renewed after the last record this process saw. That holder's renewal
// of a Lease now gone fails and it stops, so its hold ends within the renew
// deadline of its last renewal, which came before the deletion and so before
// this process saw the Lease missing: a lease duration of the spec's period
// (the one it follows) from then has outlasted it.
//
// A first install (fresh: no heartbeat was ever written, or there is no
// AddonInstance) waits nothing, so that its first heartbeat goes out at once:
// with no heartbeat ever written there is no term whose writes could be
// overlapped but one that took a Lease made moments before and lost it to a
// deletion before its first heartbeat, and that one writes at most that
// heartbeat (on the hold of its take) and stops at the renewal after it: an
// overlap of one write, in the first seconds of an install, against making
// every first install wait a lease duration. The Lease the webhook makes,
// never held, is a vacancy like a missing one.
func vacancyWait(period time.Duration, fresh bool) time.Duration {
	if fresh {
		return 0
	}
	return Timings(period).LeaseDuration
}

// lead is one term of leadership: it watches the AddonInstance (and the
// Deployments in zero-code mode) and heartbeats until ctx ends or, with a
// lock, the Lease is lost. Each heartbeat first renews the Lease.
func (r *Reporter) lead(ctx context.Context, lock *leaseLock) {
	r.leadMu.Lock()
	defer r.leadMu.Unlock()
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()

	t := &term{r: r, lock: lock, end: cancel}
	if lock != nil {
		// Stop leading when the hold runs out even if no heartbeat is due
		// to notice: is_leader must not outlive the Lease. Renewals only
		// move the deadline; the timer re-arms itself when it fires early.
		t.setDeadline(lock.validUntil)
		wg.Add(1)
		go func() {
			defer wg.Done()
			t.watchDeadline(ctx)
		}()
	}
	// Probes of the API server's clock, while a correction needs them.
	wg.Add(1)
	go func() {
		defer wg.Done()
		t.probeClock(ctx)
	}()
	kick := make(chan struct{}, 1)
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
	var err error
	if r.opts.DeploymentHealth {
		if t.deployments, err = r.kube.deploymentInformer(r.key.Namespace); err != nil {
			r.limiter.logError(r.log, err, "setting up the watch failed")
			r.sleep(ctx, time.Second)
			return
		}
		informers = append(informers, t.deployments)
	}
	if _, err = t.instance.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    signal,
		UpdateFunc: func(_, o any) { signal(o) },
		DeleteFunc: signal,
	}); err != nil {
		r.limiter.logError(r.log, err, "setting up the watch failed")
		r.sleep(ctx, time.Second)
		return
	}
	for _, inf := range informers {
		if err := inf.SetWatchErrorHandlerWithContext(r.watchError); err != nil {
			r.limiter.logError(r.log, err, "setting up the watch failed")
			r.sleep(ctx, time.Second)
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			inf.RunWithContext(informerCtx)
		}()
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

// watchError logs a failed list or watch: forbidden ones rate-limited with
// what to do, the rest as client-go does.
func (r *Reporter) watchError(ctx context.Context, refl *toolscache.Reflector, err error) {
	if apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) {
		r.limiter.logError(r.log, err, "watching is forbidden: bind the reporter role to this ServiceAccount",
			"type", refl.TypeDescription())
		return
	}
	toolscache.DefaultWatchErrorHandler(ctx, refl, err)
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
	lock        *leaseLock                // nil without leader election
	deadline    atomic.Pointer[time.Time] // end of the hold (see setDeadline)
	end         context.CancelFunc
	instance    toolscache.SharedIndexInformer
	deployments toolscache.SharedIndexInformer
	lostOnce    sync.Once
	// written is the last version this term wrote, and writtenOver the
	// versions that write replaced (touched by the heartbeat loop only).
	written     *addonsv1alpha1.AddonInstance
	writtenOver []string
}

// setDeadline moves the end of the hold. It keeps the time.Time whole, with
// the monotonic reading the clock gave it: stored as Unix nanoseconds it
// would be compared by the wall clock, and after an NTP step back the
// leader (IsLeader, is_leader) would outlive a hold a standby has already
// taken over.
func (t *term) setDeadline(at time.Time) { t.deadline.Store(&at) }

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
		}
		left := t.holdEnd().Sub(clk.Now())
		if left <= 0 {
			t.lost("could not renew the Lease in time")
			return
		}
		timer.Reset(left)
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
		t.r.knownPeriod.Store(int64(Period(ai)))
		t.r.notePeriod(ai)
	}
	if ai == nil {
		return target{period: Period(ai)}
	}
	return target{present: true, uid: ai.UID, period: Period(ai)}
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
// last heartbeat and the gap is a lease duration (see Timings). A write that
// fails renews nothing: the hold runs out unless a retry within it
// succeeds, and a standby that can write takes over.
func (t *term) beat(ctx context.Context) beatResult {
	r := t.r
	r.activity.mark(r.clock.Now())
	ai := t.current()
	period := r.period() // the last one seen, while there is no AddonInstance
	if ai != nil {
		period = Period(ai)
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
	return t.lock == nil || t.r.clock.Now().Before(t.lock.validUntil)
}

// renew extends the hold after a heartbeat (or, with no AddonInstance to
// write to, in its place), bounded like a write of its own. False means the
// hold was not extended.
func (t *term) renew(ctx context.Context, period time.Duration) bool {
	r := t.r
	ctx, cancel := context.WithTimeout(ctx, WriteTimeout(period))
	defer cancel()
	err := t.lock.renew(ctx, period)
	switch {
	case err == nil:
		t.setDeadline(t.lock.validUntil)
		return true
	case errors.Is(err, errLeaseLost):
		t.lost(err.Error())
		return false
	}
	reason := failureReason(err)
	r.metrics.failed.WithLabelValues(reason).Inc()
	r.failing = true
	r.limiter.logError(r.log, err, "renewing the Lease failed: heartbeat not sent", "reason", reason)
	if !r.clock.Now().Before(t.lock.validUntil) {
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

func (t LeaseTimings) String() string {
	return fmt.Sprintf("lease %s, renew %s, retry %s", t.LeaseDuration, t.RenewDeadline, t.RetryPeriod)
}
