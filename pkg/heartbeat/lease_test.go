package heartbeat

import (
	"maps"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// requestCounter counts one reporter's requests to the API server by verb
// and resource, as the API server would see them ("update leases", "get
// addoninstances", "watch deployments", "update addoninstances/status").
type requestCounter struct {
	mu sync.Mutex
	n  map[string]int
}

// counted returns a copy of cfg whose requests c counts.
func (c *requestCounter) counted(cfg *rest.Config) *rest.Config {
	c.n = map[string]int{}
	out := rest.CopyConfig(cfg)
	out.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			c.mu.Lock()
			c.n[requestKind(req)]++
			c.mu.Unlock()
			return rt.RoundTrip(req)
		})
	}
	return out
}

func (c *requestCounter) snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int, len(c.n))
	for k, v := range c.n {
		out[k] = v
	}
	return out
}

// requestKind names a namespaced request: verb and resource[/subresource].
func requestKind(req *http.Request) string {
	parts := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
	i := 0
	for i < len(parts) && parts[i] != "namespaces" {
		i++
	}
	rest := parts[min(i+2, len(parts)):] // resource, name, subresource
	if len(rest) == 0 {
		return req.Method + " " + req.URL.Path
	}
	resource := rest[0]
	verb := map[string]string{http.MethodGet: "get", http.MethodPut: "update", http.MethodPost: "create",
		http.MethodPatch: "patch", http.MethodDelete: "delete"}[req.Method]
	switch {
	case len(rest) == 1 && req.Method == http.MethodGet && req.URL.Query().Get("watch") == "true":
		verb = "watch"
	case len(rest) == 1 && req.Method == http.MethodGet:
		verb = "list"
	case len(rest) == 3:
		resource += "/" + rest[2]
	}
	return verb + " " + resource
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

func TestTheLeaderWritesTheLeaseOncePerHeartbeatAndStandbysOnlyWatchIt(t *testing.T) {
	const period = time.Second
	ns := newNamespace(t)
	createInstance(t, ns, "addon-instance", period)
	rec := record(t, ns, "addon-instance")
	var leaderReqs, standbyReqs requestCounter
	leader := startReporter(t, leaderReqs.counted(adminCfg), Options{Namespace: ns, Identity: "pod-a", DeploymentHealth: true})
	rec.waitBeats(t, 2, 10*time.Second)
	standby := startReporter(t, standbyReqs.counted(adminCfg), Options{Namespace: ns, Identity: "pod-b", DeploymentHealth: true})
	eventually(t, 10*time.Second, "the standby's first look at the Lease", func() (bool, error) {
		return standby.metric(t, electionAttempts, "result", electionHeld) >= 1, nil
	})

	lb, sb, sentBefore, since := leaderReqs.snapshot(), standbyReqs.snapshot(), leader.metric(t, sentTotal), time.Now()
	retriedBefore, looksBefore := leader.metric(t, conflicts), standby.metric(t, electionAttempts, "result", electionHeld)
	n := len(rec.snapshot())
	rec.waitBeats(t, n+8, 20*time.Second)
	la, sa, sent, elapsed := leaderReqs.snapshot(), standbyReqs.snapshot(), leader.metric(t, sentTotal)-sentBefore, time.Since(since)
	ld, sd := diff(lb, la), diff(sb, sa)
	retried := leader.metric(t, conflicts) - retriedBefore
	looks := standby.metric(t, electionAttempts, "result", electionHeld) - looksBefore
	t.Logf("over %s (%v heartbeats): leader %v; standby %v", elapsed.Round(time.Millisecond), sent, ld, sd)

	// The leader: per heartbeat one status write and one Lease renewal,
	// and nothing else (the watches were opened before the window).
	// Renewal and write share a tick, so the window's edges can split a
	// pair.
	// (A write that met a conflict was sent again: rare here, with no
	// other writer, but possible when the cache lags on a loaded machine.)
	if got := ld["update addoninstances/status"]; float64(got) != sent+retried {
		t.Errorf("leader: %d status writes for %v heartbeats and %v conflicts retried", got, sent, retried)
	}
	if got := ld["update leases"]; float64(got) < sent-1 || float64(got) > sent+1 {
		t.Errorf("leader: %d Lease writes for %v heartbeats, want one each", got, sent)
	}
	if extra := len(ld) - 2; extra > 0 {
		t.Errorf("leader: %d other kinds of request: %v", extra, ld)
	}
	// The standby: no request at all (its watch on the Lease was opened
	// before the window), yet it looked at the Lease once per renewal:
	// the watch brought each one.
	if len(sd) != 0 {
		t.Errorf("standby: %v, want no request while the leader renews", sd)
	}
	if looks < sent-2 || looks > sent+2 {
		t.Errorf("standby: %v looks at the held Lease for %v renewals, want one per renewal", looks, sent)
	}
	if standby.metric(t, sentTotal) != 0 || standby.IsLeader() {
		t.Errorf("the standby wrote %v heartbeats", standby.metric(t, sentTotal))
	}

	lease := &coordinationv1.Lease{}
	if err := k8s.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: LeaseName("addon-instance")}, lease); err != nil {
		t.Fatal(err)
	}
	want := Timings(period)
	if got := lease.Annotations[PeriodAnnotation]; got != period.String() {
		t.Errorf("Lease annotation %s = %q, want %q", PeriodAnnotation, got, period)
	}
	// 1.5s, rounded up to whole seconds for readers of the field.
	if got := ptr.Deref(lease.Spec.LeaseDurationSeconds, 0); got != 2 || want.LeaseDuration != 1500*time.Millisecond {
		t.Errorf("leaseDurationSeconds %d for a lease of %s, want 2", got, want.LeaseDuration)
	}
	if got := ptr.Deref(lease.Spec.HolderIdentity, ""); got != "pod-a" {
		t.Errorf("holder %q, want pod-a", got)
	}
}

