//go:build go1.25

package heartbeat

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"

	addonsv1alpha1 "github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/internal/addonsv1alpha1"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/election"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/heartbeattest"
)

// The package's one suite of a real kube-apiserver and etcd, with the
// upstream AddonInstance CRD (heartbeattest).
var (
	adminCfg *rest.Config
	k8s      *testClient
)

func TestMain(m *testing.M) {
	env, err := heartbeattest.Start(heartbeattest.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	adminCfg = env.Config
	k8s, err = newTestClient(adminCfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		_ = env.Stop()
		os.Exit(1)
	}
	code := m.Run()
	if err := env.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	os.Exit(code)
}

// newNamespace creates a namespace of its own for one test.
func newNamespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "hb-" + utilrand.String(6)}}
	if err := k8s.Create(t.Context(), ns); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

func createInstance(t *testing.T, ns, name string, period time.Duration) *addonsv1alpha1.AddonInstance {
	t.Helper()
	ai := &addonsv1alpha1.AddonInstance{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       addonsv1alpha1.AddonInstanceSpec{HeartbeatUpdatePeriod: metav1.Duration{Duration: period}},
	}
	if err := k8s.Create(t.Context(), ai); err != nil {
		t.Fatal(err)
	}
	return ai
}

// logSink collects log lines for assertions.
type logSink struct {
	mu    sync.Mutex
	lines []string
}

func (l *logSink) logger() logr.Logger {
	return funcr.New(func(prefix, args string) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.lines = append(l.lines, prefix+" "+args)
	}, funcr.Options{Verbosity: 4, LogTimestamp: true})
}

func (l *logSink) count(subs ...string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, line := range l.lines {
		if !slices.ContainsFunc(subs, func(s string) bool { return !strings.Contains(line, s) }) {
			n++
		}
	}
	return n
}

func (l *logSink) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// running is a Reporter started for a test, with its own metrics registry
// and log.
type running struct {
	*Reporter
	reg    *prometheus.Registry
	logs   *logSink
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

func startReporter(t *testing.T, cfg *rest.Config, opts Options, tweak ...func(*Reporter)) *running {
	t.Helper()
	rn := &running{reg: prometheus.NewRegistry(), logs: &logSink{}, done: make(chan error, 1)}
	opts.Registerer = rn.reg
	opts.Logger = rn.logs.logger()
	r, err := New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range tweak {
		f(r)
	}
	rn.Reporter = r
	ctx, cancel := context.WithCancel(context.Background())
	rn.cancel = cancel
	go func() { rn.done <- r.Start(ctx) }()
	t.Cleanup(func() {
		rn.stop(t)
		if t.Failed() {
			t.Logf("log of reporter %s:\n%s", opts.Identity, rn.logs)
		}
	})
	return rn
}

// stop cancels the Reporter and waits for Start to return.
func (rn *running) stop(t *testing.T) {
	rn.once.Do(func() {
		rn.cancel()
		select {
		case err := <-rn.done:
			if err != nil {
				t.Errorf("Start returned %v", err)
			}
			rn.done <- err
		case <-time.After(15 * time.Second):
			t.Errorf("Reporter did not stop within 15s")
		}
	})
}

// exited reports whether Start has returned (it must not, on its own).
func (rn *running) exited() bool {
	select {
	case err := <-rn.done:
		rn.done <- err
		return true
	default:
		return false
	}
}

// metric sums the samples of one metric family (optionally only those with
// a label value).
func (rn *running) metric(t *testing.T, name string, label ...string) float64 {
	t.Helper()
	mfs, err := rn.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	samples:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(label); i += 2 {
				if !slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool {
					return l.GetName() == label[i] && l.GetValue() == label[i+1]
				}) {
					continue samples
				}
			}
			switch {
			case m.Counter != nil:
				sum += m.Counter.GetValue()
			case m.Gauge != nil:
				sum += m.Gauge.GetValue()
			case m.Histogram != nil:
				sum += float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return sum
}

// awaitMetric waits until a metric (optionally only the samples with a label
// value) reaches want: a counter moves just after
// the write that a watch may already have delivered. It fails the test when
// the metric passes want or stays below it.
func (rn *running) awaitMetric(t *testing.T, name string, want float64, label ...string) {
	t.Helper()
	var got float64
	err := wait.PollUntilContextTimeout(t.Context(), 5*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		got = rn.metric(t, name, label...)
		return got >= want, nil
	})
	if err != nil || got != want {
		t.Fatalf("%s = %v, want %v", name, got, want)
	}
}

