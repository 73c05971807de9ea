//go:build node

package node

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	addonsv1alpha1 "github.com/openshift/addon-operator/apis/addons/v1alpha1"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/addon-heartbeat/addon-heartbeat/internal/leaseaudit"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/election"
)

// soakFor is how long the soak step runs its faults and checks.
var soakFor = flag.Duration("soak", 10*time.Minute, "length of the soak step of the real-node end to end")

// auditPolicy logs every write to Leases and AddonInstances with its request
// body (a Lease's holder and announced period; who moved lastHeartbeatTime is
// the requester's pod in user.extra), and nothing else.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Request
  verbs: [create, update, patch, delete]
  resources:
  - group: coordination.k8s.io
    resources: [leases]
  - group: addons.managed.openshift.io
    resources: [addoninstances, addoninstances/status]
- level: None
`

// soak runs the addon's reporters through faults for soakFor: the leader pod
// deleted, the leader's reporter SIGKILLed, the period changed from 5s to
// 12s and back, the Lease deleted, while an operator-like writer sets Healthy
// every 10s from a stale copy. It checks, from a watch of the AddonInstance,
// that its lastHeartbeatTime is never older than 3 periods (the operator's
// rule) and that Healthy, once written, is never lost nor set back; and from
// the API server's audit log, that every heartbeat applied was written by the
// pod holding the Lease, inside its hold (one writer per hold).
func soak(t *testing.T) {
	ctx, cancel := context.WithCancel(suiteCtx)
	defer cancel()
	start := time.Now()
	obs := watchInstance(ctx, t)

	// The operator-like writer: every 10s it writes Healthy=True with a
	// sequence number in the message, from the copy it read the last time
	// (up to 10s stale, as a controller's cache may be), re-reading and
	// retrying on a conflict as a controller's requeue does.
	var opWrites, opConflicts int
	var opErr error
	var opWG sync.WaitGroup
	opWG.Add(1)
	go func() {
		defer opWG.Done()
		var ai addonsv1alpha1.AddonInstance
		if err := cluster.Client.Get(ctx, key(addonNamespace, instance), &ai); err != nil {
			opErr = err
			return
		}
		for seq := 1; ctx.Err() == nil; seq++ {
			select {
			case <-ctx.Done():
				return
			case <-time.After(10 * time.Second):
			}
			for ctx.Err() == nil {
				meta.SetStatusCondition(&ai.Status.Conditions, metav1.Condition{Type: healthy, Status: metav1.ConditionTrue,
					Reason: "SoakCheck", Message: "soak " + strconv.Itoa(seq), ObservedGeneration: ai.Generation})
				err := cluster.Client.Status().Update(ctx, &ai)
				if err == nil {
					opWrites++
					break
				}
				if !apierrors.IsConflict(err) {
					if ctx.Err() == nil {
						opErr = fmt.Errorf("operator-like write %d: %w", seq, err)
					}
					return
				}
				opConflicts++
				if err := cluster.Client.Get(ctx, key(addonNamespace, instance), &ai); err != nil {
					if ctx.Err() == nil {
						opErr = err
					}
					return
				}
			}
		}
	}()

	// The period in force over time, for the operator's rule.
	periods := []periodChange{{at: start, period: period}}
	setPeriod := func(t *testing.T, p time.Duration) {
		t.Helper()
		var ai addonsv1alpha1.AddonInstance
		if err := cluster.Client.Get(ctx, key(addonNamespace, instance), &ai); err != nil {
			t.Fatal(err)
		}
		patch := client.MergeFrom(ai.DeepCopy())
		ai.Spec.HeartbeatUpdatePeriod = metav1.Duration{Duration: p}
		if err := cluster.Client.Patch(ctx, &ai, patch); err != nil {
			t.Fatal(err)
		}
		periods = append(periods, periodChange{at: time.Now(), period: p})
		logf("soak %s: heartbeatUpdatePeriod set to %s", time.Since(start).Round(time.Second), p)
	}
	at := func(frac float64) {
		d := time.Until(start.Add(time.Duration(frac * float64(*soakFor))))
		select {
		case <-ctx.Done():
		case <-time.After(d):
		}
	}
	faults := []struct {
		at float64
		do func(t *testing.T)
	}{
		{0.07, func(t *testing.T) {
			pod := leaderPod(t)
			if err := cluster.Client.Delete(ctx, &pod); err != nil {
				t.Fatal(err)
			}
			logf("soak %s: leader pod %s deleted", time.Since(start).Round(time.Second), pod.Name)
		}},
		{0.22, func(t *testing.T) {
			pod := leaderPod(t)
			rs := reporterStatus(pod)
			if rs == nil || rs.ContainerID == "" {
				t.Fatalf("no running reporter in %s", pod.Name)
			}
			pid, err := containerPID(ctx, rs.ContainerID)
			if err != nil {
				t.Fatal(err)
			}
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			logf("soak %s: reporter of leader %s SIGKILLed", time.Since(start).Round(time.Second), pod.Name)
		}},
		{0.35, func(t *testing.T) { setPeriod(t, 12*time.Second) }},
		{0.50, func(t *testing.T) {
			lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: addonNamespace, Name: election.LeaseName(instance)}}
			if err := cluster.Client.Delete(ctx, lease); err != nil {
				t.Fatal(err)
			}
			logf("soak %s: Lease deleted", time.Since(start).Round(time.Second))
		}},
		{0.65, func(t *testing.T) { setPeriod(t, period) }},
	}
	for _, f := range faults {
		at(f.at)
		f.do(t)
	}
	at(1)
	cancel()
	opWG.Wait()
	end := time.Now()
	if opErr != nil {
		t.Errorf("the operator-like writer stopped: %v", opErr)
	}

	versions := obs.stop()
	checkOperatorRule(t, versions, periods, end)
	checkHealthyKept(t, versions, opWrites)
	holds, beats := checkOneWriterPerHold(t, start, end)
	logf("soak of %s: %d heartbeats by pods in %d holds, operator-like writes %d (conflicts retried %d), %d versions watched",
		end.Sub(start).Round(time.Second), beats, holds, opWrites, opConflicts, len(versions))

	// Leave the addon as the later steps expect it: its pods back.
	for _, k := range []client.ObjectKey{key(addonNamespace, operatorName), key(addonNamespace, metricsName)} {
		want := int32(1)
		if k.Name == operatorName {
			want = 2
		}
		waitFor(t, k.Name+" available again", 2*time.Minute, func(ctx context.Context) (bool, string) { return rolledOut(ctx, k, want) })
	}
}

const healthy = "addons.managed.openshift.io/Healthy"

type periodChange struct {
	at     time.Time
	period time.Duration
}

// periodAt is the spec's period at t.
func periodAt(ps []periodChange, t time.Time) time.Duration {
	p := ps[0].period
	for _, c := range ps {
		if !c.at.After(t) {
			p = c.period
		}
	}
	return p
}

// observed is one version of the AddonInstance, with when the watch brought it.
type observed struct {
	at time.Time
	ai *addonsv1alpha1.AddonInstance
}

type instanceWatch struct {
	mu       sync.Mutex
	versions []observed
	cancel   context.CancelFunc
	done     chan struct{}
}

// watchInstance records every version of the addon's AddonInstance until
// stop, resuming the watch from the last version when it ends.
func watchInstance(ctx context.Context, t *testing.T) *instanceWatch {
	ctx, cancel := context.WithCancel(ctx)
	w := &instanceWatch{cancel: cancel, done: make(chan struct{})}
	var list addonsv1alpha1.AddonInstanceList
	sel := client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("metadata.name", instance)}
	if err := cluster.Client.List(ctx, &list, client.InNamespace(addonNamespace), sel); err != nil || len(list.Items) != 1 {
		t.Fatalf("listing the AddonInstance: %v (%d items)", err, len(list.Items))
	}
	w.versions = append(w.versions, observed{at: time.Now(), ai: &list.Items[0]})
	rv := list.ResourceVersion
	wc, err := client.NewWithWatch(cluster.Config, client.Options{Scheme: cluster.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(w.done)
		for ctx.Err() == nil {
			ww, err := wc.Watch(ctx, &addonsv1alpha1.AddonInstanceList{}, client.InNamespace(addonNamespace), sel,
				&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv}})
			if err != nil {
				select { // retried as a reflector does, at a gentler pace than a busy loop
				case <-ctx.Done():
				case <-time.After(100 * time.Millisecond):
				}
				continue
			}
			for ev := range ww.ResultChan() {
				ai, ok := ev.Object.(*addonsv1alpha1.AddonInstance)
				if !ok || ev.Type == watch.Deleted {
					continue
				}
				w.mu.Lock()
				w.versions = append(w.versions, observed{at: time.Now(), ai: ai})
				w.mu.Unlock()
				rv = ai.ResourceVersion
			}
		}
	}()
	return w
}

func (w *instanceWatch) stop() []observed {
	w.cancel()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.versions)
}

// checkOperatorRule: by the time each version arrived (and at the end), the
// last lastHeartbeatTime stored is at most 3 periods old (the period in
// force then), as the addon-operator requires. A change of the period gives
// notice from the moment it is made: a heartbeat written under a longer
// period, on time for it, is not late the instant the period is shortened;
// the next one is due within 3 new periods of the change (and the old
// period's rule holds up to the change). This machine's clock is the API
// server's and the reporters'.
func checkOperatorRule(t *testing.T, versions []observed, periods []periodChange, end time.Time) {
	t.Helper()
	worst, worstAt := 0.0, time.Time{}
	judge := func(at time.Time, hb time.Time) {
		p := periodAt(periods, at)
		age := at.Sub(hb)
		due := age
		for _, c := range periods[1:] {
			if !c.at.After(hb) || c.at.After(at) {
				continue
			}
			before := periodAt(periods, c.at.Add(-time.Nanosecond))
			if old := c.at.Sub(hb); old > 3*before {
				t.Errorf("at %s (a change of the period to %s) lastHeartbeatTime %s is %s old: more than 3 periods of %s",
					c.at.Format(time.RFC3339Nano), c.period, hb.Format(time.RFC3339), old, before)
			}
			due = at.Sub(c.at)
		}
		// Reported: the age, or the time since the notice where that excuses it.
		late := age
		if age > 3*p && due <= 3*p {
			late = due
		}
		if r := float64(late) / float64(p); r > worst {
			worst, worstAt = r, at
		}
		if age > 3*p && due > 3*p {
			t.Errorf("at %s lastHeartbeatTime %s is %s old: more than 3 periods of %s (%s since the period was last set)", at.Format(time.RFC3339Nano), hb.Format(time.RFC3339), age, p, due)
		}
	}
	var last time.Time
	for _, v := range versions {
		if !last.IsZero() {
			judge(v.at, last)
		}
		last = v.ai.Status.LastHeartbeatTime.Time
	}
	judge(end, last)
	logf("soak: lastHeartbeatTime at most %.2f periods old (at %s)", worst, worstAt.Format("15:04:05"))
}

// checkHealthyKept: once the operator-like writer set Healthy, every later
// version has it, and its sequence number never goes back (no write of the
// reporters drops or reverts it).
func checkHealthyKept(t *testing.T, versions []observed, writes int) {
	t.Helper()
	seq, seen := 0, false
	for _, v := range versions {
		c := meta.FindStatusCondition(v.ai.Status.Conditions, healthy)
		if c == nil || c.Reason != "SoakCheck" {
			if seen {
				t.Errorf("version %s (seen at %s) lost Healthy: %+v", v.ai.ResourceVersion, v.at.Format(time.RFC3339Nano), c)
			}
			continue
		}
		var n int
		if _, err := fmt.Sscanf(c.Message, "soak %d", &n); err != nil {
			t.Errorf("Healthy message %q", c.Message)
			continue
		}
		if n < seq {
			t.Errorf("version %s set Healthy back from soak %d to soak %d", v.ai.ResourceVersion, seq, n)
		}
		seq, seen = n, true
	}
	if seq != writes || writes < 5 {
		t.Errorf("the last Healthy seen is soak %d, after %d operator-like writes", seq, writes)
	}
}

// checkOneWriterPerHold judges the soak's window by the API server's audit
// log (leaseaudit.Judge): every heartbeat applied came from the pod holding
// the Lease, inside its hold. It returns the counts of holds and heartbeats.
func checkOneWriterPerHold(t *testing.T, from, to time.Time) (holds, beats int) {
	t.Helper()
	rep := auditReport(t, from, to)
	for _, v := range rep.Violations {
		t.Error(v)
	}
	// At least one heartbeat per two of the longest period (12s) the soak
	// sets, whatever its length (-soak), and the takeovers its faults cause.
	minBeats := max(2, int(to.Sub(from)/(2*12*time.Second)))
	if rep.Holds < 3 || rep.Heartbeats < minBeats {
		t.Errorf("the audit log shows %d holds and %d heartbeats over the soak: want the takeovers the faults cause and %d heartbeats", rep.Holds, rep.Heartbeats, minBeats)
	}
	logf("soak: audit log: %d holds, %d heartbeats applied by %d pods, %d outside their writer's hold; %d pod status writes refused",
		rep.Holds, rep.Heartbeats, len(rep.Writers), len(rep.Violations), rep.Refused)
	return rep.Holds, rep.Heartbeats
}

// auditReport judges the addon's heartbeats in [from, to] from the audit log.
func auditReport(t *testing.T, from, to time.Time) leaseaudit.Report {
	t.Helper()
	f, err := os.Open(cluster.AuditLogPath())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	events, err := leaseaudit.Read(f, addonNamespace)
	if err != nil {
		t.Fatal(err)
	}
	return leaseaudit.Judge(events, election.LeaseName(instance), instance, from, to)
}
