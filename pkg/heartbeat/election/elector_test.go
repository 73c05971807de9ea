//go:build go1.25

package election

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/heartbeattest"
)

// The package's tests of the Elector's own logic run on a fake clock; those
// that need the API server's answers (conflicts, versions) run against a
// real kube-apiserver and etcd (heartbeattest). The election as the
// heartbeat Reporter runs it, and under faults, is tested in package
// heartbeat (its tests and its simulation).
var (
	clientset *kubernetes.Clientset
	leases    Leases
)

func TestMain(m *testing.M) {
	env, err := heartbeattest.Start(heartbeattest.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	clientset, err = kubernetes.NewForConfig(env.Config)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		_ = env.Stop()
		os.Exit(1)
	}
	leases = NewLeases(clientset.CoordinationV1().RESTClient(), "election-test")
	code := m.Run()
	if err := env.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	os.Exit(code)
}

// newNamespace creates a namespace of its own for one test.
func newNamespace(t *testing.T) string {
	t.Helper()
	ns, err := clientset.CoreV1().Namespaces().Create(t.Context(),
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "el-" + utilrand.String(6)}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

// countingLeases counts the requests made through it by kind ("get
// leases", "update leases", ...), as the API server would see them.
type countingLeases struct {
	Leases
	mu sync.Mutex
	n  map[string]int
}

func (c *countingLeases) count(kind string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[kind]++
}

func (c *countingLeases) snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.n)
}

func (c *countingLeases) Get(ctx context.Context, key types.NamespacedName) (*coordinationv1.Lease, error) {
	c.count("get leases")
	return c.Leases.Get(ctx, key)
}

func (c *countingLeases) Create(ctx context.Context, l *coordinationv1.Lease) (*coordinationv1.Lease, error) {
	c.count("create leases")
	return c.Leases.Create(ctx, l)
}

func (c *countingLeases) Update(ctx context.Context, l *coordinationv1.Lease) (*coordinationv1.Lease, error) {
	c.count("update leases")
	return c.Leases.Update(ctx, l)
}

func (c *countingLeases) Watch(ctx context.Context, key types.NamespacedName, rv string) (watch.Interface, error) {
	c.count("watch leases")
	return c.Leases.Watch(ctx, key, rv)
}

// diff is after - before for every kind seen.
func diff(before, after map[string]int) map[string]int {
	out := map[string]int{}
	for k, v := range after {
		if d := v - before[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

// heldLease is a Lease record of holder, renewed at renewed, for period.
func heldLease(uid, holder, process string, period time.Duration, renewed time.Time) *coordinationv1.Lease {
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid), Name: "l", Namespace: "ns",
		Annotations: map[string]string{PeriodAnnotation: period.String()}}}
	if process != "" {
		l.Annotations[ProcessAnnotation] = process
	}
	if holder != "" {
		l.Spec.HolderIdentity = ptr.To(holder)
		l.Spec.RenewTime = &metav1.MicroTime{Time: renewed}
	}
	return l
}

