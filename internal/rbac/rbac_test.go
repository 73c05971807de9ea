package rbac_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	authzv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/addon-heartbeat/addon-heartbeat/internal/rbac"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/annotations"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat"
)

const reporterRole = "addon-heartbeat-reporter"

// allowed asks the API server's authorizer whether sa in saNS may do attrs.
func allowed(t *testing.T, saNS, sa string, attrs authzv1.ResourceAttributes) bool {
	t.Helper()
	sar := &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
		User:               "system:serviceaccount:" + saNS + ":" + sa,
		Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + saNS, "system:authenticated"},
		ResourceAttributes: &attrs,
	}}
	res, err := clientset.AuthorizationV1().SubjectAccessReviews().Create(t.Context(), sar, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return res.Status.Allowed
}

// subjects returns the names bound by the namespace's reporter RoleBinding,
// or nil when there is none.
func subjects(ctx context.Context, ns string) ([]string, error) {
	var rb rbacv1.RoleBinding
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: reporterRole}, &rb); err != nil {
		return nil, err
	}
	var out []string
	for _, s := range rb.Subjects {
		out = append(out, s.Name)
	}
	return out, nil
}

func waitSubjects(t *testing.T, ns string, want ...string) {
	t.Helper()
	poll(t, fmt.Sprintf("RoleBinding in %s binding %v", ns, want), func(ctx context.Context) (bool, string) {
		got, err := subjects(ctx, ns)
		if len(want) == 0 {
			return apierrors.IsNotFound(err), fmt.Sprintf("%v %v", got, err)
		}
		return err == nil && slices.Equal(got, want), fmt.Sprintf("%v %v", got, err)
	})
}

