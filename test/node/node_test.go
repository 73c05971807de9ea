//go:build node

package node

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	addonsv1alpha1 "github.com/openshift/addon-operator/apis/addons/v1alpha1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/addon-heartbeat/addon-heartbeat/internal/chart"
	"github.com/addon-heartbeat/addon-heartbeat/internal/gctune"
	"github.com/addon-heartbeat/addon-heartbeat/internal/images"
	"github.com/addon-heartbeat/addon-heartbeat/internal/testenv"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/election"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/inject"
)

const (
	release             = "addon-heartbeat"
	releaseNamespace    = "addon-heartbeat-system"
	addonNamespace      = "example-addon"
	addonServiceAccount = "example-addon"
	instance            = "addon-instance"
	// The addon's two components, both injected for the same AddonInstance.
	operatorName = "example-operator"
	metricsName  = "example-metrics"
	period       = 5 * time.Second
)

var (
	degraded  = addonsv1alpha1.AddonInstanceConditionDegraded.String()
	installed = addonsv1alpha1.AddonInstanceConditionInstalled.String()
)

func mustQuantity(s string) resource.Quantity { return resource.MustParse(s) }

func key(ns, name string) client.ObjectKey { return client.ObjectKey{Namespace: ns, Name: name} }

// TestRealNode installs the chart on the node and follows an addon through
// its life: injection, heartbeats, scaling, an outage, the loss of the
// leading pod, the security it all runs under, a chart upgrade and the
// uninstall. The steps run in order and share the cluster.
func TestRealNode(t *testing.T) {
	suite := t
	objs, _, err := chart.Render(chart.Release{Name: release, Namespace: releaseNamespace}, nil)
	if err != nil {
		t.Fatal(err)
	}
	names := struct{ deployment, service, serviceAccount, webhookConfig, reporterRole string }{}
	for _, o := range objs {
		switch o.GetKind() {
		case "Deployment":
			names.deployment = o.GetName()
		case "Service":
			names.service = o.GetName()
		case "ServiceAccount":
			names.serviceAccount = o.GetName()
		case "MutatingWebhookConfiguration":
			names.webhookConfig = o.GetName()
		case "ClusterRole":
			if strings.HasSuffix(o.GetName(), "-reporter") {
				names.reporterRole = o.GetName()
			}
		}
	}
	webhookSelector := map[string]string{"app.kubernetes.io/instance": release, "app.kubernetes.io/component": "webhook"}
	operatorKey, metricsKey := key(addonNamespace, operatorName), key(addonNamespace, metricsName)
	var hb *heartbeats

	step := func(name string, f func(t *testing.T)) { runStep(t, name, f) }

	step("install", func(t *testing.T) {
		crd, err := testenv.AddonInstanceCRD()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := envtest.InstallCRDs(cluster.Config, envtest.CRDInstallOptions{Paths: []string{crd}, ErrorIfPathMissing: true}); err != nil {
			t.Fatalf("installing the AddonInstance CRD: %v", err)
		}
		restrictedNamespace(t, releaseNamespace)
		start := time.Now()
		out, err := run(suiteCtx, helmBin, "install", release, chart.Dir(), "--namespace", releaseNamespace,
			"--set", "image.tag="+tag, "--set", "reporter.image.tag="+tag,
			"--set", "certificates.mode=selfManaged", "--wait", "--timeout", "3m")
		if err != nil {
			t.Fatal(err)
		}
		logf("helm install --wait: %s\n%s", time.Since(start).Round(time.Millisecond), out)

		// Both webhook replicas Ready behind the Service.
		waitFor(t, "webhook rolled out", time.Minute, func(ctx context.Context) (bool, string) {
			return rolledOut(ctx, key(releaseNamespace, names.deployment), 2)
		})
		waitFor(t, "both webhook pods ready in the Service's endpoints", time.Minute, func(ctx context.Context) (bool, string) {
			ps, err := pods(ctx, releaseNamespace, webhookSelector)
			if err != nil {
				return false, err.Error()
			}
			var slices discoveryv1.EndpointSliceList
			if err := cluster.Client.List(ctx, &slices, client.InNamespace(releaseNamespace),
				client.MatchingLabels{discoveryv1.LabelServiceName: names.service}); err != nil {
				return false, err.Error()
			}
			ready := map[string]bool{}
			for _, s := range slices.Items {
				for _, e := range s.Endpoints {
					if ptr.Deref(e.Conditions.Ready, false) {
						for _, a := range e.Addresses {
							ready[a] = true
						}
					}
				}
			}
			for _, p := range ps {
				if !ready[p.Status.PodIP] {
					return false, fmt.Sprintf("pod %s (%s) not a ready endpoint: %v", p.Name, p.Status.PodIP, ready)
				}
			}
			return len(ps) == 2 && len(ready) == 2, fmt.Sprintf("%d pods, ready endpoints %v", len(ps), ready)
		})
		var mwc admissionregistrationv1.MutatingWebhookConfiguration
		if err := cluster.Client.Get(suiteCtx, client.ObjectKey{Name: names.webhookConfig}, &mwc); err != nil {
			t.Fatal(err)
		}
		if cc := mwc.Webhooks[0].ClientConfig; cc.Service == nil || cc.Service.Name != names.service || len(cc.CABundle) == 0 {
			t.Fatalf("webhook configuration: want the Service %s and a caBundle, got %+v", names.service, cc)
		}
	})

	step("injection", func(t *testing.T) {
		restrictedNamespace(t, addonNamespace)
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: addonNamespace, Name: addonServiceAccount}}
		ai := &addonsv1alpha1.AddonInstance{
			ObjectMeta: metav1.ObjectMeta{Namespace: addonNamespace, Name: instance},
			Spec:       addonsv1alpha1.AddonInstanceSpec{HeartbeatUpdatePeriod: metav1.Duration{Duration: period}},
		}
		for _, o := range []client.Object{sa, ai} {
			if err := cluster.Client.Create(suiteCtx, o); err != nil {
				t.Fatal(err)
			}
		}
		hb = watchHeartbeats(suite, addonNamespace, instance)
		start := time.Now()
		for _, d := range []*appsv1.Deployment{exampleAddon(addonNamespace, operatorName, instance, 1), exampleAddon(addonNamespace, metricsName, instance, 1)} {
			if err := cluster.Client.Create(suiteCtx, d); err != nil {
				t.Fatalf("creating %s: %v", d.Name, err)
			}
			// The API server called the webhook: the stored object is injected.
			var sidecar *corev1.Container
			for i, c := range d.Spec.Template.Spec.InitContainers {
				if c.Name == inject.ContainerName {
					sidecar = &d.Spec.Template.Spec.InitContainers[i]
				}
			}
			if sidecar == nil || ptr.Deref(sidecar.RestartPolicy, "") != corev1.ContainerRestartPolicyAlways {
				t.Fatalf("%s: no native sidecar %s injected: %+v", d.Name, inject.ContainerName, d.Spec.Template.Spec.InitContainers)
			}
			if want := images.AddonHeartbeat + ":" + tag; sidecar.Image != want {
				t.Errorf("%s: reporter image %s, want %s", d.Name, sidecar.Image, want)
			}
			if _, ok := d.Annotations["addon-heartbeat.io/status"]; !ok {
				t.Errorf("%s: no status annotation: %v", d.Name, d.Annotations)
			}
		}
		for _, k := range []client.ObjectKey{operatorKey, metricsKey} {
			waitFor(t, k.Name+" rolled out", 2*time.Minute, func(ctx context.Context) (bool, string) { return rolledOut(ctx, k, 1) })
		}
		logf("addon Deployments available %s after creation", time.Since(start).Round(time.Millisecond))

		ps, err := pods(suiteCtx, addonNamespace, map[string]string{"app": operatorName})
		if err != nil || len(ps) != 1 {
			t.Fatalf("pods of %s: %d, %v", operatorName, len(ps), err)
		}
		pod := ps[0]
		rs := reporterStatus(pod)
		if rs == nil || !rs.Ready || !ptr.Deref(rs.Started, false) || rs.State.Running == nil {
			t.Fatalf("reporter sidecar of %s not running and ready: %+v", pod.Name, rs)
		}
		// The kubelet resolved the downward API: in the addon's own container
		// (asked over HTTP) and in the reporter's process (its environment,
		// read from /proc through containerd's task list).
		code, body, err := podHTTP(suiteCtx, http.MethodGet, "http://"+pod.Status.PodIP+":8080/env?name="+inject.TargetNamespaceEnv)
		if err != nil || code != http.StatusOK || body != addonNamespace {
			t.Errorf("addon container: %s=%q (HTTP %d, %v), want %q", inject.TargetNamespaceEnv, body, code, err, addonNamespace)
		}
		env, err := containerEnv(suiteCtx, rs.ContainerID)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{inject.TargetNamespaceEnv + "=" + addonNamespace, "POD_NAME=" + pod.Name, "POD_NAMESPACE=" + addonNamespace} {
			if !slices.Contains(env, want) {
				t.Errorf("reporter process environment lacks %s: %v", want, env)
			}
		}
		// The webhook pods counted the reviews the API server sent them.
		var injected float64
		webhookPods, err := pods(suiteCtx, releaseNamespace, webhookSelector)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range webhookPods {
			v, err := metric(suiteCtx, "http://"+p.Status.PodIP+":8080/metrics", "addon_heartbeat_webhook_reviews_total", `outcome="injected"`)
			if err == nil {
				injected += v
			}
		}
		if injected < 2 {
			t.Errorf("webhook pods counted %v injected reviews, want at least 2", injected)
		}
		// In its container the webhook found its memory limit in the cgroup
		// and set the collector by it (internal/gctune).
		for _, p := range webhookPods {
			limit := p.Spec.Containers[0].Resources.Limits.Memory().Value()
			url := "http://" + p.Status.PodIP + ":8080/metrics"
			memLimit, err1 := metric(suiteCtx, url, "go_gc_gomemlimit_bytes")
			gogc, err2 := metric(suiteCtx, url, "go_gc_gogc_percent")
			if err := errors.Join(err1, err2); err != nil {
				t.Errorf("webhook pod %s: %v", p.Name, err)
				continue
			}
			if int64(memLimit) != gctune.SoftLimit(limit) || gogc != gctune.GCPercent {
				t.Errorf("webhook pod %s: GOMEMLIMIT %v and GOGC %v for a memory limit of %d, want %d and %d",
					p.Name, memLimit, gogc, limit, gctune.SoftLimit(limit), gctune.GCPercent)
			}
		}
	})

	step("heartbeats", func(t *testing.T) {
		hb.waitCondition(t, installed, metav1.ConditionTrue, 6*period)
		hb.waitCondition(t, degraded, metav1.ConditionFalse, 3*period)
		from := time.Now()
		hb.waitWrites(t, 4, 6*period)
		to := time.Now()
		writes := hb.Since(from)
		gap := hb.MaxGap(from, to)
		mean := to.Sub(from) / time.Duration(len(writes))
		if len(writes) >= 2 {
			mean = writes[len(writes)-1].Sub(writes[0]) / time.Duration(len(writes)-1)
		}
		logf("heartbeats: %d writes, mean interval %s, longest gap %s (period %s)", len(writes), mean.Round(time.Millisecond), gap.Round(time.Millisecond), period)
		if gap >= period*3/2 {
			t.Errorf("longest gap between heartbeats %s, period %s", gap, period)
		}
		if mean < period*8/10 || mean > period*12/10 {
			t.Errorf("mean heartbeat interval %s, period %s", mean, period)
		}
	})

	step("addon-heartbeat check", checkOnNode)

	step("one writer at two replicas", func(t *testing.T) {
		var d appsv1.Deployment
		if err := cluster.Client.Get(suiteCtx, operatorKey, &d); err != nil {
			t.Fatal(err)
		}
		d.Spec.Replicas = ptr.To(int32(2))
		if err := cluster.Client.Update(suiteCtx, &d); err != nil {
			t.Fatal(err)
		}
		waitFor(t, operatorName+" at 2 replicas", 2*time.Minute, func(ctx context.Context) (bool, string) { return rolledOut(ctx, operatorKey, 2) })
		addonPods := func() []corev1.Pod {
			var all []corev1.Pod
			for _, name := range []string{operatorName, metricsName} {
				ps, err := pods(suiteCtx, addonNamespace, map[string]string{"app": name})
				if err != nil {
					t.Fatal(err)
				}
				all = append(all, ps...)
			}
			return all
		}
		all := addonPods()
		if len(all) != 3 {
			t.Fatalf("%d addon pods, want 3", len(all))
		}
		// Over three periods exactly one pod writes, and it holds the Lease.
		sent := func() map[string]float64 {
			m := map[string]float64{}
			for _, p := range all {
				v, err := reporterMetric(suiteCtx, p, "addon_heartbeat_heartbeats_sent_total")
				if err != nil {
					v = 0 // a standby may not have written yet
				}
				m[p.Name] = v
			}
			return m
		}
		before := sent()
		windowFrom := time.Now()
		hb.waitWrites(t, 3, 5*period)
		after := sent()
		var writers []string
		for _, p := range all {
			if after[p.Name] > before[p.Name] {
				writers = append(writers, p.Name)
			}
		}
		var lease coordinationv1.Lease
		if err := cluster.Client.Get(suiteCtx, key(addonNamespace, election.LeaseName(instance)), &lease); err != nil {
			t.Fatal(err)
		}
		holder := ptr.Deref(lease.Spec.HolderIdentity, "")
		if len(writers) != 1 || writers[0] != holder {
			t.Errorf("pods that wrote heartbeats over three periods: %v; Lease holder %q", writers, holder)
		}
		var leaders []string
		for _, p := range all {
			if v, err := reporterMetric(suiteCtx, p, "addon_heartbeat_is_leader"); err == nil && v == 1 {
				leaders = append(leaders, p.Name)
			}
		}
		if len(leaders) != 1 || leaders[0] != holder {
			t.Errorf("pods reporting themselves leader: %v; Lease holder %q", leaders, holder)
		}
		// The API server's own record: every replica's reporter has a token
		// bound to its pod, so the audit log names the pod of each status
		// write it applied (the reporters' metrics above are their word).
		rep := auditReport(t, windowFrom, time.Now())
		if len(rep.Writers) != 1 || rep.Writers[0] != holder || len(rep.Violations) > 0 {
			t.Errorf("pods whose status writes the API server applied over three periods: %v (violations %q); Lease holder %q",
				rep.Writers, rep.Violations, holder)
		}
		logf("one writer: Lease holder %s, writers by their metrics %v, by the audit log %v (%d heartbeats)", holder, writers, rep.Writers, rep.Heartbeats)
	})

	step("fencing: only the leader pod moves the heartbeat", fencing)

	step("degraded while the addon is unavailable", func(t *testing.T) {
		ps, err := pods(suiteCtx, addonNamespace, map[string]string{"app": operatorName})
		if err != nil || len(ps) == 0 {
			t.Fatalf("pods of %s: %v", operatorName, err)
		}
		target := ps[0]
		setReady := func(v bool) {
			code, body, err := podHTTP(suiteCtx, http.MethodPost, fmt.Sprintf("http://%s:8080/ready?value=%t", target.Status.PodIP, v))
			if err != nil || code != http.StatusOK {
				t.Fatalf("setting readiness of %s: HTTP %d %s %v", target.Name, code, body, err)
			}
		}
		start := time.Now()
		setReady(false)
		c := hb.waitCondition(t, degraded, metav1.ConditionTrue, 4*period, operatorName)
		logf("Degraded=True %s after the readiness probe started failing: %s: %s", time.Since(start).Round(time.Millisecond), c.Reason, c.Message)
		if strings.Contains(c.Message, metricsName) {
			t.Errorf("Degraded names the available component too: %s", c.Message)
		}
		if ai := hb.Latest(); ai == nil || !hasCondition(ai, installed, metav1.ConditionTrue) {
			t.Errorf("Installed changed during the outage: %+v", ai)
		}
		start = time.Now()
		setReady(true)
		hb.waitCondition(t, degraded, metav1.ConditionFalse, 4*period)
		logf("Degraded=False %s after recovery", time.Since(start).Round(time.Millisecond))
	})

	step("leader pod deleted", func(t *testing.T) {
		pod := leaderPod(t)
		holder := pod.Name
		from := time.Now()
		if err := cluster.Client.Delete(suiteCtx, &pod); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "a new Lease holder", 3*period, func(ctx context.Context) (bool, string) {
			var l coordinationv1.Lease
			if err := cluster.Client.Get(ctx, key(addonNamespace, election.LeaseName(instance)), &l); err != nil {
				return false, err.Error()
			}
			h := ptr.Deref(l.Spec.HolderIdentity, "")
			return h != "" && h != holder, "holder " + h
		})
		hb.waitWrites(t, 4, 8*period)
		to := time.Now()
		gap := hb.MaxGap(from, to)
		logf("leader %s deleted: longest gap between heartbeats %s over %s (limit %s)", holder, gap.Round(time.Millisecond), to.Sub(from).Round(time.Millisecond), 3*period)
		if gap >= 3*period {
			t.Errorf("heartbeats stopped for %s after the leader pod was deleted (period %s)", gap, period)
		}
		for _, k := range []client.ObjectKey{operatorKey, metricsKey} {
			want := int32(1)
			if k == operatorKey {
				want = 2
			}
			waitFor(t, k.Name+" available again", 2*time.Minute, func(ctx context.Context) (bool, string) { return rolledOut(ctx, k, want) })
		}
	})

	step("leader's reporter killed (SIGKILL)", func(t *testing.T) {
		// No release of the Lease: either the kubelet restarts the
		// reporter in the same pod, which takes its own Lease back at once
		// (its holder identity is the pod name), or the other pod's
		// standby takes it when it expires, 1.5 periods after the last
		// renewal. The operator must see no gap of 3 periods.
		pod := leaderPod(t)
		holder := pod.Name
		before := reporterStatus(pod)
		if before == nil || before.ContainerID == "" {
			t.Fatalf("no running reporter in %s: %+v", pod.Name, before)
		}
		pid, err := containerPID(suiteCtx, before.ContainerID)
		if err != nil {
			t.Fatal(err)
		}
		from := time.Now()
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatalf("killing the reporter (pid %d) of %s: %v", pid, pod.Name, err)
		}
		hb.waitWrites(t, 4, 8*period)
		waitFor(t, "the killed reporter restarted and ready", 2*time.Minute, func(ctx context.Context) (bool, string) {
			var p corev1.Pod
			if err := cluster.Client.Get(ctx, key(addonNamespace, pod.Name), &p); err != nil {
				return false, err.Error()
			}
			rs := reporterStatus(p)
			if rs == nil {
				return false, "no reporter status"
			}
			return rs.RestartCount > before.RestartCount && rs.Ready, fmt.Sprintf("restarts %d, ready %t", rs.RestartCount, rs.Ready)
		})
		to := time.Now()
		gap := hb.MaxGap(from, to)
		logf("reporter of leader %s killed: longest gap between heartbeats %s over %s (limit %s); the Lease is now %s's",
			holder, gap.Round(time.Millisecond), to.Sub(from).Round(time.Millisecond), 3*period, leaderPod(t).Name)
		if gap >= 3*period {
			t.Errorf("heartbeats stopped for %s after the leader's reporter was killed (period %s)", gap, period)
		}
	})

	step("soak: faults for "+soakFor.String(), soak)

	step("restricted pod security and least privilege", func(t *testing.T) {
		// Pod Security enforces restricted in both namespaces: a privileged
		// pod is refused, and every pod that runs was admitted under it.
		for _, ns := range []string{releaseNamespace, addonNamespace} {
			var n corev1.Namespace
			if err := cluster.Client.Get(suiteCtx, client.ObjectKey{Name: ns}, &n); err != nil {
				t.Fatal(err)
			}
			if n.Labels["pod-security.kubernetes.io/enforce"] != "restricted" {
				t.Errorf("namespace %s: labels %v", ns, n.Labels)
			}
			// Allowed by the baseline profile, refused by restricted only (no
			// runAsNonRoot, no seccomp profile, capabilities not dropped).
			bad := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "unrestricted"},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: images.Pause + ":" + tag}}},
			}
			if err := cluster.Client.Create(suiteCtx, bad, client.DryRunAll); !apierrors.IsForbidden(err) {
				t.Errorf("namespace %s: a pod outside the restricted profile was not refused by Pod Security: %v", ns, err)
			}
		}
		webhookSA := "system:serviceaccount:" + releaseNamespace + ":" + names.serviceAccount
		addonSA := "system:serviceaccount:" + addonNamespace + ":" + addonServiceAccount
		// The pods' own identities: the token the kubelet mounted in a webhook
		// pod and in an addon pod.
		for ns, sel := range map[string]map[string]string{releaseNamespace: webhookSelector, addonNamespace: {"app": operatorName}} {
			ps, err := pods(suiteCtx, ns, sel)
			if err != nil || len(ps) == 0 {
				t.Fatalf("pods in %s: %v", ns, err)
			}
			cfg, err := podTokenConfig(ps[0])
			if err != nil {
				t.Fatal(err)
			}
			c, err := client.New(cfg, client.Options{Scheme: cluster.Client.Scheme()})
			if err != nil {
				t.Fatal(err)
			}
			review := &authenticationv1.SelfSubjectReview{}
			if err := c.Create(suiteCtx, review); err != nil {
				t.Fatalf("SelfSubjectReview as pod %s: %v", ps[0].Name, err)
			}
			user := review.Status.UserInfo.Username
			if want := map[string]string{releaseNamespace: webhookSA, addonNamespace: addonSA}[ns]; user != want {
				t.Errorf("pod %s runs as %q, want %q", ps[0].Name, user, want)
			}
			for _, attrs := range []authorizationv1.ResourceAttributes{
				{Verb: "*", Group: "*", Resource: "*"},
				{Verb: "get", Resource: "secrets", Namespace: "kube-system"},
				{Verb: "create", Group: "rbac.authorization.k8s.io", Resource: "clusterrolebindings"},
				{Verb: "escalate", Group: "rbac.authorization.k8s.io", Resource: "clusterroles"},
				{Verb: "bind", Group: "rbac.authorization.k8s.io", Resource: "clusterroles", Name: "cluster-admin"},
				{Verb: "create", Resource: "pods", Namespace: ns},
			} {
				ssar := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &attrs}}
				if err := c.Create(suiteCtx, ssar); err != nil {
					t.Fatal(err)
				}
				if ssar.Status.Allowed {
					t.Errorf("%s may %s %s/%s %q in %q", user, attrs.Verb, attrs.Group, attrs.Resource, attrs.Name, attrs.Namespace)
				}
			}
		}
		// What each identity needs, it has (so the denials above are not a
		// broken review), and not in other namespaces.
		for _, tc := range []struct {
			user    string
			attrs   authorizationv1.ResourceAttributes
			allowed bool
		}{
			{addonSA, authorizationv1.ResourceAttributes{Verb: "update", Group: "addons.managed.openshift.io", Resource: "addoninstances", Subresource: "status", Namespace: addonNamespace, Name: instance}, true},
			{addonSA, authorizationv1.ResourceAttributes{Verb: "update", Group: "addons.managed.openshift.io", Resource: "addoninstances", Subresource: "status", Namespace: "default", Name: instance}, false},
			{addonSA, authorizationv1.ResourceAttributes{Verb: "update", Group: "addons.managed.openshift.io", Resource: "addoninstances", Namespace: addonNamespace, Name: instance}, false},
			{addonSA, authorizationv1.ResourceAttributes{Verb: "get", Resource: "secrets", Namespace: addonNamespace}, false},
			{webhookSA, authorizationv1.ResourceAttributes{Verb: "bind", Group: "rbac.authorization.k8s.io", Resource: "clusterroles", Name: names.reporterRole}, true},
			{webhookSA, authorizationv1.ResourceAttributes{Verb: "get", Resource: "secrets", Namespace: addonNamespace}, false},
			{webhookSA, authorizationv1.ResourceAttributes{Verb: "update", Group: "addons.managed.openshift.io", Resource: "addoninstances", Subresource: "status", Namespace: addonNamespace, Name: instance}, false},
		} {
			sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
				User: tc.user, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + strings.Split(tc.user, ":")[2], "system:authenticated"},
				ResourceAttributes: &tc.attrs,
			}}
			if err := cluster.Client.Create(suiteCtx, sar); err != nil {
				t.Fatal(err)
			}
			if sar.Status.Allowed != tc.allowed {
				t.Errorf("%s %s %s/%s %s in %q: allowed=%t, want %t (%s)", tc.user, tc.attrs.Verb, tc.attrs.Resource, tc.attrs.Subresource, tc.attrs.Name, tc.attrs.Namespace, sar.Status.Allowed, tc.allowed, sar.Status.Reason)
			}
		}
		// No binding anywhere gives these identities (or a group they are in)
		// cluster-admin.
		subjects := []rbacv1.Subject{
			{Kind: "ServiceAccount", Namespace: releaseNamespace, Name: names.serviceAccount},
			{Kind: "ServiceAccount", Namespace: addonNamespace, Name: addonServiceAccount},
			{Kind: "Group", Name: "system:serviceaccounts"}, {Kind: "Group", Name: "system:authenticated"},
			{Kind: "Group", Name: "system:serviceaccounts:" + releaseNamespace}, {Kind: "Group", Name: "system:serviceaccounts:" + addonNamespace},
		}
		var crbs rbacv1.ClusterRoleBindingList
		var rbs rbacv1.RoleBindingList
		if err := cluster.Client.List(suiteCtx, &crbs); err != nil {
			t.Fatal(err)
		}
		if err := cluster.Client.List(suiteCtx, &rbs); err != nil {
			t.Fatal(err)
		}
		type binding struct {
			name     string
			roleRef  rbacv1.RoleRef
			subjects []rbacv1.Subject
		}
		var all []binding
		for _, b := range crbs.Items {
			all = append(all, binding{"ClusterRoleBinding " + b.Name, b.RoleRef, b.Subjects})
		}
		for _, b := range rbs.Items {
			all = append(all, binding{"RoleBinding " + b.Namespace + "/" + b.Name, b.RoleRef, b.Subjects})
		}
		for _, b := range all {
			if b.roleRef.Kind != "ClusterRole" || (b.roleRef.Name != "cluster-admin" && b.roleRef.Name != "admin" && b.roleRef.Name != "edit") {
				continue
			}
			for _, s := range b.subjects {
				for _, ours := range subjects {
					if s.Kind == ours.Kind && s.Name == ours.Name && s.Namespace == ours.Namespace {
						t.Errorf("%s binds %s to %s %s/%s", b.name, b.roleRef.Name, s.Kind, s.Namespace, s.Name)
					}
				}
			}
		}
	})

	step("helm upgrade with a new reporter image", func(t *testing.T) {
		var before appsv1.Deployment
		if err := cluster.Client.Get(suiteCtx, operatorKey, &before); err != nil {
			t.Fatal(err)
		}
		rsBefore := replicaSets(t, operatorName)
		start := time.Now()
		if _, err := run(suiteCtx, helmBin, "upgrade", release, chart.Dir(), "--namespace", releaseNamespace, "--reuse-values",
			"--set", "reporter.image.tag="+upgradedTag, "--wait", "--timeout", "3m"); err != nil {
			t.Fatal(err)
		}
		logf("helm upgrade --wait: %s", time.Since(start).Round(time.Millisecond))
		waitFor(t, "webhook rolled out with the new reporter image", 2*time.Minute, func(ctx context.Context) (bool, string) {
			var d appsv1.Deployment
			if err := cluster.Client.Get(ctx, key(releaseNamespace, names.deployment), &d); err != nil {
				return false, err.Error()
			}
			if !slices.Contains(d.Spec.Template.Spec.Containers[0].Args, "--reporter-image="+images.AddonHeartbeat+":"+upgradedTag) {
				return false, "args " + strings.Join(d.Spec.Template.Spec.Containers[0].Args, " ")
			}
			return rolledOut(ctx, key(releaseNamespace, names.deployment), 2)
		})
		// The upgrade by itself changes no addon: a webhook only acts on
		// admission. Two heartbeats later the addon is as it was.
		hb.waitWrites(t, 2, 4*period)
		var same appsv1.Deployment
		if err := cluster.Client.Get(suiteCtx, operatorKey, &same); err != nil {
			t.Fatal(err)
		}
		if same.Generation != before.Generation || reporterImage(same) != images.AddonHeartbeat+":"+tag {
			t.Errorf("the upgrade alone changed %s: generation %d -> %d, reporter image %s", operatorName, before.Generation, same.Generation, reporterImage(same))
		}
		// The next update of the Deployment (here kubectl rollout restart) is
		// admitted through the new webhook, which injects the new image into
		// the same template change: one rollout.
		from := time.Now()
		if _, err := run(suiteCtx, "kubectl", "rollout", "restart", "deployment/"+operatorName, "-n", addonNamespace); err != nil {
			t.Fatal(err)
		}
		waitFor(t, operatorName+" rolled out", 3*time.Minute, func(ctx context.Context) (bool, string) { return rolledOut(ctx, operatorKey, 2) })
		var after appsv1.Deployment
		if err := cluster.Client.Get(suiteCtx, operatorKey, &after); err != nil {
			t.Fatal(err)
		}
		if after.Generation != before.Generation+1 {
			t.Errorf("%s: generation %d -> %d, want one more", operatorName, before.Generation, after.Generation)
		}
		if got := reporterImage(after); got != images.AddonHeartbeat+":"+upgradedTag {
			t.Errorf("%s: reporter image after the restart %s", operatorName, got)
		}
		if rsAfter := replicaSets(t, operatorName); len(rsAfter) != len(rsBefore)+1 {
			t.Errorf("%s: ReplicaSets %v -> %v, want exactly one new", operatorName, rsBefore, rsAfter)
		}
		ps, err := pods(suiteCtx, addonNamespace, map[string]string{"app": operatorName})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range ps {
			if rs := reporterStatus(p); rs == nil || !strings.HasSuffix(rs.Image, ":"+upgradedTag) || !rs.Ready {
				t.Errorf("pod %s: reporter %+v, want ready with the %s image", p.Name, rs, upgradedTag)
			}
		}
		// The other component keeps the old reporter until its own next update.
		var other appsv1.Deployment
		if err := cluster.Client.Get(suiteCtx, metricsKey, &other); err != nil {
			t.Fatal(err)
		}
		if got := reporterImage(other); got != images.AddonHeartbeat+":"+tag {
			t.Errorf("%s: reporter image %s, want the old %s until its next rollout", metricsName, got, tag)
		}
		hb.waitWrites(t, 2, 4*period)
		gap := hb.MaxGap(from, time.Now())
		logf("rollout restart with the new reporter: %s, longest heartbeat gap %s", time.Since(from).Round(time.Millisecond), gap.Round(time.Millisecond))
		if gap >= 3*period {
			t.Errorf("heartbeats stopped for %s during the rollout", gap)
		}
	})

	step("OpenShift: restricted-v2 assigns the UIDs", func(t *testing.T) {
		openshiftPlatform(t, names.deployment, webhookSelector)
	})

	step("OpenShift: service CA certificate renewed", func(t *testing.T) {
		openshiftServiceCA(t, names.deployment, names.service, names.webhookConfig, webhookSelector)
	})

	step("hostNetwork addon: reporter ports on the node", hostNetworkAddon)

	step("helm uninstall", func(t *testing.T) {
		var before appsv1.Deployment
		if err := cluster.Client.Get(suiteCtx, operatorKey, &before); err != nil {
			t.Fatal(err)
		}
		var podsBefore []corev1.Pod
		for _, name := range []string{operatorName, metricsName} {
			ps, err := pods(suiteCtx, addonNamespace, map[string]string{"app": name})
			if err != nil {
				t.Fatal(err)
			}
			podsBefore = append(podsBefore, ps...)
		}
		rsBefore := replicaSets(t, operatorName)
		start := time.Now()
		if _, err := run(suiteCtx, helmBin, "uninstall", release, "--namespace", releaseNamespace, "--wait", "--timeout", "3m"); err != nil {
			t.Fatal(err)
		}
		logf("helm uninstall --wait: %s", time.Since(start).Round(time.Millisecond))
		var mwc admissionregistrationv1.MutatingWebhookConfiguration
		if err := cluster.Client.Get(suiteCtx, client.ObjectKey{Name: names.webhookConfig}, &mwc); !apierrors.IsNotFound(err) {
			t.Fatalf("the webhook configuration is still there after uninstall: %v", err)
		}
		// Annotated Deployments stay admissible: a new one is created as sent
		// (nothing injects it any more) and an injected one can be updated.
		fresh := exampleAddon(addonNamespace, "after-uninstall", instance, 0)
		if err := cluster.Client.Create(suiteCtx, fresh); err != nil {
			t.Fatalf("creating an annotated Deployment after uninstall: %v", err)
		}
		if len(fresh.Spec.Template.Spec.InitContainers) != 0 {
			t.Errorf("a Deployment created after uninstall was injected: %+v", fresh.Spec.Template.Spec.InitContainers)
		}
		var d appsv1.Deployment
		if err := cluster.Client.Get(suiteCtx, operatorKey, &d); err != nil {
			t.Fatal(err)
		}
		d.Annotations["example.com/touched"] = "after-uninstall"
		if err := cluster.Client.Update(suiteCtx, &d); err != nil {
			t.Fatalf("updating an injected Deployment after uninstall: %v", err)
		}
		// (An annotation change bumps a Deployment's generation; what matters
		// is that the pod template, and so the pods, stay as they are.)
		if !equality.Semantic.DeepEqual(d.Spec.Template, before.Spec.Template) {
			t.Errorf("an update after uninstall changed the pod template: reporter image %q -> %q", reporterImage(before), reporterImage(d))
		}
		if rs := replicaSets(t, operatorName); !slices.Equal(rs, rsBefore) {
			t.Errorf("an update after uninstall started a rollout: ReplicaSets %v -> %v", rsBefore, rs)
		}
		// The injected sidecars stay until the next rollout, still running;
		// the RoleBinding the webhook made stays too, but the ClusterRole it
		// names went with the release, so their writes are now refused and the
		// heartbeats stop.
		var rb rbacv1.RoleBinding
		rbErr := cluster.Client.Get(suiteCtx, key(addonNamespace, names.reporterRole), &rb)
		var role rbacv1.ClusterRole
		roleErr := cluster.Client.Get(suiteCtx, client.ObjectKey{Name: names.reporterRole}, &role)
		logf("after uninstall: reporter RoleBinding: %v; reporter ClusterRole: %v", errText(rbErr), errText(roleErr))
		if !apierrors.IsNotFound(roleErr) {
			t.Errorf("the reporter ClusterRole outlived the release: %v", roleErr)
		}
		quiet := time.Now()
		last := hb.Count()
		waitFor(t, "no heartbeat for 3 periods", 6*period, func(context.Context) (bool, string) {
			if hb.Count() != last {
				last, quiet = hb.Count(), time.Now()
			}
			return time.Since(quiet) >= 3*period, fmt.Sprintf("last write %s ago", time.Since(quiet).Round(time.Millisecond))
		})
		// The leader could no longer renew its Lease and stepped down; no
		// standby can take the Lease either.
		var leaders float64
		for _, p := range podsBefore {
			failed, _ := reporterMetric(suiteCtx, p, "addon_heartbeat_heartbeats_failed_total")
			leader, err := reporterMetric(suiteCtx, p, "addon_heartbeat_is_leader")
			if err != nil {
				t.Errorf("pod %s: reporter metrics: %v", p.Name, err)
			}
			leaders += leader
			logf("after uninstall: pod %s: failed heartbeats %v, leader %v", p.Name, failed, leader)
		}
		if leaders != 0 {
			t.Errorf("%v reporters still lead after the reporter role went with the release", leaders)
		}
		ps, err := pods(suiteCtx, addonNamespace, map[string]string{"app": operatorName})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range ps {
			if rs := reporterStatus(p); rs == nil || rs.State.Running == nil {
				t.Errorf("pod %s: reporter sidecar not running after uninstall: %+v", p.Name, rs)
			} else {
				logf("after uninstall: pod %s reporter running, ready=%t, restarts %d", p.Name, rs.Ready, rs.RestartCount)
			}
		}
	})
}