// A Lease deleted under its holder (by an admin, or by a namespace cleanup
// racing the addon) must not start a new term at once: the holder may be
// sending the heartbeat it renewed for just before. A standby that saw the
// record honours it to its end, whether the Lease stays gone or comes back as
// a new object with no holder (the webhook makes it again).
func TestADeletedLeaseKeepsItsHoldersTermToTheEnd(t *testing.T) {
	const period = time.Second
	hold := Timings(period).LeaseDuration
	for name, after := range map[string]*coordinationv1.Lease{
		"gone":            nil,
		"made again":      heldLease("uid-2", "", "", period, time.Time{}),
		"made again held": heldLease("uid-2", "pod-c", "", period, time.Time{}),
	} {
		t.Run(name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(time.Now())
			t0 := clk.Now()
			// No kube: a request would panic, and none may be sent.
			l := &Elector{identity: "pod-b", process: "p-b", clock: clk}
			l.observe(heldLease("uid-1", "pod-a", "p-a", period, t0), "", t0)
			clk.Step(100 * time.Millisecond)
			l.observe(after, "", clk.Now())
			if !l.heldByOther(clk.Now()) {
				t.Fatal("the term of the deleted Lease's holder is over at once")
			}
			if after != nil {
				if held, err := l.acquire(context.Background(), period); held || err != nil {
					t.Fatalf("acquire = %v, %v while the old holder's term runs", held, err)
				}
			}
			want := hold - 100*time.Millisecond + time.Millisecond // the old term's end
			if after != nil && after.Spec.HolderIdentity != nil {
				want = hold + time.Millisecond // the new holder's, seen now, ends later
			}
			if got := l.wait(period); got != want {
				t.Errorf("wait %s, want %s", got, want)
			}
			clk.SetTime(t0.Add(hold))
			if after == nil || after.Spec.HolderIdentity == nil {
				if l.heldByOther(clk.Now()) {
					t.Error("still held once the old term is over")
				}
			}
		})
	}
	t.Run("own hold", func(t *testing.T) {
		// The process whose own Lease was deleted knows its term has
		// ended (it stopped writing first): it may take the Lease again.
		clk := clocktesting.NewFakeClock(time.Now())
		l := &Elector{identity: "pod-a", process: "p-a", clock: clk}
		l.observe(heldLease("uid-1", "pod-a", "p-a", period, clk.Now()), "", clk.Now())
		l.observe(nil, "", clk.Now())
		if l.heldByOther(clk.Now()) {
			t.Error("its own deleted hold fences the holder itself")
		}
	})
}

// Two processes with one identity (a crashed process's restart, or a
// misconfiguration): the record written by the other is another holder's,
// until it expires. A record of an earlier version, which wrote no process
// token, stays this identity's own.
func TestARecordOfTheSameIdentityByAnotherProcessIsAnotherHolders(t *testing.T) {
	const period = time.Second
	clk := clocktesting.NewFakeClock(time.Now())
	t0 := clk.Now()
	l := &Elector{identity: "twin", process: "p-2", clock: clk}
	l.observe(heldLease("uid-1", "twin", "p-1", period, t0), "", t0)
	if !l.heldByOther(t0) || !l.heldBySameIdentity() {
		t.Fatal("another process's hold under this identity is taken as this process's own")
	}
	if !l.heldByOther(t0.Add(Timings(period).LeaseDuration - time.Millisecond)) {
		t.Error("the other process's hold ends early")
	}
	if l.heldByOther(t0.Add(Timings(period).LeaseDuration)) {
		t.Error("the other process's hold outlives its lease duration")
	}
	l.observe(heldLease("uid-1", "twin", "", period, t0), "", t0)
	if l.heldByOther(t0) || l.heldBySameIdentity() {
		t.Error("a record of this identity without a process token is not this process's own")
	}
	// Taking it over records this process, as a new acquisition.
	next := heldLease("uid-1", "twin", "p-1", period, t0)
	next.Spec.AcquireTime = &metav1.MicroTime{Time: t0}
	l.record(next, period, t0.Add(time.Minute))
	if got := next.Annotations[ProcessAnnotation]; got != "p-2" {
		t.Errorf("process %q, want p-2", got)
	}
	if !next.Spec.AcquireTime.Equal(&metav1.MicroTime{Time: t0.Add(time.Minute)}) || ptr.Deref(next.Spec.LeaseTransitions, 0) != 1 {
		t.Errorf("acquire time %s, transitions %d: a new process's hold is a new acquisition",
			next.Spec.AcquireTime, ptr.Deref(next.Spec.LeaseTransitions, 0))
	}
}

