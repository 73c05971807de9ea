package check

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	addonsv1alpha1 "github.com/openshift/addon-operator/apis/addons/v1alpha1"
	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/annotations"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/election"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/inject"
)

// workload is one opted-in Deployment.
type workload struct {
	d        *appsv1.Deployment
	settings annotations.Settings
	// reporter is the injected container; nil when not injected.
	reporter *corev1.Container
}

func (w *workload) scope() string { return "deployment " + w.d.Namespace + "/" + w.d.Name }

func (w *workload) ref() string { return "deployment/" + w.d.Name }

func (w *workload) serviceAccount() string {
	return cmp.Or(w.d.Spec.Template.Spec.ServiceAccountName, "default")
}

func (w *workload) restartFix() string {
	return fmt.Sprintf("kubectl -n %s rollout restart %s", w.d.Namespace, w.ref())
}

// instanceKey is an AddonInstance that opted-in Deployments report to.
type instanceKey struct{ namespace, name string }

// checkWorkloads checks every opted-in Deployment in scope, then each
// AddonInstance they report to.
func (c *Checker) checkWorkloads(ctx context.Context, r *Report, in *install, s Scope) error {
	var list appsv1.DeploymentList
	if err := c.Client.List(ctx, &list, client.InNamespace(s.Namespace)); err != nil {
		return cannot("listing Deployments", err)
	}
	slices.SortFunc(list.Items, func(a, b appsv1.Deployment) int {
		return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name))
	})
	groups := map[instanceKey][]*workload{}
	var keys []instanceKey
	flush := func(ns string) {
		for _, k := range keys {
			if k.namespace == ns {
				c.checkInstance(ctx, r, k, groups[k])
			}
		}
	}
	var workloads int
	for i := range list.Items {
		d := &list.Items[i]
		if i > 0 && list.Items[i-1].Namespace != d.Namespace {
			flush(list.Items[i-1].Namespace)
		}
		w, ok := c.checkDeployment(ctx, r, in, d)
		if !ok {
			continue
		}
		workloads++
		k := instanceKey{d.Namespace, w.settings.AddonInstance}
		if _, seen := groups[k]; !seen {
			keys = append(keys, k)
		}
		groups[k] = append(groups[k], w)
	}
	if n := len(list.Items); n > 0 {
		flush(list.Items[n-1].Namespace)
	}
	if workloads == 0 {
		where := "in any namespace"
		if s.Namespace != "" {
			where = "in namespace " + s.Namespace + " (-A checks every namespace)"
		}
		r.add("deployments", "opted-in", StatusSkip, "no Deployment opts in "+where, "")
	}
	return nil
}

// checkDeployment checks one Deployment if it opts in; ok is false when it
// does not.
func (c *Checker) checkDeployment(ctx context.Context, r *Report, in *install, d *appsv1.Deployment) (*workload, bool) {
	src := annotations.OfDeployment(d)
	optedIn, err := annotations.ParseInject(src)
	w := &workload{d: d}
	if err == nil && !optedIn {
		return nil, false
	}
	if err == nil {
		w.settings, err = annotations.Parse(src)
	}
	if err != nil {
		r.add(w.scope(), "settings", StatusFail, err.Error(),
			fmt.Sprintf("correct the value (kubectl -n %s edit %s); the webhook refuses the Deployment's next update until then", d.Namespace, w.ref()))
		return nil, false
	}
	c.checkInjected(ctx, r, in, w)
	c.checkImage(r, in, w)
	c.checkRBAC(ctx, r, in, w)
	return w, true
}

func (c *Checker) checkInjected(ctx context.Context, r *Report, in *install, w *workload) {
	spec := &w.d.Spec.Template.Spec
	kind := "a native sidecar"
	i := slices.IndexFunc(spec.InitContainers, func(ct corev1.Container) bool { return ct.Name == inject.ContainerName })
	if i >= 0 {
		w.reporter = &spec.InitContainers[i]
	} else if i = slices.IndexFunc(spec.Containers, func(ct corev1.Container) bool { return ct.Name == inject.ContainerName }); i >= 0 {
		w.reporter, kind = &spec.Containers[i], "a container"
	}
	rec, recErr := inject.ReadRecord(w.d.Annotations)
	switch {
	case recErr != nil:
		w.reporter = nil
		r.add(w.scope(), "injected", StatusFail, recErr.Error(), w.restartFix())
	case w.reporter == nil || rec == nil:
		w.reporter = nil
		why, fix := c.notInjected(ctx, in, w)
		r.add(w.scope(), "injected", StatusFail, "no "+inject.ContainerName+" container in the pod template: "+why, fix)
	default:
		r.ok(w.scope(), "injected", "%s as %s, for AddonInstance %s, running as ServiceAccount %s",
			inject.ContainerName, kind, w.settings.AddonInstance, w.serviceAccount())
	}
}

