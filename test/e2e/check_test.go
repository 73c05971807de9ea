package e2e

// The tests of `addon-heartbeat check`: the command runs as a process
// against this suite's cluster, as a user runs it. The chart's webhook
// Deployment object, whose arguments check reads, is created beside the
// webhook process that stands for its pod, and each reporter's pod is
// created as Running. Each test injects one fault, asserts the line check
// prints for it and the exit status, and repairs it.

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	addonsv1alpha1 "github.com/openshift/addon-operator/apis/addons/v1alpha1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/addon-heartbeat/addon-heartbeat/internal/certrotator"
	"github.com/addon-heartbeat/addon-heartbeat/internal/chart"
	"github.com/addon-heartbeat/addon-heartbeat/internal/check"
	"github.com/addon-heartbeat/addon-heartbeat/internal/localcluster"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/certs"
)

const (
	webhookNS     = "addon-heartbeat-system"
	webhookConfig = "addon-heartbeat"
	webhookLease  = "addon-heartbeat-webhook"
	logsFix       = "kubectl -n addon-heartbeat-system logs deployment/addon-heartbeat-webhook"
	checkPeriod   = 3 * time.Second
	addonInstance = "addon-instance"
)

func webhookURL() string {
	return "https://127.0.0.1:" + strconv.Itoa(webhook.Port) + "/mutate-apps-v1-deployment"
}

