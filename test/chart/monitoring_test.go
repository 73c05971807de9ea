package chart_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/addon-heartbeat/addon-heartbeat/internal/chart"
	"github.com/addon-heartbeat/addon-heartbeat/internal/promserver"
	"github.com/addon-heartbeat/addon-heartbeat/internal/testenv"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/inject"
)

// allMonitoring turns every monitoring object on, with more values after it.
const allMonitoring = `monitoring: {serviceMonitor: {enabled: true}, podMonitor: {enabled: true}, prometheusRule: {enabled: true}, dashboard: {enabled: true}}`

var monitoringKinds = []string{"ServiceMonitor", "PodMonitor", "PrometheusRule"}

func TestMonitoringOffByDefault(t *testing.T) {
	objs, _ := render(t, "")
	for _, o := range objs {
		if slices.Contains(monitoringKinds, o.GetKind()) || o.GetKind() == "ConfigMap" {
			t.Errorf("%s rendered with the default values", chart.Key(o))
		}
	}
}

// The monitoring objects render as the values say, agree with what they
// monitor (the webhook's Service, the injected reporter container), and the
// API server accepts them with the Prometheus Operator's CRDs (server-side
// dry-run create).
func TestMonitoringObjects(t *testing.T) {
	tests := map[string]struct {
		values string
		// want are the rendered settings.
		job, dashboardNamespace, interval string
		metricsPort                       int
		labels, dashboardLabels           map[string]string
		alertLabels                       map[string]string
	}{
		"defaults": {
			values: allMonitoring,
			job:    "addon-heartbeat-webhook", dashboardNamespace: "addon-heartbeat-system", interval: "30s", metricsPort: 9782,
			dashboardLabels: map[string]string{"grafana_dashboard": "1"},
		},
		"everything set": {
			values: `
monitoring:
  serviceMonitor: {enabled: true, interval: 10s, labels: {release: kube-prometheus}}
  podMonitor: {enabled: true, interval: 10s, labels: {release: kube-prometheus}}
  prometheusRule: {enabled: true, labels: {release: kube-prometheus}, alertLabels: {team: platform}, webhookJob: my-job, runbookBaseURL: "https://docs.example.com/addon-heartbeat"}
  dashboard: {enabled: true, labels: {grafana_dashboard: "yes", team: platform}, annotations: {grafana_folder: Addons}, namespace: monitoring}
reporter: {metricsPort: 19782}
`,
			job: "my-job", dashboardNamespace: "monitoring", interval: "10s", metricsPort: 19782,
			labels:          map[string]string{"release": "kube-prometheus"},
			dashboardLabels: map[string]string{"grafana_dashboard": "yes", "team": "platform"},
			alertLabels:     map[string]string{"team": "platform"},
		},
	}
	if err := k8s.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "monitoring"}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			objs, _ := render(t, tc.values)
			for _, o := range objs {
				if err := k8s.Create(t.Context(), o.DeepCopy(), client.DryRunAll); err != nil {
					t.Errorf("%s refused: %v", chart.Key(o), err)
				}
			}
			for _, m := range chart.Lint(chart.DefaultRelease, values(t, tc.values)) {
				t.Errorf("helm lint: %s", m)
			}

			svc := convert[corev1.Service](t, mustFind(t, objs, "Service", "addon-heartbeat-webhook"))
			sm := mustFind(t, objs, "ServiceMonitor", "addon-heartbeat-webhook")
			checkServiceMonitor(t, sm, svc, tc.interval)
			pm := mustFind(t, objs, "PodMonitor", "addon-heartbeat-reporters")
			checkPodMonitor(t, pm, objs, tc.metricsPort, tc.interval)
			rule := mustFind(t, objs, "PrometheusRule", "addon-heartbeat")
			for _, o := range []*unstructured.Unstructured{sm, pm, rule} {
				for k, v := range tc.labels {
					if o.GetLabels()[k] != v {
						t.Errorf("%s: label %s=%q, want %q", chart.Key(o), k, o.GetLabels()[k], v)
					}
				}
			}
			checkRules(t, rule, tc.job, tc.alertLabels)

			cm := convert[corev1.ConfigMap](t, mustFind(t, objs, "ConfigMap", "addon-heartbeat-dashboard"))
			if cm.Namespace != tc.dashboardNamespace {
				t.Errorf("dashboard ConfigMap in %s, want %s", cm.Namespace, tc.dashboardNamespace)
			}
			for k, v := range tc.dashboardLabels {
				if cm.Labels[k] != v {
					t.Errorf("dashboard ConfigMap label %s=%q, want %q", k, cm.Labels[k], v)
				}
			}
			dash := decodeDashboard(t, cm.Data["addon-heartbeat.json"])
			if got := dash.Variable("webhook_job"); got != tc.job {
				t.Errorf("the dashboard's webhook_job is %q, want %q", got, tc.job)
			}
		})
	}
}

