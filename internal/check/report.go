package check

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// Status is the outcome of one check.
type Status string

// The outcomes. Only StatusFail makes the command exit non-zero: a warning is
// something to look at that does not stop heartbeats (an outdated reporter
// image, a Degraded addon), and a skipped check could not apply (nothing
// injected to check the RBAC of).
const (
	StatusOK   Status = "ok"
	StatusWarn Status = "warn"
	StatusFail Status = "fail"
	StatusSkip Status = "skip"
)

// Result is one line of the report.
type Result struct {
	// Scope is what was checked: "webhook", "deployment <ns>/<name>" or
	// "addoninstance <ns>/<name>".
	Scope string `json:"scope"`
	// Check names the check within the scope, such as "serving" or "rbac".
	Check  string `json:"check"`
	Status Status `json:"status"`
	// Message says what was found.
	Message string `json:"message"`
	// Fix says how to repair a failure or a warning: a command to run or a
	// value to change. Empty when the check passed.
	Fix string `json:"fix,omitempty"`
}

// Report is every check's result, in the order they ran.
type Report struct {
	Results []Result `json:"checks"`
}

func (r *Report) add(scope, check string, status Status, message, fix string) {
	r.Results = append(r.Results, Result{Scope: scope, Check: check, Status: status, Message: message, Fix: fix})
}

func (r *Report) ok(scope, check, format string, args ...any) {
	r.add(scope, check, StatusOK, fmt.Sprintf(format, args...), "")
}

// Count is the number of results with status s.
func (r Report) Count(s Status) int {
	n := 0
	for _, res := range r.Results {
		if res.Status == s {
			n++
		}
	}
	return n
}

// Healthy is true when no check failed.
func (r Report) Healthy() bool { return r.Count(StatusFail) == 0 }

// jsonReport is the -o json document: the results and a summary, so that a
// script can read the verdict without counting.
type jsonReport struct {
	Healthy  bool     `json:"healthy"`
	Failures int      `json:"failures"`
	Warnings int      `json:"warnings"`
	Results  []Result `json:"checks"`
}

// WriteJSON writes the report as one indented JSON document.
func (r Report) WriteJSON(w io.Writer) error {
	results := r.Results
	if results == nil {
		results = []Result{}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(jsonReport{Healthy: r.Healthy(), Failures: r.Count(StatusFail), Warnings: r.Count(StatusWarn), Results: results})
}

// WriteTable writes one line per check, then a summary line. A failing or
// warning line carries its fix on the same line, after "fix:".
func (r Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SCOPE\tCHECK\tSTATUS\tDETAIL")
	for _, res := range r.Results {
		detail := res.Message
		if res.Fix != "" {
			detail += "; fix: " + res.Fix
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", res.Scope, res.Check, strings.ToUpper(string(res.Status)), oneLine(detail))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintln(w, r.Summary())
	return err
}

// Summary is the last line of the table.
func (r Report) Summary() string {
	fails, warns := r.Count(StatusFail), r.Count(StatusWarn)
	switch {
	case fails > 0:
		return fmt.Sprintf("%s, %s: addon-heartbeat needs attention", plural(fails, "failure"), plural(warns, "warning"))
	case warns > 0:
		return fmt.Sprintf("no failures, %s", plural(warns, "warning"))
	default:
		return fmt.Sprintf("all %d checks passed", len(r.Results))
	}
}

func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return fmt.Sprintf("%d %ss", n, word)
}

// oneLine keeps a table row on one line whatever an error message holds.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