// A healthy installation and addon: every check passes, in the table and in
// JSON, whichever way the kubeconfig, context and namespace are given, and
// under the kubectl plugin's name.
func TestCheckHealthy(t *testing.T) {
	a := newCheckedAddon(t, "healthy")
	t.Cleanup(func() { a.remove(t) })

	r := runCheck(t, "-n", a.ns)
	r.expectCode(t, check.ExitHealthy)
	if r.stderr != "" {
		t.Errorf("stderr: %s", r.stderr)
	}
	ds, as := "deployment "+a.ns+"/operator", "addoninstance "+a.ns+"/addon-instance"
	r.expectLine(t, "webhook", "configuration", "webhook configuration OK MutatingWebhookConfiguration addon-heartbeat has the webhook inject.addon-heartbeat.io")
	r.expectLine(t, "webhook", "deployment", "webhook deployment OK Deployment addon-heartbeat-system/addon-heartbeat-webhook injects reporter image "+reporterImage)
	r.expectLine(t, "webhook", "serving", "webhook serving OK "+webhookURL()+" answers TLS")
	leaf := servingCert(t)
	r.expectLine(t, "webhook", "trusted", fmt.Sprintf("webhook trusted OK the caBundle verifies the certificate %s serves for 127.0.0.1 (issuer %q, valid until %s)",
		webhookURL(), leaf.Issuer.CommonName, leaf.NotAfter.UTC().Format("2006-01-02")))
	r.expectLine(t, "webhook", "matchConditions", "webhook matchConditions OK addon-heartbeat-opted-in: only opted-in Deployments are sent to the webhook")
	r.expectLine(t, "webhook", "failurePolicy", "webhook failurePolicy OK Fail: while the webhook is down, opted-in Deployments are refused, never admitted without their reporter")
	r.expectLine(t, ds, "injected", ds+" injected OK heartbeat-reporter as a native sidecar, for AddonInstance addon-instance, running as ServiceAccount default")
	r.expectLine(t, ds, "reporterImage", ds+" reporterImage OK "+reporterImage+", the image the webhook injects now")
	r.expectLine(t, ds, "rbac", ds+" rbac OK ServiceAccount default may do everything the reporter does: AddonInstance addon-instance and its status, Lease addon-heartbeat-addon-instance, list Deployments")
	r.expectLine(t, as, "exists", as+" exists OK heartbeatUpdatePeriod 3s, written by the reporter of deployment/operator")
	r.expectLine(t, as, "lease", as+" lease OK Lease addon-heartbeat-addon-instance is held by pod operator-pod-0, which is running")
	r.expectMatch(t, as, "heartbeat", `^`+regexp.QuoteMeta(as)+` heartbeat OK last heartbeat [0-6]s ago \(\S+Z\), within 2 periods of 3s$`)
	r.expectLine(t, as, "degraded", as+" degraded OK False AllComponentsAvailable: available: operator")
	r.expectLine(t, as, "installed", as+" installed OK True SetupComplete: every component has been available")
	if last := lastLine(r.stdout); last != "all 14 checks passed" {
		t.Errorf("summary %q", last)
	}

	// -o json: the same checks, all ok, and the verdict.
	j := runCheck(t, "-n", a.ns, "-o", "json")
	j.expectCode(t, check.ExitHealthy)
	got := statuses(t, j)
	if len(got) != 14 {
		t.Errorf("-o json has %d checks, want 14: %v", len(got), got)
	}
	for k, s := range got {
		if s != check.StatusOK {
			t.Errorf("-o json: %s is %s", k, s)
		}
	}
	var doc struct{ Healthy bool }
	if err := json.Unmarshal([]byte(j.stdout), &doc); err != nil || !doc.Healthy {
		t.Errorf("-o json: healthy %v (%v)", doc.Healthy, err)
	}

	// -A checks every namespace: this one and another addon's; without -n
	// or -A, the context's namespace ("default" here, which has no addon).
	b := newCheckedAddon(t, "healthy-b")
	t.Cleanup(func() { b.remove(t) })
	all := runCheck(t, "-A")
	for _, ns := range []string{a.ns, b.ns} {
		d := "deployment " + ns + "/operator"
		all.expectLine(t, d, "injected", strings.ReplaceAll(r.line(ds, "injected"), a.ns, ns))
	}
	def := runCheck(t)
	def.expectCode(t, check.ExitHealthy)
	def.expectLine(t, "deployments", "opted-in", "deployments opted-in SKIP no Deployment opts in in namespace default (-A checks every namespace)")

	// --kubeconfig and --context, with no KUBECONFIG, under the name kubectl
	// runs a plugin by.
	plugin := filepath.Join(t.TempDir(), check.PluginBinary)
	if err := os.Symlink(checkBinary(t), plugin); err != nil {
		t.Fatal(err)
	}
	p := runBinary(t, plugin, "check", "--kubeconfig", cluster.Kubeconfig, "--context", "local", "-n", a.ns)
	p.expectCode(t, check.ExitHealthy)
	p.expectLine(t, ds, "rbac", r.line(ds, "rbac"))
	if u := runBinary(t, plugin); u.code != check.ExitCannotCheck || !strings.Contains(u.stderr, "Usage: kubectl addon-heartbeat check") {
		t.Errorf("usage under the plugin's name: exit %d, %q", u.code, u.stderr)
	}

	// Bad flags, and a cluster that cannot be reached: exit 2, with the reason.
	for args, want := range map[string]string{
		"-o yaml":                        `-o "yaml": expected table or json`,
		"-A -n x":                        "-n and -A: give one or the other",
		"--context nowhere":              `context "nowhere" does not exist`,
		"--kubeconfig " + unreachable(t): "cannot check: listing MutatingWebhookConfigurations",
	} {
		b := runCheck(t, strings.Fields(args)...)
		if b.code != check.ExitCannotCheck || !strings.Contains(b.stderr, want) {
			t.Errorf("check %s: exit %d, stderr %q; want %d and %q", args, b.code, b.stderr, check.ExitCannotCheck, want)
		}
	}
}

// The webhook process down: check says it does not answer, and how to get
// it back; exit status 1.
func TestCheckWebhookDown(t *testing.T) {
	a := newCheckedAddon(t, "webhook-down")
	t.Cleanup(func() { a.remove(t) })
	if err := webhook.Stop(15 * time.Second); err != nil {
		t.Fatal(err)
	}
	r := runCheck(t, "-n", a.ns)
	r.expectCode(t, check.ExitProblems)
	r.expectLine(t, "webhook", "serving", fmt.Sprintf("webhook serving FAIL %s: dial tcp 127.0.0.1:%d: connect: connection refused; "+
		"fix: kubectl -n addon-heartbeat-system rollout status deployment/addon-heartbeat-webhook, and %s", webhookURL(), webhook.Port, logsFix))
	r.expectLine(t, "webhook", "trusted", "webhook trusted SKIP the webhook does not answer")
	expectOnlyFailing(t, r, "webhook serving")

	if err := webhook.Restart(t.Context()); err != nil {
		t.Fatal(err)
	}
	runCheck(t, "-n", a.ns).expectCode(t, check.ExitHealthy)
}

