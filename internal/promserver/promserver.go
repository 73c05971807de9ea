// Package promserver runs Prometheus' own code for the tests: promtool on the
// chart's rules and dashboard queries, and a Prometheus server as a local
// process, read through its HTTP API. The binaries come from
// hack/prometheus-binaries.sh, built from the Go module proxy into a cache
// folder outside the checkout.
package promserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/yaml"

	"github.com/addon-heartbeat/addon-heartbeat/internal/localcluster"
	"github.com/addon-heartbeat/addon-heartbeat/internal/testenv"
)

// Version is the github.com/prometheus/prometheus module version that
// hack/tools/prometheus pins and hack/prometheus-binaries.sh builds.
const Version = "v0.316.0"

// Dir returns the folder holding prometheus and promtool: PROMETHEUS_ASSETS
// when set, else the cache folder hack/prometheus-binaries.sh writes, when it
// holds both.
func Dir() (string, error) {
	dir := os.Getenv("PROMETHEUS_ASSETS")
	if dir == "" {
		cache, err := testenv.CacheDir()
		if err != nil {
			return "", err
		}
		dir = filepath.Join(cache, "bin", "prometheus-"+Version)
	}
	for _, name := range []string{"prometheus", "promtool"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			return "", fmt.Errorf("no %s in %s: run hack/prometheus-binaries.sh or set PROMETHEUS_ASSETS: %w", name, dir, err)
		}
	}
	return dir, nil
}

// Promtool runs promtool with args in dir (the folder relative file names
// are read from) and returns its output, stdout and stderr together. A
// non-zero exit is an error carrying that output.
func Promtool(ctx context.Context, dir string, args ...string) (string, error) {
	bin, err := Dir()
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "promtool"), args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("promtool %v: %w:\n%s", args, err, out)
	}
	return string(out), nil
}

// Server is a Prometheus server running as a local process on loopback.
type Server struct {
	*localcluster.Process
	// URL is the server's base URL, http://127.0.0.1:<port>.
	URL string
	dir string
}

// Start runs a Prometheus server with config (prometheus.yml) and rule
// files (name to content, loaded by the config's rule_files) in a new folder
// under parent, listening on a free loopback port, and waits until it is
// ready. Stop it with Stop.
func Start(ctx context.Context, parent, config string, rules map[string]string) (*Server, error) {
	bin, err := Dir()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(parent, "prometheus-")
	if err != nil {
		return nil, fmt.Errorf("creating the Prometheus folder: %w", err)
	}
	files := map[string]string{"prometheus.yml": config}
	for name, content := range rules {
		files[name] = content
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			return nil, fmt.Errorf("writing %s: %w", name, err)
		}
	}
	port, err := localcluster.FreePort()
	if err != nil {
		return nil, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	args := []string{
		"--config.file=" + filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path=" + filepath.Join(dir, "data"),
		"--web.listen-address=" + addr,
		"--web.enable-lifecycle",
		"--log.level=warn",
	}
	p, err := localcluster.StartProcess("prometheus", filepath.Join(dir, "prometheus.log"), filepath.Join(bin, "prometheus"), args, nil, nil)
	if err != nil {
		return nil, err
	}
	s := &Server{Process: p, URL: "http://" + addr, dir: dir}
	if err := localcluster.WaitReady(ctx, p, s.URL+"/-/ready"); err != nil {
		return nil, errors.Join(err, p.Stop(10*time.Second))
	}
	return s, nil
}

// Dir is the server's folder: its configuration, rules, data and log.
func (s *Server) Dir() string { return s.dir }

// WriteFile replaces a file in the server's folder atomically (for file
// service discovery, which Prometheus re-reads when it changes).
func (s *Server) WriteFile(name, content string) error {
	tmp := filepath.Join(s.dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(s.dir, name))
}

// Sample is one element of an instant vector.
type Sample struct {
	Metric map[string]string
	Value  float64
}

