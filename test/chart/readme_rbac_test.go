package chart_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/addon-heartbeat/addon-heartbeat/internal/testenv"
)

// rbacRows are the rows of README's RBAC table for what the chart renders
// with its defaults: one row per identity, rule and resource.
func rbacRows(t *testing.T) []string {
	t.Helper()
	objs, _ := render(t, "")
	roles := []struct {
		identity   string
		kind, name string
	}{
		{"webhook, cluster-wide", "ClusterRole", "addon-heartbeat-webhook"},
		{"webhook, in its namespace", "Role", "addon-heartbeat-webhook"},
		{"reporter, in its addon's namespace", "ClusterRole", "addon-heartbeat-reporter"},
	}
	var rows []string
	for _, r := range roles {
		var rules []rbacv1.PolicyRule
		switch r.kind {
		case "Role":
			rules = convert[rbacv1.Role](t, mustFind(t, objs, r.kind, r.name)).Rules
		default:
			rules = convert[rbacv1.ClusterRole](t, mustFind(t, objs, r.kind, r.name)).Rules
		}
		for _, rule := range rules {
			names := "any"
			if len(rule.ResourceNames) > 0 {
				names = "`" + strings.Join(rule.ResourceNames, "`, `") + "`"
			}
			for _, g := range rule.APIGroups {
				for _, res := range rule.Resources {
					if g != "" {
						res += "." + g
					}
					rows = append(rows, fmt.Sprintf("| %s | %s | `%s` | %s |", r.identity, strings.Join(rule.Verbs, ", "), res, names))
				}
			}
		}
	}
	return rows
}

// Must show (issue: README says what each identity may do): the RBAC table in
// README.md is exactly what the chart grants with its default values, row for
// row, so neither can change without the other.
func TestREADMERBACTableIsTheChart(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	const begin, end = "<!-- rbac-table: begin -->", "<!-- rbac-table: end -->"
	_, rest, ok := strings.Cut(string(readme), begin)
	table, _, ok2 := strings.Cut(rest, end)
	if !ok || !ok2 {
		t.Fatalf("README.md has no %s ... %s section", begin, end)
	}
	var got []string
	for _, line := range strings.Split(table, "\n") {
		if strings.HasPrefix(line, "| ") && !strings.HasPrefix(line, "| identity ") {
			got = append(got, line)
		}
	}
	want := rbacRows(t)
	if !slices.Equal(got, want) {
		t.Errorf("README.md's RBAC table differs from the chart's roles; the chart grants:\n| identity | verbs | resource | names |\n|---|---|---|---|\n%s",
			strings.Join(want, "\n"))
	}
}
