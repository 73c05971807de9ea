//go:build go1.25

package heartbeat

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/annotations"
)

func cond(t string, s metav1.ConditionStatus, reason, msg string) metav1.Condition {
	return metav1.Condition{Type: t, Status: s, Reason: reason, Message: msg}
}

func TestCompute(t *testing.T) {
	up := func(n string) Component { return Component{Name: n, Available: true, Message: n + " 1/1 available"} }
	down := func(n, reason, msg string) Component { return Component{Name: n, Reason: reason, Message: msg} }
	rtbd := cond(ConditionReadyToBeDeleted, metav1.ConditionTrue, "AddonReadyToBeDeleted", "deletion is acknowledged automatically (delete-ack: auto)")
	notRtbd := cond(ConditionReadyToBeDeleted, metav1.ConditionFalse, "AddonNotReadyToBeDeleted", "deletion is acknowledged manually (delete-ack: manual)")
	tests := map[string]struct {
		in   Observation
		want Desired
	}{
		"all available, installed": {
			in: Observation{Components: []Component{up("a"), up("b")}, Installed: true},
			want: Desired{
				Set: []metav1.Condition{
					cond(ConditionDegraded, metav1.ConditionFalse, "AllComponentsAvailable", "available: a, b"),
					cond(ConditionInstalled, metav1.ConditionTrue, "SetupComplete", "every component has been available"),
				},
				Remove: []string{ConditionReadyToBeDeleted},
			},
		},
		"one deployment down, not yet installed": {
			in: Observation{Components: []Component{down("addon-operator", ReasonDeploymentUnavailable, "addon-operator 1/3 available"), up("b")}},
			want: Desired{
				Set: []metav1.Condition{
					cond(ConditionDegraded, metav1.ConditionTrue, "DeploymentUnavailable", "addon-operator 1/3 available"),
					cond(ConditionInstalled, metav1.ConditionFalse, "Blocked", "waiting for addon-operator to become available"),
				},
				Remove: []string{ConditionReadyToBeDeleted},
			},
		},
		"two down with different reasons": {
			in: Observation{Components: []Component{
				down("a", ReasonDeploymentUnavailable, "a 0/1 available"),
				down("health-url", ReasonHealthCheckFailed, "health check http://127.0.0.1:1/ returned 503 Service Unavailable"),
			}, Installed: true},
			want: Desired{
				Set: []metav1.Condition{
					cond(ConditionDegraded, metav1.ConditionTrue, "MultipleComponentsUnavailable",
						"a 0/1 available; health check http://127.0.0.1:1/ returned 503 Service Unavailable"),
					cond(ConditionInstalled, metav1.ConditionTrue, "SetupComplete", "every component has been available"),
				},
				Remove: []string{ConditionReadyToBeDeleted},
			},
		},
		"health unknown: Degraded and Installed untouched": {
			in:   Observation{},
			want: Desired{Remove: []string{ConditionReadyToBeDeleted}},
		},
		"marked for deletion, auto": {
			in:   Observation{MarkedForDeletion: true, DeleteAck: annotations.DeleteAckAuto},
			want: Desired{Set: []metav1.Condition{rtbd}},
		},
		"marked for deletion, manual": {
			in:   Observation{MarkedForDeletion: true, DeleteAck: annotations.DeleteAckManual},
			want: Desired{Set: []metav1.Condition{notRtbd}},
		},
		"marked for deletion, manual, acknowledged by the addon": {
			in: Observation{MarkedForDeletion: true, DeleteAck: annotations.DeleteAckManual,
				Overrides: []metav1.Condition{cond(ConditionReadyToBeDeleted, metav1.ConditionTrue, "AddonReadyToBeDeleted", "done")}},
			want: Desired{Set: []metav1.Condition{cond(ConditionReadyToBeDeleted, metav1.ConditionTrue, "AddonReadyToBeDeleted", "done")}},
		},
		"override of Degraded and a custom condition, one removed": {
			in: Observation{
				Components: []Component{up("a")}, Installed: true,
				Overrides: []metav1.Condition{
					cond(ConditionDegraded, metav1.ConditionTrue, "CacheCold", "warming up"),
					cond("example.com/Synced", metav1.ConditionTrue, "Synced", "ok"),
				},
				Removed: []string{"example.com/Old"},
			},
			want: Desired{
				Set: []metav1.Condition{
					cond(ConditionInstalled, metav1.ConditionTrue, "SetupComplete", "every component has been available"),
					cond(ConditionDegraded, metav1.ConditionTrue, "CacheCold", "warming up"),
					cond("example.com/Synced", metav1.ConditionTrue, "Synced", "ok"),
				},
				Remove: []string{ConditionReadyToBeDeleted, "example.com/Old"},
			},
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			got := Compute(tt.in)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Compute (-want +got):\n%s", diff)
			}
			for _, c := range got.Set {
				if c.Type == ConditionHealthy {
					t.Errorf("Compute sets Healthy")
				}
				if err := ValidateCondition(c); err != nil {
					t.Errorf("invalid condition: %v", err)
				}
			}
		})
	}
}

func TestComputeIsDeterministic(t *testing.T) {
	comps := []Component{
		{Name: "a", Reason: ReasonDeploymentUnavailable, Message: "a 0/1 available"},
		{Name: "b", Reason: ReasonDeploymentUnavailable, Message: "b 1/2 available"},
	}
	first := Compute(Observation{Components: comps})
	for range 20 {
		if diff := cmp.Diff(first, Compute(Observation{Components: comps})); diff != "" {
			t.Fatalf("Compute changed between calls:\n%s", diff)
		}
	}
	if msg := first.Set[0].Message; msg != "a 0/1 available; b 1/2 available" {
		t.Errorf("Degraded message %q does not name every component in order", msg)
	}
}

