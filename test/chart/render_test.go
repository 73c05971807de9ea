package chart_test

import (
	"flag"
	"io"
	"slices"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/addon-heartbeat/addon-heartbeat/internal/chart"
	"github.com/addon-heartbeat/addon-heartbeat/internal/webhook"
)

// modes are the default values and every documented mode of the chart.
var modes = map[string]struct {
	values string
	// cluster is what the chart is told about the API server (Helm's
	// .Capabilities); no API beyond Helm's built-in ones when empty.
	cluster chart.Cluster
	// platform is the platform the chart must install for.
	platform string
	// check checks what is particular to the mode; every mode is also
	// checked for its platform and certificate mode (checkPlatform,
	// checkCertificates).
	check func(t *testing.T, objs []*unstructured.Unstructured)
}{
	"default (self-managed certificates)": {
		platform: "kubernetes",
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			mwc := convert[admissionv1.MutatingWebhookConfiguration](t, mustFind(t, objs, "MutatingWebhookConfiguration", "addon-heartbeat"))
			if len(mwc.Annotations) != 0 || len(mwc.Webhooks[0].ClientConfig.CABundle) != 0 {
				t.Error("self-managed: no cert-manager annotation and no caBundle in the chart")
			}
			if chart.Find(objs, "Certificate", "addon-heartbeat-serving") != nil {
				t.Error("self-managed: no cert-manager objects")
			}
			mustFind(t, objs, "PodDisruptionBudget", "addon-heartbeat-webhook")
			role := convert[rbacv1.Role](t, mustFind(t, objs, "Role", "addon-heartbeat-webhook"))
			if !hasRule(role.Rules, "secrets", "update", "addon-heartbeat-webhook-tls") {
				t.Error("self-managed: the webhook must be able to update its own Secret")
			}
			args := containerArgs(t, objs)
			if !slices.Contains(args, "--cert-mode=self-managed") {
				t.Errorf("args %v", args)
			}
		},
	},
	"cert-manager with the chart's own CA": {
		values:   `certificates: {mode: certManager}`,
		platform: "kubernetes",
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			mwc := convert[admissionv1.MutatingWebhookConfiguration](t, mustFind(t, objs, "MutatingWebhookConfiguration", "addon-heartbeat"))
			if got := mwc.Annotations["cert-manager.io/inject-ca-from"]; got != "addon-heartbeat-system/addon-heartbeat-serving" {
				t.Errorf("inject-ca-from %q", got)
			}
			if len(mwc.Webhooks[0].ClientConfig.CABundle) != 0 {
				t.Error("no caBundle in the chart")
			}
			for _, o := range [][2]string{{"Issuer", "addon-heartbeat-selfsigned"}, {"Certificate", "addon-heartbeat-ca"}, {"Issuer", "addon-heartbeat-ca"}, {"Certificate", "addon-heartbeat-serving"}} {
				mustFind(t, objs, o[0], o[1])
			}
			role := convert[rbacv1.Role](t, mustFind(t, objs, "Role", "addon-heartbeat-webhook"))
			if slices.ContainsFunc(role.Rules, func(r rbacv1.PolicyRule) bool {
				return slices.Contains(r.Resources, "secrets") && slices.Contains(r.ResourceNames, "addon-heartbeat-webhook-tls")
			}) {
				t.Error("cert-manager mode: the webhook needs no access to the certificate's Secret (it is a volume)")
			}
			dep := convert[appsv1.Deployment](t, mustFind(t, objs, "Deployment", "addon-heartbeat-webhook"))
			if v := dep.Spec.Template.Spec.Volumes; len(v) != 1 || v[0].Secret.SecretName != "addon-heartbeat-webhook-tls" {
				t.Errorf("volumes %+v", v)
			}
		},
	},
	"cert-manager with the user's ClusterIssuer": {
		values:   `certificates: {mode: certManager, certManager: {issuerRef: {name: corp-ca, kind: ClusterIssuer}}}`,
		platform: "kubernetes",
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			if chart.Find(objs, "Issuer", "addon-heartbeat-selfsigned") != nil || chart.Find(objs, "Certificate", "addon-heartbeat-ca") != nil {
				t.Error("a user's issuer replaces the chart's CA")
			}
			ref, _, _ := unstructured.NestedStringMap(mustFind(t, objs, "Certificate", "addon-heartbeat-serving").Object, "spec", "issuerRef")
			if ref["name"] != "corp-ca" || ref["kind"] != "ClusterIssuer" || ref["group"] != "cert-manager.io" {
				t.Errorf("issuerRef %v", ref)
			}
		},
	},
	"one replica, plain sidecar, digests, Ignore, selector, priority class": {
		platform: "kubernetes",
		values: `
image: {digest: "sha256:0000000000000000000000000000000000000000000000000000000000000001"}
webhook:
  replicaCount: 1
  failurePolicy: Ignore
  timeoutSeconds: 3
  priorityClassName: system-cluster-critical
  namespaceSelector:
    matchLabels: {addons.example.com/managed: "true"}
reporter:
  image: {repository: registry.example.com/reporter, digest: "sha256:0000000000000000000000000000000000000000000000000000000000000002"}
  nativeSidecar: false
  logLevel: debug
  resources: {requests: {cpu: 20m, memory: 32Mi}, limits: {memory: 96Mi}}
  addonInstanceNames: [addon-instance, my-addon]
logLevel: debug
`,
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			if chart.Find(objs, "PodDisruptionBudget", "addon-heartbeat-webhook") != nil {
				t.Error("no PodDisruptionBudget for one replica")
			}
			dep := convert[appsv1.Deployment](t, mustFind(t, objs, "Deployment", "addon-heartbeat-webhook"))
			if c := dep.Spec.Template.Spec.Containers[0]; !strings.HasSuffix(c.Image, "@sha256:0000000000000000000000000000000000000000000000000000000000000001") {
				t.Errorf("image %s", c.Image)
			}
			if dep.Spec.Template.Spec.PriorityClassName != "system-cluster-critical" {
				t.Error("priorityClassName")
			}
			o := parseArgs(t, containerArgs(t, objs))
			cfg, err := o.InjectConfig()
			if err != nil {
				t.Fatal(err)
			}
			if cfg.NativeSidecar || cfg.Image != "registry.example.com/reporter@sha256:0000000000000000000000000000000000000000000000000000000000000002" ||
				cfg.LogLevel != "debug" || cfg.Resources.Limits.Memory().String() != "96Mi" || cfg.Resources.Requests.Cpu().String() != "20m" {
				t.Errorf("reporter config %+v", cfg)
			}
			// The injector warns about exactly the names the reporter role allows.
			if !slices.Equal(cfg.AddonInstanceNames, []string{"addon-instance", "my-addon"}) {
				t.Errorf("the webhook's AddonInstance names %q, want the chart's [addon-instance my-addon]", cfg.AddonInstanceNames)
			}
			mwc := convert[admissionv1.MutatingWebhookConfiguration](t, mustFind(t, objs, "MutatingWebhookConfiguration", "addon-heartbeat"))
			w := mwc.Webhooks[0]
			if *w.FailurePolicy != admissionv1.Ignore || *w.TimeoutSeconds != 3 || w.NamespaceSelector.MatchLabels["addons.example.com/managed"] != "true" {
				t.Errorf("webhook %+v", w)
			}
			reporter := convert[rbacv1.ClusterRole](t, mustFind(t, objs, "ClusterRole", "addon-heartbeat-reporter"))
			if !hasRule(reporter.Rules, "leases", "update", "addon-heartbeat-my-addon") {
				t.Error("a Lease per AddonInstance name")
			}
		},
	},
	"platform auto on OpenShift (security.openshift.io/v1 served)": {
		cluster:  chart.OpenShift,
		platform: "openshift",
	},
	"platform openshift": {
		values:   `platform: openshift`,
		platform: "openshift",
	},
	"platform kubernetes on OpenShift": {
		values:   `platform: kubernetes`,
		cluster:  chart.OpenShift,
		platform: "kubernetes",
	},
	"platform auto with another API group served": {
		cluster:  chart.Cluster{APIVersions: []string{"config.openshift.io/v1", "cert-manager.io/v1"}},
		platform: "kubernetes",
	},
	"OpenShift service CA": {
		values:   `certificates: {mode: openshiftServiceCA}`,
		cluster:  chart.OpenShift,
		platform: "openshift",
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			svc := convert[corev1.Service](t, mustFind(t, objs, "Service", "addon-heartbeat-webhook"))
			if got := svc.Annotations["service.beta.openshift.io/serving-cert-secret-name"]; got != "addon-heartbeat-webhook-tls" {
				t.Errorf("serving-cert-secret-name %q, want the Secret the webhook mounts", got)
			}
			mwc := convert[admissionv1.MutatingWebhookConfiguration](t, mustFind(t, objs, "MutatingWebhookConfiguration", "addon-heartbeat"))
			if got := mwc.Annotations["service.beta.openshift.io/inject-cabundle"]; got != "true" {
				t.Errorf("inject-cabundle %q", got)
			}
			args := containerArgs(t, objs)
			for _, a := range args {
				if strings.HasPrefix(a, "--cert-secret-name") || strings.HasPrefix(a, "--ca-validity") {
					t.Errorf("self-managed flag %s in the service CA mode", a)
				}
			}
		},
	},
}