// A caBundle that does not verify the served certificate, and the
// reporter's RoleBinding removed. The webhook's elected replica repairs
// both within milliseconds, so the test first holds the webhook's election
// Lease for a replica that does not exist (as when the leading pod hangs):
// the running webhook still serves, but repairs nothing until the Lease is
// released.
func TestCheckCABundleWrongAndRBACBindingRemoved(t *testing.T) {
	a := newCheckedAddon(t, "trust-rbac")
	t.Cleanup(func() { a.remove(t) })
	holdWebhookLeadership(t)

	// A caBundle of another CA: the API server refuses to call the webhook,
	// and check says why.
	var mwc admissionregistrationv1.MutatingWebhookConfiguration
	if err := cluster.Client.Get(t.Context(), client.ObjectKey{Name: webhookConfig}, &mwc); err != nil {
		t.Fatal(err)
	}
	good := mwc.Webhooks[0].ClientConfig.CABundle
	other, err := certs.NewCA("another-ca", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	setCABundle(t, other.CertPEM)
	err = cluster.Client.Create(t.Context(), addonDeployment(a.ns, "probe", 1, nil), client.DryRunAll)
	if err == nil || !strings.Contains(err.Error(), "x509") {
		t.Fatalf("the API server called the webhook with the wrong caBundle: %v", err)
	}
	r := runCheck(t, "-n", a.ns)
	r.expectCode(t, check.ExitProblems)
	r.expectLine(t, "webhook", "trusted", fmt.Sprintf("webhook trusted FAIL %s: the caBundle does not verify the served certificate: "+
		`it is issued by "addon-heartbeat-webhook-ca", and the caBundle holds "another-ca": the API server refuses to call the webhook; `+
		"fix: the webhook's elected replica rewrites the caBundle from Secret addon-heartbeat-system/addon-heartbeat-webhook-tls within seconds; "+
		"if it stays wrong, see which replica leads and its log: kubectl -n addon-heartbeat-system get lease addon-heartbeat-webhook, and %s", webhookURL(), logsFix))
	expectOnlyFailing(t, r, "webhook trusted")
	setCABundle(t, good)

	// The reporter's RoleBinding deleted: its ServiceAccount may no longer
	// read its AddonInstance.
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: a.ns, Name: "addon-heartbeat-reporter"}}
	if err := cluster.Client.Delete(t.Context(), rb); err != nil {
		t.Fatal(err)
	}
	ds := "deployment " + a.ns + "/operator"
	r = runCheck(t, "-n", a.ns)
	r.expectCode(t, check.ExitProblems)
	r.expectLine(t, ds, "rbac", fmt.Sprintf("%s rbac FAIL ServiceAccount default may not get addoninstances.addons.managed.openshift.io addon-instance: "+
		"RoleBinding %s/addon-heartbeat-reporter is missing; fix: the webhook's elected replica binds the ServiceAccount of each signed record "+
		"while the AddonInstance exists; if it does not within seconds, kubectl -n %s rollout restart deployment/operator (the webhook signs the record again), and %s",
		ds, a.ns, a.ns, logsFix))
	expectOnlyFailing(t, r, ds+" rbac")

	// The Lease released: the webhook leads again, binds the ServiceAccount
	// again, and the reporter heartbeats again.
	releaseWebhookLeadership(t)
	waitHealthy(t, a.ns)
}

