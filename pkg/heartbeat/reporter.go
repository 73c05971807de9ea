package heartbeat

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"

	addonsv1alpha1 "github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/internal/addonsv1alpha1"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/annotations"
)

// FieldManager is the field manager of the reporter's status writes, so that
// managedFields show which fields the reporter wrote.
const FieldManager = "addon-heartbeat-reporter"

// Options configure a Reporter.
type Options struct {
	// Namespace of the AddonInstance (the addon's target namespace). Required.
	Namespace string
	// Name of the AddonInstance; annotations.DefaultAddonInstance when empty.
	Name string
	// DeleteAck says how markedForDeletion is acknowledged: auto (the
	// default) reports ReadyToBeDeleted=True at once; manual reports False
	// until the addon sets ReadyToBeDeleted itself with SetCondition.
	DeleteAck annotations.DeleteAckMode
	// DeploymentHealth makes the availability of every Deployment in
	// Namespace injected for this AddonInstance a component (zero-code mode).
	DeploymentHealth bool
	// HealthURL, when set, is a pod-local URL checked each period (a
	// component named HealthURLComponent). It must pass
	// annotations.ValidateHealthURL.
	HealthURL string

	// DisableLeaderElection turns off the Reporter's own per-AddonInstance
	// election. Then NeedLeaderElection is true and the manager's own leader
	// election decides: use it only when that election already guarantees one
	// writer per AddonInstance across every Deployment that reports into it.
	DisableLeaderElection bool
	// LeaseNamespace holds the election Lease; Namespace when empty.
	LeaseNamespace string
	// Identity in the Lease (its holderIdentity); the host name plus a
	// random suffix when empty. It must be unique to each process: in a
	// pod, the pod name (the chart's fencing policy admits heartbeats only
	// from the pod the holder names). Processes that share one anyway are
	// told apart by a token of each process on the Lease: the one that
	// finds the other's renewal stops leading, and neither takes the other's
	// hold before it expires, so there is still one writer; each says so in
	// its log. A restarted process is such another process too: it takes
	// over the hold of its crashed predecessor when that expires.
	Identity string

	// Logger; logr.Discard() when unset.
	Logger logr.Logger
	// Registerer for the Reporter's metrics; prometheus.DefaultRegisterer
	// when nil. With a controller-runtime manager pass its registry
	// (sigs.k8s.io/controller-runtime/pkg/metrics.Registry) to serve them on
	// the manager's metrics endpoint.
	Registerer prometheus.Registerer
	// ErrorLogInterval is how often a persisting error is logged again;
	// DefaultErrorLogInterval when zero.
	ErrorLogInterval time.Duration
}

// Reporter keeps one AddonInstance's heartbeat and conditions current. Create
// it with New and add it to a manager (or call Start). Its SDK methods
// (SetHealth, SetCondition, ...) are safe for concurrent use and take effect
// with the next heartbeat, within one period.
type Reporter struct {
	opts Options
	key  types.NamespacedName
	kube *kube
	// leaseKey is the election Lease (see election.LeaseName).
	leaseKey types.NamespacedName
	metrics  *metrics
	log      logr.Logger
	limiter  *errorLimiter
	clock    clock.WithTicker
	// serverClock is the API server's clock as its responses tell it: the
	// time heartbeats are written in (see serverClock).
	serverClock *serverClock
	// clockSaidLarge is whether the log last said the offset was large.
	clockSaidLarge atomic.Bool
	// clockKick asks the term's probeClock to look whether the estimate
	// needs probes (capacity 1; sent after each status write).
	clockKick chan struct{}
	health    *healthChecker
	started   atomic.Bool
	leading   atomic.Bool
	// running is true while Start runs; activity is its last try (Healthz).
	running  atomic.Bool
	activity activity
	// belowFloor is the requested period last said to be below the
	// floor (a string of it), so that it is said once per value.
	belowFloor atomic.Value
	// knownPeriod is the last period seen (nanoseconds), for election
	// timings when the AddonInstance cannot be read.
	knownPeriod     atomic.Int64
	leadMu          sync.Mutex // held by the one heartbeat loop
	releaseOnCancel bool       // false only in tests: keep the Lease on cancel, like a killed process

	mu         sync.Mutex // guards the SDK state below
	components map[string]Component
	overrides  map[string]metav1.Condition
	removed    map[string]bool

	// State of the heartbeat loop, touched only while leadMu is held.
	installed bool
	seen      map[string]bool
	waiting   bool
	failing   bool
}