// checkServiceMonitor: it selects the webhook's Service, on a port the
// Service has, keeping the exported namespace label.
func checkServiceMonitor(t *testing.T, o *unstructured.Unstructured, svc *corev1.Service, interval string) {
	t.Helper()
	sel, _, _ := unstructured.NestedStringMap(o.Object, "spec", "selector", "matchLabels")
	for k, v := range sel {
		if svc.Labels[k] != v {
			t.Errorf("the ServiceMonitor selects %s=%s, which the webhook Service does not carry (%v)", k, v, svc.Labels)
		}
	}
	if len(sel) == 0 {
		t.Error("the ServiceMonitor selects every Service")
	}
	names, _, _ := unstructured.NestedStringSlice(o.Object, "spec", "namespaceSelector", "matchNames")
	if !slices.Equal(names, []string{svc.Namespace}) {
		t.Errorf("the ServiceMonitor looks in %v, want [%s]", names, svc.Namespace)
	}
	eps, _, _ := unstructured.NestedSlice(o.Object, "spec", "endpoints")
	if len(eps) != 1 {
		t.Fatalf("%d endpoints, want 1", len(eps))
	}
	ep := eps[0].(map[string]any)
	if !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == ep["port"] }) {
		t.Errorf("the ServiceMonitor scrapes port %v, which the Service does not have", ep["port"])
	}
	if ep["honorLabels"] != true || ep["interval"] != interval || ep["path"] != "/metrics" {
		t.Errorf("endpoint %v: want honorLabels, interval %s, /metrics", ep, interval)
	}
}