// notInjected says why an opted-in Deployment has no reporter, and how to
// get one.
func (c *Checker) notInjected(ctx context.Context, in *install, w *workload) (why, fix string) {
	ns := w.d.Namespace
	if in == nil {
		return "no webhook is installed", installFix
	}
	served, err := c.namespaceServed(ctx, in, ns)
	switch {
	case err != nil:
		return fmt.Sprintf("it was admitted without the webhook (whether namespace %s is served is unknown: %v)", ns, err), w.restartFix()
	case !served && in.deployment != nil && ns == in.deployment.Namespace:
		return fmt.Sprintf("the webhook never serves its own namespace %s", ns), "run the addon in a namespace of its own"
	case !served:
		return fmt.Sprintf("the webhook's namespaceSelector leaves namespace %s out", ns),
			"change the chart value webhook.namespaceSelector or the namespace's labels, then " + w.restartFix()
	}
	return "it was admitted without the webhook (created before the webhook was installed, or while it was down with failurePolicy Ignore)",
		w.restartFix() + " (the webhook injects the reporter into this update)"
}

func (c *Checker) checkImage(r *Report, in *install, w *workload) {
	const check = "reporterImage"
	switch current := in.reporterImage(); {
	case w.reporter == nil:
		r.add(w.scope(), check, StatusSkip, "not injected", "")
	case current == "":
		r.add(w.scope(), check, StatusSkip, fmt.Sprintf("%s; the image the webhook injects now is unknown", w.reporter.Image), "")
	case w.reporter.Image == current:
		r.ok(w.scope(), check, "%s, the image the webhook injects now", current)
	default:
		r.add(w.scope(), check, StatusWarn,
			fmt.Sprintf("%s, not the image the webhook injects now (%s): the webhook updates it at the Deployment's next update", w.reporter.Image, current),
			w.restartFix())
	}
}

// checkRBAC asks the API server, with SubjectAccessReviews as the pods'
// ServiceAccount, for each permission the reporter uses
// (heartbeat.PolicyRules).
func (c *Checker) checkRBAC(ctx context.Context, r *Report, in *install, w *workload) {
	const check = "rbac"
	if w.reporter == nil {
		r.add(w.scope(), check, StatusSkip, "not injected", "")
		return
	}
	ns, sa, instance := w.d.Namespace, w.serviceAccount(), w.settings.AddonInstance
	key := [3]string{ns, sa, instance}
	denied, seen := c.denied[key]
	var err error
	if !seen {
		denied, err = c.firstDenied(ctx, ns, sa, heartbeat.PolicyRules(instance))
	}
	if err == nil && !seen {
		c.denied[key] = denied
	}
	if err != nil {
		r.add(w.scope(), check, StatusWarn, fmt.Sprintf("could not ask the API server: %v", err),
			"run check as a user who may create subjectaccessreviews.authorization.k8s.io")
		return
	}
	if denied == "" {
		r.ok(w.scope(), check, "ServiceAccount %s may do everything the reporter does: AddonInstance %s and its status, Lease %s, list Deployments",
			sa, instance, election.LeaseName(instance))
		return
	}
	why, fix := c.rbacDiagnosis(ctx, in, w)
	r.add(w.scope(), check, StatusFail, fmt.Sprintf("ServiceAccount %s may not %s: %s", sa, denied, why), fix)
}