// After the controller bound an injected Deployment's ServiceAccount, the
// API server's authorizer allows that ServiceAccount exactly what the
// reporter does, in its own namespace, and nothing else.
func TestReporterPermissions(t *testing.T) {
	ns := addonNamespace(t, nil)
	other := addonNamespace(t, nil)
	if err := k8s.Create(t.Context(), injected(t, ns, "my-addon", "my-addon-sa", "addon-instance")); err != nil {
		t.Fatal(err)
	}
	waitSubjects(t, ns, "my-addon-sa")
	// The reporter may not create its election Lease: the controller did,
	// with no holder, naming its AddonInstance for the fencing policy.
	poll(t, "the election Lease created by the controller", func(ctx context.Context) (bool, string) {
		var l coordinationv1.Lease
		err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "addon-heartbeat-addon-instance"}, &l)
		return err == nil && l.Labels[rbac.ManagedByLabel] == rbac.ManagedByValue && l.Spec.HolderIdentity == nil &&
			l.Annotations[heartbeat.InstanceAnnotation] == "addon-instance", fmt.Sprintf("%v %v", err, l.Annotations)
	})

	const ai, group = "addon-instance", "addons.managed.openshift.io"
	res := func(ns, group, resource, sub, verb, name string) authzv1.ResourceAttributes {
		return authzv1.ResourceAttributes{Namespace: ns, Group: group, Resource: resource, Subresource: sub, Verb: verb, Name: name}
	}
	tests := map[string]struct {
		attrs authzv1.ResourceAttributes
		want  bool
	}{
		// What the reporter does.
		"get its AddonInstance":                         {res(ns, group, "addoninstances", "", "get", ai), true},
		"list its AddonInstance by name":                {res(ns, group, "addoninstances", "", "list", ai), true},
		"watch its AddonInstance by name":               {res(ns, group, "addoninstances", "", "watch", ai), true},
		"update its status":                             {res(ns, group, "addoninstances", "status", "update", ai), true},
		"update the status of a second listed instance": {res(ns, group, "addoninstances", "status", "update", "second"), true},
		"get its Lease":                                 {res(ns, "coordination.k8s.io", "leases", "", "get", "addon-heartbeat-addon-instance"), true},
		"update its Lease":                              {res(ns, "coordination.k8s.io", "leases", "", "update", "addon-heartbeat-addon-instance"), true},
		"list Deployments":                              {res(ns, "apps", "deployments", "", "list", ""), true},
		"watch Deployments":                             {res(ns, "apps", "deployments", "", "watch", ""), true},
		// Everything else. No create anywhere: RBAC cannot limit create by
		// name, so a create would reach every Lease of the namespace.
		"create a Lease":                                  {res(ns, "coordination.k8s.io", "leases", "", "create", ""), false},
		"create its Lease":                                {res(ns, "coordination.k8s.io", "leases", "", "create", "addon-heartbeat-addon-instance"), false},
		"create an AddonInstance":                         {res(ns, group, "addoninstances", "", "create", ""), false},
		"list Leases":                                     {res(ns, "coordination.k8s.io", "leases", "", "list", ""), false},
		"update the AddonInstance spec":                   {res(ns, group, "addoninstances", "", "update", ai), false},
		"patch the AddonInstance spec":                    {res(ns, group, "addoninstances", "", "patch", ai), false},
		"delete the AddonInstance":                        {res(ns, group, "addoninstances", "", "delete", ai), false},
		"list every AddonInstance":                        {res(ns, group, "addoninstances", "", "list", ""), false},
		"update the status of an unlisted instance":       {res(ns, group, "addoninstances", "status", "update", "someone-else"), false},
		"get another namespace's AddonInstance":           {res(other, group, "addoninstances", "", "get", ai), false},
		"update another namespace's AddonInstance status": {res(other, group, "addoninstances", "status", "update", ai), false},
		"update another Lease":                            {res(ns, "coordination.k8s.io", "leases", "", "update", "kube-controller-manager"), false},
		"delete its Lease":                                {res(ns, "coordination.k8s.io", "leases", "", "delete", "addon-heartbeat-addon-instance"), false},
		"patch its status (it only updates)":              {res(ns, group, "addoninstances", "status", "patch", ai), false},
		"get its status (it reads the object)":            {res(ns, group, "addoninstances", "status", "get", ai), false},
		"create Events (it records none)":                 {res(ns, "", "events", "", "create", ""), false},
		"update Deployments":                              {res(ns, "apps", "deployments", "", "update", "my-addon"), false},
		"get Secrets":                                     {res(ns, "", "secrets", "", "get", "any"), false},
		"list Secrets":                                    {res(ns, "", "secrets", "", "list", ""), false},
		"list Deployments in another namespace":           {res(other, "apps", "deployments", "", "list", ""), false},
		"list Deployments cluster-wide":                   {res("", "apps", "deployments", "", "list", ""), false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := allowed(t, ns, "my-addon-sa", tc.attrs); got != tc.want {
				t.Errorf("allowed = %v, want %v for %+v", got, tc.want, tc.attrs)
			}
		})
	}
	// A ServiceAccount of the same namespace that no injected Deployment
	// uses gets nothing.
	if allowed(t, ns, "bystander", res(ns, group, "addoninstances", "status", "update", ai)) {
		t.Error("a ServiceAccount no injected Deployment uses was granted the reporter role")
	}
}

// The RoleBinding follows the injected Deployments: subjects change with
// their ServiceAccounts and the RoleBinding goes with the last of them.
func TestRoleBindingFollowsDeployments(t *testing.T) {
	ctx := t.Context()
	ns := addonNamespace(t, nil)
	a := injected(t, ns, "a", "sa-a", "addon-instance")
	b := injected(t, ns, "b", "", "addon-instance") // runs as "default"
	if err := k8s.Create(ctx, a); err != nil {
		t.Fatal(err)
	}
	if err := k8s.Create(ctx, b); err != nil {
		t.Fatal(err)
	}
	if err := k8s.Create(ctx, addon(ns, "not-injected", "sa-plain", nil)); err != nil {
		t.Fatal(err)
	}
	waitSubjects(t, ns, "default", "sa-a")

	// b changes its ServiceAccount, admitted by the webhook.
	b.Spec.Template.Spec.ServiceAccountName = "sa-b"
	b = admit(t, b)
	if err := k8s.Update(ctx, b); err != nil {
		t.Fatal(err)
	}
	waitSubjects(t, ns, "sa-a", "sa-b")
	if allowed(t, ns, "default", authzv1.ResourceAttributes{Namespace: ns, Group: "addons.managed.openshift.io", Resource: "addoninstances", Verb: "get", Name: "addon-instance"}) {
		t.Error("the ServiceAccount no Deployment uses any more keeps the reporter role")
	}

	// a opts out (the webhook removes its status annotation on the way).
	a.Annotations[annotations.Inject] = "false"
	a = admit(t, a)
	if err := k8s.Update(ctx, a); err != nil {
		t.Fatal(err)
	}
	waitSubjects(t, ns, "sa-b")

	// The last injected Deployment goes: so does the RoleBinding.
	if err := k8s.Delete(ctx, b); err != nil {
		t.Fatal(err)
	}
	waitSubjects(t, ns)
	if allowed(t, ns, "sa-b", authzv1.ResourceAttributes{Namespace: ns, Group: "addons.managed.openshift.io", Resource: "addoninstances", Subresource: "status", Verb: "update", Name: "addon-instance"}) {
		t.Error("permissions outlived the RoleBinding")
	}
}