// The AddonInstance deleted: check names it and who creates it.
func TestCheckAddonInstanceMissing(t *testing.T) {
	a := newCheckedAddon(t, "no-instance")
	t.Cleanup(func() { a.remove(t) })
	ai := &addonsv1alpha1.AddonInstance{ObjectMeta: metav1.ObjectMeta{Namespace: a.ns, Name: addonInstance}}
	if err := cluster.Client.Delete(t.Context(), ai); err != nil {
		t.Fatal(err)
	}
	as := "addoninstance " + a.ns + "/addon-instance"
	r := runCheck(t, "-n", a.ns)
	r.expectCode(t, check.ExitProblems)
	r.expectLine(t, as, "exists", fmt.Sprintf("%s exists FAIL not found: the reporter of deployment/operator has nothing to write to; "+
		"fix: the addon-operator creates it when it installs the addon; or set addon-heartbeat.io/addon-instance on deployment/operator "+
		"to an AddonInstance that exists (kubectl -n %s get addoninstances)", as, a.ns))
	for _, c := range []string{"lease", "heartbeat", "degraded", "installed"} {
		r.expectLine(t, as, c, as+" "+c+" SKIP no AddonInstance")
	}

	// Back: the reporter, which waited, heartbeats again.
	ai = &addonsv1alpha1.AddonInstance{ObjectMeta: metav1.ObjectMeta{Namespace: a.ns, Name: addonInstance},
		Spec: addonsv1alpha1.AddonInstanceSpec{HeartbeatUpdatePeriod: metav1.Duration{Duration: checkPeriod}}}
	if err := cluster.Client.Create(t.Context(), ai); err != nil {
		t.Fatal(err)
	}
	waitHealthy(t, a.ns)
}

// An opted-in Deployment admitted while the webhook was down under
// failurePolicy Ignore has no reporter: check says so and that a rollout
// restart injects it, which it does.
func TestCheckReporterNotInjected(t *testing.T) {
	ns := newNamespace(t, "not-injected")
	ai := &addonsv1alpha1.AddonInstance{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: addonInstance},
		Spec: addonsv1alpha1.AddonInstanceSpec{HeartbeatUpdatePeriod: metav1.Duration{Duration: checkPeriod}}}
	if err := cluster.Client.Create(t.Context(), ai); err != nil {
		t.Fatal(err)
	}
	setFailurePolicy(t, admissionregistrationv1.Ignore)
	if err := webhook.Stop(15 * time.Second); err != nil {
		t.Fatal(err)
	}
	d := addonDeployment(ns, "operator", 1, nil)
	err := cluster.Client.Create(t.Context(), d)
	if rerr := webhook.Restart(t.Context()); rerr != nil {
		t.Fatal(rerr)
	}
	setFailurePolicy(t, admissionregistrationv1.Fail)
	if err != nil {
		t.Fatal(err)
	}
	a := &checkedAddon{ns: ns, d: d}
	t.Cleanup(func() { a.remove(t) })

	ds, as := "deployment "+ns+"/operator", "addoninstance "+ns+"/addon-instance"
	r := runCheck(t, "-n", ns)
	r.expectCode(t, check.ExitProblems)
	r.expectLine(t, ds, "injected", fmt.Sprintf("%s injected FAIL no heartbeat-reporter container in the pod template: it was admitted without the webhook "+
		"(created before the webhook was installed, or while it was down with failurePolicy Ignore); "+
		"fix: kubectl -n %s rollout restart deployment/operator (the webhook injects the reporter into this update)", ds, ns))
	r.expectLine(t, ds, "rbac", ds+" rbac SKIP not injected")
	r.expectLine(t, as, "heartbeat", as+" heartbeat SKIP no injected Deployment reports to it")
	expectOnlyFailing(t, r, ds+" injected")

	// The fix it gives: what `kubectl rollout restart` writes.
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var cur appsv1.Deployment
		if err := cluster.Client.Get(t.Context(), client.ObjectKeyFromObject(d), &cur); err != nil {
			return err
		}
		if cur.Spec.Template.Annotations == nil {
			cur.Spec.Template.Annotations = map[string]string{}
		}
		cur.Spec.Template.Annotations["kubectl.kubernetes.io/restartedAt"] = time.Now().Format(time.RFC3339)
		return cluster.Client.Update(t.Context(), &cur)
	})
	if err != nil {
		t.Fatal(err)
	}
	r = runCheck(t, "-n", ns)
	r.expectLine(t, ds, "injected", ds+" injected OK heartbeat-reporter as a native sidecar, for AddonInstance addon-instance, running as ServiceAccount default")
}