func errText(err error) string {
	if err == nil {
		return "present"
	}
	return err.Error()
}

func hasCondition(ai *addonsv1alpha1.AddonInstance, typ string, status metav1.ConditionStatus) bool {
	for _, c := range ai.Status.Conditions {
		if c.Type == typ {
			return c.Status == status
		}
	}
	return false
}

// reporterImage is the injected reporter's image in d's pod template.
func reporterImage(d appsv1.Deployment) string {
	for _, c := range d.Spec.Template.Spec.InitContainers {
		if c.Name == inject.ContainerName {
			return c.Image
		}
	}
	return ""
}

// replicaSets lists the names of an addon Deployment's ReplicaSets.
func replicaSets(t *testing.T, app string) []string {
	t.Helper()
	var list appsv1.ReplicaSetList
	if err := cluster.Client.List(suiteCtx, &list, client.InNamespace(addonNamespace), client.MatchingLabels{"app": app}); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, rs := range list.Items {
		names = append(names, rs.Name)
	}
	slices.Sort(names)
	return names
}

// containerEnv reads the environment of a container's main process.
func containerEnv(ctx context.Context, containerID string) ([]string, error) {
	pid, err := containerPID(ctx, containerID)
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		return nil, err
	}
	return strings.Split(strings.TrimRight(string(data), "\x00"), "\x00"), nil
}