// A RoleBinding deleted or edited by hand is put back.
func TestRoleBindingRestored(t *testing.T) {
	ctx := t.Context()
	ns := addonNamespace(t, nil)
	if err := k8s.Create(ctx, injected(t, ns, "a", "sa-a", "addon-instance")); err != nil {
		t.Fatal(err)
	}
	waitSubjects(t, ns, "sa-a")
	var rb rbacv1.RoleBinding
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: reporterRole}, &rb); err != nil {
		t.Fatal(err)
	}
	rb.Subjects = append(rb.Subjects, rbacv1.Subject{Kind: "ServiceAccount", Name: "intruder", Namespace: ns})
	if err := k8s.Update(ctx, &rb); err != nil {
		t.Fatal(err)
	}
	waitSubjects(t, ns, "sa-a")
	if err := k8s.Delete(ctx, &rb); err != nil {
		t.Fatal(err)
	}
	poll(t, "RoleBinding recreated", func(ctx context.Context) (bool, string) {
		var again rbacv1.RoleBinding
		err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: reporterRole}, &again)
		return err == nil && again.UID != rb.UID && again.Labels[rbac.ManagedByLabel] == rbac.ManagedByValue, fmt.Sprint(err)
	})
}

// Annotating a Deployment grants nothing in a namespace the webhook's
// namespaceSelector leaves out (here by label, and the webhook's own
// namespace), and a namespace that leaves the selector loses its RoleBinding.
func TestNamespaceOutsideSelector(t *testing.T) {
	ctx := t.Context()
	disabled := map[string]string{"example.com/addons": "disabled"}
	out := addonNamespace(t, disabled)
	if err := k8s.Create(ctx, injected(t, out, "a", "sa-a", "addon-instance")); err != nil {
		t.Fatal(err)
	}
	ai := newAddonInstance(t, "addon-heartbeat-system", "addon-instance")
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), ai) })
	sneaky := injected(t, "addon-heartbeat-system", "sneaky", "sa-sneaky", "addon-instance")
	if err := k8s.Create(ctx, sneaky); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), sneaky) })
	// A namespace in the selector, created afterwards, as a sign that the
	// controller has seen the Deployments above.
	in := addonNamespace(t, nil)
	if err := k8s.Create(ctx, injected(t, in, "a", "sa-a", "addon-instance")); err != nil {
		t.Fatal(err)
	}
	waitSubjects(t, in, "sa-a")
	for _, ns := range []string{out, "addon-heartbeat-system"} {
		if got, err := subjects(ctx, ns); !apierrors.IsNotFound(err) {
			t.Errorf("namespace %s outside the selector has a RoleBinding for %v (%v)", ns, got, err)
		}
	}
	if allowed(t, out, "sa-a", authzv1.ResourceAttributes{Namespace: out, Group: "addons.managed.openshift.io", Resource: "addoninstances", Subresource: "status", Verb: "update", Name: "addon-instance"}) {
		t.Error("a ServiceAccount outside the selector was granted the reporter role")
	}

	// The admin lets the namespace in, then leaves it out again.
	setLabels := func(ns string, labels map[string]string) {
		t.Helper()
		var n corev1.Namespace
		if err := k8s.Get(ctx, types.NamespacedName{Name: ns}, &n); err != nil {
			t.Fatal(err)
		}
		n.Labels = labels
		if err := k8s.Update(ctx, &n); err != nil {
			t.Fatal(err)
		}
	}
	setLabels(out, nil)
	waitSubjects(t, out, "sa-a")
	setLabels(out, disabled)
	waitSubjects(t, out)
}

