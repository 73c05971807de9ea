package webhook

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	addonsv1alpha1 "github.com/openshift/addon-operator/apis/addons/v1alpha1"
	appsv1 "k8s.io/api/apps/v1"
	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/annotations"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/election"
)

// as is a client that impersonates user in groups (the API server then
// authorizes and admits as that user, and tells the webhook who it is).
func as(t *testing.T, user string, groups ...string) client.Client {
	t.Helper()
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: append(groups, "system:authenticated")}
	c, err := client.New(cfg, client.Options{Scheme: k8s.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// grant gives user (a User, or a ServiceAccount "ns/name") rules in ns,
// through a Role and a RoleBinding.
func grant(t *testing.T, ns, name string, subject rbacv1.Subject, rules ...rbacv1.PolicyRule) {
	t.Helper()
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Rules: rules}
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name}, Subjects: []rbacv1.Subject{subject}}
	for _, o := range []client.Object{role, rb} {
		if err := k8s.Create(t.Context(), o); err != nil {
			t.Fatal(err)
		}
	}
}

var deploymentWriter = rbacv1.PolicyRule{APIGroups: []string{"apps"}, Resources: []string{"deployments"},
	Verbs: []string{"get", "list", "watch", "create", "update", "patch"}}

// reporterMay asks the authorizer whether ServiceAccount sa of ns may update
// the AddonInstance status or the election Lease: any of the reporter's
// permissions.
func reporterMay(t *testing.T, ns, sa string) []string {
	t.Helper()
	var got []string
	for _, attrs := range []authzv1.ResourceAttributes{
		{Namespace: ns, Group: "addons.managed.openshift.io", Resource: "addoninstances", Subresource: "status", Verb: "update", Name: "addon-instance"},
		{Namespace: ns, Group: "addons.managed.openshift.io", Resource: "addoninstances", Verb: "get", Name: "addon-instance"},
		{Namespace: ns, Group: "coordination.k8s.io", Resource: "leases", Verb: "update", Name: election.LeaseName("addon-instance")},
		{Namespace: ns, Group: "coordination.k8s.io", Resource: "leases", Verb: "create"},
	} {
		sar := &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
			User:               "system:serviceaccount:" + ns + ":" + sa,
			Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
			ResourceAttributes: &attrs,
		}}
		res, err := clientset.AuthorizationV1().SubjectAccessReviews().Create(t.Context(), sar, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if res.Status.Allowed {
			got = append(got, strings.TrimSpace(fmt.Sprint(attrs.Verb, " ", attrs.Resource, "/", attrs.Subresource, " ", attrs.Name)))
		}
	}
	return got
}

// addonNamespace is a namespace holding AddonInstance "addon-instance", as
// the operator makes for an addon.
func addonNamespace(t *testing.T) string {
	t.Helper()
	ns := newNamespace(t)
	ai := &addonsv1alpha1.AddonInstance{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "addon-instance"},
		Spec: addonsv1alpha1.AddonInstanceSpec{HeartbeatUpdatePeriod: metav1.Duration{Duration: 10 * time.Second}}}
	if err := k8s.Create(t.Context(), ai); err != nil {
		t.Fatal(err)
	}
	return ns
}

func withSA(d *appsv1.Deployment, sa string) *appsv1.Deployment {
	d.Spec.Template.Spec.ServiceAccountName = sa
	return d
}

// boundSubjects are the ServiceAccounts of ns's reporter RoleBinding.
func boundSubjects(ctx context.Context, ns string) ([]string, error) {
	var rb rbacv1.RoleBinding
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: options.ReporterClusterRole}, &rb); err != nil {
		return nil, err
	}
	var out []string
	for _, s := range rb.Subjects {
		out = append(out, s.Name)
	}
	slices.Sort(out)
	return out, nil
}

func waitBound(t *testing.T, ns string, want ...string) {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, testTimeout, true, func(ctx context.Context) (bool, error) {
		got, err := boundSubjects(ctx, ns)
		last = fmt.Sprintf("%v %v", got, err)
		return err == nil && slices.Equal(got, want), nil
	})
	if err != nil {
		t.Fatalf("RoleBinding in %s binding %v: %v (last %s)", ns, want, err, last)
	}
}

