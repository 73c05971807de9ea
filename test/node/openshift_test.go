//go:build node

package node

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	addonsv1alpha1 "github.com/openshift/addon-operator/apis/addons/v1alpha1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/addon-heartbeat/addon-heartbeat/internal/chart"
	"github.com/addon-heartbeat/addon-heartbeat/internal/testenv"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/certs"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/inject"
)

// On the real node, OpenShift's own SCC admission plugin
// (github.com/openshift/apiserver-library-go, run by test/openshift's
// scc-webhook as a mutating webhook for pod CREATE) assigns UIDs from the
// namespace's range and the seccomp profile, as OpenShift's kube-apiserver
// does. The namespaces it serves are "OpenShift projects": they carry the
// annotations OpenShift's namespace controller sets and the label below.
const (
	projectLabel = "test.addon-heartbeat.io/openshift-project"
	sccPort      = 19443
	osAddonNS    = "openshift-addon"
)

// project marks namespace ns as an OpenShift project with UID block base.
func project(t *testing.T, ns string, base int64) {
	t.Helper()
	var n corev1.Namespace
	if err := cluster.Client.Get(suiteCtx, key("", ns), &n); err != nil {
		t.Fatal(err)
	}
	if n.Labels == nil {
		n.Labels = map[string]string{}
	}
	if n.Annotations == nil {
		n.Annotations = map[string]string{}
	}
	n.Labels[projectLabel] = "true"
	block := fmt.Sprintf("%d/10000", base)
	n.Annotations["openshift.io/sa.scc.uid-range"] = block
	n.Annotations["openshift.io/sa.scc.supplemental-groups"] = block
	n.Annotations["openshift.io/sa.scc.mcs"] = "s0:c26,c5"
	if err := cluster.Client.Update(suiteCtx, &n); err != nil {
		t.Fatal(err)
	}
}

// startSCCAdmission builds and runs the scc-webhook inside the node's
// network and registers it for pod CREATE in OpenShift projects.
func startSCCAdmission(t *testing.T) {
	t.Helper()
	dir := filepath.Join(workDir, "scc-webhook")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	bin := filepath.Join(dir, "scc-webhook")
	build := exec.CommandContext(suiteCtx, "go", "build", "-o", bin, "./cmd/scc-webhook")
	build.Dir = filepath.Join(testenv.RepoRoot(), "test", "openshift")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the scc-webhook: %v\n%s", err, out)
	}
	logf("cost: scc-webhook built in %s", time.Since(start).Round(time.Millisecond))
	ca, err := certs.NewCA("scc-admission-ca", time.Now(), 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := ca.Issue([]string{"127.0.0.1"}, time.Now(), 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(certFile, kp.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, kp.KeyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := cluster.StartProcess("scc-webhook", bin, "--listen=127.0.0.1:"+strconv.Itoa(sccPort),
		"--cert="+certFile, "--key="+keyFile, "--kubeconfig="+cluster.Kubeconfig,
		"--scc-dir="+filepath.Join(testenv.RepoRoot(), "test", "openshift", "testdata", "scc"),
		"--default-scc=restricted-v2"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "scc-webhook serving", time.Minute, func(ctx context.Context) (bool, string) {
		c, err := cluster.NetNS.DialContext(ctx, "tcp", "127.0.0.1:"+strconv.Itoa(sccPort))
		if err != nil {
			return false, err.Error() + "\n" + cluster.Tail("scc-webhook", 5)
		}
		c.Close()
		return true, ""
	})
	url := "https://127.0.0.1:" + strconv.Itoa(sccPort) + "/mutate-pods"
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "openshift-scc-admission"},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name:                    "scc.admission.test.addon-heartbeat.io",
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: ca.CertPEM},
			Rules:                   []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create}, Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}}}},
			NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{projectLabel: "true"}},
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"},
			FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
			// After the other mutating webhooks, as OpenShift's SCC
			// admission runs after them.
			ReinvocationPolicy: ptr.To(admissionregistrationv1.NeverReinvocationPolicy),
		}},
	}
	if err := cluster.Client.Create(suiteCtx, mwc); err != nil {
		t.Fatal(err)
	}
}

// uidOf is the effective runAsUser of container c of pod p.
func uidOf(p corev1.Pod, c corev1.Container) *int64 {
	if c.SecurityContext != nil && c.SecurityContext.RunAsUser != nil {
		return c.SecurityContext.RunAsUser
	}
	if p.Spec.SecurityContext != nil {
		return p.Spec.SecurityContext.RunAsUser
	}
	return nil
}