// containerPID is the host pid of a container's main process, from
// containerd's task list.
func containerPID(ctx context.Context, containerID string) (int, error) {
	id := strings.TrimPrefix(containerID, "containerd://")
	out, err := cluster.CtrOutput(ctx, "tasks", "ls")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == id {
			pid, err := strconv.Atoi(f[1])
			if err != nil {
				return 0, fmt.Errorf("task %s: pid %q: %w", id, f[1], err)
			}
			return pid, nil
		}
	}
	return 0, fmt.Errorf("no task %s in:\n%s", id, out)
}

// podTokenConfig is a client configuration with the ServiceAccount token
// the kubelet mounted into pod.
func podTokenConfig(pod corev1.Pod) (*rest.Config, error) {
	matches, err := filepath.Glob(filepath.Join(cluster.KubeletRoot(), "pods", string(pod.UID), "volumes", "kubernetes.io~projected", "kube-api-access-*", "token"))
	if err != nil || len(matches) != 1 {
		return nil, fmt.Errorf("the token of pod %s: %v %v", pod.Name, matches, err)
	}
	token, err := os.ReadFile(matches[0])
	if err != nil {
		return nil, err
	}
	cfg := rest.CopyConfig(cluster.Config)
	cfg.BearerToken = string(token)
	return cfg, nil
}

// dumpPodLogs prints the last lines of every container log on the node,
// for a failed step.
func dumpPodLogs(lines int) {
	logs, _ := filepath.Glob(filepath.Join(cluster.Dir, "kubelet", "pod-logs", "*", "*", "*.log"))
	for _, l := range logs {
		data, err := os.ReadFile(l)
		if err != nil {
			continue
		}
		all := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
		logf("log %s:\n%s", strings.TrimPrefix(l, cluster.Dir), strings.Join(all[max(0, len(all)-lines):], "\n"))
	}
}
