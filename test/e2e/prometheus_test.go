package e2e

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/addon-heartbeat/addon-heartbeat/internal/chart"
	"github.com/addon-heartbeat/addon-heartbeat/internal/localcluster"
	"github.com/addon-heartbeat/addon-heartbeat/internal/promserver"
)

// monitoring is what the chart renders for Prometheus and Grafana.
type monitoring struct {
	rules string
	// webhookJob and honorLabels are the ServiceMonitor's: its job label
	// (the Service's name) and whether exported labels win.
	webhookJob  string
	honorLabels bool
	// reporterJob is the job the Prometheus Operator gives the PodMonitor's
	// targets ("<namespace>/<name>").
	reporterJob string
	dashboard   promserver.Dashboard
}

func renderMonitoring(t *testing.T) monitoring {
	t.Helper()
	vals := map[string]any{"monitoring": map[string]any{
		"serviceMonitor": map[string]any{"enabled": true}, "podMonitor": map[string]any{"enabled": true},
		"prometheusRule": map[string]any{"enabled": true}, "dashboard": map[string]any{"enabled": true},
	}}
	objs, _, err := chart.Render(chart.DefaultRelease, vals)
	if err != nil {
		t.Fatal(err)
	}
	find := func(kind string) *unstructured.Unstructured {
		for _, o := range objs {
			if o.GetKind() == kind {
				return o
			}
		}
		t.Fatalf("the chart renders no %s", kind)
		return nil
	}
	var m monitoring
	if m.rules, err = promserver.RuleFile(find("PrometheusRule").Object); err != nil {
		t.Fatal(err)
	}
	sm := find("ServiceMonitor")
	eps, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	m.honorLabels = eps[0].(map[string]any)["honorLabels"] == true
	// The Prometheus Operator names a ServiceMonitor's job after the Service
	// it selects: the chart's only Service.
	m.webhookJob = find("Service").GetName()
	pm := find("PodMonitor")
	m.reporterJob = pm.GetNamespace() + "/" + pm.GetName()
	var cm corev1.ConfigMap
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(find("ConfigMap").Object, &cm); err != nil {
		t.Fatal(err)
	}
	if m.dashboard, err = promserver.ReadDashboard([]byte(cm.Data["addon-heartbeat.json"])); err != nil {
		t.Fatal(err)
	}
	return m
}

