package heartbeat

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	addonsv1alpha1 "github.com/openshift/addon-operator/apis/addons/v1alpha1"
	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
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
	defer func() {
		if r.health != nil {
			r.health.close()
		}
	}()
	r.log.Info("starting heartbeat reporter", "identity", r.opts.Identity,
		"lease", r.opts.LeaseNamespace+"/"+LeaseName(r.opts.Name), "leaderElection", !r.opts.DisableLeaderElection)
	if r.opts.DisableLeaderElection {
		for ctx.Err() == nil {
			_ = r.lead(ctx, nil) // errRestart does not apply without an election
		}
		return nil
	}
	for ctx.Err() == nil {
		period := r.probePeriod(ctx)
		if led := r.campaign(ctx, period); !led {
			// The election ended without a term (for example a
			// configuration it refused): never spin.
			select {
			case <-ctx.Done():
			case <-r.clock.After(Timings(period).RetryPeriod):
			}
		}
	}
	r.log.Info("heartbeat reporter stopped")
	return nil
}

// probePeriod reads the AddonInstance's period once, to pick election timings
// before leading (standbys watch nothing). When it cannot be read it falls
// back to the last period this process saw, or DefaultPeriod.
func (r *Reporter) probePeriod(ctx context.Context) time.Duration {
	ctx, cancel := context.WithTimeout(ctx, maxWriteTimeout)
	defer cancel()
	ai := &addonsv1alpha1.AddonInstance{}
	err := r.client.Get(ctx, r.key, ai)
	switch {
	case err == nil:
		r.knownPeriod.Store(int64(Period(ai)))
		return Period(ai)
	case apierrors.IsNotFound(err), ctx.Err() != nil:
	case apierrors.IsForbidden(err):
		r.limiter.logError(r.log, err, "reading the AddonInstance is forbidden: bind the reporter role to this ServiceAccount")
	default:
		r.limiter.logError(r.log, err, "reading the AddonInstance failed")
	}
	if p := time.Duration(r.knownPeriod.Load()); p > 0 {
		return p
	}
	return DefaultPeriod
}

// campaign runs one leader election with timings for period until this
// process has led and stopped leading, or ctx ends. It reports whether it led.
func (r *Reporter) campaign(ctx context.Context, period time.Duration) bool {
	t := Timings(period)
	log := r.log.WithValues("lease", r.opts.LeaseNamespace+"/"+LeaseName(r.opts.Name))
	// client-go logs every failed attempt through the context's logger;
	// rate-limit it like our own errors.
	electLog := rateLimited(log.WithName("leaderelection"), r.limiter)
	electCtx, cancelElect := context.WithCancel(klog.NewContext(context.WithoutCancel(ctx), electLog))
	defer cancelElect()

	var mu sync.Mutex
	leading := false
	// Not leading when ctx ends: stop campaigning. Leading: the term below
	// stops its loop first and then cancels the election, which releases.
	stop := context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		if !leading {
			cancelElect()
		}
	})
	defer stop()

	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: r.opts.LeaseNamespace, Name: LeaseName(r.opts.Name)},
		Client:     r.leases,
		LockConfig: resourcelock.ResourceLockConfig{Identity: r.opts.Identity},
		Labels:     map[string]string{"app.kubernetes.io/managed-by": "addon-heartbeat"},
	}
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		Name:            LeaseName(r.opts.Name),
		LeaseDuration:   t.LeaseDuration,
		RenewDeadline:   t.RenewDeadline,
		RetryPeriod:     t.RetryPeriod,
		ReleaseOnCancel: r.releaseOnCancel,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(leadCtx context.Context) {
				mu.Lock()
				if electCtx.Err() != nil {
					mu.Unlock()
					return
				}
				leading = true
				mu.Unlock()
				termCtx, cancel := context.WithCancel(leadCtx)
				defer cancel()
				stopTerm := context.AfterFunc(ctx, cancel)
				defer stopTerm()
				if err := r.lead(termCtx, &period); errors.Is(err, errRestart) {
					log.Info(err.Error())
				}
				// Loop stopped: now release the Lease (ReleaseOnCancel).
				cancelElect()
			},
			OnStoppedLeading: func() {},
		},
	})
	if err != nil {
		r.limiter.logError(log, err, "configuring leader election failed", "timings", t)
		return false
	}
	log.V(1).Info("campaigning", "identity", r.opts.Identity, "leaseDuration", t.LeaseDuration,
		"renewDeadline", t.RenewDeadline, "retryPeriod", t.RetryPeriod)
	le.Run(electCtx)
	// A term that started late (client-go starts it in a goroutine) finds
	// its context cancelled; waiting for leadMu waits for a running term.
	r.leadMu.Lock()
	r.leadMu.Unlock() //nolint:staticcheck // an empty critical section: wait for the term to end
	mu.Lock()
	defer mu.Unlock()
	return leading
}