// Must show 1: a user who may only create and update Deployments in an addon
// namespace gets none of the reporter's permissions for any ServiceAccount,
// whichever way it opts in (annotation, label, pod-template annotation), with
// a forged status record, or by changing the ServiceAccount of an injected
// Deployment; each denial names the permission it lacks and who can onboard.
// A rollout restart and a scale of the injected Deployment stay allowed.
// Must show 2: a cluster admin, an OLM-like ServiceAccount (OLM's operator
// runs as cluster-admin) and a user who holds the reporter's permissions
// onboard as before.
func TestOnlyWhoMayGrantTheReporterRoleOnboards(t *testing.T) {
	ctx := t.Context()
	ns := addonNamespace(t)
	grant(t, ns, "tenant", rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "tenant"}, deploymentWriter)
	tenant := as(t, "tenant")

	// The cluster admin onboards the addon.
	admin := as(t, "admin", "system:masters")
	if err := admin.Create(ctx, withSA(addon(ns, "addon", optIn()), "addon-sa")); err != nil {
		t.Fatalf("the cluster admin could not onboard: %v", err)
	}
	waitBound(t, ns, "addon-sa")

	forgedRecord := `{"version":2,"sidecar":"initContainers","serviceAccount":"tenant-sa","addonInstance":"addon-instance","signature":"forged"}`
	denials := map[string]*appsv1.Deployment{
		"annotation": withSA(addon(ns, "by-annotation", optIn()), "tenant-sa"),
		"label": func() *appsv1.Deployment {
			d := withSA(addon(ns, "by-label", nil), "tenant-sa")
			d.Labels = map[string]string{annotations.Inject: "true"}
			return d
		}(),
		"pod-template annotation": func() *appsv1.Deployment {
			d := withSA(addon(ns, "by-template", nil), "tenant-sa")
			d.Spec.Template.Annotations = map[string]string{annotations.Inject: "true"}
			return d
		}(),
		"forged status record":                   withSA(addon(ns, "forged", map[string]string{annotations.Inject: "true", annotations.Status: forgedRecord}), "tenant-sa"),
		"the namespace's default ServiceAccount": addon(ns, "as-default", optIn()),
	}
	for name, d := range denials {
		t.Run("create by "+name, func(t *testing.T) {
			err := tenant.Create(ctx, d)
			assertDenied(t, err, "tenant", ns, d.Spec.Template.Spec.ServiceAccountName)
		})
	}

	t.Run("update the ServiceAccount of an injected Deployment", func(t *testing.T) {
		var d appsv1.Deployment
		if err := tenant.Get(ctx, client.ObjectKey{Namespace: ns, Name: "addon"}, &d); err != nil {
			t.Fatal(err)
		}
		d.Spec.Template.Spec.ServiceAccountName = "tenant-sa"
		assertDenied(t, tenant.Update(ctx, &d), "tenant", ns, "tenant-sa")
	})

	t.Run("a forged record without the opt-in is dropped", func(t *testing.T) {
		d := withSA(addon(ns, "forged-no-opt-in", map[string]string{annotations.Status: forgedRecord}), "tenant-sa")
		if err := tenant.Create(ctx, d); err != nil {
			t.Fatal(err)
		}
		if got := get(t, ns, d.Name); got.Annotations[annotations.Status] != "" {
			t.Errorf("the forged record was kept: %s", got.Annotations[annotations.Status])
		}
	})

	t.Run("rollout restart and scale stay allowed", func(t *testing.T) {
		restart := client.RawPatch(types.StrategicMergePatchType,
			[]byte(`{"spec":{"template":{"metadata":{"annotations":{"kubectl.kubernetes.io/restartedAt":"2026-12-03T12:00:00Z"}}}}}`))
		if err := tenant.Patch(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "addon"}}, restart); err != nil {
			t.Errorf("rollout restart: %v", err)
		}
		scale := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"replicas":3}}`))
		if err := tenant.Patch(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "addon"}}, scale); err != nil {
			t.Errorf("scale: %v", err)
		}
	})

	// Nothing the tenant did reached the RoleBinding or the authorizer.
	waitBound(t, ns, "addon-sa")
	for _, sa := range []string{"tenant-sa", "default"} {
		if got := reporterMay(t, ns, sa); len(got) > 0 {
			t.Errorf("ServiceAccount %s may %v", sa, got)
		}
	}

	// Who may grant the role onboards: an OLM-like ServiceAccount bound to
	// cluster-admin, and a user holding exactly the reporter's permissions.
	olmSA := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "olm-operator"}}
	if err := k8s.Create(ctx, olmSA); err != nil {
		t.Fatal(err)
	}
	crb := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "olm-like-" + ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: olmSA.Name}}}
	if err := k8s.Create(ctx, crb); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), crb) })
	olm := as(t, "system:serviceaccount:"+ns+":olm-operator", "system:serviceaccounts", "system:serviceaccounts:"+ns)
	if err := olm.Create(ctx, withSA(addon(ns, "from-csv", optIn()), "csv-sa")); err != nil {
		t.Fatalf("an OLM-like ServiceAccount could not onboard: %v", err)
	}
	holder := rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "addon-admin"}
	grant(t, ns, "addon-admin", holder, append(heartbeat.PolicyRules("addon-instance"), deploymentWriter)...)
	if err := as(t, "addon-admin").Create(ctx, withSA(addon(ns, "by-holder", optIn()), "holder-sa")); err != nil {
		t.Fatalf("a user holding the reporter's permissions could not onboard: %v", err)
	}
	waitBound(t, ns, "addon-sa", "csv-sa", "holder-sa")
	// The suite runs no chart: the reporter ClusterRole the binding names is
	// made here, so that the authorizer answers for it.
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: options.ReporterClusterRole}, Rules: heartbeat.PolicyRules("addon-instance")}
	if err := k8s.Create(ctx, role); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	// The authorizer sees a new role through its informer: await it.
	var got []string
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, testTimeout, true, func(context.Context) (bool, error) {
		got = reporterMay(t, ns, "csv-sa")
		return len(got) == 3, nil
	}); err != nil {
		t.Errorf("the onboarded ServiceAccount may %v, want the reporter's three", got)
	}
}

func assertDenied(t *testing.T, err error, user, ns, sa string) {
	t.Helper()
	if !apierrors.IsForbidden(err) {
		t.Fatalf("admitted (err %v), want a denial", err)
	}
	if sa == "" {
		sa = "default"
	}
	for _, want := range []string{
		fmt.Sprintf("user %q may not give ServiceAccount %s/%s", user, ns, sa),
		"may not bind ClusterRole \"" + options.ReporterClusterRole + "\"",
		"verb bind on clusterroles.rbac.authorization.k8s.io",
		"it may not get addoninstances.addons.managed.openshift.io addon-instance",
		"A cluster admin, or whoever may bind that ClusterRole",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the denial does not say %q:\n%v", want, err)
		}
	}
}

// The check is asked of the authorizer for the user the API server names, so
// it follows RBAC as it changes: once the tenant is given bind on the
// reporter ClusterRole in its namespace, it onboards.
func TestBindPermissionOnboards(t *testing.T) {
	ctx := t.Context()
	ns := addonNamespace(t)
	grant(t, ns, "deployer", rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "deployer"}, deploymentWriter,
		rbacv1.PolicyRule{APIGroups: []string{rbacv1.GroupName}, Resources: []string{"clusterroles"}, Verbs: []string{"bind"},
			ResourceNames: []string{options.ReporterClusterRole}})
	if err := as(t, "deployer").Create(ctx, withSA(addon(ns, "addon", optIn()), "addon-sa")); err != nil {
		t.Fatalf("a user with bind on the reporter ClusterRole could not onboard: %v", err)
	}
	waitBound(t, ns, "addon-sa")
}
