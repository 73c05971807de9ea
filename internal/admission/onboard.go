package admission

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilcache "k8s.io/apimachinery/pkg/util/cache"
	authorizationv1client "k8s.io/client-go/kubernetes/typed/authorization/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Onboarding applies Kubernetes' RBAC escalation rule to the reporter
// binding at admission. The webhook holds bind on the reporter ClusterRole,
// so the API server's own check (whoever binds a role must be allowed to bind
// it, or hold all of its permissions) never applies to what the RBAC
// controller grants; without this, anyone who may create a Deployment could
// give any ServiceAccount of the namespace the reporter's permissions. When an
// admission would add a subject to the namespace's reporter RoleBinding, the
// requesting user must pass that same rule, asked of the API server's
// authorizer with SubjectAccessReviews.
type Onboarding struct {
	// Bindings reads the namespaces' reporter RoleBindings (the manager's
	// cache, limited to their name).
	Bindings client.Reader
	// Reviews asks the API server's authorizer.
	Reviews authorizationv1client.SubjectAccessReviewInterface
	// ClusterRole is the reporter ClusterRole and BindingName the name of
	// the RoleBinding the RBAC controller keeps in each namespace.
	ClusterRole, BindingName string
	// Rules are the ClusterRole's permissions (heartbeat.PolicyRules for
	// each allowed AddonInstance), for "holds its permissions".
	Rules []rbacv1.PolicyRule

	once      sync.Once
	decisions *utilcache.LRUExpireCache
}

// decisionTTL is how long a user's answer for a namespace is reused: a burst
// of admissions (a CSV with several Deployments, a GitOps sync) costs one set
// of reviews, and a grant or a revocation is seen within it.
const decisionTTL = 10 * time.Second

// Check reports whether user may give ServiceAccount sa of namespace the
// reporter's permissions. When it may not, why says what it lacks.
func (o *Onboarding) Check(ctx context.Context, user authenticationv1.UserInfo, namespace, sa string) (ok bool, why string, err error) {
	bound, err := o.bound(ctx, namespace, sa)
	if err != nil || bound {
		// Already bound: nothing is added.
		return bound, "", err
	}
	o.once.Do(func() { o.decisions = utilcache.NewLRUExpireCache(4096) })
	key := decisionKey(user, namespace)
	if v, found := o.decisions.Get(key); found {
		d := v.(decision)
		return d.ok, d.why, nil
	}
	d, err := o.decide(ctx, user, namespace)
	if err != nil {
		return false, "", err
	}
	o.decisions.Add(key, d, decisionTTL)
	return d.ok, d.why, nil
}

type decision struct {
	ok  bool
	why string
}

// bound reports whether the namespace's reporter RoleBinding already has sa.
func (o *Onboarding) bound(ctx context.Context, namespace, sa string) (bool, error) {
	var rb rbacv1.RoleBinding
	err := o.Bindings.Get(ctx, types.NamespacedName{Namespace: namespace, Name: o.BindingName}, &rb)
	switch {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("reading RoleBinding %s/%s: %w", namespace, o.BindingName, err)
	}
	if rb.RoleRef.Kind != "ClusterRole" || rb.RoleRef.Name != o.ClusterRole {
		return false, nil
	}
	return slices.ContainsFunc(rb.Subjects, func(s rbacv1.Subject) bool {
		return s.Kind == rbacv1.ServiceAccountKind && s.Namespace == namespace && s.Name == sa
	}), nil
}

// decide asks the authorizer whether user may bind the ClusterRole in
// namespace, and else whether it holds each of its permissions there.
func (o *Onboarding) decide(ctx context.Context, user authenticationv1.UserInfo, namespace string) (decision, error) {
	bind := authorizationv1.ResourceAttributes{Namespace: namespace, Verb: "bind", Group: rbacv1.GroupName,
		Resource: "clusterroles", Name: o.ClusterRole}
	if ok, err := o.allowed(ctx, user, bind); err != nil || ok {
		return decision{ok: ok}, err
	}
	for _, attrs := range expand(o.Rules, namespace) {
		ok, err := o.allowed(ctx, user, attrs)
		if err != nil {
			return decision{}, err
		}
		if !ok {
			return decision{why: fmt.Sprintf("it may not bind ClusterRole %q in namespace %q (verb bind on clusterroles.rbac.authorization.k8s.io), "+
				"nor does it hold the role's permissions (it may not %s)", o.ClusterRole, namespace, describe(attrs))}, nil
		}
	}
	return decision{ok: true}, nil
}

func (o *Onboarding) allowed(ctx context.Context, user authenticationv1.UserInfo, attrs authorizationv1.ResourceAttributes) (bool, error) {
	extra := map[string]authorizationv1.ExtraValue{}
	for k, v := range user.Extra {
		extra[k] = authorizationv1.ExtraValue(v)
	}
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: user.Username, UID: user.UID, Groups: user.Groups, Extra: extra, ResourceAttributes: &attrs,
	}}
	res, err := o.Reviews.Create(ctx, sar, metav1.CreateOptions{})
	if err != nil {
		return false, fmt.Errorf("asking the authorizer whether %q may %s: %w", user.Username, describe(attrs), err)
	}
	return res.Status.Allowed, nil
}

// expand turns rules into one request each (verb, resource, name) in
// namespace.
func expand(rules []rbacv1.PolicyRule, namespace string) []authorizationv1.ResourceAttributes {
	var out []authorizationv1.ResourceAttributes
	for _, r := range rules {
		names := r.ResourceNames
		if len(names) == 0 {
			names = []string{""}
		}
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				resource, sub, _ := strings.Cut(res, "/")
				for _, v := range r.Verbs {
					for _, n := range names {
						out = append(out, authorizationv1.ResourceAttributes{Namespace: namespace, Group: g,
							Resource: resource, Subresource: sub, Verb: v, Name: n})
					}
				}
			}
		}
	}
	return out
}

// describe names a request as RBAC would: "update addoninstances/status
// addon-instance".
func describe(a authorizationv1.ResourceAttributes) string {
	res := a.Resource
	if a.Group != "" {
		res += "." + a.Group
	}
	if a.Subresource != "" {
		res += "/" + a.Subresource
	}
	if a.Name != "" {
		res += " " + a.Name
	}
	return a.Verb + " " + res
}

// decisionKey identifies a user (everything the authorizer sees) and a
// namespace.
func decisionKey(u authenticationv1.UserInfo, namespace string) string {
	groups := slices.Clone(u.Groups)
	slices.Sort(groups)
	var extra []string
	for k, v := range u.Extra {
		extra = append(extra, k+"="+strings.Join(v, ","))
	}
	slices.Sort(extra)
	return strings.Join([]string{namespace, u.Username, u.UID, strings.Join(groups, ","), strings.Join(extra, ";")}, "\x00")
}
