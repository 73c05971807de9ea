package chart_test

import (
	"slices"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"

	"github.com/addon-heartbeat/addon-heartbeat/internal/chart"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/inject"
)

// checkPlatform checks that the chart installs for platform: the webhook's
// --platform, which decides the injected reporter's security context, and
// the webhook pods' own security context. On openshift nothing in the pod
// sets what the SCC assigns (runAsUser, runAsGroup, seccompProfile); on
// kubernetes the restricted Pod Security profile is set in full. On both,
// the webhook container's security context is the one the webhook gives the
// reporter it injects on that platform.
func checkPlatform(t *testing.T, objs []*unstructured.Unstructured, platform string) {
	t.Helper()
	o := parseArgs(t, containerArgs(t, objs))
	if o.Platform != platform {
		t.Errorf("--platform=%s, want %s", o.Platform, platform)
	}
	dep := convert[appsv1.Deployment](t, onlyOfKind(t, objs, "Deployment"))
	pod := dep.Spec.Template.Spec
	psc := pod.SecurityContext
	if psc == nil {
		t.Fatal("the webhook pod has no security context")
	}
	if !ptr.Deref(psc.RunAsNonRoot, false) {
		t.Error("pod: runAsNonRoot must be true")
	}
	containers := slices.Concat(pod.InitContainers, pod.Containers)
	for _, c := range containers {
		sc := c.SecurityContext
		if sc == nil {
			t.Errorf("container %s has no security context", c.Name)
			continue
		}
		if !ptr.Deref(sc.RunAsNonRoot, false) || ptr.Deref(sc.AllowPrivilegeEscalation, true) ||
			!ptr.Deref(sc.ReadOnlyRootFilesystem, false) || ptr.Deref(sc.Privileged, false) ||
			sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0 {
			t.Errorf("container %s: want non-root, no privilege escalation, a read-only root filesystem and no capabilities, got %+v", c.Name, sc)
		}
	}
	switch platform {
	case "openshift":
		if psc.RunAsUser != nil || psc.RunAsGroup != nil || psc.SeccompProfile != nil || psc.FSGroup != nil {
			t.Errorf("pod: the SCC assigns the UID, GID, fsGroup and seccomp profile, got %+v", psc)
		}
		for _, c := range containers {
			if sc := c.SecurityContext; sc != nil && (sc.RunAsUser != nil || sc.RunAsGroup != nil || sc.SeccompProfile != nil) {
				t.Errorf("container %s: the SCC assigns the UID, GID and seccomp profile, got %+v", c.Name, sc)
			}
		}
	case "kubernetes":
		if psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
			t.Errorf("pod: want the RuntimeDefault seccomp profile, got %+v", psc)
		}
		for _, c := range containers {
			if sc := c.SecurityContext; sc != nil && (ptr.Deref(sc.RunAsUser, 0) != 65532 || ptr.Deref(sc.RunAsGroup, 0) != 65532 ||
				sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault) {
				t.Errorf("container %s: want UID and GID 65532 and RuntimeDefault seccomp, got %+v", c.Name, sc)
			}
		}
	default:
		t.Fatalf("unknown platform %q", platform)
	}

	cfg, err := o.InjectConfig()
	if err != nil {
		t.Fatal(err)
	}
	res, err := inject.Mutate(optedIn(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	var reporter *corev1.Container
	for _, c := range slices.Concat(res.Deployment.Spec.Template.Spec.InitContainers, res.Deployment.Spec.Template.Spec.Containers) {
		if c.Name == inject.ContainerName {
			reporter = &c
		}
	}
	if reporter == nil {
		t.Fatal("the webhook, with the chart's args, injected no reporter")
	}
	if webhook := pod.Containers[0].SecurityContext; !equalJSON(t, webhook, reporter.SecurityContext) {
		t.Errorf("the webhook container's security context %+v differs from the reporter's on %s %+v", webhook, platform, reporter.SecurityContext)
	}
}

// optedIn is a Deployment that opts in.
func optedIn() *appsv1.Deployment {
	labels := map[string]string{"app": "addon"}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: "addon", Name: "addon", Annotations: map[string]string{"addon-heartbeat.io/inject": "true"}},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "manager", Image: "registry.example.com/addon:v1"}}},
			},
		},
	}
}

// certificateMode is certificates.mode in vals, or the chart's default.
func certificateMode(t *testing.T, vals string) string {
	t.Helper()
	if m, ok, _ := unstructured.NestedString(values(t, vals), "certificates", "mode"); ok {
		return m
	}
	return "selfManaged"
}