func TestInstalled(t *testing.T) {
	up := func(n string) Component { return Component{Name: n, Available: true} }
	down := func(n string) Component { return Component{Name: n} }
	installedTrue := []metav1.Condition{cond(ConditionInstalled, metav1.ConditionTrue, "SetupComplete", "")}
	tests := map[string]struct {
		already  bool
		existing []metav1.Condition
		seen     []string
		comps    []Component
		want     bool
	}{
		"all available now":                  {comps: []Component{up("a"), up("b")}, want: true},
		"one never available":                {comps: []Component{up("a"), down("b")}, want: false},
		"each has been available once":       {seen: []string{"b"}, comps: []Component{up("a"), down("b")}, want: true},
		"latched in process":                 {already: true, comps: []Component{down("a")}, want: true},
		"Installed=True from earlier leader": {existing: installedTrue, comps: []Component{down("a")}, want: true},
		"no components":                      {want: false},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			seen := map[string]bool{}
			for _, n := range tt.seen {
				seen[n] = true
			}
			if got := Installed(tt.already, tt.existing, tt.comps, seen); got != tt.want {
				t.Errorf("Installed = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestApplyPreservesOthersAndTransitionTimes(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	t1 := t0.Add(time.Hour)
	healthy := metav1.Condition{Type: ConditionHealthy, Status: metav1.ConditionTrue, Reason: "ReceivingHeartbeats",
		LastTransitionTime: metav1.NewTime(t0), ObservedGeneration: 1}
	other := metav1.Condition{Type: "example.com/Other", Status: metav1.ConditionFalse, Reason: "X",
		LastTransitionTime: metav1.NewTime(t0)}
	conds := []metav1.Condition{healthy, other,
		{Type: ConditionReadyToBeDeleted, Status: metav1.ConditionTrue, Reason: "AddonReadyToBeDeleted", LastTransitionTime: metav1.NewTime(t0)}}
	Apply(&conds, Desired{
		Set:    []metav1.Condition{cond(ConditionDegraded, metav1.ConditionFalse, "AllComponentsAvailable", "m")},
		Remove: []string{ConditionReadyToBeDeleted},
	}, 7, t0)
	Apply(&conds, Desired{Set: []metav1.Condition{cond(ConditionDegraded, metav1.ConditionFalse, "AllComponentsAvailable", "m2")}}, 8, t1)

	if diff := cmp.Diff(healthy, *meta.FindStatusCondition(conds, ConditionHealthy)); diff != "" {
		t.Errorf("Healthy changed:\n%s", diff)
	}
	if diff := cmp.Diff(other, *meta.FindStatusCondition(conds, "example.com/Other")); diff != "" {
		t.Errorf("foreign condition changed:\n%s", diff)
	}
	if meta.FindStatusCondition(conds, ConditionReadyToBeDeleted) != nil {
		t.Errorf("ReadyToBeDeleted not removed")
	}
	d := meta.FindStatusCondition(conds, ConditionDegraded)
	if !d.LastTransitionTime.Time.Equal(t0) || d.Message != "m2" || d.ObservedGeneration != 8 {
		t.Errorf("Degraded = %+v: want transition time kept, message and generation updated", d)
	}
	Apply(&conds, Desired{Set: []metav1.Condition{cond(ConditionDegraded, metav1.ConditionTrue, "DeploymentUnavailable", "x")}}, 8, t1)
	if d := meta.FindStatusCondition(conds, ConditionDegraded); !d.LastTransitionTime.Time.Equal(t1) {
		t.Errorf("status change kept the old transition time")
	}
}

func TestValidateCondition(t *testing.T) {
	tests := map[string]struct {
		c       metav1.Condition
		wantErr string
	}{
		"ok":              {cond(ConditionDegraded, metav1.ConditionFalse, "Fine", ""), ""},
		"custom type":     {cond("example.com/Synced", metav1.ConditionTrue, "Synced", ""), ""},
		"healthy":         {cond(ConditionHealthy, metav1.ConditionTrue, "ReceivingHeartbeats", ""), "computed by the addon-operator"},
		"healthy short":   {cond("Healthy", metav1.ConditionTrue, "ReceivingHeartbeats", ""), "computed by the addon-operator"},
		"empty type":      {cond("", metav1.ConditionTrue, "X", ""), "condition type"},
		"bad status":      {cond(ConditionDegraded, "Maybe", "X", ""), `status "Maybe"`},
		"empty reason":    {cond(ConditionDegraded, metav1.ConditionTrue, "", ""), "reason"},
		"reason w/ space": {cond(ConditionDegraded, metav1.ConditionTrue, "Not Camel", ""), "reason"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			err := ValidateCondition(tt.c)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("unexpected error: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("error = %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestNormalizeType(t *testing.T) {
	tests := map[string]string{
		"Degraded":                              ConditionDegraded,
		"ReadyToBeDeleted":                      ConditionReadyToBeDeleted,
		"addons.managed.openshift.io/Installed": ConditionInstalled,
		"example.com/Synced":                    "example.com/Synced",
		"Synced":                                "Synced",
	}
	for in, want := range tests {
		if got := normalizeType(in); got != want {
			t.Errorf("normalizeType(%q) = %q, want %q", in, got, want)
		}
	}
}