// The reporter killed and its pod gone: the Lease names a pod that does
// not exist and the heartbeat times out; a new pod takes over.
func TestCheckStaleHeartbeat(t *testing.T) {
	a := newCheckedAddon(t, "stale")
	t.Cleanup(func() { a.remove(t) })
	if err := a.reporters[0].Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-a.reporters[0].Done()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: a.ns, Name: a.pods[0]}}
	if err := cluster.Client.Delete(t.Context(), pod, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	// Over 3 periods since the last heartbeat (one second more for the
	// second resolution of lastHeartbeatTime).
	waitFor(t, "the heartbeat to be 3 periods old", 30*time.Second, func(ctx context.Context) (bool, error) {
		var ai addonsv1alpha1.AddonInstance
		if err := cluster.Client.Get(ctx, client.ObjectKey{Namespace: a.ns, Name: addonInstance}, &ai); err != nil {
			return false, err
		}
		return time.Since(ai.Status.LastHeartbeatTime.Time) > 3*checkPeriod+time.Second, nil
	})
	as := "addoninstance " + a.ns + "/addon-instance"
	logs := fmt.Sprintf("kubectl -n %s logs deployment/operator -c heartbeat-reporter", a.ns)
	r := runCheck(t, "-n", a.ns)
	r.expectCode(t, check.ExitProblems)
	r.expectLine(t, as, "lease", fmt.Sprintf("%s lease FAIL Lease addon-heartbeat-addon-instance is held by pod operator-pod-0, which does not exist: "+
		"a standby reporter takes over within 1.5 periods, if one runs; fix: kubectl -n %s get pods, and %s", as, a.ns, logs))
	r.expectMatch(t, as, "heartbeat", `^`+regexp.QuoteMeta(as)+` heartbeat FAIL last heartbeat \d+s ago \(\S+Z\), over 3 periods of 3s: `+
		`the addon-operator reports HeartbeatTimeout; fix: `+regexp.QuoteMeta(logs)+`$`)
	expectOnlyFailing(t, r, as+" lease", as+" heartbeat")

	// A new pod: its reporter takes the Lease over and heartbeats.
	a.startPod(t, "operator-pod-1")
	waitHealthy(t, a.ns)
}