// Must show 3: a signed record binds nothing in a namespace where its
// AddonInstance does not exist; the binding (and the election Lease) appear
// when the operator creates the AddonInstance, and the binding goes with it.
func TestBindsOnlyWhereTheAddonInstanceExists(t *testing.T) {
	ctx := t.Context()
	ns := newNamespace(t, nil)
	if err := k8s.Create(ctx, injected(t, ns, "a", "sa-a", "addon-instance")); err != nil {
		t.Fatal(err)
	}
	// An addon namespace, created afterwards, as a sign that the controller
	// has seen the Deployment above.
	sign := addonNamespace(t, nil)
	if err := k8s.Create(ctx, injected(t, sign, "a", "sa-a", "addon-instance")); err != nil {
		t.Fatal(err)
	}
	waitSubjects(t, sign, "sa-a")
	if got, err := subjects(ctx, ns); !apierrors.IsNotFound(err) {
		t.Fatalf("a namespace without the AddonInstance has a RoleBinding for %v (%v)", got, err)
	}
	var lease coordinationv1.Lease
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "addon-heartbeat-addon-instance"}, &lease); !apierrors.IsNotFound(err) {
		t.Fatalf("a namespace without the AddonInstance got an election Lease (%v)", err)
	}

	ai := newAddonInstance(t, ns, "addon-instance")
	waitSubjects(t, ns, "sa-a")
	if !allowed(t, ns, "sa-a", authzv1.ResourceAttributes{Namespace: ns, Group: "addons.managed.openshift.io", Resource: "addoninstances", Subresource: "status", Verb: "update", Name: "addon-instance"}) {
		t.Error("the ServiceAccount may not update the AddonInstance status once it exists")
	}
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "addon-heartbeat-addon-instance"}, &lease); err != nil {
		t.Errorf("no election Lease once the AddonInstance exists: %v", err)
	}

	if err := k8s.Delete(ctx, ai); err != nil {
		t.Fatal(err)
	}
	waitSubjects(t, ns)
}

// Must show 1 (the controller's half): a status record the webhook did not
// sign binds nothing: one edited to name another ServiceAccount, one
// without a signature (the first record version, or written by hand while
// the webhook was down under failurePolicy Ignore), and one copied from
// another namespace. A pod template whose ServiceAccount changed behind the
// webhook's back binds only what the record names.
func TestUnsignedRecordsGrantNothing(t *testing.T) {
	ctx := t.Context()
	ns := addonNamespace(t, nil)
	other := addonNamespace(t, nil)

	edited := injected(t, ns, "edited", "sa-x", "addon-instance")
	edited.Annotations[annotations.Status] = strings.Replace(edited.Annotations[annotations.Status], `"serviceAccount":"sa-x"`, `"serviceAccount":"sa-edited"`, 1)
	unsigned := addon(ns, "unsigned", "sa-unsigned", map[string]string{annotations.Inject: "true",
		annotations.Status: `{"version":2,"sidecar":"initContainers","serviceAccount":"sa-unsigned","addonInstance":"addon-instance"}`})
	v1 := addon(ns, "v1", "sa-v1", map[string]string{annotations.Inject: "true",
		annotations.Status: `{"version":1,"sidecar":"initContainers"}`})
	copied := injected(t, other, "copied", "sa-copied", "addon-instance")
	copied.Namespace = ns
	behind := injected(t, ns, "behind", "sa-record", "addon-instance")
	behind.Spec.Template.Spec.ServiceAccountName = "sa-template"
	for _, d := range []*appsv1.Deployment{edited, unsigned, v1, copied, behind} {
		if err := k8s.Create(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	// The one signed record of the namespace is the only subject.
	waitSubjects(t, ns, "sa-record")
	for _, sa := range []string{"sa-x", "sa-edited", "sa-unsigned", "sa-v1", "default", "sa-copied", "sa-template"} {
		if allowed(t, ns, sa, authzv1.ResourceAttributes{Namespace: ns, Group: "addons.managed.openshift.io", Resource: "addoninstances", Subresource: "status", Verb: "update", Name: "addon-instance"}) {
			t.Errorf("ServiceAccount %s got the reporter role from a record the webhook did not sign for it", sa)
		}
	}
}
