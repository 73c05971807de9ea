package chart_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/addon-heartbeat/addon-heartbeat/internal/promserver"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/inject"
)

// The PodMonitor's relabelings, run by Prometheus' own Kubernetes service
// discovery and relabeling (`promtool check service-discovery`) on pods of
// the API server: one target per injected reporter, on reporter.metricsPort
// of the pod's IP (IPv4 or IPv6), in a pod network pod (no port declared)
// and in a hostNetwork pod (hb-health left out); none for other containers
// or pods. The Prometheus Operator's own relabelings before them (the
// namespace, container, pod and job labels, no pods that ended) are written
// out here as it generates them.
func TestPodMonitorFindsTheReporters(t *testing.T) {
	const metricsPort = 19782
	objs, _ := render(t, fmt.Sprintf(`{monitoring: {podMonitor: {enabled: true}}, reporter: {metricsPort: %d}}`, metricsPort))
	pm := mustFind(t, objs, "PodMonitor", "addon-heartbeat-reporters")
	cfg, err := parseArgs(t, containerArgs(t, objs)).InjectConfig()
	if err != nil {
		t.Fatal(err)
	}

	namespace := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "podmonitor-"}}
	if err := k8s.Create(t.Context(), namespace); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), namespace) })
	ns := namespace.Name
	pods := map[string]struct {
		hostNetwork bool
		ip          string
		inject      bool
		phase       corev1.PodPhase
	}{
		"injected":              {ip: "10.1.0.5", inject: true, phase: corev1.PodRunning},
		"injected-ipv6":         {ip: "fd00::5", inject: true, phase: corev1.PodRunning},
		"injected-host-network": {hostNetwork: true, ip: "192.168.0.7", inject: true, phase: corev1.PodRunning},
		"injected-succeeded":    {ip: "10.1.0.9", inject: true, phase: corev1.PodSucceeded},
		"not-injected":          {ip: "10.1.0.6", phase: corev1.PodRunning},
	}
	for name, p := range pods {
		pod := podOf(t, name, ns, p.hostNetwork, p.inject, cfg)
		if err := k8s.Create(t.Context(), pod); err != nil {
			t.Fatal(err)
		}
		pod.Status = corev1.PodStatus{Phase: p.phase, PodIP: p.ip, PodIPs: []corev1.PodIP{{IP: p.ip}}, HostIP: "192.168.0.7"}
		if err := k8s.Status().Update(t.Context(), pod); err != nil {
			t.Fatal(err)
		}
	}

	dir := t.TempDir()
	writeFile := func(name string, data []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	job := pm.GetNamespace() + "/" + pm.GetName()
	config := map[string]any{"scrape_configs": []any{map[string]any{
		"job_name": job,
		"kubernetes_sd_configs": []any{map[string]any{
			"role": "pod", "api_server": env.Config.Host,
			"namespaces": map[string]any{"names": []any{ns}},
			"tls_config": map[string]any{
				"ca_file":   writeFile("ca.crt", env.Config.CAData),
				"cert_file": writeFile("client.crt", env.Config.CertData),
				"key_file":  writeFile("client.key", env.Config.KeyData),
			},
		}},
		"relabel_configs": append(operatorRelabelings(job), chartRelabelings(t, pm)...),
	}}}
	data, err := yaml.Marshal(config)
	if err != nil {
		t.Fatal(err)
	}
	writeFile("prometheus.yml", data)
	out, err := promserver.Promtool(t.Context(), dir, "check", "service-discovery", "--timeout=5s", "prometheus.yml", job)
	if err != nil {
		t.Fatal(err)
	}
	var results []struct {
		Labels map[string]string `json:"labels"`
	}
	if err := json.Unmarshal([]byte(out[strings.Index(out, "["):]), &results); err != nil {
		t.Fatalf("reading promtool's output: %v\n%s", err, out)
	}
	var got []string
	for _, r := range results {
		if len(r.Labels) > 0 {
			got = append(got, fmt.Sprintf("%s %s %s %s", r.Labels["pod"], r.Labels["container"], r.Labels["namespace"], r.Labels["__address__"]))
		}
	}
	slices.Sort(got)
	got = slices.Compact(got)
	want := []string{
		fmt.Sprintf("injected %s %s 10.1.0.5:%d", inject.ContainerName, ns, metricsPort),
		fmt.Sprintf("injected-host-network %s %s 192.168.0.7:%d", inject.ContainerName, ns, metricsPort),
		fmt.Sprintf("injected-ipv6 %s %s [fd00::5]:%d", inject.ContainerName, ns, metricsPort),
	}
	if !slices.Equal(got, want) {
		t.Errorf("targets after relabeling:\n%s\nwant:\n%s\n(promtool: %s)", strings.Join(got, "\n"), strings.Join(want, "\n"), out)
	}
}

// podOf is a pod of a Deployment, injected by the webhook's injector with
// cfg when inject is set, with an addon container that declares a port.
func podOf(t *testing.T, name, ns string, hostNetwork, injected bool, cfg inject.Config) *corev1.Pod {
	t.Helper()
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: map[string]string{"addon-heartbeat.io/inject": strconvBool(injected)}},
		Spec: appsv1.DeploymentSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			HostNetwork: hostNetwork,
			Containers: []corev1.Container{{Name: "manager", Image: "registry.example.com/addon:v1",
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}}},
		}}},
	}
	res, err := inject.Mutate(d, cfg)
	if err != nil {
		t.Fatal(err)
	}
	spec := res.Deployment.Spec.Template.Spec
	spec.AutomountServiceAccountToken = ptr.To(false)
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: spec}
}

func strconvBool(b bool) string {
	if b {
		return "true"
	}
	return "false"
}

// operatorRelabelings are the relabelings the Prometheus Operator (v0.85)
// puts before a PodMonitor endpoint's own, for a selector that selects
// every pod and no port: no pods that ended, then the namespace, container,
// pod and job labels.
func operatorRelabelings(job string) []any {
	return []any{
		map[string]any{"source_labels": []any{"__meta_kubernetes_pod_phase"}, "regex": "(Failed|Succeeded)", "action": "drop"},
		map[string]any{"source_labels": []any{"__meta_kubernetes_namespace"}, "target_label": "namespace"},
		map[string]any{"source_labels": []any{"__meta_kubernetes_pod_container_name"}, "target_label": "container"},
		map[string]any{"source_labels": []any{"__meta_kubernetes_pod_name"}, "target_label": "pod"},
		map[string]any{"target_label": "job", "replacement": job},
	}
}

// chartRelabelings are the PodMonitor endpoint's relabelings in
// Prometheus' configuration format (snake_case), as the operator writes them.
func chartRelabelings(t *testing.T, pm *unstructured.Unstructured) []any {
	t.Helper()
	eps, _, _ := unstructured.NestedSlice(pm.Object, "spec", "podMetricsEndpoints")
	rules, _ := eps[0].(map[string]any)["relabelings"].([]any)
	names := map[string]string{"sourceLabels": "source_labels", "targetLabel": "target_label", "regex": "regex", "replacement": "replacement", "action": "action"}
	var out []any
	for _, r := range rules {
		converted := map[string]any{}
		for k, v := range r.(map[string]any) {
			name, ok := names[k]
			if !ok {
				t.Fatalf("relabeling field %s: not translated here", k)
			}
			converted[name] = v
		}
		out = append(out, converted)
	}
	return out
}