// servingCert is the certificate the webhook serves, from its Secret.
func servingCert(t *testing.T) *x509.Certificate {
	t.Helper()
	var s corev1.Secret
	if err := cluster.Client.Get(t.Context(), client.ObjectKey{Namespace: webhookNS, Name: "addon-heartbeat-webhook-tls"}, &s); err != nil {
		t.Fatal(err)
	}
	c, err := certs.ParseCert(s.Data[certrotator.KeyCert])
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// expectMatch fails unless the row for scope and check matches pattern.
func (r result) expectMatch(t *testing.T, scope, check, pattern string) {
	t.Helper()
	if got := r.line(scope, check); !regexp.MustCompile(pattern).MatchString(got) {
		t.Errorf("line %s %s:\n got: %s\nwant: %s\nfull output:\n%s%s", scope, check, got, pattern, r.stdout, r.stderr)
	}
}

// expectOnlyFailing fails unless exactly the rows named (scope and check)
// failed: the fault is reported where it is and nowhere else.
func expectOnlyFailing(t *testing.T, r result, rows ...string) {
	t.Helper()
	var failing []string
	for _, l := range strings.Split(r.stdout, "\n") {
		f := strings.Fields(l)
		for i := 1; i+1 < len(f); i++ {
			if f[i+1] == "FAIL" && (i == 1 || i == 2) {
				failing = append(failing, strings.Join(f[:i+1], " "))
				break
			}
		}
	}
	if !slices.Equal(failing, rows) {
		t.Errorf("failing rows %q, want %q; output:\n%s", failing, rows, r.stdout)
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// waitHealthy waits until check of ns passes: a repaired fault is no longer
// reported.
func waitHealthy(t *testing.T, ns string) {
	t.Helper()
	var last result
	waitFor(t, "check -n "+ns+" to pass", time.Minute, func(context.Context) (bool, error) {
		last = runCheck(t, "-n", ns)
		return last.code == check.ExitHealthy, nil
	})
	_ = last
}

// unreachable writes a kubeconfig for an API server that is not there.
func unreachable(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(cluster.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	port := strings.TrimPrefix(cluster.Config.Host, "https://127.0.0.1:")
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, []byte(strings.ReplaceAll(string(data), "127.0.0.1:"+port, "127.0.0.1:1")), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func setCABundle(t *testing.T, pem []byte) {
	t.Helper()
	updateWebhookConfig(t, func(mwc *admissionregistrationv1.MutatingWebhookConfiguration) {
		mwc.Webhooks[0].ClientConfig.CABundle = pem
	})
}

func setFailurePolicy(t *testing.T, p admissionregistrationv1.FailurePolicyType) {
	t.Helper()
	updateWebhookConfig(t, func(mwc *admissionregistrationv1.MutatingWebhookConfiguration) {
		mwc.Webhooks[0].FailurePolicy = &p
	})
}

func updateWebhookConfig(t *testing.T, change func(*admissionregistrationv1.MutatingWebhookConfiguration)) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var mwc admissionregistrationv1.MutatingWebhookConfiguration
		if err := cluster.Client.Get(t.Context(), client.ObjectKey{Name: webhookConfig}, &mwc); err != nil {
			return err
		}
		change(&mwc)
		return cluster.Client.Update(t.Context(), &mwc)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// holdWebhookLeadership stops the webhook (which releases its election
// Lease), gives the Lease to a replica that does not exist for an hour, and
// starts the webhook again: it serves, but runs none of the controllers
// that repair things.
func holdWebhookLeadership(t *testing.T) {
	t.Helper()
	if err := webhook.Stop(15 * time.Second); err != nil {
		t.Fatal(err)
	}
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var l coordinationv1.Lease
		err := cluster.Client.Get(t.Context(), client.ObjectKey{Namespace: webhookNS, Name: webhookLease}, &l)
		if apierrors.IsNotFound(err) {
			l = coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: webhookNS, Name: webhookLease}}
		} else if err != nil {
			return err
		}
		now := metav1.NowMicro()
		l.Spec = coordinationv1.LeaseSpec{HolderIdentity: ptr.To("replica-elsewhere"), LeaseDurationSeconds: ptr.To(int32(3600)),
			AcquireTime: &now, RenewTime: &now}
		if l.ResourceVersion == "" {
			return cluster.Client.Create(t.Context(), &l)
		}
		return cluster.Client.Update(t.Context(), &l)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := webhook.Restart(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { releaseWebhookLeadership(t) })
}

// releaseWebhookLeadership deletes the webhook's election Lease while the
// replica that does not exist holds it, so that the running webhook takes it
// at its next try. A Lease the webhook holds is left alone: deleting it
// would make the webhook exit, as a leader that lost its Lease does.
func releaseWebhookLeadership(t *testing.T) {
	t.Helper()
	ctx := context.WithoutCancel(t.Context())
	var l coordinationv1.Lease
	err := cluster.Client.Get(ctx, client.ObjectKey{Namespace: webhookNS, Name: webhookLease}, &l)
	if apierrors.IsNotFound(err) || (err == nil && ptr.Deref(l.Spec.HolderIdentity, "") != "replica-elsewhere") {
		return
	}
	if err == nil {
		err = cluster.Client.Delete(ctx, &l, client.Preconditions{ResourceVersion: &l.ResourceVersion})
	}
	if err != nil {
		t.Error(err)
	}
}

// The command's binary and the webhook's Deployment object, made once for
// the tests that need them.
var (
	checkBin     string
	checkBinErr  error
	checkBinOnce sync.Once

	webhookDeploymentErr  error
	webhookDeploymentOnce sync.Once
)

func checkBinary(t *testing.T) string {
	t.Helper()
	checkBinOnce.Do(func() {
		var b map[string]string
		b, checkBinErr = localcluster.Build(cluster.Dir, os.Stderr, "./cmd/addon-heartbeat")
		checkBin = b["addon-heartbeat"]
	})
	if checkBinErr != nil {
		t.Fatal(checkBinErr)
	}
	return checkBin
}

// ensureWebhookDeployment creates the chart's webhook Deployment, rendered
// with the suite's values and the reporter image the webhook process
// injects, with the status the controller-manager would give it.
func ensureWebhookDeployment(t *testing.T) {
	t.Helper()
	webhookDeploymentOnce.Do(func() { webhookDeploymentErr = createWebhookDeployment(context.Background()) })
	if webhookDeploymentErr != nil {
		t.Fatal(webhookDeploymentErr)
	}
}

func createWebhookDeployment(ctx context.Context) error {
	objs, _, err := chart.Render(chart.DefaultRelease, suiteValues)
	if err != nil {
		return err
	}
	o := chart.Find(objs, "Deployment", "addon-heartbeat-webhook")
	if o == nil {
		return errors.New("the chart renders no Deployment addon-heartbeat-webhook")
	}
	var d appsv1.Deployment
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &d); err != nil {
		return fmt.Errorf("reading the chart's Deployment: %w", err)
	}
	args := d.Spec.Template.Spec.Containers[0].Args
	i := slices.IndexFunc(args, func(a string) bool { return strings.HasPrefix(a, "--reporter-image=") })
	if i < 0 {
		return errors.New("the chart's webhook has no --reporter-image")
	}
	args[i] = "--reporter-image=" + reporterImage
	if err := cluster.Client.Create(ctx, &d); err != nil {
		return fmt.Errorf("creating the webhook Deployment: %w", err)
	}
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		var cur appsv1.Deployment
		if err := cluster.Client.Get(ctx, client.ObjectKeyFromObject(&d), &cur); err != nil {
			return false, nil
		}
		n := *cur.Spec.Replicas
		cur.Status = appsv1.DeploymentStatus{ObservedGeneration: cur.Generation, Replicas: n, UpdatedReplicas: n, ReadyReplicas: n, AvailableReplicas: n}
		return cluster.Client.Status().Update(ctx, &cur) == nil, nil
	})
}

