package heartbeat

import (
	rbacv1 "k8s.io/api/rbac/v1"

	addonsv1alpha1 "github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/internal/addonsv1alpha1"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/election"
)

// PolicyRules are the only permissions a Reporter uses, in the AddonInstance's
// namespace, for the AddonInstance named instance:
//
//   - get, list, watch that AddonInstance (list and watch carry a field
//     selector on its name, so resourceNames applies to them too);
//   - update its status (the heartbeat);
//   - get, watch and update the election Lease LeaseName(instance)
//     (standbys watch it, with a field selector on its name). No create:
//     RBAC cannot restrict create by name, so whoever provisions a
//     Reporter's RBAC creates the Lease (the webhook does for the sidecar);
//     a Reporter that may create it does so itself;
//   - list and watch Deployments (zero-code health; not needed in SDK mode
//     without DeploymentHealth).
//
// It never needs patch, delete, or any access to the AddonInstance spec.
func PolicyRules(instance string) []rbacv1.PolicyRule {
	group := addonsv1alpha1.GroupVersion.Group
	return []rbacv1.PolicyRule{
		{APIGroups: []string{group}, Resources: []string{"addoninstances"}, ResourceNames: []string{instance},
			Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{group}, Resources: []string{"addoninstances/status"}, ResourceNames: []string{instance},
			Verbs: []string{"update"}},
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, ResourceNames: []string{election.LeaseName(instance)},
			Verbs: []string{"get", "watch", "update"}},
		{APIGroups: []string{"apps"}, Resources: []string{"deployments"}, Verbs: []string{"list", "watch"}},
	}
}
