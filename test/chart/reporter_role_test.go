package chart_test

import (
	"fmt"
	"slices"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat"
)

// grants expands rules into one "group resource verb name" line per
// permission ("*" for any name), sorted.
func grants(rules []rbacv1.PolicyRule) []string {
	var out []string
	for _, r := range rules {
		names := r.ResourceNames
		if len(names) == 0 {
			names = []string{"*"}
		}
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					for _, n := range names {
						out = append(out, fmt.Sprintf("%s %s %s %s", g, res, v, n))
					}
				}
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// The chart's reporter ClusterRole grants exactly what the reporter says it
// uses (heartbeat.PolicyRules) for every configured AddonInstance name: no
// more, and nothing it would be refused.
func TestReporterRoleIsWhatTheReporterUses(t *testing.T) {
	names := []string{"addon-instance", "second", "an-addon-instance-with-a-name-long-enough-to-shorten-its-lease"}
	objs, _ := render(t, `reporter: {addonInstanceNames: [addon-instance, second, an-addon-instance-with-a-name-long-enough-to-shorten-its-lease]}`)
	role := convert[rbacv1.ClusterRole](t, mustFind(t, objs, "ClusterRole", "addon-heartbeat-reporter"))
	var want []rbacv1.PolicyRule
	for _, n := range names {
		want = append(want, heartbeat.PolicyRules(n)...)
	}
	if got, want := grants(role.Rules), grants(want); !slices.Equal(got, want) {
		t.Errorf("reporter ClusterRole grants\n%q\nthe reporter uses\n%q", got, want)
	}
}
