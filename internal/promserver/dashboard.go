package promserver

import (
	"encoding/json"
	"fmt"
	"strings"
)

// Dashboard is the part of a Grafana dashboard the tests read.
type Dashboard struct {
	Title      string `json:"title"`
	UID        string `json:"uid"`
	Templating struct {
		List []Variable `json:"list"`
	} `json:"templating"`
	Panels []Panel `json:"panels"`
}

// Variable is a dashboard variable.
type Variable struct {
	Name       string `json:"name"`
	Type       string `json:"type"`
	Query      any    `json:"query"`
	Definition string `json:"definition"`
}

// Panel is a dashboard panel (a row has no targets).
type Panel struct {
	ID         int    `json:"id"`
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource *struct {
		UID string `json:"uid"`
	} `json:"datasource"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
}

// ReadDashboard decodes a dashboard's JSON.
func ReadDashboard(data []byte) (Dashboard, error) {
	var d Dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		return d, fmt.Errorf("the dashboard is not valid JSON: %w", err)
	}
	return d, nil
}

// Variable returns the query of the variable name ("" when there is none).
func (d Dashboard) Variable(name string) string {
	for _, v := range d.Templating.List {
		if v.Name == name {
			s, _ := v.Query.(string)
			return s
		}
	}
	return ""
}

// Query is one panel query with the dashboard's variables filled in.
type Query struct {
	Panel, RefID, Expr string
}

// Queries are the dashboard's panel queries with its variables filled in
// as Grafana does when every namespace is chosen: $namespace matches any,
// $__rate_interval is rateInterval, and $webhook_job is the dashboard's own
// webhook_job constant.
func (d Dashboard) Queries(rateInterval string) []Query {
	r := strings.NewReplacer(`$namespace`, `.*`, `$__rate_interval`, rateInterval, `$webhook_job`, d.Variable("webhook_job"))
	var out []Query
	for _, p := range d.Panels {
		for _, q := range p.Targets {
			out = append(out, Query{Panel: p.Title, RefID: q.RefID, Expr: r.Replace(q.Expr)})
		}
	}
	return out
}