// lead is one term of leadership: it watches the AddonInstance (and the
// Deployments in zero-code mode) and heartbeats until ctx ends. With
// timingsFor set, a period that the election's timings no longer cover ends
// the term with errRestart.
func (r *Reporter) lead(ctx context.Context, timingsFor *time.Duration) error {
	r.leadMu.Lock()
	defer r.leadMu.Unlock()
	if ctx.Err() != nil {
		return nil
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()

	c, err := r.newCache()
	if err != nil {
		r.limiter.logError(r.log, err, "setting up the watch failed")
		r.sleep(ctx, time.Second)
		return nil
	}
	kick := make(chan struct{}, 1)
	signal := func(any) {
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	term := &term{r: r, cache: c}
	term.instance, err = c.GetInformer(ctx, &addonsv1alpha1.AddonInstance{}, cache.BlockUntilSynced(false))
	if err == nil {
		_, err = term.instance.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
			AddFunc:    signal,
			UpdateFunc: func(_, o any) { signal(o) },
			DeleteFunc: signal,
		})
	}
	if err == nil && r.opts.DeploymentHealth {
		term.deployments, err = c.GetInformer(ctx, &appsv1.Deployment{}, cache.BlockUntilSynced(false))
	}
	if err != nil {
		r.limiter.logError(r.log, err, "setting up the watch failed")
		r.sleep(ctx, time.Second)
		return nil
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := c.Start(ctx); err != nil {
			r.limiter.logError(r.log, err, "watch stopped")
		}
	}()
	syncCtx, stopSync := context.WithTimeout(ctx, WriteTimeout(DefaultPeriod))
	c.WaitForCacheSync(syncCtx)
	stopSync()

	r.leading.Store(true)
	r.metrics.leader.Set(1)
	defer func() {
		r.leading.Store(false)
		r.metrics.leader.Set(0)
	}()
	r.log.Info("leading: sending heartbeats", "identity", r.opts.Identity)
	defer r.log.Info("stopped leading", "identity", r.opts.Identity)

	l := &loop{clock: r.clock, observe: term.observe, beat: term.beat, kick: kick}
	if timingsFor != nil {
		l.restart = func(p time.Duration) bool { return timingsStale(*timingsFor, p) }
	}
	return l.run(ctx)
}

func (r *Reporter) sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-r.clock.After(d):
	}
}

// newCache builds the leader's cache: its AddonInstance only (a field
// selector on the name, so that RBAC can restrict it with resourceNames) and,
// in zero-code mode, the Deployments of its namespace trimmed to what health
// reads.
func (r *Reporter) newCache() (cache.Cache, error) {
	byObject := map[client.Object]cache.ByObject{
		&addonsv1alpha1.AddonInstance{}: {Field: fields.OneTermEqualSelector("metadata.name", r.key.Name)},
	}
	if r.opts.DeploymentHealth {
		byObject[&appsv1.Deployment{}] = cache.ByObject{Transform: TrimDeployment, UnsafeDisableDeepCopy: ptr.To(true)}
	}
	return cache.New(r.cfg, cache.Options{
		HTTPClient:                  r.http,
		Scheme:                      r.scheme,
		Mapper:                      r.mapper,
		DefaultNamespaces:           map[string]cache.Config{r.key.Namespace: {}},
		ReaderFailOnMissingInformer: true,
		ByObject:                    byObject,
		DefaultWatchErrorHandler: func(ctx context.Context, refl *toolscache.Reflector, err error) {
			if apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) {
				r.limiter.logError(r.log, err, "watching is forbidden: bind the reporter role to this ServiceAccount",
					"type", refl.TypeDescription())
				return
			}
			toolscache.DefaultWatchErrorHandler(ctx, refl, err)
		},
	})
}

// term is the leader's view of the cluster for one term.
type term struct {
	r           *Reporter
	cache       cache.Cache
	instance    cache.Informer
	deployments cache.Informer
}

// current reads the AddonInstance from the cache: nil when it does not exist
// or the watch has not synced yet.
func (t *term) current(ctx context.Context) *addonsv1alpha1.AddonInstance {
	if !t.instance.HasSynced() {
		return nil
	}
	ai := &addonsv1alpha1.AddonInstance{}
	if err := t.cache.Get(ctx, t.r.key, ai); err != nil {
		return nil
	}
	return ai
}

func (t *term) observe() target {
	ai := t.current(context.Background())
	if ai != nil {
		t.r.knownPeriod.Store(int64(Period(ai)))
	}
	return target{present: ai != nil, period: Period(ai)}
}

// beat is one heartbeat of the loop.
func (t *term) beat(ctx context.Context) beatResult {
	r := t.r
	ai := t.current(ctx)
	if ai == nil {
		if !r.waiting {
			if t.instance.HasSynced() {
				r.log.Info("waiting for the AddonInstance to exist")
			} else {
				r.log.Info("waiting for the AddonInstance watch to sync")
			}
			r.waiting = true
		}
		return beatWaiting
	}
	if r.waiting {
		r.log.Info("AddonInstance found: sending heartbeats")
		r.waiting = false
	}
	period := Period(ai)
	ctx, cancel := context.WithTimeout(ctx, WriteTimeout(period))
	defer cancel()
	comps := t.components(ctx, period)

	start := r.clock.Now()
	err := r.write(ctx, ai, comps)
	r.metrics.latency.Observe(r.clock.Since(start).Seconds())
	if err == nil {
		r.metrics.sent.Inc()
		r.metrics.lastSuccess.Set(float64(r.clock.Now().UnixNano()) / 1e9)
		if r.failing {
			r.log.Info("heartbeats resumed")
			r.failing = false
		}
		return beatWritten
	}
	reason := failureReason(err)
	r.metrics.failed.WithLabelValues(reason).Inc()
	if reason == failNotFound {
		// Deleted since the cache saw it: the watch reports the deletion.
		return beatWaiting
	}
	r.failing = true
	if reason == failForbidden {
		r.limiter.logError(r.log, err, "heartbeat forbidden: bind the reporter role to this ServiceAccount", "reason", reason)
	} else {
		r.limiter.logError(r.log, err, "heartbeat failed", "reason", reason)
	}
	return beatFailed
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
		var list appsv1.DeploymentList
		if err := t.cache.List(ctx, &list, client.InNamespace(r.key.Namespace)); err != nil {
			r.limiter.logError(r.log, err, "listing Deployments from the cache failed")
			return nil
		}
		comps = append(comps, DeploymentComponents(list.Items, r.key.Namespace, r.key.Name)...)
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