// beat is one heartbeat seen through a watch.
type beat struct {
	at   time.Time // when the watch delivered it
	hb   time.Time // status.lastHeartbeatTime (second precision)
	uid  string
	obj  *addonsv1alpha1.AddonInstance
	rv   string
	from string // manager of the newest status entry in managedFields
}

// recorder watches one AddonInstance and records every new lastHeartbeatTime
// and every version of the object.
type recorder struct {
	mu       sync.Mutex
	beats    []beat
	versions []*addonsv1alpha1.AddonInstance
	stop     context.CancelFunc
	done     chan struct{}
}

func record(t *testing.T, ns, name string) *recorder {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	rec := &recorder{stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(rec.done)
		var last *addonsv1alpha1.AddonInstance
		for ctx.Err() == nil {
			w, err := k8s.watchInstance(ctx, types.NamespacedName{Namespace: ns, Name: name})
			if err != nil {
				select {
				case <-ctx.Done():
				case <-time.After(100 * time.Millisecond):
				}
				continue
			}
			for ev := range w.ResultChan() {
				ai, ok := ev.Object.(*addonsv1alpha1.AddonInstance)
				if !ok {
					continue
				}
				now := time.Now()
				rec.mu.Lock()
				if ev.Type == watch.Deleted {
					last = nil
					rec.mu.Unlock()
					continue
				}
				rec.versions = append(rec.versions, ai)
				if !ai.Status.LastHeartbeatTime.IsZero() && (last == nil || last.UID != ai.UID ||
					!ai.Status.LastHeartbeatTime.Equal(&last.Status.LastHeartbeatTime)) {
					rec.beats = append(rec.beats, beat{at: now, hb: ai.Status.LastHeartbeatTime.Time,
						uid: string(ai.UID), obj: ai, rv: ai.ResourceVersion})
				}
				last = ai
				rec.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-rec.done
	})
	return rec
}

func (rec *recorder) snapshot() []beat {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return slices.Clone(rec.beats)
}

func (rec *recorder) allVersions() []*addonsv1alpha1.AddonInstance {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return slices.Clone(rec.versions)
}

// waitBeats waits until n heartbeats have been seen in total.
func (rec *recorder) waitBeats(t *testing.T, n int, timeout time.Duration) []beat {
	t.Helper()
	var got []beat
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		got = rec.snapshot()
		return len(got) >= n, nil
	})
	if err != nil {
		t.Fatalf("saw %d heartbeats within %s, want %d", len(got), timeout, n)
	}
	return got
}

// beatsAfter are the heartbeats seen after a point in time.
func beatsAfter(bs []beat, t0 time.Time) []beat {
	var out []beat
	for _, b := range bs {
		if b.at.After(t0) {
			out = append(out, b)
		}
	}
	return out
}

func gaps(bs []beat) []time.Duration {
	var out []time.Duration
	for i := 1; i < len(bs); i++ {
		out = append(out, bs[i].at.Sub(bs[i-1].at))
	}
	return out
}

// eventually polls cond every 50ms until it holds or timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	var lastErr error
	err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		ok, err := cond()
		lastErr = err
		return ok, nil
	})
	if err != nil {
		t.Fatalf("%s: not within %s (last error: %v)", what, timeout, lastErr)
	}
}

func getInstance(t *testing.T, ns, name string) *addonsv1alpha1.AddonInstance {
	t.Helper()
	ai := &addonsv1alpha1.AddonInstance{}
	if err := k8s.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: name}, ai); err != nil {
		t.Fatal(err)
	}
	return ai
}

// leaseObjectMeta is the metadata of the election Lease named key, as
// whoever makes it gives it.
func leaseObjectMeta(key types.NamespacedName) metav1.ObjectMeta {
	return metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name,
		Labels: map[string]string{election.ManagedByLabel: election.ManagedByValue}}
}
