package check

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	addonsv1alpha1 "github.com/openshift/addon-operator/apis/addons/v1alpha1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/addon-heartbeat/addon-heartbeat/internal/chart"
	"github.com/addon-heartbeat/addon-heartbeat/internal/logging"
	"github.com/addon-heartbeat/addon-heartbeat/internal/testenv"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/inject"
)

// The cases a running webhook and reporters cannot easily make (test/e2e
// covers those), on a real API server with the chart's objects installed as
// rendered: a webhook behind a Service, and workloads in every state. No
// webhook serves here: the chart's configuration is installed with
// failurePolicy Ignore, so Deployments are admitted as sent, and the
// injected ones are made by the injector itself (pkg/inject).
var (
	env *testenv.Environment
	k8s client.Client
	// chartObjs are the chart's objects as rendered with chartValues.
	chartObjs []*unstructured.Unstructured
	// chartImage is the reporter image the chart's webhook injects.
	chartImage string
)

const (
	excludedLabel = "check.example.com/excluded"
	releaseNS     = "addon-heartbeat-system"
	webhookDeploy = "addon-heartbeat-webhook"
	webhookLogs   = "kubectl -n addon-heartbeat-system logs deployment/addon-heartbeat-webhook"
)

var chartValues = map[string]any{"webhook": map[string]any{
	"failurePolicy": "Ignore",
	// Nothing answers: fail fast.
	"timeoutSeconds":    1,
	"namespaceSelector": map[string]any{"matchExpressions": []any{map[string]any{"key": excludedLabel, "operator": "DoesNotExist"}}},
}}

func TestMain(m *testing.M) {
	os.Exit(testenv.RunSuite(m, logging.LevelError, testenv.Options{}, func(s *testenv.Suite) (func() error, error) {
		env, k8s = s.Env, s.Client
		return nil, installChart(context.Background())
	}))
}

// installChart creates the chart's objects that check reads: the webhook
// configuration, Service and Deployment, and the RBAC.
func installChart(ctx context.Context) error {
	var err error
	if chartObjs, _, err = chart.Render(chart.DefaultRelease, chartValues); err != nil {
		return err
	}
	if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: releaseNS}}); err != nil {
		return err
	}
	for _, o := range chartObjs {
		switch o.GetKind() {
		case "MutatingWebhookConfiguration", "Service", "Deployment", "ClusterRole", "ServiceAccount":
			if err := k8s.Create(ctx, o.DeepCopy()); err != nil {
				return fmt.Errorf("creating %s: %w", chart.Key(o), err)
			}
		}
		if o.GetKind() == "Deployment" {
			args, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
			for _, a := range args[0].(map[string]any)["args"].([]any) {
				if v, ok := strings.CutPrefix(a.(string), "--reporter-image="); ok {
					chartImage = v
				}
			}
		}
	}
	if chartImage == "" {
		return fmt.Errorf("the chart's webhook has no --reporter-image")
	}
	return nil
}

