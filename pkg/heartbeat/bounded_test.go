//go:build go1.25

package heartbeat

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	addonsv1alpha1 "github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/internal/addonsv1alpha1"
)

// No message stops the heartbeat. 300 injected Deployments with
// 253-character names (none available: each has a message naming it) and an
// SDK component with a 100 KB message: the API server accepts every status
// write, heartbeats go on at the period, and Degraded and Installed carry
// valid messages cut to MaxMessage, listing the first components and
// counting the rest. Before the bound, the API server refused every write
// ("may not be more than 32768 bytes").
func TestHeartbeatsDoNotDependOnTheSizeOfAMessage(t *testing.T) {
	ns := newNamespace(t)
	createInstance(t, ns, "addon-instance", time.Second)
	rec := record(t, ns, "addon-instance")
	const n = 300
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for i := range n {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			name := fmt.Sprintf("d%03d-%s", i, strings.Repeat("n", 253-5))
			labels := map[string]string{"app": fmt.Sprintf("d%03d", i)} // label values stop at 63
			d := &appsv1.Deployment{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: map[string]string{"addon-heartbeat.io/inject": "true"}},
				Spec: appsv1.DeploymentSpec{
					Selector: &metav1.LabelSelector{MatchLabels: labels},
					Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
						Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "example.com/addon:v1"}}}},
				},
			}
			if err := k8s.Create(t.Context(), d); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	rn := startReporter(t, adminCfg, Options{Namespace: ns, Identity: "only", DeploymentHealth: true})
	if err := rn.SetHealth(Component{Name: "database", Reason: "ConnectionRefused", Message: strings.Repeat("m", 100<<10)}); err != nil {
		t.Fatal(err)
	}
	if err := rn.SetCondition(metav1.Condition{Type: "example.com/Synced", Status: metav1.ConditionFalse, Reason: "Behind", Message: strings.Repeat("s", 100<<10)}); err != nil {
		t.Fatalf("SetCondition refused a long message, want it cut: %v", err)
	}
	// Heartbeats once every component is in the message, at the period.
	eventually(t, 30*time.Second, "a heartbeat with all 300 Deployments and the SDK component in Degraded", func() (bool, error) {
		ai := getInstance(t, ns, "addon-instance")
		c := meta.FindStatusCondition(ai.Status.Conditions, ConditionDegraded)
		return c != nil && strings.HasSuffix(c.Message, fmt.Sprintf("and %d more", n+1-strings.Count(c.Message, "; "))), nil
	})
	// The recorder's own watch may not have brought any heartbeat yet.
	start := max(1, len(rec.snapshot()))
	bs := rec.waitBeats(t, start+3, 30*time.Second)
	for _, g := range gaps(bs[start-1:]) {
		if g > 3*time.Second {
			t.Errorf("heartbeat gap %s at a 1s period", g)
		}
	}
	ai := getInstance(t, ns, "addon-instance")
	for _, typ := range []string{ConditionDegraded, ConditionInstalled, "example.com/Synced"} {
		c := meta.FindStatusCondition(ai.Status.Conditions, typ)
		if c == nil {
			t.Errorf("no %s condition", typ)
			continue
		}
		if len(c.Message) > MaxMessage {
			t.Errorf("%s message is %d bytes, over %d", typ, len(c.Message), MaxMessage)
		}
		t.Logf("%s (%d bytes): %s ... %s", typ, len(c.Message), c.Message[:min(60, len(c.Message))], c.Message[max(0, len(c.Message)-60):])
	}
	if c := meta.FindStatusCondition(ai.Status.Conditions, ConditionInstalled); c == nil || !strings.HasSuffix(c.Message, " more to become available") {
		t.Errorf("Installed does not count the components it leaves out: %+v", c)
	}
	if c := meta.FindStatusCondition(ai.Status.Conditions, "example.com/Synced"); c == nil || !strings.HasSuffix(c.Message, "bytes more)") {
		t.Errorf("the SDK condition's message is not cut with a marker: %+v", c)
	}
}

// A period the reporter cannot meet (an explicit 0s, 100ms): it heartbeats
// at its 1s floor, says so once in its log, and exports both the requested
// and the followed period.
func TestAPeriodBelowTheFloorIsFollowedAtTheFloorAndSaidOnce(t *testing.T) {
	for name, asked := range map[string]time.Duration{"0s": 0, "100ms": 100 * time.Millisecond} {
		t.Run(name, func(t *testing.T) {
			ns := newNamespace(t)
			createInstance(t, ns, "addon-instance", asked)
			if got := getInstance(t, ns, "addon-instance").Spec.HeartbeatUpdatePeriod.Duration; got != asked {
				t.Fatalf("the API server stored %s, want %s", got, asked)
			}
			rec := record(t, ns, "addon-instance")
			rn := startReporter(t, adminCfg, Options{Namespace: ns, Identity: "only"})
			bs := rec.waitBeats(t, 4, 30*time.Second)
			// lastHeartbeatTime has second precision: at most one heartbeat
			// per second means no two share one.
			for i := 1; i < len(bs); i++ {
				if !bs[i].hb.After(bs[i-1].hb) {
					t.Errorf("heartbeats %d and %d both at %s: faster than the 1s floor", i-1, i, bs[i].hb)
				}
			}
			if n := rn.logs.count("below the reporter's floor", `"heartbeatUpdatePeriod"="`+asked.String()+`"`); n != 1 {
				t.Errorf("said %d times, want once:\n%s", n, rn.logs)
			}
			if got := rn.metric(t, "addon_heartbeat_period_seconds"); got != 1 {
				t.Errorf("addon_heartbeat_period_seconds = %v, want 1", got)
			}
			if got := rn.metric(t, "addon_heartbeat_period_requested_seconds"); got != asked.Seconds() {
				t.Errorf("addon_heartbeat_period_requested_seconds = %v, want %v", got, asked.Seconds())
			}
		})
	}
}