// processUID is the real UID of a container's main process, read on the node.
func processUID(ctx context.Context, containerID string) (int64, error) {
	pid, err := containerPID(ctx, containerID)
	if err != nil {
		return 0, err
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "Uid:"); ok {
			f := strings.Fields(rest)
			return strconv.ParseInt(f[0], 10, 64)
		}
	}
	return 0, fmt.Errorf("/proc/%d/status has no Uid", pid)
}

// runningUID is the process UID of the container named name in pod p as it
// runs now: the pod's status is read again until it names a container the
// node runs (a status read right after a rollout may still name one that
// has since been restarted, whose task is gone), for at most 30 s.
func runningUID(p corev1.Pod, name string) (int64, error) {
	var uid int64
	var last error
	err := wait.PollUntilContextTimeout(suiteCtx, 250*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		var now corev1.Pod
		if err := cluster.Client.Get(ctx, key(p.Namespace, p.Name), &now); err != nil {
			last = err
			return false, nil
		}
		statuses := append(slices.Clone(now.Status.InitContainerStatuses), now.Status.ContainerStatuses...)
		i := slices.IndexFunc(statuses, func(s corev1.ContainerStatus) bool { return s.Name == name })
		if i < 0 || statuses[i].ContainerID == "" || statuses[i].State.Running == nil {
			last = fmt.Errorf("container %s not running (restarts %d)", name, restarts(statuses, i))
			return false, nil
		}
		uid, last = processUID(ctx, statuses[i].ContainerID)
		if last != nil {
			last = fmt.Errorf("%w (restarts %d)", last, statuses[i].RestartCount)
		}
		return last == nil, nil
	})
	if err != nil {
		return 0, fmt.Errorf("%v: %w", err, last)
	}
	return uid, nil
}

func restarts(statuses []corev1.ContainerStatus, i int) int32 {
	if i < 0 {
		return 0
	}
	return statuses[i].RestartCount
}

// inRange checks that every container of pods runs, by its spec and by its
// process on the node, with a UID from [base, base+9999] that restricted-v2
// assigned.
func inRange(t *testing.T, ps []corev1.Pod, base int64) {
	t.Helper()
	for _, p := range ps {
		if got := p.Annotations["openshift.io/scc"]; got != "restricted-v2" {
			t.Errorf("pod %s admitted under SCC %q, want restricted-v2", p.Name, got)
		}
		for _, c := range append(slices.Clone(p.Spec.InitContainers), p.Spec.Containers...) {
			uid := uidOf(p, c)
			if uid == nil || *uid < base || *uid > base+9999 {
				t.Errorf("pod %s container %s: runAsUser %v, want one from [%d, %d]", p.Name, c.Name, uid, base, base+9999)
				continue
			}
			got, err := runningUID(p, c.Name)
			if err != nil || got != *uid {
				t.Errorf("pod %s container %s: process UID %d (%v), want %d", p.Name, c.Name, got, err, *uid)
				continue
			}
			logf("pod %s/%s container %s: admitted by %s, runs as UID %d", p.Namespace, p.Name, c.Name, p.Annotations["openshift.io/scc"], got)
		}
	}
}