// run checks scope with the local clock fixed at now.
func run(t *testing.T, c *Checker, ns string) Report {
	t.Helper()
	r, err := c.Run(t.Context(), Scope{Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	// Every line that fails or warns says how to fix it.
	for _, res := range r.Results {
		if (res.Status == StatusFail || res.Status == StatusWarn) && res.Fix == "" {
			t.Errorf("%s %s is %s without a fix: %s", res.Scope, res.Check, res.Status, res.Message)
		}
	}
	return r
}

// expect fails unless report has the result for scope and check, with
// status, message and fix.
func expect(t *testing.T, r Report, scope, check string, status Status, message, fix string) {
	t.Helper()
	for _, res := range r.Results {
		if res.Scope == scope && res.Check == check {
			if res.Status != status || res.Message != message || res.Fix != fix {
				t.Errorf("%s %s:\n got: %s %q (fix %q)\nwant: %s %q (fix %q)", scope, check, res.Status, res.Message, res.Fix, status, message, fix)
			}
			return
		}
	}
	t.Errorf("no result for %s %s in %+v", scope, check, r.Results)
}

// A webhook behind a Service: serving is its ready endpoints; its
// certificate is read from a pod, through a port-forward.
func TestWebhookBehindService(t *testing.T) {
	c := &Checker{Client: k8s}
	r := run(t, c, "default")
	expect(t, r, "webhook", "configuration", StatusOK, "MutatingWebhookConfiguration addon-heartbeat has the webhook inject.addon-heartbeat.io", "")
	expect(t, r, "webhook", "deployment", StatusOK, "Deployment addon-heartbeat-system/addon-heartbeat-webhook injects reporter image "+chartImage, "")
	expect(t, r, "webhook", "serving", StatusFail,
		"Service addon-heartbeat-system/addon-heartbeat-webhook has no ready endpoint (0 not ready): no webhook pod is ready to answer the API server",
		"kubectl -n addon-heartbeat-system rollout status deployment/addon-heartbeat-webhook, and "+webhookLogs)
	expect(t, r, "webhook", "trusted", StatusSkip, "no webhook pod is ready", "")
	expect(t, r, "webhook", "failurePolicy", StatusWarn,
		"Ignore: while the webhook is down, opted-in Deployments are admitted without their reporter, and stop heartbeating at their next rollout",
		"set the chart value webhook.failurePolicy=Fail, unless admitting Deployments matters more than their heartbeat")

	// The endpoints the EndpointSlice controller would publish for three
	// webhook pods, one of them not ready.
	ep := func(pod string, ready bool) discoveryv1.Endpoint {
		return discoveryv1.Endpoint{Addresses: []string{"10.1.0.1"}, Conditions: discoveryv1.EndpointConditions{Ready: &ready},
			TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: releaseNS, Name: pod}}
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: releaseNS, Name: "addon-heartbeat-webhook-x1", Labels: map[string]string{discoveryv1.LabelServiceName: "addon-heartbeat-webhook"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("webhook"), Port: ptr.To(int32(9443))}},
		Endpoints:   []discoveryv1.Endpoint{ep("webhook-b", true), ep("webhook-c", false), ep("webhook-a", true)},
	}
	if err := k8s.Create(t.Context(), slice); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), slice) })
	r = run(t, c, "default")
	expect(t, r, "webhook", "serving", StatusOK, "Service addon-heartbeat-system/addon-heartbeat-webhook: 2 of 3 endpoints ready (webhook-a, webhook-b)", "")
	expect(t, r, "webhook", "trusted", StatusSkip, "not connecting to the webhook pods", "")

	// With port-forwards: there is no kubelet (nor pod) here, so the API
	// server refuses, and check says what it needs.
	c.Pods = PortForwarder{Config: env.Config}
	r = run(t, c, "default")
	for _, res := range r.Results {
		if res.Scope == "webhook" && res.Check == "trusted" {
			if res.Status != StatusWarn || !strings.HasPrefix(res.Message, "could not read the certificate pod webhook-a serves on port 9443: ") ||
				res.Fix != "check reads it through a port-forward, which must work as for kubectl -n addon-heartbeat-system port-forward pod/webhook-a 9443 (it needs create on pods/portforward there)" {
				t.Errorf("trusted: %+v", res)
			}
		}
	}
}