// A Reporter is a controller-runtime manager.Runnable and
// LeaderElectionRunnable by its method set (Start, NeedLeaderElection); the
// package does not import controller-runtime, so that the sidecar stays small.

// New validates opts and builds a Reporter that talks to the API server of
// cfg. It does no I/O.
func New(cfg *rest.Config, opts Options) (*Reporter, error) {
	if opts.Namespace == "" {
		return nil, errors.New("heartbeat: Options.Namespace is required")
	}
	if errs := validation.IsDNS1123Label(opts.Namespace); len(errs) > 0 {
		return nil, fmt.Errorf("heartbeat: namespace %q: %s", opts.Namespace, errs[0])
	}
	if opts.Name == "" {
		opts.Name = annotations.DefaultAddonInstance
	}
	if errs := validation.IsDNS1123Subdomain(opts.Name); len(errs) > 0 {
		return nil, fmt.Errorf("heartbeat: AddonInstance name %q: %s", opts.Name, errs[0])
	}
	if opts.DeleteAck == "" {
		opts.DeleteAck = annotations.DefaultDeleteAck
	}
	if _, err := annotations.ParseDeleteAck(string(opts.DeleteAck)); err != nil {
		return nil, fmt.Errorf("heartbeat: delete-ack: %w", err)
	}
	if opts.HealthURL != "" {
		if err := annotations.ValidateHealthURL(opts.HealthURL); err != nil {
			return nil, fmt.Errorf("heartbeat: health URL: %w", err)
		}
	}
	if opts.LeaseNamespace == "" {
		opts.LeaseNamespace = opts.Namespace
	}
	if opts.Identity == "" {
		host, _ := os.Hostname()
		opts.Identity = host + "_" + string(uuid.NewUUID())
	}
	if opts.Logger.GetSink() == nil {
		opts.Logger = logr.Discard()
	}
	if opts.Registerer == nil {
		opts.Registerer = prometheus.DefaultRegisterer
	}
	if opts.ErrorLogInterval <= 0 {
		opts.ErrorLogInterval = DefaultErrorLogInterval
	}

	cfg = rest.CopyConfig(cfg)
	if cfg.UserAgent == "" {
		cfg.UserAgent = FieldManager
	}
	clk := clock.RealClock{}
	// Every response of the API server, whichever client sent it, is a
	// sample of its clock.
	sc := newServerClock(clk)
	cfg.Wrap(sc.wrap)
	httpClient, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("heartbeat: building the HTTP client: %w", err)
	}
	k, err := newKube(cfg, httpClient)
	if err != nil {
		return nil, fmt.Errorf("heartbeat: %w", err)
	}
	m, err := newMetrics(opts.Registerer, opts.Namespace, opts.Name)
	if err != nil {
		return nil, fmt.Errorf("heartbeat: registering metrics: %w", err)
	}
	key := types.NamespacedName{Namespace: opts.Namespace, Name: opts.Name}
	r := &Reporter{
		opts:            opts,
		key:             key,
		kube:            k,
		leaseKey:        leaseKey(opts.LeaseNamespace, opts.Name),
		metrics:         m,
		log:             opts.Logger.WithValues("addonInstance", key.String()),
		limiter:         newErrorLimiter(clk, opts.ErrorLogInterval),
		clock:           clk,
		serverClock:     sc,
		clockKick:       make(chan struct{}, 1),
		releaseOnCancel: true,
		components:      map[string]Component{},
		overrides:       map[string]metav1.Condition{},
		removed:         map[string]bool{},
		seen:            map[string]bool{},
	}
	if opts.HealthURL != "" {
		r.health = newHealthChecker(opts.HealthURL)
	}
	return r, nil
}

// NeedLeaderElection is false: the Reporter runs on every replica and elects
// one writer per AddonInstance with its own Lease, across all the Deployments
// that report into that AddonInstance, whatever the manager's own election
// does. With Options.DisableLeaderElection it is true and the manager's
// election gates it instead.
func (r *Reporter) NeedLeaderElection() bool {
	return r.opts.DisableLeaderElection
}

// IsLeader reports whether this Reporter is currently the one writer.
func (r *Reporter) IsLeader() bool {
	return r.leading.Load()
}

