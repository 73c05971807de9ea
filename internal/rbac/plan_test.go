package rbac

import (
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/annotations"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/inject"
)

var testKey = []byte("a key for the tests only, 32 b..")

// signed is a status record as the webhook writes it in namespace ns.
func signed(ns, sa, instance string) map[string]string {
	return map[string]string{annotations.Status: fmt.Sprintf(`{"version":2,"sidecar":"initContainers","serviceAccount":%q,"addonInstance":%q,"signature":%q}`,
		sa, instance, inject.Sign(testKey, ns, sa, instance))}
}

func TestPlan(t *testing.T) {
	const ns = "addon"
	unsigned := map[string]string{annotations.Status: `{"version":2,"sidecar":"initContainers","serviceAccount":"admin","addonInstance":"addon-instance"}`}
	v1 := map[string]string{annotations.Status: `{"version":1,"sidecar":"initContainers","env":["manager"]}`}
	forged := signed("elsewhere", "admin", "addon-instance") // copied from another namespace
	tests := map[string]struct {
		deps      []Deployment
		instances []string
		bound     []string
		subjects  []string
		leases    []Lease
		refused   []string
	}{
		"signed, its AddonInstance exists": {deps: []Deployment{{"a", signed(ns, "sa-a", "addon-instance")}},
			instances: []string{"addon-instance"}, subjects: []string{"sa-a"}, leases: []Lease{{Name: "addon-heartbeat-addon-instance", Instance: "addon-instance"}}},
		"no AddonInstance: not an addon's namespace": {deps: []Deployment{{"a", signed(ns, "sa-a", "addon-instance")}},
			refused: []string{"a"}},
		"another AddonInstance exists":   {deps: []Deployment{{"a", signed(ns, "sa-a", "mine")}}, instances: []string{"addon-instance"}, refused: []string{"a"}},
		"unsigned: nothing new":          {deps: []Deployment{{"a", unsigned}}, instances: []string{"addon-instance"}, refused: []string{"a"}},
		"signed for another namespace":   {deps: []Deployment{{"a", forged}}, instances: []string{"addon-instance"}, refused: []string{"a"}},
		"not a record":                   {deps: []Deployment{{"a", map[string]string{annotations.Status: "done"}}}, instances: []string{"addon-instance"}, refused: []string{"a"}},
		"no record, only the opt-in":     {deps: []Deployment{{"a", map[string]string{annotations.Inject: "true"}}}, instances: []string{"addon-instance"}},
		"a binding without records goes": {bound: []string{"old"}, instances: []string{"addon-instance"}},
		"version 1 records keep what is bound, add nothing": {
			deps:      []Deployment{{"old", v1}, {"new", signed(ns, "sa-new", "addon-instance")}},
			instances: []string{"addon-instance"}, bound: []string{"sa-old"},
			subjects: []string{"sa-new", "sa-old"}, leases: []Lease{{Name: "addon-heartbeat-addon-instance", Instance: "addon-instance"}}, refused: []string{"old"}},
		// A tenant can write a version 1 record too: it keeps nothing once
		// the AddonInstance is gone, and a version 2 record without a
		// valid signature, or a value that is no record, keeps nothing.
		"version 1 records keep nothing without an AddonInstance": {
			deps: []Deployment{{"old", v1}}, bound: []string{"sa-old"}, refused: []string{"old"}},
		"an unsigned version 2 record keeps nothing": {
			deps: []Deployment{{"a", unsigned}}, instances: []string{"addon-instance"}, bound: []string{"sa-old"}, refused: []string{"a"}},
		"a record signed elsewhere keeps nothing": {
			deps: []Deployment{{"a", forged}}, instances: []string{"addon-instance"}, bound: []string{"sa-old"}, refused: []string{"a"}},
		"not a record keeps nothing": {
			deps: []Deployment{{"a", map[string]string{annotations.Status: "done"}}}, instances: []string{"addon-instance"}, bound: []string{"sa-old"}, refused: []string{"a"}},
		"sorted, no duplicates, a Lease per instance": {
			deps:      []Deployment{{"b", signed(ns, "sa-b", "second")}, {"a", signed(ns, "sa-a", "addon-instance")}, {"c", signed(ns, "sa-b", "addon-instance")}},
			instances: []string{"addon-instance", "second"}, subjects: []string{"sa-a", "sa-b"},
			leases: []Lease{{Name: "addon-heartbeat-addon-instance", Instance: "addon-instance"}, {Name: "addon-heartbeat-second", Instance: "second"}}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			g := Plan(ns, tc.deps, tc.instances, tc.bound, testKey)
			var subjects, refused []string
			for _, s := range g.Subjects {
				if s.Kind != "ServiceAccount" || s.Namespace != ns {
					t.Errorf("subject %+v", s)
				}
				subjects = append(subjects, s.Name)
			}
			for d := range g.Refused {
				refused = append(refused, d)
			}
			opts := []cmp.Option{cmpopts.EquateEmpty(), cmpopts.SortSlices(func(a, b string) bool { return a < b })}
			if diff := cmp.Diff(tc.subjects, subjects, opts...); diff != "" {
				t.Errorf("subjects (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.leases, g.Leases, opts...); diff != "" {
				t.Errorf("leases (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.refused, refused, opts...); diff != "" {
				t.Errorf("refused (-want +got):\n%s (%v)", diff, g.Refused)
			}
		})
	}
	// Without the key nothing verifies.
	if g := Plan(ns, []Deployment{{"a", signed(ns, "sa-a", "addon-instance")}}, []string{"addon-instance"}, nil, nil); len(g.Subjects) != 0 {
		t.Errorf("bound without a key: %v", g.Subjects)
	}
}
