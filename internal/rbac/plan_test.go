package rbac

import (
	"fmt"
	"strings"
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

// The cache keeps a few hundred bytes of a status annotation whatever it
// holds, and the plan reads the same from it: a valid record stays valid
// (signature and all) without the container list it does not need; a value
// that is no record stays none, cut.
func TestTheCacheKeepsACompactRecord(t *testing.T) {
	const ns = "addon"
	envs := make([]string, 200)
	for i := range envs {
		envs[i] = fmt.Sprintf("%q", fmt.Sprintf("container-%03d-with-a-long-name-for-its-size", i))
	}
	valid := fmt.Sprintf(`{"version":2,"sidecar":"initContainers","env":[%s],"serviceAccount":"sa-a","addonInstance":"addon-instance","signature":%q}`,
		strings.Join(envs, ","), inject.Sign(testKey, ns, "sa-a", "addon-instance"))
	tests := map[string]struct {
		value      string
		wantRecord bool
	}{
		"a signed record with 200 containers": {value: valid, wantRecord: true},
		"a record and 200 KiB after it":       {value: valid + strings.Repeat(" x", 100<<10)},
		"200 KiB of no record":                {value: strings.Repeat("{", 200<<10)},
		"a short value that is no record":     {value: "yes"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			kept := compactRecord(tc.value)
			if len(kept) > 400 {
				t.Errorf("kept %d bytes of a %d-byte value", len(kept), len(tc.value))
			}
			g := Plan(ns, []Deployment{{Name: "d", Annotations: map[string]string{annotations.Status: kept}}},
				[]string{"addon-instance"}, nil, testKey)
			if bound := len(g.Subjects) == 1 && g.Subjects[0].Name == "sa-a"; bound != tc.wantRecord {
				t.Errorf("from what the cache keeps, the plan binds %v (refused: %v), want a binding %v", g.Subjects, g.Refused, tc.wantRecord)
			}
			if !tc.wantRecord && len(g.Refused["d"]) > 300 {
				t.Errorf("a %d-byte reason: %.100s...", len(g.Refused["d"]), g.Refused["d"])
			}
		})
	}
}