// checkPodMonitor: its relabelings keep the container the webhook injects,
// and the port it names in a hostNetwork pod, and scrape metricsPort.
func checkPodMonitor(t *testing.T, o *unstructured.Unstructured, objs []*unstructured.Unstructured, metricsPort int, interval string) {
	t.Helper()
	cfg, err := parseArgs(t, containerArgs(t, objs)).InjectConfig()
	if err != nil {
		t.Fatal(err)
	}
	if int(cfg.MetricsPort) != metricsPort {
		t.Fatalf("the webhook injects metrics port %d, want %d", cfg.MetricsPort, metricsPort)
	}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "a", Annotations: map[string]string{"addon-heartbeat.io/inject": "true"}},
		Spec: appsv1.DeploymentSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			HostNetwork: true, Containers: []corev1.Container{{Name: "manager", Image: "example.com/a"}},
		}}},
	}
	res, err := inject.Mutate(d, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var metricsPortName string
	for _, c := range slices.Concat(res.Deployment.Spec.Template.Spec.InitContainers, res.Deployment.Spec.Template.Spec.Containers) {
		for _, p := range c.Ports {
			if c.Name == inject.ContainerName && int(p.ContainerPort) == metricsPort {
				metricsPortName = p.Name
			}
		}
	}
	if metricsPortName == "" {
		t.Fatal("the injected hostNetwork reporter declares no metrics port")
	}
	eps, _, _ := unstructured.NestedSlice(o.Object, "spec", "podMetricsEndpoints")
	if len(eps) != 1 {
		t.Fatalf("%d endpoints, want 1", len(eps))
	}
	ep := eps[0].(map[string]any)
	if ep["interval"] != interval {
		t.Errorf("interval %v, want %s", ep["interval"], interval)
	}
	rules, _ := ep["relabelings"].([]any)
	matches := func(source, value string) bool {
		for _, r := range rules {
			r := r.(map[string]any)
			if r["action"] == "keep" && fmt.Sprint(r["sourceLabels"]) == "["+source+"]" {
				return regexp.MustCompile("^(?:" + r["regex"].(string) + ")$").MatchString(value)
			}
		}
		return false
	}
	if !matches("__meta_kubernetes_pod_container_name", inject.ContainerName) || matches("__meta_kubernetes_pod_container_name", "manager") {
		t.Errorf("the PodMonitor does not keep exactly the %s container: %v", inject.ContainerName, rules)
	}
	if !matches("__meta_kubernetes_pod_container_port_name", metricsPortName) || !matches("__meta_kubernetes_pod_container_port_name", "") ||
		matches("__meta_kubernetes_pod_container_port_name", "hb-health") {
		t.Errorf("the PodMonitor must keep a port-less target and port %s, not hb-health: %v", metricsPortName, rules)
	}
	port := fmt.Sprintf(":%d", metricsPort)
	replaced := 0
	for _, r := range rules {
		r := r.(map[string]any)
		if r["targetLabel"] == "__address__" {
			replaced++
			if !strings.HasSuffix(fmt.Sprint(r["replacement"]), port) {
				t.Errorf("relabeling %v does not scrape port %d", r, metricsPort)
			}
		}
	}
	if replaced != 2 {
		t.Errorf("%d relabelings set the address, want 2 (IPv4 and IPv6)", replaced)
	}
}

// checkRules: the webhook-down alert looks for the webhook's job, every
// alert carries the extra labels and a runbook in README.md.
func checkRules(t *testing.T, o *unstructured.Unstructured, job string, extra map[string]string) {
	t.Helper()
	readme, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range alertRules(t, o) {
		for k, v := range extra {
			if r.Labels[k] != v {
				t.Errorf("%s: label %s=%q, want %q", r.Alert, k, r.Labels[k], v)
			}
		}
		if r.Labels["severity"] != "warning" && r.Labels["severity"] != "critical" {
			t.Errorf("%s: severity %q", r.Alert, r.Labels["severity"])
		}
		_, anchor, _ := strings.Cut(r.Annotations["runbook_url"], "#")
		if anchor != strings.ToLower(r.Alert) || !strings.Contains(string(readme), "\n#### "+r.Alert+"\n") {
			t.Errorf("%s: runbook_url %q, want an anchor to a README.md heading %q", r.Alert, r.Annotations["runbook_url"], "#### "+r.Alert)
		}
		if r.Alert == "AddonHeartbeatWebhookDown" && !strings.Contains(r.Expr, `job="`+job+`"`) {
			t.Errorf("%s does not look for job %q: %s", r.Alert, job, r.Expr)
		}
	}
}

