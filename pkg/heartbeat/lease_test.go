//go:build go1.25

package heartbeat

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/election"
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

// On a driven clock the counts are exact: each heartbeat is one status write
// and one Lease renewal by the leader, and one look at the Lease by the
// standby (a watch event), which makes no request at all.
func TestTheLeaderWritesTheLeaseOncePerHeartbeatAndStandbysOnlyWatchIt(t *testing.T) {
	const period = time.Second
	tm := election.Timings(period)
	ns, rec, clk, t0 := drivenAddon(t, period)
	tick := func(k int) time.Time { return t0.Add(time.Duration(k) * period) }
	var leaderReqs, standbyReqs requestCounter
	leader := startReporter(t, leaderReqs.counted(adminCfg), Options{Namespace: ns, Identity: "pod-a", DeploymentHealth: true}, clk.drive)
	clk.beatAt(t, rec, tick(0))
	clk.beatAt(t, rec, tick(1))
	// The renewal follows the heartbeat: wait for it, or the standby's read
	// may find the Lease before it, and its watch bring the renewal as one
	// more look inside the counted beats (the clock stands still between
	// ticks, so both looks wait for the same instant).
	eventually(t, 10*time.Second, "the leader's renewal after its heartbeat at 1s", func() (bool, error) {
		renewed := leaseOf(t, ns, "addon-instance").Spec.RenewTime
		return renewed != nil && renewed.After(tick(1).Add(-time.Millisecond)), nil
	})
	standby := startReporter(t, standbyReqs.counted(adminCfg), Options{Namespace: ns, Identity: "pod-b", DeploymentHealth: true}, clk.drive)
	// Its first look (a read) finds the Lease renewed at 1s, and it waits
	// for the rest of that term.
	clk.awaitArmed(t, tick(1).Add(tm.LeaseDuration+time.Millisecond), "the standby's first look at the Lease")

	lb, sb := leaderReqs.snapshot(), standbyReqs.snapshot()
	sentBefore, retriedBefore := leader.metric(t, sentTotal), leader.metric(t, conflicts)
	looksBefore := standby.metric(t, electionAttempts, "result", string(election.HeldByOther))
	const beats = 8
	for k := 2; k < 2+beats; k++ {
		clk.beatAt(t, rec, tick(k))
		// The standby saw the renewal through its watch: it waits from
		// that moment.
		clk.awaitArmed(t, tick(k).Add(tm.LeaseDuration+time.Millisecond), "the standby's look at the renewal")
	}
	leader.awaitMetric(t, sentTotal, sentBefore+beats)
	la, sa := leaderReqs.snapshot(), standbyReqs.snapshot()
	ld, sd := diff(lb, la), diff(sb, sa)
	retried := leader.metric(t, conflicts) - retriedBefore
	looks := standby.metric(t, electionAttempts, "result", string(election.HeldByOther)) - looksBefore
	t.Logf("over %d heartbeats: leader %v; standby %v", beats, ld, sd)

	// The leader: per heartbeat one status write and one Lease renewal,
	// and nothing else (the watches were opened before). A write that met
	// a conflict was sent again; it writes over its own last version while
	// its watch lags, so none is expected without another writer.
	if got := ld["update addoninstances/status"]; got != beats || retried != 0 {
		t.Errorf("leader: %d status writes and %v conflicts retried for %d heartbeats, want %d and none", got, retried, beats, beats)
	}
	if got := ld["update leases"]; got != beats {
		t.Errorf("leader: %d Lease writes for %d heartbeats, want one each", got, beats)
	}
	if extra := len(ld) - 2; extra > 0 {
		t.Errorf("leader: %d other kinds of request: %v", extra, ld)
	}
	// The standby: no request at all, yet one look per renewal.
	if len(sd) != 0 {
		t.Errorf("standby: %v, want no request while the leader renews", sd)
	}
	if looks != beats {
		t.Errorf("standby: %v looks at the held Lease for %d renewals, want one per renewal", looks, beats)
	}
	if standby.metric(t, sentTotal) != 0 || standby.IsLeader() {
		t.Errorf("the standby wrote %v heartbeats", standby.metric(t, sentTotal))
	}

	lease := leaseOf(t, ns, "addon-instance")
	if got := lease.Annotations[election.PeriodAnnotation]; got != period.String() {
		t.Errorf("Lease annotation %s = %q, want %q", election.PeriodAnnotation, got, period)
	}
	// 1.75s, rounded up to whole seconds for readers of the field.
	if got := ptr.Deref(lease.Spec.LeaseDurationSeconds, 0); got != 2 || tm.LeaseDuration != 1750*time.Millisecond {
		t.Errorf("leaseDurationSeconds %d for a lease of %s, want 2", got, tm.LeaseDuration)
	}
	if got := ptr.Deref(lease.Spec.HolderIdentity, ""); got != "pod-a" {
		t.Errorf("holder %q, want pod-a", got)
	}
}