// What an SDK user passes is bounded too: a component reason past
// metav1.Condition's 1,024 bytes (it becomes Degraded's reason, which the API
// server would refuse with the whole write), more condition types than
// MaxConditions (each rides every status write), more components than
// MaxComponents: each is refused with an error that says the bound, quotes at
// most the first 64 bytes of what it refuses, and keeps what was set before.
// Then, against the real API server, a status with MaxConditions conditions
// of MaxMessage bytes each, besides the Reporter's own, is written at once.
func TestSDKInputsAreBounded(t *testing.T) {
	ns := newNamespace(t)
	createInstance(t, ns, "addon-instance", time.Second)
	rec := record(t, ns, "addon-instance")
	r := startReporter(t, adminCfg, Options{Namespace: ns, Identity: "pod-a"})
	long := strings.Repeat("A", 2000)
	if err := r.SetHealth(Component{Name: "db", Reason: long}); err == nil || !strings.Contains(err.Error(), "at most 1024 bytes") ||
		len(err.Error()) > 300 {
		t.Errorf("SetHealth with a 2000-byte reason: %v", err)
	}
	if err := r.SetCondition(metav1.Condition{Type: "example.com/Ready", Status: metav1.ConditionTrue, Reason: long}); err == nil ||
		!strings.Contains(err.Error(), "at most 1024 bytes") || len(err.Error()) > 300 {
		t.Errorf("SetCondition with a 2000-byte reason: %v", err)
	}
	for i := range MaxConditions {
		if err := r.SetCondition(metav1.Condition{Type: fmt.Sprintf("example.com/Check%02d", i), Status: metav1.ConditionTrue,
			Reason: "Checked", Message: strings.Repeat("m", 2*MaxMessage)}); err != nil {
			t.Fatalf("condition %d: %v", i, err)
		}
	}
	err := r.SetCondition(metav1.Condition{Type: "example.com/OneTooMany", Status: metav1.ConditionTrue, Reason: "Checked"})
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("at most %d conditions", MaxConditions)) {
		t.Errorf("condition %d: %v, want refused naming the bound", MaxConditions+1, err)
	}
	// Setting one already there again is no new one.
	if err := r.SetCondition(metav1.Condition{Type: "example.com/Check00", Status: metav1.ConditionFalse, Reason: "Failed"}); err != nil {
		t.Errorf("setting an existing condition again: %v", err)
	}
	for i := range MaxComponents {
		if err := r.SetHealth(Component{Name: fmt.Sprintf("c%04d", i), Available: true}); err != nil {
			t.Fatalf("component %d: %v", i, err)
		}
	}
	if err := r.SetHealth(Component{Name: strings.Repeat("z", 500), Available: true}); err == nil ||
		!strings.Contains(err.Error(), fmt.Sprintf("at most %d components", MaxComponents)) || len(err.Error()) > 300 {
		t.Errorf("component %d: %v, want refused naming the bound", MaxComponents+1, err)
	}

	// The next heartbeat carries them all, each message cut to MaxMessage.
	var last *addonsv1alpha1.AddonInstance
	eventually(t, 30*time.Second, "a heartbeat with every condition set", func() (bool, error) {
		for _, b := range rec.snapshot() {
			if c := meta.FindStatusCondition(b.obj.Status.Conditions, "example.com/Check00"); c != nil && c.Reason == "Failed" {
				last = b.obj
				return true, nil
			}
		}
		return false, nil
	})
	got := 0
	for _, c := range last.Status.Conditions {
		if strings.HasPrefix(c.Type, "example.com/") {
			got++
			if len(c.Message) > MaxMessage {
				t.Errorf("condition %s: a %d-byte message", c.Type, len(c.Message))
			}
		}
	}
	if got != MaxConditions {
		t.Errorf("%d of the addon's conditions written, want %d", got, MaxConditions)
	}
	if r.metric(t, sentTotal) < 1 || r.metric(t, failTotal) != 0 {
		t.Errorf("heartbeats %v, failed %v", r.metric(t, sentTotal), r.metric(t, failTotal))
	}
}