// openshiftPlatform: with platform=openshift, the webhook pods and an addon
// injected in an OpenShift project are admitted by OpenShift's restricted-v2
// SCC, run with UIDs from their namespace's range (on the node, not only in
// the spec), pass the restricted Pod Security profile, and heartbeat.
func openshiftPlatform(t *testing.T, webhookDeployment string, webhookSelector map[string]string) {
	startSCCAdmission(t)
	project(t, releaseNamespace, 1000660000)
	restrictedNamespace(t, osAddonNS)
	project(t, osAddonNS, 1000650000)

	start := time.Now()
	if _, err := run(suiteCtx, helmBin, "upgrade", release, chart.Dir(), "--namespace", releaseNamespace, "--reuse-values",
		"--set", "platform=openshift", "--wait", "--timeout", "3m"); err != nil {
		t.Fatal(err)
	}
	logf("helm upgrade --set platform=openshift --wait: %s", time.Since(start).Round(time.Millisecond))
	waitFor(t, "webhook rolled out for OpenShift", 2*time.Minute, func(ctx context.Context) (bool, string) {
		var d appsv1.Deployment
		if err := cluster.Client.Get(ctx, key(releaseNamespace, webhookDeployment), &d); err != nil {
			return false, err.Error()
		}
		if !slices.Contains(d.Spec.Template.Spec.Containers[0].Args, "--platform=openshift") {
			return false, "args " + strings.Join(d.Spec.Template.Spec.Containers[0].Args, " ")
		}
		return rolledOut(ctx, key(releaseNamespace, webhookDeployment), 2)
	})
	webhookPods, err := pods(suiteCtx, releaseNamespace, webhookSelector)
	if err != nil {
		t.Fatal(err)
	}
	inRange(t, webhookPods, 1000660000)

	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: osAddonNS, Name: addonServiceAccount}}
	ai := &addonsv1alpha1.AddonInstance{ObjectMeta: metav1.ObjectMeta{Namespace: osAddonNS, Name: instance},
		Spec: addonsv1alpha1.AddonInstanceSpec{HeartbeatUpdatePeriod: metav1.Duration{Duration: period}}}
	for _, o := range []client.Object{sa, ai} {
		if err := cluster.Client.Create(suiteCtx, o); err != nil {
			t.Fatal(err)
		}
	}
	hb := watchHeartbeats(t, osAddonNS, instance)
	d := exampleAddon(osAddonNS, operatorName, instance, 2)
	if err := cluster.Client.Create(suiteCtx, d); err != nil {
		t.Fatalf("creating the addon in an OpenShift project (restricted Pod Security, restricted-v2): %v", err)
	}
	waitFor(t, "the addon rolled out under restricted-v2", 3*time.Minute, func(ctx context.Context) (bool, string) {
		return rolledOut(ctx, key(osAddonNS, operatorName), 2)
	})
	addonPods, err := pods(suiteCtx, osAddonNS, map[string]string{"app": operatorName})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range addonPods {
		if rs := reporterStatus(p); rs == nil || !rs.Ready {
			t.Errorf("pod %s: reporter %+v, want ready", p.Name, rs)
		}
	}
	inRange(t, addonPods, 1000650000)
	hb.waitWrites(t, 2, 4*period)
	hb.waitCondition(t, installed, metav1.ConditionTrue, 4*period)
}