// A vacant Lease seen through a gap in the view (by a read, or as a watch's
// first report) may follow a hold that came and went unseen: the process
// waits out a lease duration from that sighting before it takes it. Seen
// again unwritten (the same object and version), the wait stands; a
// different vacant object (the Lease deleted and made again meanwhile, as a
// second deletion during a watch outage does) starts it again. Before, any
// vacancy after the first kept the first sighting, and a process took the
// second inside the hold that came between.
func TestAVacancySeenThroughAGapIsWaitedOutFromItsSighting(t *testing.T) {
	const period = time.Second
	wait := Timings(period).LeaseDuration
	vacantObj := func(uid, rv string) *coordinationv1.Lease {
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid), ResourceVersion: rv, Name: "l", Namespace: "ns"}}
	}
	clk := clocktesting.NewFakeClock(time.Now())
	t0 := clk.Now()
	l := &Elector{identity: "pod-b", clock: clk, vacancyWait: wait}
	l.observeRead(vacantObj("uid-1", "10"), t0)
	if end, held := l.otherHoldEnd(t0); !held || !end.Equal(t0.Add(wait)) {
		t.Fatalf("after a read of a vacant Lease: held %v until %s, want until %s", held, end.Sub(t0), wait)
	}
	// The same object, unwritten: no hold came in between.
	clk.Step(time.Second)
	l.observeRead(vacantObj("uid-1", "10"), clk.Now())
	if end, _ := l.otherHoldEnd(clk.Now()); !end.Equal(t0.Add(wait)) {
		t.Errorf("a second read of the same vacant object moved the wait to %s, want it at %s", end.Sub(t0), wait)
	}
	// Another vacant object: taken, held and deleted unseen, then made
	// again.
	clk.Step(500 * time.Millisecond)
	again := clk.Now()
	l.observeRead(vacantObj("uid-2", "17"), again)
	if end, held := l.otherHoldEnd(again); !held || !end.Equal(again.Add(wait)) {
		t.Errorf("a new vacant object: held %v until %s, want a wait of %s from its sighting (%s)",
			held, end.Sub(t0), wait, again.Add(wait).Sub(t0))
	}
	// In an unbroken view (a watch from the version read), the object's
	// deletion and the next one made do not restart it: the view saw that
	// nothing came between.
	l.observe(nil, "18", again)
	l.observe(vacantObj("uid-3", "19"), "19", again)
	if end, _ := l.otherHoldEnd(again); !end.Equal(again.Add(wait)) {
		t.Errorf("in an unbroken view the wait moved to %s, want %s", end.Sub(again), wait)
	}
}

// A standby whose view is stale (its watch lags) meets a newer version when
// it tries to take the Lease. It waits for its watch to bring what it
// missed, in order, rather than read at once (a read would be a view with a
// gap, see Elector.vacantSince), and reads once only when nothing comes
// within a retry period; then it waits out the whole term it read.
func TestAStandbyWhoseViewIsStaleWaitsForItsWatchThenReadsOnce(t *testing.T) {
	const period = time.Second
	ns := newNamespace(t)
	reqs := &countingLeases{Leases: leases}
	key := types.NamespacedName{Namespace: ns, Name: LeaseName("addon-instance")}
	clk := clocktesting.NewFakeClock(time.Now())
	other := New(Config{Leases: reqs, Lease: key, Identity: "other", Clock: clk})
	me := New(Config{Leases: reqs, Lease: key, Identity: "me", Clock: clk})
	// A missing Lease is made vacant, and taken once seen.
	if held, err := other.acquire(t.Context(), period); held || err != nil || other.awaiting == "" {
		t.Fatalf("first acquire: held=%v err=%v awaiting %q, want the Lease made vacant, not taken", held, err, other.awaiting)
	}
	if err := other.refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	if held, err := other.acquire(t.Context(), period); !held || err != nil {
		t.Fatalf("acquire of the vacant Lease it made: held=%v err=%v", held, err)
	}
	// The standby saw that version; the renewal after it never reached it
	// (a lagging watch), and by its clock the hold it saw has run out.
	start := clk.Now()
	me.observe(other.lease.DeepCopy(), other.lease.ResourceVersion, start)
	clk.SetTime(start.Add(period))
	if err := other.Renew(t.Context(), period); err != nil {
		t.Fatal(err)
	}
	clk.SetTime(start.Add(Timings(period).LeaseDuration))

	before := reqs.snapshot()
	held, err := me.acquire(t.Context(), period)
	if held || err != nil {
		t.Fatalf("acquire on a stale view: held=%v err=%v, want a clean refusal", held, err)
	}
	if got, want := diff(before, reqs.snapshot()), map[string]int{"update leases": 1}; !maps.Equal(got, want) {
		t.Errorf("requests %v, want %v: one write that conflicts, and no read yet", got, want)
	}
	// Within a retry period it tries nothing: it waits for its watch.
	clk.SetTime(clk.Now().Add(Timings(period).RetryPeriod * 8 / 10))
	before = reqs.snapshot()
	if held, err := me.acquire(t.Context(), period); held || err != nil {
		t.Fatalf("acquire while behind: held=%v err=%v", held, err)
	}
	if got := diff(before, reqs.snapshot()); len(got) != 0 {
		t.Errorf("requests %v while waiting for the watch, want none", got)
	}
	// Nothing came: it reads once, and finds the hold renewed.
	clk.SetTime(clk.Now().Add(Timings(period).RetryPeriod))
	before = reqs.snapshot()
	if held, err := me.acquire(t.Context(), period); held || err != nil {
		t.Fatalf("acquire after the read: held=%v err=%v", held, err)
	}
	if got, want := diff(before, reqs.snapshot()), map[string]int{"get leases": 1}; !maps.Equal(got, want) {
		t.Errorf("requests %v, want %v: one read, and no write on the hold it shows", got, want)
	}
	if me.lease.ResourceVersion != other.lease.ResourceVersion || !me.heldByOther(clk.Now()) {
		t.Errorf("after the read the standby sees version %s (held by another: %v), want %s held",
			me.lease.ResourceVersion, me.heldByOther(clk.Now()), other.lease.ResourceVersion)
	}
	// It waits out the whole term from the moment of that read.
	if got, want := me.wait(period), Timings(period).LeaseDuration+time.Millisecond; got != want {
		t.Errorf("wait %s after the read, want %s", got, want)
	}
}