// Every mode renders, passes its checks, and every object it renders is
// accepted by the API server (server-side dry-run create: field names,
// types, CRD schemas of cert-manager's objects, RBAC rule validation).
func TestRenderAcceptedByAPIServer(t *testing.T) {
	for name, mode := range modes {
		t.Run(name, func(t *testing.T) {
			objs, notes := renderFor(t, mode.cluster, mode.values)
			if !strings.Contains(notes, "addon-heartbeat.io/inject=true") {
				t.Errorf("NOTES.txt does not say how to annotate a Deployment:\n%s", notes)
			}
			checkPlatform(t, objs, mode.platform)
			checkCertificates(t, objs, certificateMode(t, mode.values))
			if mode.check != nil {
				mode.check(t, objs)
			}
			for _, o := range objs {
				if err := k8s.Create(t.Context(), o.DeepCopy(), client.DryRunAll); err != nil {
					t.Errorf("%s refused: %v", chart.Key(o), err)
				}
			}
			// The webhook configuration and the RBAC controller use one selector.
			mwc := convert[admissionv1.MutatingWebhookConfiguration](t, mustFind(t, objs, "MutatingWebhookConfiguration", "addon-heartbeat"))
			o := parseArgs(t, containerArgs(t, objs))
			sel, err := jsonSelector(o.NamespaceSelector)
			if err != nil || !equalJSON(t, sel, mwc.Webhooks[0].NamespaceSelector) {
				t.Errorf("--namespace-selector %s differs from the webhook's %+v (%v)", o.NamespaceSelector, mwc.Webhooks[0].NamespaceSelector, err)
			}
		})
	}
}