// Workloads in each state check tells apart, each in a namespace of its own.
func TestWorkloads(t *testing.T) {
	now := time.Now().Truncate(time.Second)
	c := &Checker{Client: k8s, Now: func() time.Time { return now }}

	t.Run("opted in by label, in a namespace the webhook does not serve", func(t *testing.T) {
		ns := namespace(t, map[string]string{excludedLabel: "yes"})
		d := deployment(ns, "operator", nil)
		d.Labels = map[string]string{"addon-heartbeat.io/inject": "true"}
		create(t, d)
		r := run(t, c, ns)
		expect(t, r, "deployment "+ns+"/operator", "injected", StatusFail,
			"no heartbeat-reporter container in the pod template: the webhook's namespaceSelector leaves namespace "+ns+" out",
			"change the chart value webhook.namespaceSelector or the namespace's labels, then kubectl -n "+ns+" rollout restart deployment/operator")
		expect(t, r, "deployment "+ns+"/operator", "rbac", StatusSkip, "not injected", "")
	})

	t.Run("opted in by pod-template annotation, admitted without the webhook", func(t *testing.T) {
		ns := namespace(t, nil)
		d := deployment(ns, "operator", nil)
		d.Spec.Template.Annotations = map[string]string{"addon-heartbeat.io/inject": "true"}
		create(t, d)
		instance(t, ns, "addon-instance", 3*time.Second)
		r := run(t, c, ns)
		expect(t, r, "deployment "+ns+"/operator", "injected", StatusFail,
			"no heartbeat-reporter container in the pod template: it was admitted without the webhook (created before the webhook was installed, or while it was down with failurePolicy Ignore)",
			"kubectl -n "+ns+" rollout restart deployment/operator (the webhook injects the reporter into this update)")
		expect(t, r, "addoninstance "+ns+"/addon-instance", "exists", StatusOK, "heartbeatUpdatePeriod 3s, written by the reporter of deployment/operator", "")
		expect(t, r, "addoninstance "+ns+"/addon-instance", "heartbeat", StatusSkip, "no injected Deployment reports to it", "")
	})

	t.Run("conflicting opt-in", func(t *testing.T) {
		ns := namespace(t, nil)
		d := deployment(ns, "operator", map[string]string{"addon-heartbeat.io/inject": "true"})
		d.Labels = map[string]string{"addon-heartbeat.io/inject": "false"}
		create(t, d)
		r := run(t, c, ns)
		expect(t, r, "deployment "+ns+"/operator", "settings", StatusFail,
			`addon-heartbeat.io/inject is "true" in the Deployment's annotations and "false" in the Deployment's labels: set it in one place, or to the same value in each`,
			"correct the value (kubectl -n "+ns+" edit deployment/operator); the webhook refuses the Deployment's next update until then")
		expect(t, r, "deployments", "opted-in", StatusSkip, "no Deployment opts in in namespace "+ns+" (-A checks every namespace)", "")
	})

	t.Run("an outdated reporter, for an AddonInstance the reporter role does not allow", func(t *testing.T) {
		ns := namespace(t, nil)
		injected(t, ns, "custom", "addon-heartbeat/reporter:old")
		instance(t, ns, "custom", 3*time.Second)
		bindReporter(t, ns)
		ds := "deployment " + ns + "/operator"
		r := run(t, c, ns)
		expect(t, r, ds, "injected", StatusOK, "heartbeat-reporter as a native sidecar, for AddonInstance custom, running as ServiceAccount operator-sa", "")
		expect(t, r, ds, "reporterImage", StatusWarn,
			"addon-heartbeat/reporter:old, not the image the webhook injects now ("+chartImage+"): the webhook updates it at the Deployment's next update",
			"kubectl -n "+ns+" rollout restart deployment/operator")
		expect(t, r, ds, "rbac", StatusFail,
			"ServiceAccount operator-sa may not get addoninstances.addons.managed.openshift.io custom: the reporter role allows only AddonInstances addon-instance",
			"add custom to the chart value reporter.addonInstanceNames")
	})

	t.Run("a late heartbeat, a degraded addon, the Lease held by a pending pod", func(t *testing.T) {
		ns := namespace(t, nil)
		injected(t, ns, "addon-instance", chartImage)
		ai := instance(t, ns, "addon-instance", 3*time.Second)
		bindReporter(t, ns)
		ai.Status = addonsv1alpha1.AddonInstanceStatus{LastHeartbeatTime: metav1.NewTime(now.Add(-7 * time.Second)), Conditions: []metav1.Condition{
			{Type: "addons.managed.openshift.io/Degraded", Status: metav1.ConditionTrue, Reason: "DeploymentUnavailable", Message: "operator 0/1 available", LastTransitionTime: metav1.NewTime(now)},
			{Type: "addons.managed.openshift.io/Installed", Status: metav1.ConditionFalse, Reason: "Blocked", Message: "not every component has been available", LastTransitionTime: metav1.NewTime(now)},
		}}
		if err := k8s.Status().Update(t.Context(), ai); err != nil {
			t.Fatal(err)
		}
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "operator-1"},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "manager", Image: "example.com/operator:v1"}}}}
		create(t, pod)
		lease(t, ns, ptr.To("operator-1_2b0f7c9e-8f2d-4c1e-9b1a-3c4d5e6f7a8b"))
		as := "addoninstance " + ns + "/addon-instance"
		r := run(t, c, ns)
		expect(t, r, "deployment "+ns+"/operator", "rbac", StatusOK,
			"ServiceAccount operator-sa may do everything the reporter does: AddonInstance addon-instance and its status, Lease addon-heartbeat-addon-instance, list Deployments", "")
		expect(t, r, as, "lease", StatusFail, "Lease addon-heartbeat-addon-instance is held by pod operator-1, which is Pending, not running",
			"kubectl -n "+ns+" describe pod operator-1")
		expect(t, r, as, "heartbeat", StatusWarn,
			fmt.Sprintf("last heartbeat 7s ago (%s), over 2 periods of 3s: late", now.Add(-7*time.Second).UTC().Format(time.RFC3339)),
			"kubectl -n "+ns+" logs pod/operator-1 -c heartbeat-reporter")
		expect(t, r, as, "degraded", StatusWarn, "True DeploymentUnavailable: operator 0/1 available",
			"the addon is degraded, not its heartbeat: see the components named (kubectl -n "+ns+" get deployments)")
		expect(t, r, as, "installed", StatusWarn, "False Blocked: not every component has been available",
			"Installed turns True once every component has been available: kubectl -n "+ns+" get deployments")
	})

	t.Run("a period under the reporter's floor, a Lease without holder", func(t *testing.T) {
		ns := namespace(t, nil)
		injected(t, ns, "addon-instance", chartImage)
		instance(t, ns, "addon-instance", 0)
		lease(t, ns, nil)
		as := "addoninstance " + ns + "/addon-instance"
		logs := "kubectl -n " + ns + " logs deployment/operator -c heartbeat-reporter"
		r := run(t, c, ns)
		expect(t, r, as, "lease", StatusFail, "Lease addon-heartbeat-addon-instance has no holder: no reporter leads", logs)
		expect(t, r, as, "heartbeat", StatusFail,
			"heartbeatUpdatePeriod 0s is under the reporter's floor of 1s: the addon-operator times the addon out after 3 x 0s whatever the reporter does",
			"set spec.heartbeatUpdatePeriod to 1s or more where the addon-operator takes it from (the Addon)")
		expect(t, r, as, "degraded", StatusSkip, "not written: no heartbeat yet", "")
	})

	t.Run("no Lease, no heartbeat, no AddonInstance API object", func(t *testing.T) {
		ns := namespace(t, nil)
		injected(t, ns, "addon-instance", chartImage)
		instance(t, ns, "addon-instance", 3*time.Second)
		as := "addoninstance " + ns + "/addon-instance"
		r := run(t, c, ns)
		expect(t, r, as, "lease", StatusFail,
			"election Lease addon-heartbeat-addon-instance not found: no reporter can lead (reporters may not create it; the webhook does)",
			"the webhook's elected replica creates it for each AddonInstance with an injected Deployment; see its log")
		expect(t, r, as, "heartbeat", StatusFail, "no heartbeat yet", "kubectl -n "+ns+" logs deployment/operator -c heartbeat-reporter")
		expect(t, r, "deployment "+ns+"/operator", "rbac", StatusFail,
			"ServiceAccount operator-sa may not get addoninstances.addons.managed.openshift.io addon-instance: RoleBinding "+ns+"/addon-heartbeat-reporter is missing",
			"the webhook's elected replica binds the ServiceAccount of each signed record while the AddonInstance exists; if it does not within seconds, "+
				"kubectl -n "+ns+" rollout restart deployment/operator (the webhook signs the record again), and "+webhookLogs)
	})
}

