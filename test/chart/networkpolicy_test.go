package chart_test

import (
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/addon-heartbeat/addon-heartbeat/internal/chart"
)

// The NetworkPolicy selects exactly the webhook pods and admits each of
// their ports from its own peers only: the webhook port and the health port
// from anywhere by default (the API server and the kubelet are not pods,
// so no selector matches them), the metrics port from Prometheus pods only;
// a value narrows a port to addresses. It is on by default, can be turned
// off, and the API server accepts what it renders. (Whether traffic is
// then dropped is the network plugin's decision; the real-node suite's
// bridge plugin enforces no NetworkPolicy, so that part is not run here.)
func TestNetworkPolicy(t *testing.T) {
	objs, _ := render(t, "")
	np := convert[networkingv1.NetworkPolicy](t, mustFind(t, objs, "NetworkPolicy", "addon-heartbeat-webhook"))
	dep := convert[appsv1.Deployment](t, onlyOfKind(t, objs, "Deployment"))

	sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
	if err != nil || !sel.Matches(labels.Set(dep.Spec.Template.Labels)) || sel.Empty() {
		t.Errorf("podSelector %v does not select the webhook pods (%v) alone (%v)", np.Spec.PodSelector, dep.Spec.Template.Labels, err)
	}
	if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) {
		t.Errorf("policyTypes %v: want Ingress only (the webhook calls the API server)", np.Spec.PolicyTypes)
	}
	// Every container port is in exactly one rule, and no rule names a
	// port the pod does not have.
	rules := map[string]networkingv1.NetworkPolicyIngressRule{}
	for _, r := range np.Spec.Ingress {
		if len(r.Ports) != 1 || r.Ports[0].Port == nil {
			t.Fatalf("rule %+v: want one named port per rule", r)
		}
		rules[r.Ports[0].Port.String()] = r
	}
	var ports []string
	for _, p := range dep.Spec.Template.Spec.Containers[0].Ports {
		ports = append(ports, p.Name)
	}
	slices.Sort(ports)
	var ruled []string
	for p := range rules {
		ruled = append(ruled, p)
	}
	slices.Sort(ruled)
	if !slices.Equal(ports, ruled) {
		t.Errorf("rules for ports %v, the pod has %v", ruled, ports)
	}
	if from := rules["webhook"].From; len(from) != 0 {
		t.Errorf("webhook port from %+v by default, want any source", from)
	}
	metrics := rules["metrics"].From
	if len(metrics) != 1 || metrics[0].PodSelector == nil || metrics[0].PodSelector.MatchLabels["app.kubernetes.io/name"] != "prometheus" ||
		metrics[0].NamespaceSelector == nil || len(metrics[0].NamespaceSelector.MatchLabels)+len(metrics[0].NamespaceSelector.MatchExpressions) != 0 {
		t.Errorf("metrics port from %+v, want Prometheus pods of any namespace", metrics)
	}

	narrowed, _ := render(t, `networkPolicy: {enabled: true, webhookFrom: [{ipBlock: {cidr: 10.0.0.0/24}}], healthFrom: [{ipBlock: {cidr: 10.0.1.0/24}}], metricsFrom: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: monitoring}}}]}`)
	np2 := mustFind(t, narrowed, "NetworkPolicy", "addon-heartbeat-webhook")
	if err := k8s.Create(t.Context(), np2.DeepCopy(), client.DryRunAll); err != nil {
		t.Errorf("the narrowed NetworkPolicy is refused: %v", err)
	}
	got := convert[networkingv1.NetworkPolicy](t, np2)
	for i, want := range []string{"10.0.0.0/24", "", "10.0.1.0/24"} {
		from := got.Spec.Ingress[i].From
		if want != "" && (len(from) != 1 || from[0].IPBlock == nil || from[0].IPBlock.CIDR != want) {
			t.Errorf("rule %d from %+v, want %s", i, from, want)
		}
	}

	off, _ := render(t, `networkPolicy: {enabled: false}`)
	if chart.Find(off, "NetworkPolicy", "addon-heartbeat-webhook") != nil {
		t.Error("networkPolicy.enabled=false still renders a NetworkPolicy")
	}
	for _, bad := range []string{`networkPolicy: {enabled: true, webhookFrom: [{}]}`, `networkPolicy: {enabled: true, metricsFrom: [{ports: [{port: 1}]}]}`} {
		if _, _, err := chart.Render(chart.DefaultRelease, values(t, bad)); err == nil || !strings.Contains(err.Error(), "networkPolicy") {
			t.Errorf("%s: rendered (%v), want the schema to refuse it", bad, err)
		}
	}
}