// Query evaluates expr at the current time. A query the server refuses
// (such as one that does not parse) is an error naming the server's reason.
func (s *Server) Query(ctx context.Context, expr string) ([]Sample, error) {
	var data struct {
		ResultType string `json:"resultType"`
		Result     json.RawMessage
	}
	if err := s.get(ctx, "/api/v1/query?"+url.Values{"query": {expr}}.Encode(), &data); err != nil {
		return nil, fmt.Errorf("query %s: %w", expr, err)
	}
	switch data.ResultType {
	case "vector":
		var raw []struct {
			Metric map[string]string `json:"metric"`
			Value  [2]any            `json:"value"`
		}
		if err := json.Unmarshal(data.Result, &raw); err != nil {
			return nil, fmt.Errorf("query %s: decoding the vector: %w", expr, err)
		}
		out := make([]Sample, 0, len(raw))
		for _, r := range raw {
			out = append(out, Sample{Metric: r.Metric, Value: parseValue(r.Value[1])})
		}
		return out, nil
	case "scalar":
		var raw [2]any
		if err := json.Unmarshal(data.Result, &raw); err != nil {
			return nil, fmt.Errorf("query %s: decoding the scalar: %w", expr, err)
		}
		return []Sample{{Value: parseValue(raw[1])}}, nil
	default:
		return nil, fmt.Errorf("query %s: result type %q, want a vector or a scalar", expr, data.ResultType)
	}
}

func parseValue(v any) float64 {
	s, _ := v.(string)
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0
	}
	return f
}

// Alert is an alert of the server's rules, pending or firing.
type Alert struct {
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
	State       string            `json:"state"`
	ActiveAt    time.Time         `json:"activeAt"`
}

// Alerts returns the pending and firing alerts.
func (s *Server) Alerts(ctx context.Context) ([]Alert, error) {
	var data struct {
		Alerts []Alert `json:"alerts"`
	}
	if err := s.get(ctx, "/api/v1/alerts", &data); err != nil {
		return nil, fmt.Errorf("reading the alerts: %w", err)
	}
	return data.Alerts, nil
}

// Target is one active scrape target.
type Target struct {
	Labels    map[string]string `json:"labels"`
	ScrapeURL string            `json:"scrapeUrl"`
	Health    string            `json:"health"`
	LastError string            `json:"lastError"`
}

// Targets returns the active scrape targets.
func (s *Server) Targets(ctx context.Context) ([]Target, error) {
	var data struct {
		ActiveTargets []Target `json:"activeTargets"`
	}
	if err := s.get(ctx, "/api/v1/targets?state=active", &data); err != nil {
		return nil, fmt.Errorf("reading the targets: %w", err)
	}
	return data.ActiveTargets, nil
}

// RuleHealth returns, per rule name, the health of every rule the server
// evaluates ("ok", "err" or "unknown" before the first evaluation), and the
// last error of those that failed.
func (s *Server) RuleHealth(ctx context.Context) (map[string]string, error) {
	var data struct {
		Groups []struct {
			Rules []struct {
				Name      string `json:"name"`
				Health    string `json:"health"`
				LastError string `json:"lastError"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := s.get(ctx, "/api/v1/rules", &data); err != nil {
		return nil, fmt.Errorf("reading the rules: %w", err)
	}
	out := map[string]string{}
	for _, g := range data.Groups {
		for _, r := range g.Rules {
			h := r.Health
			if r.LastError != "" {
				h += ": " + r.LastError
			}
			if prev, ok := out[r.Name]; ok && prev != "ok" {
				continue // a rule name may repeat (two severities); keep the worse
			}
			out[r.Name] = h
		}
	}
	return out, nil
}

// Await polls cond every 250ms until it holds or timeout passes, returning
// the last thing cond saw with the error.
func Await(ctx context.Context, timeout time.Duration, cond func(ctx context.Context) (bool, string, error)) error {
	var last string
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		ok, seen, err := cond(ctx)
		last = seen
		if err != nil {
			last = err.Error()
		}
		return ok, nil
	})
	if err != nil {
		return fmt.Errorf("%w (last: %s)", err, last)
	}
	return nil
}

// get reads an API endpoint and decodes its data into out.
func (s *Server) get(ctx context.Context, path string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+path, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	var env struct {
		Status string          `json:"status"`
		Data   json.RawMessage `json:"data"`
		Error  string          `json:"error"`
	}
	if err := json.Unmarshal(body, &env); err != nil {
		return fmt.Errorf("HTTP %s: %s", resp.Status, bytes.TrimSpace(body))
	}
	if env.Status != "success" {
		return fmt.Errorf("HTTP %s: %s", resp.Status, env.Error)
	}
	return json.Unmarshal(env.Data, out)
}

// RuleFile is the rule file (groups) of a PrometheusRule object, as the
// Prometheus Operator hands its spec to Prometheus.
func RuleFile(prometheusRule map[string]any) (string, error) {
	spec, ok := prometheusRule["spec"].(map[string]any)
	if !ok {
		return "", errors.New("the PrometheusRule has no spec")
	}
	out, err := yaml.Marshal(spec)
	if err != nil {
		return "", fmt.Errorf("encoding the rule file: %w", err)
	}
	return string(out), nil
}