// helm lint is clean in every mode (lint renders for Helm's built-in API
// versions, so a mode's cluster plays no part).
func TestHelmLint(t *testing.T) {
	for name, mode := range modes {
		t.Run(name, func(t *testing.T) {
			for _, m := range chart.Lint(chart.DefaultRelease, values(t, mode.values)) {
				t.Errorf("helm lint: %s", m)
			}
		})
	}
}

// Invalid values are refused by values.schema.json before anything renders.
func TestSchemaRejectsInvalidValues(t *testing.T) {
	tests := map[string]struct{ values, wantErr string }{
		"unknown top-level key":           {`replicas: 3`, "additional properties 'replicas' not allowed"},
		"unknown nested key":              {`webhook: {replicas: 3}`, "additional properties 'replicas' not allowed"},
		"zero replicas":                   {`webhook: {replicaCount: 0}`, "replicaCount"},
		"failure policy":                  {`webhook: {failurePolicy: Retry}`, "failurePolicy"},
		"timeout over 30s":                {`webhook: {timeoutSeconds: 31}`, "timeoutSeconds"},
		"certificate mode":                {`certificates: {mode: vault}`, "mode"},
		"OpenShift certificate mode":      {`certificates: {mode: openshift}`, "mode"},
		"platform":                        {`platform: okd`, "platform"},
		"platform case":                   {`platform: OpenShift`, "platform"},
		"issuer for another mode":         {`certificates: {mode: openshiftServiceCA, certManager: {issuerRef: {name: corp-ca}}}`, "mode"},
		"issuer for self-managed":         {`certificates: {certManager: {issuerRef: {name: corp-ca, kind: ClusterIssuer}}}`, "mode"},
		"log level":                       {`logLevel: trace`, "logLevel"},
		"reporter pull policy":            {`reporter: {image: {pullPolicy: Sometimes}}`, "pullPolicy"},
		"digest without sha256":           {`image: {digest: "abc"}`, "digest"},
		"native sidecar as a string":      {`reporter: {nativeSidecar: "yes"}`, "nativeSidecar"},
		"reporter CPU limit":              {`reporter: {resources: {requests: {cpu: 5m, memory: 24Mi}, limits: {memory: 64Mi, cpu: 1}}}`, "additional properties 'cpu' not allowed"},
		"reporter memory quantity":        {`reporter: {resources: {requests: {cpu: 5m, memory: lots}, limits: {memory: 64Mi}}}`, "memory"},
		"AddonInstance name":              {`reporter: {addonInstanceNames: [My_Addon]}`, "addonInstanceNames"},
		"validity not a duration":         {`certificates: {selfManaged: {certValidity: 1y}}`, "certValidity"},
		"issuerRef without a name":        {`certificates: {certManager: {issuerRef: {kind: ClusterIssuer}}}`, "name"},
		"namespace selector operator":     {`webhook: {namespaceSelector: {matchExpressions: [{key: a, operator: Like}]}}`, "operator"},
		"port out of range":               {`webhook: {port: 70000}`, "port"},
		"monitoring: unknown key":         {`monitoring: {serviceMonitor: {enabled: true, port: metrics}}`, "additional properties 'port' not allowed"},
		"monitoring: interval":            {`monitoring: {podMonitor: {enabled: true, interval: 30 seconds}}`, "interval"},
		"monitoring: Go-only interval":    {`monitoring: {serviceMonitor: {enabled: true, interval: 1m30.5s}}`, "interval"},
		"monitoring: enabled string":      {`monitoring: {prometheusRule: {enabled: "yes"}}`, "enabled"},
		"monitoring: runbook anchor":      {`monitoring: {prometheusRule: {enabled: true, runbookBaseURL: "https://example.com/r#x"}}`, "runbookBaseURL"},
		"monitoring: label value":         {`monitoring: {dashboard: {enabled: true, labels: {grafana_dashboard: 1}}}`, "grafana_dashboard"},
		"monitoring: dashboard namespace": {`monitoring: {dashboard: {enabled: true, namespace: Monitoring}}`, "namespace"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, _, err := chart.Render(chart.DefaultRelease, values(t, tc.values))
			if err == nil {
				t.Fatal("rendered; want the schema to refuse the values")
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("error %q does not mention %q", err, tc.wantErr)
			}
		})
	}
}