func TestAwaitLease(t *testing.T) {
	now := time.Now()
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "l", ResourceVersion: "7"},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("other")}}
	never := make(chan time.Time)
	tests := map[string]struct {
		send           func(w *watch.FakeWatcher)
		open, ok       bool
		wantRV, wantNo bool // the lock then has lease (wantRV) or none (wantNo)
	}{
		"a change is recorded":         {send: func(w *watch.FakeWatcher) { w.Modify(lease) }, open: true, ok: true, wantRV: true},
		"a deletion is recorded":       {send: func(w *watch.FakeWatcher) { w.Delete(lease) }, open: true, ok: true, wantNo: true},
		"closed by the server: resume": {send: func(w *watch.FakeWatcher) { w.Stop() }, open: false, ok: true},
		"an error event: read again": {send: func(w *watch.FakeWatcher) {
			w.Error(&metav1.Status{Code: http.StatusGone, Reason: metav1.StatusReasonExpired})
		}, open: false, ok: false},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			w := watch.NewFakeWithChanSize(1, false)
			tt.send(w)
			lock := &Elector{identity: "me", clock: clocktesting.NewFakeClock(now),
				lease: &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "6"}}}
			open, ok := awaitLease(t.Context(), w, lock, never)
			if open != tt.open || ok != tt.ok {
				t.Errorf("awaitLease = (open %v, ok %v), want (%v, %v)", open, ok, tt.open, tt.ok)
			}
			switch {
			case tt.wantRV && (lock.lease == nil || lock.lease.ResourceVersion != "7"):
				t.Errorf("the lock has %v, want version 7", lock.lease)
			case tt.wantNo && lock.lease != nil:
				t.Errorf("the lock has %v, want no Lease", lock.lease)
			case !tt.wantRV && !tt.wantNo && lock.lease.ResourceVersion != "6":
				t.Errorf("the lock changed to %v", lock.lease)
			}
		})
	}
	t.Run("no watch: waits for the retry", func(t *testing.T) {
		timeout := make(chan time.Time, 1)
		timeout <- now
		if open, ok := awaitLease(t.Context(), nil, &Elector{}, timeout); open || ok {
			t.Errorf("awaitLease without a watch = (%v, %v), want (false, false): open one from a read", open, ok)
		}
	})
}

func TestCheckIntervalNeverExceedsTheRetryPeriod(t *testing.T) {
	for _, p := range []time.Duration{time.Second, 2 * time.Second, 10 * time.Second} {
		r := Timings(p).RetryPeriod
		lo, hi := r, time.Duration(0)
		for range 1000 {
			d := checkInterval(p)
			lo, hi = min(lo, d), max(hi, d)
		}
		if hi > r || lo < r*9/10 {
			t.Errorf("period %s: check intervals in [%s, %s], want within [%s, %s]", p, lo, hi, r*9/10, r)
		}
		if lo == hi {
			t.Errorf("period %s: check interval %s never varies; standbys started together would stay in step", p, lo)
		}
	}
}