func TestALeaderWhoseLeaseIsTakenStopsWritingAtOnce(t *testing.T) {
	const period = time.Second
	ns, rec, clk, t0 := drivenAddon(t, period)
	rn := startReporter(t, adminCfg, Options{Namespace: ns, Identity: "pod-a"}, clk.drive)
	clk.beatAt(t, rec, t0)
	clk.beatAt(t, rec, t0.Add(period))
	rn.awaitMetric(t, sentTotal, 2)
	// The renewal after that heartbeat is done once the next tick is armed.
	clk.awaitArmed(t, t0.Add(2*period), "the next tick")

	// Another holder (a replica that judged the Lease expired, say) writes
	// itself in with a long hold.
	key := types.NamespacedName{Namespace: ns, Name: election.LeaseName("addon-instance")}
	lease := leaseOf(t, ns, "addon-instance")
	lease.Spec.HolderIdentity = ptr.To("intruder")
	lease.Spec.LeaseDurationSeconds = ptr.To[int32](3600)
	lease.Spec.RenewTime = &metav1.MicroTime{Time: clk.Now()}
	if err := k8s.Update(t.Context(), lease); err != nil {
		t.Fatal(err)
	}
	// Its next tick writes that tick's heartbeat on the hold its last
	// renewal gave (which had not run out: a take by the rules waits for
	// that), and the renewal after it finds the new holder: it stops, and
	// writes nothing more.
	clk.beatAt(t, rec, t0.Add(2*period))
	eventually(t, driveTimeout, "the leader giving up", func() (bool, error) { return !rn.IsLeader(), nil })
	// It now watches the Lease as a standby: its first look is a read,
	// each renewal by the intruder one more, and none makes it take the
	// Lease back while the intruder's hold runs.
	rn.awaitMetric(t, electionAttempts, 1, "result", string(election.HeldByOther))
	looks := 1.0
	for i := range 3 {
		if err := k8s.Get(t.Context(), key, lease); err != nil {
			t.Fatal(err)
		}
		lease.Spec.RenewTime = &metav1.MicroTime{Time: clk.Now().Add(time.Duration(i+1) * time.Millisecond)}
		if err := k8s.Update(t.Context(), lease); err != nil {
			t.Fatal(err)
		}
		rn.awaitMetric(t, electionAttempts, looks+float64(i)+1, "result", string(election.HeldByOther))
	}
	if got := rn.metric(t, sentTotal); got != 3 {
		t.Errorf("%v heartbeats written after the renewal that found the Lease taken", got-3)
	}
	if got := ptr.Deref(leaseOf(t, ns, "addon-instance").Spec.HolderIdentity, ""); got != "intruder" {
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

// Anyone who may update the Lease can write a holder and a huge period into
// it. A standby honours no hold longer than the lease duration for its
// AddonInstance's own period: a forged holder that never renews delays the
// takeover by exactly that, 1.5 periods (plus the millisecond past the end
// of the term), not by what the Lease claims.
func TestAForgedLeaseDelaysTakeoverByNoMoreThanTheInstancesOwnBound(t *testing.T) {
	const period = 2 * time.Second
	claims := map[string]func(*coordinationv1.Lease){
		"a period of 1000h": func(l *coordinationv1.Lease) {
			l.Annotations = map[string]string{election.PeriodAnnotation: "1000h"}
			l.Spec.LeaseDurationSeconds = ptr.To[int32](3_600_000)
		},
		"a lease duration of 1000h and no period": func(l *coordinationv1.Lease) {
			l.Spec.LeaseDurationSeconds = ptr.To[int32](3_600_000)
		},
	}
	for name, claim := range claims {
		t.Run(name, func(t *testing.T) {
			ns, rec, clk, t0 := drivenAddon(t, period)
			forged := &coordinationv1.Lease{ObjectMeta: leaseObjectMeta(leaseKey(ns, "addon-instance")), Spec: coordinationv1.LeaseSpec{
				HolderIdentity: ptr.To("forger"), RenewTime: &metav1.MicroTime{Time: t0}, AcquireTime: &metav1.MicroTime{Time: t0},
			}}
			claim(forged)
			if err := k8s.Create(t.Context(), forged); err != nil {
				t.Fatal(err)
			}
			rn := startReporter(t, adminCfg, Options{Namespace: ns, Identity: "pod-a"}, clk.drive)
			// It saw the forged hold at t0 and waits out 1.5 periods
			// from then, no more.
			takeover := t0.Add(election.Timings(period).LeaseDuration + time.Millisecond)
			clk.fire(t, takeover, "the standby's look at the end of the bounded hold")
			clk.beatAt(t, rec, takeover)
			rn.awaitMetric(t, sentTotal, 1)
			if got := ptr.Deref(leaseOf(t, ns, "addon-instance").Spec.HolderIdentity, ""); got != "pod-a" {
				t.Errorf("holder %q after the takeover, want pod-a", got)
			}
		})
	}
}