// result is what one run of the command printed and returned.
type result struct {
	stdout, stderr string
	code           int
}

// runCheck runs `addon-heartbeat check args...` with the admin kubeconfig
// in KUBECONFIG.
func runCheck(t *testing.T, args ...string) result {
	t.Helper()
	return runBinary(t, checkBinary(t), append([]string{"check"}, args...)...)
}

func runBinary(t *testing.T, bin string, args ...string) result {
	t.Helper()
	ensureWebhookDeployment(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = []string{"KUBECONFIG=" + cluster.Kubeconfig, "HOME=" + t.TempDir(), "PATH=" + os.Getenv("PATH")}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if exit, ok := errors.AsType[*exec.ExitError](err); ok {
		code = exit.ExitCode()
	} else if err != nil {
		t.Fatalf("running %s: %v", filepath.Base(bin), err)
	}
	return result{stdout: stdout.String(), stderr: stderr.String(), code: code}
}

// line is the table row for scope and check, its columns joined by single
// spaces; "" when there is none.
func (r result) line(scope, check string) string {
	prefix := scope + " " + check + " "
	for _, l := range strings.Split(r.stdout, "\n") {
		if l = strings.Join(strings.Fields(l), " "); strings.HasPrefix(l, prefix) {
			return l
		}
	}
	return ""
}

// expectLine fails unless the row for scope and check is exactly want.
func (r result) expectLine(t *testing.T, scope, check, want string) {
	t.Helper()
	if got := r.line(scope, check); got != want {
		t.Errorf("line %s %s:\n got: %s\nwant: %s\nfull output:\n%s%s", scope, check, got, want, r.stdout, r.stderr)
	}
}

func (r result) expectCode(t *testing.T, code int) {
	t.Helper()
	if r.code != code {
		t.Errorf("exit status %d, want %d; output:\n%s%s", r.code, code, r.stdout, r.stderr)
	}
}

// statuses are the status of each scope and check of a JSON report.
func statuses(t *testing.T, r result) map[string]check.Status {
	t.Helper()
	var doc struct {
		Checks []check.Result `json:"checks"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &doc); err != nil {
		t.Fatalf("-o json printed no JSON report: %v\n%s%s", err, r.stdout, r.stderr)
	}
	out := map[string]check.Status{}
	for _, c := range doc.Checks {
		out[c.Scope+" "+c.Check] = c.Status
	}
	return out
}

// checkedAddon is an opted-in Deployment, its pods and their reporters.
type checkedAddon struct {
	ns        string
	d         *appsv1.Deployment
	reporters []*localcluster.Reporter
	pods      []string
}

// newCheckedAddon creates a namespace with an AddonInstance heartbeating
// every checkPeriod and an opted-in Deployment with one pod, and waits for
// Installed=True.
func newCheckedAddon(t *testing.T, prefix string) *checkedAddon {
	t.Helper()
	a := &checkedAddon{ns: newNamespace(t, prefix)}
	createAddonInstance(t, a.ns, addonInstance, checkPeriod)
	rec := recordHeartbeats(t, a.ns, addonInstance)
	a.d = createInjected(t, addonDeployment(a.ns, "operator", 1, nil))
	setAvailable(t, a.d, 1)
	a.startPod(t, "operator-pod-0")
	rec.waitCondition(t, installed, metav1.ConditionTrue, 30*time.Second)
	rec.waitCondition(t, degraded, metav1.ConditionFalse, 30*time.Second)
	return a
}

// startPod creates a pod of the Deployment, Running and Ready as the
// kubelet would report it, and runs its reporter.
func (a *checkedAddon) startPod(t *testing.T, name string) {
	t.Helper()
	ctx := t.Context()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: a.ns, Name: name, Labels: a.d.Spec.Template.Labels},
		Spec:       *a.d.Spec.Template.Spec.DeepCopy(),
	}
	pod.Spec.NodeName = "local"
	if err := cluster.Client.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	now := metav1.Now()
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, StartTime: &now,
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now}}}
	if err := cluster.Client.Status().Update(ctx, pod); err != nil {
		t.Fatal(err)
	}
	r, err := cluster.StartReporter(ctx, bins["reporter"], a.d, name, nil)
	if err != nil {
		t.Fatal(err)
	}
	a.reporters = append(a.reporters, r)
	a.pods = append(a.pods, name)
	t.Cleanup(func() {
		if err := r.Stop(15 * time.Second); err != nil {
			t.Errorf("%v (log %s)", err, r.LogPath)
		}
	})
}

// remove stops the reporters and deletes the Deployment and its pods
// (there is no namespace controller to empty a deleted namespace).
func (a *checkedAddon) remove(t *testing.T) {
	t.Helper()
	for _, r := range a.reporters {
		if err := r.Stop(15 * time.Second); err != nil {
			t.Error(err)
		}
	}
	objs := []client.Object{&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: a.ns, Name: a.d.Name}}}
	for _, p := range a.pods {
		objs = append(objs, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: a.ns, Name: p}})
	}
	for _, o := range objs {
		if err := client.IgnoreNotFound(cluster.Client.Delete(context.WithoutCancel(t.Context()), o, client.GracePeriodSeconds(0))); err != nil {
			t.Error(err)
		}
	}
}

// waitFor polls cond until it holds, failing the test after timeout.
func waitFor(t *testing.T, what string, timeout time.Duration, cond func(ctx context.Context) (bool, error)) {
	t.Helper()
	var last error
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		ok, err := cond(ctx)
		last = err
		return ok && err == nil, nil
	})
	if err != nil {
		t.Fatalf("waiting %s for %s: %v (last error: %v)", timeout, what, err, last)
	}
}