// checkCertificates checks what each certificate mode renders and only it:
// the annotations that ask cert-manager or OpenShift's service CA for the
// certificate and the caBundle, cert-manager's objects, the Secret volume and
// the webhook's --cert-mode, and the Secret and webhook-configuration write
// access that only self-managed certificates need. No mode carries a caBundle.
func checkCertificates(t *testing.T, objs []*unstructured.Unstructured, mode string) {
	t.Helper()
	const secretName, certDir = "addon-heartbeat-webhook-tls", "/tmp/k8s-webhook-server/serving-certs"
	certManager, serviceCA, selfManaged := mode == "certManager", mode == "openshiftServiceCA", mode == "selfManaged"

	svc := convert[corev1.Service](t, mustFind(t, objs, "Service", "addon-heartbeat-webhook"))
	if got, ok := svc.Annotations["service.beta.openshift.io/serving-cert-secret-name"]; ok != serviceCA || (ok && got != secretName) {
		t.Errorf("%s: Service annotation serving-cert-secret-name %q (set: %t), want it exactly in mode openshiftServiceCA, naming %s", mode, got, ok, secretName)
	}
	mwc := convert[admissionv1.MutatingWebhookConfiguration](t, mustFind(t, objs, "MutatingWebhookConfiguration", "addon-heartbeat"))
	if got, ok := mwc.Annotations["service.beta.openshift.io/inject-cabundle"]; ok != serviceCA || (ok && got != "true") {
		t.Errorf("%s: inject-cabundle %q (set: %t), want \"true\" exactly in mode openshiftServiceCA", mode, got, ok)
	}
	if _, ok := mwc.Annotations["cert-manager.io/inject-ca-from"]; ok != certManager {
		t.Errorf("%s: cert-manager.io/inject-ca-from set: %t, want it exactly in mode certManager", mode, ok)
	}
	for _, w := range mwc.Webhooks {
		if len(w.ClientConfig.CABundle) != 0 {
			t.Errorf("%s: a caBundle in the chart", mode)
		}
	}
	for _, o := range objs {
		if strings.HasPrefix(o.GetAPIVersion(), "cert-manager.io/") && !certManager {
			t.Errorf("%s: %s rendered", mode, chart.Key(o))
		}
	}

	dep := convert[appsv1.Deployment](t, onlyOfKind(t, objs, "Deployment"))
	pod := dep.Spec.Template.Spec
	o := parseArgs(t, containerArgs(t, objs))
	role := convert[rbacv1.Role](t, mustFind(t, objs, "Role", "addon-heartbeat-webhook"))
	clusterRole := convert[rbacv1.ClusterRole](t, mustFind(t, objs, "ClusterRole", "addon-heartbeat-webhook"))
	// Every mode reads (and may create) the status record signing key's
	// Secret; only selfManaged touches the certificate's.
	writesSecret := slices.ContainsFunc(role.Rules, func(r rbacv1.PolicyRule) bool {
		return slices.Contains(r.Resources, "secrets") && slices.Contains(r.ResourceNames, secretName)
	})
	writesCABundle := hasRule(clusterRole.Rules, "mutatingwebhookconfigurations", "update", "")
	if writesSecret != selfManaged || writesCABundle != selfManaged {
		t.Errorf("%s: Secret access %t, webhook configuration updates %t; want both exactly in mode selfManaged", mode, writesSecret, writesCABundle)
	}
	if selfManaged {
		if o.CertMode != "self-managed" || len(pod.Volumes) != 0 {
			t.Errorf("%s: --cert-mode=%s, volumes %+v; want self-managed and no volume", mode, o.CertMode, pod.Volumes)
		}
		return
	}
	// A Secret someone else writes, mounted where the webhook serves and
	// reloads it from.
	if o.CertMode != "dir" || o.CertDir != certDir {
		t.Errorf("%s: --cert-mode=%s --cert-dir=%s, want dir %s", mode, o.CertMode, o.CertDir, certDir)
	}
	if v := pod.Volumes; len(v) != 1 || v[0].Secret == nil || v[0].Secret.SecretName != secretName {
		t.Fatalf("%s: volumes %+v, want the Secret %s", mode, v, secretName)
	}
	if m := pod.Containers[0].VolumeMounts; len(m) != 1 || m[0].Name != pod.Volumes[0].Name || m[0].MountPath != certDir || !m[0].ReadOnly {
		t.Errorf("%s: volume mounts %+v, want the Secret read-only at %s", mode, m, certDir)
	}
}

// NOTES.txt says which platform the chart installed for and why, who issues
// the certificate, and warns when the service CA is asked for on a cluster
// that is not OpenShift.
func TestNotes(t *testing.T) {
	const warning = "WARNING: certificates.mode is openshiftServiceCA, but this is not OpenShift"
	tests := map[string]struct {
		values        string
		cluster       chart.Cluster
		want, wantNot []string
	}{
		"auto on Kubernetes": {
			want:    []string{"for kubernetes (platform auto: no security.openshift.io/v1 API was found)", "creates its own CA"},
			wantNot: []string{"SCC", warning},
		},
		"auto on OpenShift with the service CA": {
			values:  `certificates: {mode: openshiftServiceCA}`,
			cluster: chart.OpenShift,
			want: []string{
				"for openshift (platform auto: the API server serves security.openshift.io/v1)",
				"leave runAsUser, runAsGroup and seccompProfile to the SCC",
				"service CA operator issues the serving certificate into Secret addon-heartbeat-webhook-tls",
				"as a Deployment label",
			},
			wantNot: []string{warning},
		},
		"the service CA where auto finds no OpenShift": {
			values: `certificates: {mode: openshiftServiceCA}`,
			want:   []string{warning},
		},
		"the service CA with platform kubernetes, chosen": {
			values:  `{platform: kubernetes, certificates: {mode: openshiftServiceCA}}`,
			want:    []string{"for kubernetes."},
			wantNot: []string{warning},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, notes := renderFor(t, tc.cluster, tc.values)
			for _, s := range tc.want {
				if !strings.Contains(notes, s) {
					t.Errorf("NOTES.txt does not say %q:\n%s", s, notes)
				}
			}
			for _, s := range tc.wantNot {
				if strings.Contains(notes, s) {
					t.Errorf("NOTES.txt says %q:\n%s", s, notes)
				}
			}
		})
	}
}