// SetHealth reports the health of one component of the addon (SDK mode). It
// replaces an earlier report of the same name. Components drive Degraded and
// Installed together with the Deployments and the health URL. A message
// over MaxMessage bytes is cut to it, and the Degraded and Installed messages
// built from many components list the first and count the rest.
func (r *Reporter) SetHealth(c Component) error {
	if c.Name == "" {
		return errors.New("heartbeat: component name is empty")
	}
	if !c.Available && c.Reason != "" && (!reasonPattern.MatchString(c.Reason) || len(c.Reason) > maxReason) {
		return fmt.Errorf("heartbeat: component %s: reason %s: expected a CamelCase word of at most %d bytes",
			c.Name, quoteBounded(c.Reason), maxReason)
	}
	if c.Message == "" {
		if c.Available {
			c.Message = c.Name + " available"
		} else {
			c.Message = c.Name + " unavailable"
		}
	}
	c.Message = truncate(c.Message, MaxMessage)
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.components[c.Name]; !ok && len(r.components) >= MaxComponents {
		return fmt.Errorf("heartbeat: component %s: the Reporter keeps at most %d components; remove one with RemoveHealth first",
			quoteBounded(c.Name), MaxComponents)
	}
	r.components[c.Name] = c
	return nil
}

// RemoveHealth forgets a component reported with SetHealth.
func (r *Reporter) RemoveHealth(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.components, name)
}