func TestALeaderWhoseLeaseIsTakenStopsWritingAtOnce(t *testing.T) {
	const period = time.Second
	ns := newNamespace(t)
	createInstance(t, ns, "addon-instance", period)
	rec := record(t, ns, "addon-instance")
	rn := startReporter(t, adminCfg, Options{Namespace: ns, Identity: "pod-a"})
	rec.waitBeats(t, 2, 10*time.Second)

	// Another holder (a replica that judged the Lease expired, say) writes
	// itself in with a long hold.
	key := client.ObjectKey{Namespace: ns, Name: LeaseName("addon-instance")}
	lease := &coordinationv1.Lease{}
	if err := k8s.Get(t.Context(), key, lease); err != nil {
		t.Fatal(err)
	}
	lease.Spec.HolderIdentity = ptr.To("intruder")
	lease.Spec.LeaseDurationSeconds = ptr.To[int32](3600)
	lease.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
	if err := k8s.Update(t.Context(), lease); err != nil {
		t.Fatal(err)
	}
	taken := time.Now()
	// Its next renewal, within one period, finds the new holder.
	eventually(t, 3*period, "the leader giving up", func() (bool, error) { return !rn.IsLeader(), nil })
	t.Logf("stopped leading %s after the Lease was taken", time.Since(taken).Round(time.Millisecond))
	sent := rn.metric(t, sentTotal)
	// It now watches the Lease as a standby: each renewal by the intruder
	// is a look, and none makes it take the Lease back while the
	// intruder's hold runs.
	looks := rn.metric(t, electionAttempts, "result", electionHeld)
	for i := range 3 {
		if err := k8s.Get(t.Context(), key, lease); err != nil {
			t.Fatal(err)
		}
		lease.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
		if err := k8s.Update(t.Context(), lease); err != nil {
			t.Fatal(err)
		}
		eventually(t, 10*time.Second, "a look at the renewed Lease", func() (bool, error) {
			return rn.metric(t, electionAttempts, "result", electionHeld) >= looks+float64(i)+1, nil
		})
	}
	if got := rn.metric(t, sentTotal); got != sent {
		t.Errorf("%v heartbeats written after the Lease was taken", got-sent)
	}
	if err := k8s.Get(t.Context(), key, lease); err != nil {
		t.Fatal(err)
	}
	if got := ptr.Deref(lease.Spec.HolderIdentity, ""); got != "intruder" {
		t.Errorf("holder %q, want the intruder", got)
	}
	if got := rn.metric(t, isLeader); got != 0 {
		t.Errorf("is_leader %v after losing the Lease", got)
	}
}

func TestRequestKind(t *testing.T) {
	tests := map[string]struct{ method, url, want string }{
		"status write": {http.MethodPut, "/apis/addons.managed.openshift.io/v1alpha1/namespaces/ns/addoninstances/ai/status?fieldManager=x", "update addoninstances/status"},
		"lease read":   {http.MethodGet, "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l", "get leases"},
		"watch":        {http.MethodGet, "/apis/apps/v1/namespaces/ns/deployments?watch=true", "watch deployments"},
		"list":         {http.MethodGet, "/apis/apps/v1/namespaces/ns/deployments", "list deployments"},
		"create":       {http.MethodPost, "/apis/coordination.k8s.io/v1/namespaces/ns/leases", "create leases"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			req, err := http.NewRequest(tt.method, "https://h"+tt.url, nil)
			if err != nil {
				t.Fatal(err)
			}
			if got := requestKind(req); got != tt.want {
				t.Errorf("requestKind(%s %s) = %q, want %q", tt.method, tt.url, got, tt.want)
			}
		})
	}
}

func TestAStandbyWhoseViewIsStaleReadsTheLeaseOnceAndWaitsAgain(t *testing.T) {
	const period = time.Second
	ns := newNamespace(t)
	var reqs requestCounter
	cfg := reqs.counted(adminCfg)
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	k, err := newKube(cfg, hc)
	if err != nil {
		t.Fatal(err)
	}
	key := leaseKey(ns, "addon-instance")
	clk := clocktesting.NewFakePassiveClock(time.Now())
	other := &leaseLock{kube: k, key: key, identity: "other", clock: clk}
	me := &leaseLock{kube: k, key: key, identity: "me", clock: clk}
	if held, err := other.acquire(t.Context(), period); !held || err != nil {
		t.Fatalf("first acquire: held=%v err=%v", held, err)
	}
	// The standby saw that version; the renewal after it never reached it
	// (a lagging watch), and by its clock the hold it saw has run out.
	start := clk.Now()
	me.observe(other.lease.DeepCopy(), start)
	clk.SetTime(start.Add(period))
	if err := other.renew(t.Context(), period); err != nil {
		t.Fatal(err)
	}
	clk.SetTime(start.Add(Timings(period).LeaseDuration))

	before := reqs.snapshot()
	held, err := me.acquire(t.Context(), period)
	if held || err != nil {
		t.Fatalf("acquire on a stale view: held=%v err=%v, want a clean refusal", held, err)
	}
	if got, want := diff(before, reqs.snapshot()), map[string]int{"update leases": 1, "get leases": 1}; !maps.Equal(got, want) {
		t.Errorf("requests %v, want %v: one write that conflicts, one read", got, want)
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
			lock := &leaseLock{identity: "me", clock: clocktesting.NewFakePassiveClock(now),
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
		if open, ok := awaitLease(t.Context(), nil, &leaseLock{}, timeout); open || ok {
			t.Errorf("awaitLease without a watch = (%v, %v), want (false, false): open one from a read", open, ok)
		}
	})
}