// No webhook configuration, and two of them.
func TestConfigurations(t *testing.T) {
	c := &Checker{Client: k8s}
	var mwc admissionregistrationv1.MutatingWebhookConfiguration
	if err := k8s.Get(t.Context(), client.ObjectKey{Name: "addon-heartbeat"}, &mwc); err != nil {
		t.Fatal(err)
	}
	second := &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "addon-heartbeat-second"}, Webhooks: mwc.Webhooks}
	create(t, second)
	r := run(t, c, "default")
	expect(t, r, "webhook", "configuration", StatusFail,
		"2 MutatingWebhookConfigurations have the webhook inject.addon-heartbeat.io (addon-heartbeat, addon-heartbeat-second): two installations inject the same Deployments; checking addon-heartbeat",
		"keep one installation: helm uninstall the other release, or kubectl delete mutatingwebhookconfiguration addon-heartbeat-second")
	if err := k8s.Delete(t.Context(), second); err != nil {
		t.Fatal(err)
	}

	// Without matchConditions every Deployment of the served namespaces
	// waits on the webhook.
	bare := mwc.DeepCopy()
	bare.Webhooks[0].MatchConditions = nil
	if err := k8s.Update(t.Context(), bare); err != nil {
		t.Fatal(err)
	}
	r = run(t, c, "default")
	expect(t, r, "webhook", "matchConditions", StatusFail,
		"none: the API server calls the webhook for every Deployment of the served namespaces, so all of them wait on it (and fail while it is down, with failurePolicy Fail)",
		"install the chart's configuration, which only sends opted-in Deployments (Kubernetes 1.30+): "+installFix)
	bare.Webhooks[0].MatchConditions = mwc.Webhooks[0].MatchConditions
	if err := k8s.Update(t.Context(), bare); err != nil {
		t.Fatal(err)
	}
	mwc = *bare

	ns := namespace(t, nil)
	create(t, deployment(ns, "operator", map[string]string{"addon-heartbeat.io/inject": "true"}))
	if err := k8s.Delete(t.Context(), &mwc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		mwc.ResourceVersion = ""
		if err := k8s.Create(context.Background(), &mwc); err != nil {
			t.Error(err)
		}
	})
	r = run(t, c, ns)
	expect(t, r, "webhook", "configuration", StatusFail,
		"no MutatingWebhookConfiguration has the webhook inject.addon-heartbeat.io: opted-in Deployments are not injected", installFix)
	expect(t, r, "deployment "+ns+"/operator", "injected", StatusFail, "no heartbeat-reporter container in the pod template: no webhook is installed", installFix)
	// No other webhook check can run without a configuration.
	if n := len(r.Results); n != 1+3+5 {
		t.Errorf("%d results, want the configuration's, the Deployment's 3 and the AddonInstance's 5: %+v", n, r.Results)
	}
}