// SetCondition reports a condition on the AddonInstance (SDK mode), as the
// upstream design's SetAndSendHeartbeat intended. It replaces the computed
// condition of the same type (for example ReadyToBeDeleted=True acknowledges
// deletion with delete-ack manual) and is written with the next heartbeat.
// The short upstream type names (Degraded, Installed, ReadyToBeDeleted) get
// their group prefix. Healthy is refused: the addon-operator computes it.
// LastTransitionTime and ObservedGeneration are filled in by the Reporter.
// A message over MaxMessage bytes is cut to it, with a marker.
func (r *Reporter) SetCondition(c metav1.Condition) error {
	c.Type = normalizeType(c.Type)
	// A long message is cut, not refused: the heartbeat never depends on it.
	c.Message = truncate(c.Message, MaxMessage)
	if err := ValidateCondition(c); err != nil {
		return fmt.Errorf("heartbeat: %w", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.overrides[c.Type]; !ok && len(r.overrides) >= MaxConditions {
		return fmt.Errorf("heartbeat: condition %s: the Reporter writes at most %d conditions of the addon's own; remove one with RemoveCondition first",
			c.Type, MaxConditions)
	}
	r.overrides[c.Type] = c
	delete(r.removed, c.Type)
	return nil
}

// RemoveCondition withdraws a condition set with SetCondition: a computed
// condition of that type takes over again, and a type only the addon
// reported is removed from the status with the next heartbeat.
func (r *Reporter) RemoveCondition(condType string) {
	condType = normalizeType(condType)
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.overrides[condType]; !ok {
		return
	}
	delete(r.overrides, condType)
	switch condType {
	case ConditionDegraded, ConditionInstalled, ConditionReadyToBeDeleted:
	default:
		r.removed[condType] = true
	}
}

// sdkState copies the SDK inputs, sorted, for one heartbeat.
func (r *Reporter) sdkState() (comps []Component, overrides []metav1.Condition, removed []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.components {
		comps = append(comps, c)
	}
	for _, c := range r.overrides {
		overrides = append(overrides, c)
	}
	for t := range r.removed {
		removed = append(removed, t)
	}
	slices.SortFunc(overrides, func(a, b metav1.Condition) int { return cmp.Compare(a.Type, b.Type) })
	slices.Sort(removed)
	return comps, overrides, removed
}

// conflictBackoff spaces the retries of a conflicting status write: up to
// ten attempts, 5ms doubling to at most 100ms, jittered, and never past the
// write's deadline.
var conflictBackoff = wait.Backoff{Steps: 10, Duration: 5 * time.Millisecond, Factor: 2, Jitter: 0.5, Cap: 100 * time.Millisecond}

// errHoldEnded stops a heartbeat whose write would be sent after the hold
// it was renewed for has ended.
var errHoldEnded = errors.New("the Lease's hold ended before the heartbeat could be written")

// write performs one heartbeat: lastHeartbeatTime and the owned conditions
// in one Status().Update of cached, retrying conflicts a bounded number of
// times against a fresh read. The caller bounds ctx. held says whether the
// hold the heartbeat was renewed for still runs; every attempt, the first
// and each retry, is sent only while it does, so a write slowed by conflicts
// never lands in a term a standby may have begun (ctx's bound alone is in
// real time, and would not follow the hold if the two were ever set apart).
// On success it returns the version written and the versions it was written
// over (cached's and any read after a conflict).
func (r *Reporter) write(ctx context.Context, cached *addonsv1alpha1.AddonInstance, comps []Component, held func() bool) (*addonsv1alpha1.AddonInstance, []string, error) {
	_, overrides, removed := r.sdkState()
	obj := cached.DeepCopy()
	over := []string{obj.ResourceVersion}
	backoff := conflictBackoff
	for attempt := 0; ; attempt++ {
		if !held() {
			return nil, nil, errHoldEnded
		}
		if attempt > 0 {
			r.metrics.conflicts.Inc()
			fresh, err := r.kube.getInstance(ctx, r.key)
			if err != nil {
				return nil, nil, fmt.Errorf("reading AddonInstance %s: %w", r.key, err)
			}
			obj = fresh
			over = append(over, obj.ResourceVersion)
		}
		// In the API server's time: the operator judges lastHeartbeatTime
		// by its own clock, which follows the server's, not this node's.
		now := r.serverClock.Now()
		if comps != nil {
			r.installed = Installed(r.installed, obj.Status.Conditions, comps, r.seen)
		}
		d := Compute(Observation{
			Components:        comps,
			Installed:         r.installed,
			MarkedForDeletion: obj.Spec.MarkedForDeletion,
			DeleteAck:         r.opts.DeleteAck,
			Overrides:         overrides,
			Removed:           removed,
		})
		Apply(&obj.Status.Conditions, d, obj.Generation, now)
		obj.Status.LastHeartbeatTime = metav1.NewTime(now)
		err := r.kube.updateInstanceStatus(ctx, obj)
		r.noteClock()
		if err == nil {
			return obj, over, nil
		}
		err = fmt.Errorf("updating AddonInstance %s status: %w", r.key, err)
		if !apierrors.IsConflict(err) || backoff.Steps <= 1 {
			return nil, nil, err
		}
		select {
		case <-ctx.Done():
			return nil, nil, err
		case <-r.clock.After(backoff.Step()):
		}
	}
}

// failureReason classifies a failed write for the metrics.
func failureReason(err error) string {
	switch {
	case apierrors.IsConflict(err):
		return failConflict
	case errors.Is(err, errHoldEnded):
		return failHoldEnded
	case IsFenced(err):
		return failFenced
	case apierrors.IsForbidden(err), apierrors.IsUnauthorized(err):
		return failForbidden
	case apierrors.IsNotFound(err):
		return failNotFound
	case errors.Is(err, context.DeadlineExceeded), apierrors.IsTimeout(err), apierrors.IsServerTimeout(err):
		return failTimeout
	case apierrors.IsServiceUnavailable(err), apierrors.IsTooManyRequests(err), apierrors.IsInternalError(err),
		apierrors.IsUnexpectedServerError(err), isConnectionError(err):
		return failUnavailable
	default:
		return failOther
	}
}

// fencedMessage is in the message of every refusal by the chart's fencing
// policy (charts/addon-heartbeat/templates/fencing-validatingadmissionpolicy.yaml;
// test/chart checks that IsFenced recognizes it).
const fencedMessage = "may be moved only by the pod holding"

// IsFenced reports whether err is a heartbeat write refused by the chart's
// fencing policy: the write came from a pod that does not hold the
// AddonInstance's election Lease (a leader whose hold ended while its write
// was on its way, or after the Lease was deleted and made again). It is a
// 403 like a missing permission, which it must not be taken for.
func IsFenced(err error) bool {
	return apierrors.IsForbidden(err) && strings.Contains(err.Error(), fencedMessage)
}

func isConnectionError(err error) bool {
	var opErr *net.OpError
	return errors.As(err, &opErr)
}

// notePeriod exports the requested and the followed period, and says once,
// per requested value, when the AddonInstance asks for a period below the
// floor: the addon-operator times out an addon whose heartbeat is older than
// 3 requested periods, which the reporter cannot meet below it.
func (r *Reporter) notePeriod(ai *addonsv1alpha1.AddonInstance) {
	asked, used := ai.Spec.HeartbeatUpdatePeriod.Duration, instancePeriod(ai)
	r.metrics.asked.Set(asked.Seconds())
	r.metrics.used.Set(used.Seconds())
	if asked >= MinPeriod {
		r.belowFloor.Store("")
		return
	}
	if prev, _ := r.belowFloor.Load().(string); prev == asked.String() {
		return
	}
	r.belowFloor.Store(asked.String())
	r.log.Info("the AddonInstance asks for a heartbeat period below the reporter's floor: heartbeating at the floor; "+
		"the addon-operator judges heartbeats against 3 requested periods, so it will report them as timed out until the period is raised",
		"heartbeatUpdatePeriod", asked.String(), "floor", MinPeriod.String())
}