// firstDenied asks a SubjectAccessReview for each verb of each rule, as
// ServiceAccount ns/sa, and returns the first one denied ("" when all are
// allowed).
func (c *Checker) firstDenied(ctx context.Context, ns, sa string, rules []rbacv1.PolicyRule) (string, error) {
	user := "system:serviceaccount:" + ns + ":" + sa
	groups := []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}
	for _, rule := range rules {
		for _, res := range rule.Resources {
			resource, sub, _ := strings.Cut(res, "/")
			names := rule.ResourceNames
			if len(names) == 0 {
				names = []string{""}
			}
			for _, name := range names {
				for _, verb := range rule.Verbs {
					attrs := &authorizationv1.ResourceAttributes{Namespace: ns, Verb: verb, Group: rule.APIGroups[0],
						Resource: resource, Subresource: sub, Name: name}
					allowed, err := c.allowed(ctx, user, groups, attrs)
					if err != nil {
						return "", err
					}
					if !allowed {
						return describeAccess(attrs), nil
					}
				}
			}
		}
	}
	return "", nil
}

// rbacDiagnosis finds out why the reporter's permissions are missing: the
// webhook's RoleBinding, its subject, its ClusterRole or the names the role
// allows.
func (c *Checker) rbacDiagnosis(ctx context.Context, in *install, w *workload) (why, fix string) {
	ns, sa := w.d.Namespace, w.serviceAccount()
	binding := cmp.Or(in.arg("reporter-role-binding-name"), "addon-heartbeat-reporter")
	rebind := fmt.Sprintf("the webhook's elected replica binds the ServiceAccount of each signed record while the AddonInstance exists; if it does not within seconds, %s (the webhook signs the record again), and %s",
		w.restartFix(), in.logsFix())
	var rb rbacv1.RoleBinding
	if err := c.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: binding}, &rb); err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Sprintf("RoleBinding %s/%s is missing", ns, binding), rebind
		}
		return fmt.Sprintf("RoleBinding %s/%s: %v", ns, binding, err), rebind
	}
	if !slices.ContainsFunc(rb.Subjects, func(s rbacv1.Subject) bool {
		return s.Kind == "ServiceAccount" && s.Name == sa && cmp.Or(s.Namespace, ns) == ns
	}) {
		return fmt.Sprintf("RoleBinding %s/%s does not name ServiceAccount %s", ns, binding, sa), rebind
	}
	var role rbacv1.ClusterRole
	if err := c.Client.Get(ctx, client.ObjectKey{Name: rb.RoleRef.Name}, &role); apierrors.IsNotFound(err) {
		return fmt.Sprintf("RoleBinding %s/%s refers to ClusterRole %s, which is missing", ns, binding, rb.RoleRef.Name), installFix
	}
	// The chart joins reporter.addonInstanceNames with commas.
	if list := in.arg("reporter-addon-instance-names"); list != "" && !slices.Contains(strings.Split(list, ","), w.settings.AddonInstance) {
		return fmt.Sprintf("the reporter role allows only AddonInstances %s", list),
			fmt.Sprintf("add %s to the chart value reporter.addonInstanceNames", w.settings.AddonInstance)
	}
	return fmt.Sprintf("ClusterRole %s, bound by RoleBinding %s/%s, does not allow it", rb.RoleRef.Name, ns, binding), installFix
}