type alertRule struct {
	Alert       string            `json:"alert"`
	Expr        string            `json:"expr"`
	For         string            `json:"for"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

func alertRules(t *testing.T, o *unstructured.Unstructured) []alertRule {
	t.Helper()
	var spec struct {
		Groups []struct {
			Rules []alertRule `json:"rules"`
		} `json:"groups"`
	}
	data, err := json.Marshal(o.Object["spec"])
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &spec); err != nil {
		t.Fatal(err)
	}
	var out []alertRule
	for _, g := range spec.Groups {
		out = append(out, g.Rules...)
	}
	if len(out) == 0 {
		t.Fatal("the PrometheusRule has no rules")
	}
	return out
}

// Must show: `promtool check rules` and `promtool test rules` pass on the
// chart's rules, with unit tests (testdata/alerts_test.yaml) in which every
// alert both fires and stays silent.
func TestPrometheusRulesPromtool(t *testing.T) {
	objs, _ := render(t, allMonitoring)
	rules, err := promserver.RuleFile(mustFind(t, objs, "PrometheusRule", "addon-heartbeat").Object)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	tests, err := os.ReadFile(filepath.Join("testdata", "alerts_test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for name, content := range map[string][]byte{"rules.yaml": []byte(rules), "alerts_test.yaml": tests} {
		if err := os.WriteFile(filepath.Join(dir, name), content, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	out, err := promserver.Promtool(t.Context(), dir, "check", "rules", "rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "SUCCESS") {
		t.Errorf("promtool check rules:\n%s", out)
	}
	if out, err := promserver.Promtool(t.Context(), dir, "test", "rules", "alerts_test.yaml"); err != nil {
		t.Fatal(err)
	} else if !strings.Contains(out, "SUCCESS") {
		t.Errorf("promtool test rules:\n%s", out)
	}

	// Every alert is tested both ways.
	var file struct {
		Tests []struct {
			Name       string `json:"name"`
			AlertTests []struct {
				Alertname string `json:"alertname"`
				ExpAlerts []any  `json:"exp_alerts"`
			} `json:"alert_rule_test"`
		} `json:"tests"`
	}
	if err := yaml.Unmarshal(tests, &file); err != nil {
		t.Fatal(err)
	}
	fires, silent := map[string]bool{}, map[string]bool{}
	for _, tc := range file.Tests {
		for _, at := range tc.AlertTests {
			if len(at.ExpAlerts) > 0 {
				fires[at.Alertname] = true
			} else {
				silent[at.Alertname] = true
			}
		}
	}
	for _, r := range alertRules(t, mustFind(t, objs, "PrometheusRule", "addon-heartbeat")) {
		if !fires[r.Alert] || !silent[r.Alert] {
			t.Errorf("alert %s: tested firing %v, tested silent %v; want both in testdata/alerts_test.yaml", r.Alert, fires[r.Alert], silent[r.Alert])
		}
	}
}

func decodeDashboard(t *testing.T, data string) promserver.Dashboard {
	t.Helper()
	d, err := promserver.ReadDashboard([]byte(data))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// Must show: the dashboard is valid JSON whose every query parses (promtool,
// with the dashboard's variables as Grafana fills them in). test/e2e runs
// them against a real Prometheus.
func TestDashboardQueriesParse(t *testing.T) {
	objs, _ := render(t, allMonitoring)
	cm := convert[corev1.ConfigMap](t, mustFind(t, objs, "ConfigMap", "addon-heartbeat-dashboard"))
	d := decodeDashboard(t, cm.Data["addon-heartbeat.json"])
	if d.Title == "" || d.UID == "" {
		t.Errorf("title %q, uid %q", d.Title, d.UID)
	}
	ids := map[int]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d repeated", p.ID)
		}
		ids[p.ID] = true
		if p.Type != "row" && (p.Datasource == nil || p.Datasource.UID != "${datasource}" || len(p.Targets) == 0) {
			t.Errorf("panel %q: want queries on the ${datasource} variable", p.Title)
		}
	}
	queries := d.Queries("1m")
	if len(queries) < 10 {
		t.Fatalf("%d queries, want the dashboard's", len(queries))
	}
	var rules strings.Builder
	rules.WriteString("groups:\n- name: dashboard\n  rules:\n")
	for i, q := range queries {
		if strings.Contains(q.Expr, "$") {
			t.Errorf("panel %q: a variable left in %s", q.Panel, q.Expr)
		}
		fmt.Fprintf(&rules, "  - record: dashboard:query_%d\n    expr: %q\n", i, q.Expr)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "queries.yaml"), []byte(rules.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := promserver.Promtool(t.Context(), dir, "check", "rules", "queries.yaml"); err != nil {
		t.Errorf("the dashboard's queries: %v", err)
	}
}