// prometheusConfig scrapes the webhook as the chart's ServiceMonitor does,
// and the reporters listed in reporters.json with the labels the chart's
// PodMonitor gives them (the pod's namespace, pod and container), every
// second, evaluating the chart's rules every second.
func (m monitoring) prometheusConfig(webhookTarget string) string {
	return fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files: [rules.yaml]
scrape_configs:
- job_name: %q
  honor_labels: %t
  static_configs:
  - targets: [%q]
    labels: {namespace: %q, pod: webhook-0, container: webhook}
- job_name: %q
  file_sd_configs:
  - files: [reporters.json]
    refresh_interval: 1s
`, m.webhookJob, m.honorLabels, webhookTarget, chart.DefaultRelease.Namespace, m.reporterJob)
}

// reporterTargets is reporters.json for file service discovery.
func reporterTargets(t *testing.T, reps map[string][]*localcluster.Reporter) string {
	t.Helper()
	type group struct {
		Targets []string          `json:"targets"`
		Labels  map[string]string `json:"labels"`
	}
	groups := []group{}
	for ns, rs := range reps {
		for _, r := range rs {
			groups = append(groups, group{
				Targets: []string{fmt.Sprintf("127.0.0.1:%d", r.MetricsPort)},
				Labels:  map[string]string{"namespace": ns, "pod": strings.TrimPrefix(r.Name, "reporter "), "container": "heartbeat-reporter"},
			})
		}
	}
	data, err := json.Marshal(groups)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// refuseStatusWrites installs a ValidatingAdmissionPolicy that refuses
// every AddonInstance status update in ns: the reporter's writes fail, as
// they would under a policy of the cluster's.
func refuseStatusWrites(t *testing.T, ns string) {
	t.Helper()
	name := "e2e-refuse-status-" + ns
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Update},
					Rule: admissionregistrationv1.Rule{APIGroups: []string{"addons.managed.openshift.io"}, APIVersions: []string{"v1alpha1"},
						Resources: []string{"addoninstances/status"}},
				},
			}}},
			Validations: []admissionregistrationv1.Validation{{Expression: "false", Message: "status writes are refused in this namespace"}},
		},
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        name,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
			MatchResources: &admissionregistrationv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{
				MatchLabels: map[string]string{corev1.LabelMetadataName: ns}}},
		},
	}
	for _, o := range []client.Object{policy, binding} {
		if err := cluster.Client.Create(t.Context(), o); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cluster.Client.Delete(context.Background(), o) })
	}
}

// Must show: a real Prometheus server scrapes the webhook and the reporters
// with the chart's rules loaded. Killing every reporter of an addon makes
// the heartbeat alerts fire within their `for` (from the webhook's gauges:
// no reporter is left to export anything), restarting them resolves the
// alerts, and every query of the chart's dashboard is accepted and returns
// series.
func TestPrometheus(t *testing.T) {
	m := renderMonitoring(t)
	const period = 2 * time.Second

	// The addon whose reporters are killed, one that heartbeats throughout,
	// one whose status writes are refused, and an AddonInstance asking for
	// a period below the reporter's floor.
	nsDown, nsUp, nsRefused, nsFloor := newNamespace(t, "prom-down"), newNamespace(t, "prom-up"), newNamespace(t, "prom-refused"), newNamespace(t, "prom-floor")
	refuseStatusWrites(t, nsRefused)
	for _, ns := range []string{nsDown, nsUp, nsRefused} {
		createAddonInstance(t, ns, "addon-instance", period)
	}
	createAddonInstance(t, nsFloor, "addon-instance", 100*time.Millisecond)
	recDown := recordHeartbeats(t, nsDown, "addon-instance")
	reps := map[string][]*localcluster.Reporter{}
	deps := map[string]*appsDeployment{}
	for ns, replicas := range map[string]int{nsDown: 2, nsUp: 1, nsRefused: 1} {
		d := createInjected(t, addonDeployment(ns, "operator", int32(replicas), nil))
		setAvailable(t, d, int32(replicas))
		deps[ns] = &appsDeployment{d, replicas}
		reps[ns] = startReporters(t, d, replicas)
	}

	webhookURL, err := url.Parse(webhook.MetricsURL)
	if err != nil {
		t.Fatal(err)
	}
	prom, err := promserver.Start(t.Context(), cluster.Dir, m.prometheusConfig(webhookURL.Host), map[string]string{
		"rules.yaml": m.rules, "reporters.json": reporterTargets(t, reps),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := prom.Stop(15 * time.Second); err != nil {
			t.Errorf("%v (log %s)", err, prom.LogPath)
		}
	})
	await := func(what string, timeout time.Duration, cond func(ctx context.Context) (bool, string, error)) {
		t.Helper()
		if err := promserver.Await(t.Context(), timeout, cond); err != nil {
			t.Fatalf("%s: %v (Prometheus log %s)", what, err, prom.LogPath)
		}
	}

	// Every target up, every rule evaluated without error, heartbeats seen.
	await("every target scraped", 30*time.Second, func(ctx context.Context) (bool, string, error) {
		targets, err := prom.Targets(ctx)
		if err != nil {
			return false, "", err
		}
		up := 0
		for _, tg := range targets {
			if tg.Health == "up" {
				up++
			}
		}
		return up == 5 && len(targets) == 5, fmt.Sprint(targets), nil
	})
	recDown.waitWrites(t, 2, 10*period)
	await("the webhook's heartbeat gauges in Prometheus", 30*time.Second, func(ctx context.Context) (bool, string, error) {
		s, err := prom.Query(ctx, fmt.Sprintf(`addon_heartbeat_instance_last_heartbeat_timestamp_seconds{namespace=%q}`, nsDown))
		return err == nil && len(s) == 1, fmt.Sprint(s), err
	})
	await("every rule evaluated", 30*time.Second, func(ctx context.Context) (bool, string, error) {
		health, err := prom.RuleHealth(ctx)
		if err != nil {
			return false, "", err
		}
		for name, h := range health {
			if h != "ok" {
				return false, name + " " + h, nil
			}
		}
		return len(health) > 0, fmt.Sprint(health), nil
	})
	// The certificate the webhook serves (self-managed here) is the one
	// whose expiry it exports.
	conn, err := tls.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", webhook.Port), &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // reading the certificate only
	if err != nil {
		t.Fatal(err)
	}
	served := conn.ConnectionState().PeerCertificates[0]
	conn.Close()
	await("the served certificate's expiry in Prometheus", 30*time.Second, func(ctx context.Context) (bool, string, error) {
		s, err := prom.Query(ctx, "addon_heartbeat_webhook_serving_certificate_not_after_timestamp_seconds")
		return err == nil && len(s) == 1 && s[0].Value == float64(served.NotAfter.Unix()), fmt.Sprint(s, " want ", served.NotAfter.Unix()), err
	})
	if a := alertsFor(t, prom, "firing", nsDown, nsUp); len(a) > 0 {
		t.Fatalf("alerts firing before any fault: %v", a)
	}

	// Every reporter of the addon killed: nothing is left to heartbeat, nor
	// to export a metric.
	for _, r := range reps[nsDown] {
		if err := r.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		<-r.Done()
	}
	last := recDown.Latest().Status.LastHeartbeatTime.Time
	forLate, forTimedOut := ruleFor(t, m.rules, "AddonHeartbeatLate"), ruleFor(t, m.rules, "AddonHeartbeatTimedOut")
	// Within the rule's bound, its `for`, a scrape and an evaluation, plus
	// slack for a busy machine.
	const slack = 15 * time.Second
	for _, a := range []struct {
		name    string
		periods int
		forDur  time.Duration
	}{{"AddonHeartbeatLate", 2, forLate}, {"AddonHeartbeatTimedOut", 3, forTimedOut}} {
		deadline := last.Add(time.Duration(a.periods)*period + a.forDur + 2*time.Second + slack)
		await(a.name+" firing for "+nsDown, time.Until(deadline), func(ctx context.Context) (bool, string, error) {
			alerts, err := prom.Alerts(ctx)
			if err != nil {
				return false, "", err
			}
			for _, al := range alerts {
				if al.Labels["alertname"] == a.name && al.Labels["namespace"] == nsDown && al.State == "firing" {
					// It became pending only once the heartbeat was that old.
					if early := last.Add(time.Duration(a.periods) * period).Sub(al.ActiveAt); early > time.Second {
						return false, "", fmt.Errorf("pending from %s, %s before the heartbeat of %s was %d periods old", al.ActiveAt, early, last, a.periods)
					}
					return true, "", nil
				}
			}
			return false, fmt.Sprint(alerts), nil
		})
	}
	// One alert each, for that addon only; the webhook stays up.
	firing := alertsFor(t, prom, "firing", nsDown, nsUp)
	slices.Sort(firing)
	if want := []string{"AddonHeartbeatLate " + nsDown, "AddonHeartbeatTimedOut " + nsDown}; !slices.Equal(firing, want) {
		t.Errorf("alerts %v, want %v", firing, want)
	}
	if a := alertsNamed(t, prom, "AddonHeartbeatWebhookDown"); len(a) > 0 {
		t.Errorf("the webhook reported down: %v", a)
	}

	// Restarted, the reporters heartbeat again (on new ports: Prometheus
	// follows through the targets file) and the alerts resolve.
	reps[nsDown] = startReporters(t, deps[nsDown].Deployment, deps[nsDown].replicas)
	if err := prom.WriteFile("reporters.json", reporterTargets(t, reps)); err != nil {
		t.Fatal(err)
	}
	recDown.waitWrites(t, 1, 10*period)
	await("the alerts resolved", 30*time.Second, func(context.Context) (bool, string, error) {
		a := alertsFor(t, prom, "", nsDown, nsUp)
		return len(a) == 0, fmt.Sprint(a), nil
	})

	// Must show: every query of the dashboard is accepted by this
	// Prometheus and returns series (the refused addon gives the failures,
	// the 100ms AddonInstance the impossible periods).
	await("a failed heartbeat write in Prometheus", 30*time.Second, func(ctx context.Context) (bool, string, error) {
		s, err := prom.Query(ctx, fmt.Sprintf(`addon_heartbeat_heartbeats_failed_total{namespace=%q}`, nsRefused))
		return err == nil && len(s) > 0 && s[0].Value > 0, fmt.Sprint(s), err
	})
	await("the reporters' targets up again", 30*time.Second, func(ctx context.Context) (bool, string, error) {
		s, err := prom.Query(ctx, fmt.Sprintf(`up{namespace=%q} == 1`, nsDown))
		return err == nil && len(s) == deps[nsDown].replicas, fmt.Sprint(s), err
	})
	queries := m.dashboard.Queries("30s")
	if len(queries) < 10 {
		t.Fatalf("%d dashboard queries", len(queries))
	}
	for _, q := range queries {
		await(fmt.Sprintf("dashboard panel %q query %s: series", q.Panel, q.RefID), 30*time.Second, func(ctx context.Context) (bool, string, error) {
			s, err := prom.Query(ctx, q.Expr)
			if err != nil {
				// Refused (does not parse, or fails): no retry helps.
				t.Fatalf("panel %q: %v", q.Panel, err)
			}
			return len(s) > 0, q.Expr, nil
		})
	}
}

// appsDeployment is an injected Deployment and its replica count.
type appsDeployment struct {
	*appsv1.Deployment
	replicas int
}

// alertsFor lists the alerts in state (pending or firing; both when empty)
// of the given namespaces, as "alertname namespace".
func alertsFor(t *testing.T, prom *promserver.Server, state string, namespaces ...string) []string {
	t.Helper()
	alerts, err := prom.Alerts(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, a := range alerts {
		if slices.Contains(namespaces, a.Labels["namespace"]) && (state == "" || a.State == state) {
			out = append(out, a.Labels["alertname"]+" "+a.Labels["namespace"])
		}
	}
	return out
}

func alertsNamed(t *testing.T, prom *promserver.Server, name string) []promserver.Alert {
	t.Helper()
	alerts, err := prom.Alerts(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var out []promserver.Alert
	for _, a := range alerts {
		if a.Labels["alertname"] == name {
			out = append(out, a)
		}
	}
	return out
}

// ruleFor is the `for` of the alert named in a rule file.
func ruleFor(t *testing.T, rules, alert string) time.Duration {
	t.Helper()
	var file struct {
		Groups []struct {
			Rules []struct {
				Alert string `json:"alert"`
				For   string `json:"for"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal([]byte(rules), &file); err != nil {
		t.Fatal(err)
	}
	for _, g := range file.Groups {
		for _, r := range g.Rules {
			if r.Alert == alert {
				d, err := time.ParseDuration(r.For)
				if err != nil {
					t.Fatalf("%s: for %q: %v", alert, r.For, err)
				}
				return d
			}
		}
	}
	t.Fatalf("no alert %s in the chart's rules", alert)
	return 0
}