// checkInstance checks one AddonInstance and what its reporters write.
func (c *Checker) checkInstance(ctx context.Context, r *Report, k instanceKey, ws []*workload) {
	scope := "addoninstance " + k.namespace + "/" + k.name
	refs := make([]string, len(ws))
	var injected []*workload
	for i, w := range ws {
		refs[i] = w.ref()
		if w.reporter != nil {
			injected = append(injected, w)
		}
	}
	var ai addonsv1alpha1.AddonInstance
	err := c.Client.Get(ctx, client.ObjectKey{Namespace: k.namespace, Name: k.name}, &ai)
	switch {
	case apimeta.IsNoMatchError(err):
		r.add(scope, "exists", StatusFail, "the AddonInstance API (addons.managed.openshift.io/v1alpha1) is not installed",
			"install the addon-operator, which serves it")
	case apierrors.IsNotFound(err):
		r.add(scope, "exists", StatusFail,
			fmt.Sprintf("not found: the reporter of %s has nothing to write to", strings.Join(refs, ", ")),
			fmt.Sprintf("the addon-operator creates it when it installs the addon; or set %s on %s to an AddonInstance that exists (kubectl -n %s get addoninstances)",
				annotations.AddonInstance, strings.Join(refs, ", "), k.namespace))
	case err != nil:
		r.add(scope, "exists", StatusWarn, fmt.Sprintf("could not read it: %v", err), "run check as a user who may get addoninstances.addons.managed.openshift.io")
	default:
		r.ok(scope, "exists", "heartbeatUpdatePeriod %s, written by the reporter of %s", ai.Spec.HeartbeatUpdatePeriod.Duration, strings.Join(refs, ", "))
	}
	rest := []string{"lease", "heartbeat", "degraded", "installed"}
	if err != nil {
		for _, check := range rest {
			r.add(scope, check, StatusSkip, "no AddonInstance", "")
		}
		return
	}
	if len(injected) == 0 {
		for _, check := range rest {
			r.add(scope, check, StatusSkip, "no injected Deployment reports to it", "")
		}
		return
	}
	logs := fmt.Sprintf("kubectl -n %s logs %s -c %s", k.namespace, injected[0].ref(), inject.ContainerName)
	holder := c.checkLease(ctx, r, scope, k, logs)
	if holder != "" {
		logs = fmt.Sprintf("kubectl -n %s logs pod/%s -c %s", k.namespace, holder, inject.ContainerName)
	}
	beating := c.checkHeartbeat(r, scope, &ai, logs)
	c.checkConditions(r, scope, &ai, beating, logs)
}

// checkLease checks that the election Lease is held by a running pod, and
// returns that pod's name.
func (c *Checker) checkLease(ctx context.Context, r *Report, scope string, k instanceKey, logs string) string {
	name := election.LeaseName(k.name)
	var lease coordinationv1.Lease
	if err := c.Client.Get(ctx, client.ObjectKey{Namespace: k.namespace, Name: name}, &lease); err != nil {
		if apierrors.IsNotFound(err) {
			r.add(scope, "lease", StatusFail,
				fmt.Sprintf("election Lease %s not found: no reporter can lead (reporters may not create it; the webhook does)", name),
				"the webhook's elected replica creates it for each AddonInstance with an injected Deployment; see its log")
		} else {
			r.add(scope, "lease", StatusWarn, fmt.Sprintf("could not read Lease %s: %v", name, err), "run check as a user who may get leases.coordination.k8s.io")
		}
		return ""
	}
	holder := ""
	if lease.Spec.HolderIdentity != nil {
		// The holder is the pod name, or the pod name, "_" and a UUID; a
		// pod name never holds "_".
		holder, _, _ = strings.Cut(*lease.Spec.HolderIdentity, "_")
	}
	if holder == "" {
		r.add(scope, "lease", StatusFail, fmt.Sprintf("Lease %s has no holder: no reporter leads", name), logs)
		return ""
	}
	var pod corev1.Pod
	err := c.Client.Get(ctx, client.ObjectKey{Namespace: k.namespace, Name: holder}, &pod)
	switch {
	case apierrors.IsNotFound(err):
		r.add(scope, "lease", StatusFail,
			fmt.Sprintf("Lease %s is held by pod %s, which does not exist: a standby reporter takes over within 1.5 periods, if one runs", name, holder),
			fmt.Sprintf("kubectl -n %s get pods, and %s", k.namespace, logs))
		return ""
	case err != nil:
		r.add(scope, "lease", StatusWarn, fmt.Sprintf("Lease %s is held by pod %s, which could not be read: %v", name, holder, err),
			"run check as a user who may get pods")
		return holder
	case pod.DeletionTimestamp != nil || pod.Status.Phase != corev1.PodRunning:
		phase := string(pod.Status.Phase)
		if pod.DeletionTimestamp != nil {
			phase = "terminating"
		}
		r.add(scope, "lease", StatusFail, fmt.Sprintf("Lease %s is held by pod %s, which is %s, not running", name, holder, cmp.Or(phase, "in no phase")),
			fmt.Sprintf("kubectl -n %s describe pod %s", k.namespace, holder))
		return holder
	}
	r.ok(scope, "lease", "Lease %s is held by pod %s, which is running", name, holder)
	return holder
}