func hasRule(rules []rbacv1.PolicyRule, resource, verb, name string) bool {
	return slices.ContainsFunc(rules, func(r rbacv1.PolicyRule) bool {
		return slices.Contains(r.Resources, resource) && slices.Contains(r.Verbs, verb) &&
			(name == "" || slices.Contains(r.ResourceNames, name))
	})
}

// containerArgs are the webhook container's args, with $(POD_NAMESPACE)
// expanded as the kubelet does.
func containerArgs(t *testing.T, objs []*unstructured.Unstructured) []string {
	t.Helper()
	dep := convert[appsv1.Deployment](t, onlyOfKind(t, objs, "Deployment"))
	var out []string
	for _, a := range dep.Spec.Template.Spec.Containers[0].Args {
		out = append(out, strings.ReplaceAll(a, "$(POD_NAMESPACE)", dep.Namespace))
	}
	return out
}

// parseArgs parses args with the webhook binary's own flags and validates
// them as it does at start-up.
func parseArgs(t *testing.T, args []string) webhook.Options {
	t.Helper()
	o := webhook.DefaultOptions()
	fs := flag.NewFlagSet("webhook", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	o.BindFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatalf("the chart's args are not the webhook's flags: %v", err)
	}
	if err := o.Validate(); err != nil {
		t.Fatalf("the webhook refuses the chart's args: %v", err)
	}
	return o
}