func TestLeaseName(t *testing.T) {
	long := strings.Repeat("a", 60) + ".b" + strings.Repeat("c", 40)
	tests := map[string]struct {
		instance string
		want     string
	}{
		"default":        {"addon-instance", "addon-heartbeat-addon-instance"},
		"long":           {long, ""},
		"dot at the cut": {strings.Repeat("a", 46) + "." + strings.Repeat("b", 30), ""},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			got := LeaseName(tt.instance)
			if tt.want != "" && got != tt.want {
				t.Errorf("LeaseName = %q, want %q", got, tt.want)
			}
			if len(got) > 63 {
				t.Errorf("LeaseName %q is %d characters", got, len(got))
			}
			if errs := validation.IsDNS1123Subdomain(got); len(errs) > 0 {
				t.Errorf("LeaseName %q: %v", got, errs)
			}
			if got == LeaseName(tt.instance+"x") {
				t.Errorf("different instances share Lease %q", got)
			}
		})
	}
}

func TestAStandbyWaitsForTheEndOfTheHoldersTerm(t *testing.T) {
	const period = 2 * time.Second // lease 3.5s, retries after 0.9-1s
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	lease := func(holder string) *coordinationv1.Lease {
		return &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{PeriodAnnotation: period.String()}},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(holder), LeaseDurationSeconds: ptr.To[int32](4)},
		}
	}
	tests := map[string]struct {
		holder   string
		observed time.Duration // how long ago the record last changed
		lo, hi   time.Duration
	}{
		"renewed just now: the whole term":          {holder: "other", observed: 0, lo: 3501 * time.Millisecond, hi: 3501 * time.Millisecond},
		"renewed a while ago: the rest of the term": {holder: "other", observed: 3300 * time.Millisecond, lo: 201 * time.Millisecond, hi: 201 * time.Millisecond},
		"term already over: a retry":                {holder: "other", observed: 5 * time.Second, lo: 900 * time.Millisecond, hi: time.Second},
		"released (no holder): a retry":             {holder: "", observed: 2800 * time.Millisecond, lo: 900 * time.Millisecond, hi: time.Second},
		"this process's own: a retry":               {holder: "me", observed: 2800 * time.Millisecond, lo: 900 * time.Millisecond, hi: time.Second},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			l := &Elector{identity: "me", clock: clocktesting.NewFakeClock(now),
				lease: lease(tt.holder), observedAt: now.Add(-tt.observed)}
			if got := l.wait(time.Minute); got < tt.lo || got > tt.hi {
				t.Errorf("wait = %s, want in [%s, %s]", got, tt.lo, tt.hi)
			}
		})
	}
}

func TestTimings(t *testing.T) {
	for _, p := range []time.Duration{time.Second, 1500 * time.Millisecond, 2 * time.Second, 10 * time.Second, 45 * time.Second, 5 * time.Minute} {
		t.Run(p.String(), func(t *testing.T) {
			tm := Timings(p)
			if got := time.Duration(leaseSeconds(tm.LeaseDuration)) * time.Second; got < tm.LeaseDuration || got-tm.LeaseDuration >= time.Second {
				t.Errorf("leaseDurationSeconds %s for a lease of %s: want it rounded up to whole seconds", got, tm.LeaseDuration)
			}
			if tm.RenewDeadline >= tm.LeaseDuration || tm.RenewDeadline <= p {
				t.Errorf("renew deadline %s for period %s and lease %s: want it past a period and short of the lease", tm.RenewDeadline, p, tm.LeaseDuration)
			}
			if tm.RetryPeriod > tm.LeaseDuration/2 || tm.RetryPeriod < MinPeriod/2 {
				t.Errorf("retry period %s for lease %s", tm.RetryPeriod, tm.LeaseDuration)
			}
		})
	}
	// Below the floor (a forged or mistyped period), the floor's.
	if got, want := Timings(time.Nanosecond), Timings(MinPeriod); got != want {
		t.Errorf("Timings(1ns) = %v, want the floor's %v", got, want)
	}
}