// reporterFloor is the shortest period the reporter follows.
const reporterFloor = time.Second

// checkHeartbeat judges lastHeartbeatTime as the addon-operator does: late
// after 2 periods (the warning alert), timed out after 3. It reports
// whether heartbeats arrive.
func (c *Checker) checkHeartbeat(r *Report, scope string, ai *addonsv1alpha1.AddonInstance, logs string) bool {
	period := ai.Spec.HeartbeatUpdatePeriod.Duration
	if period < reporterFloor {
		r.add(scope, "heartbeat", StatusFail,
			fmt.Sprintf("heartbeatUpdatePeriod %s is under the reporter's floor of %s: the addon-operator times the addon out after 3 x %s whatever the reporter does",
				period, reporterFloor, period),
			"set spec.heartbeatUpdatePeriod to 1s or more where the addon-operator takes it from (the Addon)")
		return false
	}
	last := ai.Status.LastHeartbeatTime
	if last.IsZero() {
		r.add(scope, "heartbeat", StatusFail, "no heartbeat yet", logs)
		return false
	}
	age := max(c.now().Sub(last.Time), 0).Truncate(time.Second)
	at := last.UTC().Format(time.RFC3339)
	switch {
	case age > 3*period:
		r.add(scope, "heartbeat", StatusFail,
			fmt.Sprintf("last heartbeat %s ago (%s), over 3 periods of %s: the addon-operator reports HeartbeatTimeout", age, at, period), logs)
	case age > 2*period:
		r.add(scope, "heartbeat", StatusWarn, fmt.Sprintf("last heartbeat %s ago (%s), over 2 periods of %s: late", age, at, period), logs)
	default:
		r.ok(scope, "heartbeat", "last heartbeat %s ago (%s), within 2 periods of %s", age, at, period)
	}
	return true
}

// checkConditions shows Degraded and Installed as the reporter wrote them.
func (c *Checker) checkConditions(r *Report, scope string, ai *addonsv1alpha1.AddonInstance, beating bool, logs string) {
	for _, t := range []struct {
		check, typ string
		good       metav1.ConditionStatus
		fix        string
	}{
		{"degraded", heartbeat.ConditionDegraded, metav1.ConditionFalse,
			fmt.Sprintf("the addon is degraded, not its heartbeat: see the components named (kubectl -n %s get deployments)", ai.Namespace)},
		{"installed", heartbeat.ConditionInstalled, metav1.ConditionTrue,
			fmt.Sprintf("Installed turns True once every component has been available: kubectl -n %s get deployments", ai.Namespace)},
	} {
		cond := apimeta.FindStatusCondition(ai.Status.Conditions, t.typ)
		switch {
		case cond == nil && !beating:
			r.add(scope, t.check, StatusSkip, "not written: no heartbeat yet", "")
		case cond == nil:
			r.add(scope, t.check, StatusFail, "not written, although heartbeats arrive: the reporter writes it with every heartbeat", logs)
		case cond.Status == t.good:
			r.ok(scope, t.check, "%s", describeCondition(cond))
		default:
			r.add(scope, t.check, StatusWarn, describeCondition(cond), t.fix)
		}
	}
}

func describeCondition(c *metav1.Condition) string {
	s := string(c.Status) + " " + c.Reason
	if c.Message != "" {
		s += ": " + c.Message
	}
	return s
}

// allowed asks the API server whether user (in groups) may do attrs.
func (c *Checker) allowed(ctx context.Context, user string, groups []string, attrs *authorizationv1.ResourceAttributes) (bool, error) {
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: user, Groups: groups, ResourceAttributes: attrs,
	}}
	if err := c.Client.Create(ctx, sar); err != nil {
		return false, fmt.Errorf("SubjectAccessReview: %w", err)
	}
	return sar.Status.Allowed, nil
}

// describeAccess says what attrs ask for, as in "update
// addoninstances/status addon-instance".
func describeAccess(a *authorizationv1.ResourceAttributes) string {
	res := a.Resource
	if a.Subresource != "" {
		res += "/" + a.Subresource
	}
	if a.Group != "" {
		res += "." + a.Group
	}
	s := a.Verb + " " + res
	if a.Name != "" {
		s += " " + a.Name
	}
	return s
}