// The webhook's name in the chart is the one check looks for.
func TestWebhookName(t *testing.T) {
	o := chart.Find(chartObjs, "MutatingWebhookConfiguration", "addon-heartbeat")
	hooks, _, _ := unstructured.NestedSlice(o.Object, "webhooks")
	if len(hooks) != 1 || hooks[0].(map[string]any)["name"] != WebhookName {
		t.Errorf("the chart's webhooks %v, want one named %s", hooks, WebhookName)
	}
}

func namespace(t *testing.T, labels map[string]string) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "check-", Labels: labels}}
	create(t, ns)
	return ns.Name
}

func create(t *testing.T, o client.Object) {
	t.Helper()
	if err := k8s.Create(t.Context(), o); err != nil {
		t.Fatal(err)
	}
}

func deployment(ns, name string, annots map[string]string) *appsv1.Deployment {
	labels := map[string]string{"app": name}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: annots},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{ServiceAccountName: "operator-sa",
					Containers: []corev1.Container{{Name: "manager", Image: "example.com/" + name + ":v1"}}},
			},
		},
	}
}

// injected creates Deployment "operator" as the webhook would have admitted
// it, for AddonInstance instance, with reporter image.
func injected(t *testing.T, ns, instance, image string) {
	t.Helper()
	d := deployment(ns, "operator", map[string]string{"addon-heartbeat.io/inject": "true", "addon-heartbeat.io/addon-instance": instance})
	cfg := inject.DefaultConfig()
	cfg.Image = image
	res, err := inject.Mutate(d, cfg)
	if err != nil {
		t.Fatal(err)
	}
	create(t, res.Deployment)
}

func instance(t *testing.T, ns, name string, period time.Duration) *addonsv1alpha1.AddonInstance {
	t.Helper()
	ai := &addonsv1alpha1.AddonInstance{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: addonsv1alpha1.AddonInstanceSpec{HeartbeatUpdatePeriod: metav1.Duration{Duration: period}}}
	create(t, ai)
	return ai
}

// bindReporter binds the chart's reporter ClusterRole to ServiceAccount
// operator-sa, as the webhook's RBAC controller does.
func bindReporter(t *testing.T, ns string) {
	t.Helper()
	create(t, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "addon-heartbeat-reporter"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "addon-heartbeat-reporter"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "operator-sa"}},
	})
}

func lease(t *testing.T, ns string, holder *string) {
	t.Helper()
	create(t, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "addon-heartbeat-addon-instance"},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: holder}})
}