// openshiftServiceCA: with certificates.mode=openshiftServiceCA the webhook
// serves the Secret the service CA operator writes (played here: a CA of the
// test issues for the Service's DNS names, and its bundle goes into the
// webhook configuration as the operator's cabundle injector puts it), and
// when the operator renews the Secret, every webhook pod serves the new
// certificate without a restart, and admission keeps working.
func openshiftServiceCA(t *testing.T, webhookDeployment, service, webhookConfig string, webhookSelector map[string]string) {
	start := time.Now()
	if _, err := run(suiteCtx, helmBin, "upgrade", release, chart.Dir(), "--namespace", releaseNamespace, "--reuse-values",
		"--set", "certificates.mode=openshiftServiceCA", "--wait", "--timeout", "3m"); err != nil {
		t.Fatal(err)
	}
	logf("helm upgrade --set certificates.mode=openshiftServiceCA --wait: %s", time.Since(start).Round(time.Millisecond))
	waitFor(t, "webhook rolled out in service-CA mode", 2*time.Minute, func(ctx context.Context) (bool, string) {
		return rolledOut(ctx, key(releaseNamespace, webhookDeployment), 2)
	})
	var svc corev1.Service
	if err := cluster.Client.Get(suiteCtx, key(releaseNamespace, service), &svc); err != nil {
		t.Fatal(err)
	}
	secretName := svc.Annotations["service.beta.openshift.io/serving-cert-secret-name"]
	if secretName == "" {
		t.Fatalf("the Service asks the service CA for no Secret: %v", svc.Annotations)
	}
	var mwc admissionregistrationv1.MutatingWebhookConfiguration
	if err := cluster.Client.Get(suiteCtx, key("", webhookConfig), &mwc); err != nil {
		t.Fatal(err)
	}
	if mwc.Annotations["service.beta.openshift.io/inject-cabundle"] != "true" {
		t.Fatalf("the webhook configuration does not ask for the service CA bundle: %v", mwc.Annotations)
	}
	before, err := pods(suiteCtx, releaseNamespace, webhookSelector)
	if err != nil {
		t.Fatal(err)
	}

	// The service CA operator issues for <service>.<namespace>.svc and
	// <service>.<namespace>.svc.cluster.local into the Secret, and its
	// injector sets the bundle (here next to the old CA until the pods have
	// the new certificate).
	ca, err := certs.NewCA("openshift-service-serving-signer@test", time.Now(), 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := ca.Issue([]string{service + "." + releaseNamespace + ".svc", service + "." + releaseNamespace + ".svc.cluster.local"}, time.Now(), 12*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	want, err := certs.ParseCert(kp.CertPEM)
	if err != nil {
		t.Fatal(err)
	}
	mwc.Webhooks[0].ClientConfig.CABundle = append(bytes.Clone(mwc.Webhooks[0].ClientConfig.CABundle), ca.CertPEM...)
	if err := cluster.Client.Update(suiteCtx, &mwc); err != nil {
		t.Fatal(err)
	}
	var secret corev1.Secret
	if err := cluster.Client.Get(suiteCtx, key(releaseNamespace, secretName), &secret); err != nil {
		t.Fatal(err)
	}
	secret.Data = map[string][]byte{corev1.TLSCertKey: kp.CertPEM, corev1.TLSPrivateKeyKey: kp.KeyPEM}
	if err := cluster.Client.Update(suiteCtx, &secret); err != nil {
		t.Fatal(err)
	}
	renewed := time.Now()
	// The kubelet updates the mounted Secret on its next sync of the pod.
	for _, p := range before {
		waitFor(t, "pod "+p.Name+" serving the renewed certificate", 3*time.Minute, func(ctx context.Context) (bool, string) {
			serial, err := servedSerial(ctx, p.Status.PodIP+":9443")
			if err != nil {
				return false, err.Error()
			}
			return serial == want.SerialNumber.String(), "serving serial " + serial
		})
	}
	logf("renewed service-CA certificate served by every webhook pod %s after the Secret update", time.Since(renewed).Round(time.Millisecond))
	after, err := pods(suiteCtx, releaseNamespace, webhookSelector)
	if err != nil {
		t.Fatal(err)
	}
	restarts := func(ps []corev1.Pod) map[string]int32 {
		out := map[string]int32{}
		for _, p := range ps {
			for _, s := range p.Status.ContainerStatuses {
				out[string(p.UID)] += s.RestartCount
			}
		}
		return out
	}
	if b, a := restarts(before), restarts(after); !maps.Equal(b, a) {
		t.Errorf("webhook pods (UID: restarts) %v became %v: the renewal must not restart them", b, a)
	}

	// Only the service CA's bundle now: admission works through the Service.
	if err := cluster.Client.Get(suiteCtx, key("", webhookConfig), &mwc); err != nil {
		t.Fatal(err)
	}
	mwc.Webhooks[0].ClientConfig.CABundle = ca.CertPEM
	if err := cluster.Client.Update(suiteCtx, &mwc); err != nil {
		t.Fatal(err)
	}
	// The API server picks up a new caBundle within moments: retry until it
	// has (a TLS error until then).
	var probe *appsv1.Deployment
	waitFor(t, "an opted-in Deployment admitted through the renewed certificate", time.Minute, func(ctx context.Context) (bool, string) {
		probe = exampleAddon(osAddonNS, "service-ca-probe", instance, 0)
		if err := cluster.Client.Create(ctx, probe); err != nil {
			return false, err.Error()
		}
		return true, ""
	})
	if !slices.ContainsFunc(probe.Spec.Template.Spec.InitContainers, func(c corev1.Container) bool { return c.Name == inject.ContainerName }) {
		t.Errorf("the Deployment admitted through the renewed certificate has no reporter: %+v", probe.Spec.Template.Spec.InitContainers)
	}
	if err := cluster.Client.Delete(suiteCtx, probe); err != nil {
		t.Error(err)
	}
}

// servedSerial is the serial number of the certificate served at addr,
// dialled inside the node's network.
func servedSerial(ctx context.Context, addr string) (string, error) {
	raw, err := cluster.NetNS.DialContext(ctx, "tcp", addr)
	if err != nil {
		return "", err
	}
	conn := tls.Client(raw, &tls.Config{InsecureSkipVerify: true}) // the serial is what is compared
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if err := conn.HandshakeContext(ctx); err != nil {
		return "", err
	}
	return conn.ConnectionState().PeerCertificates[0].SerialNumber.String(), nil
}
