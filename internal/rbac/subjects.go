// Package rbac provisions the reporter's permissions: in every served
// namespace that has injected Deployments, one RoleBinding binds the
// ServiceAccounts those Deployments run as to the reporter ClusterRole, and
// nothing else. The RoleBinding follows the Deployments: a ServiceAccount no
// injected Deployment uses any more is removed from it, and the RoleBinding
// is deleted when none is left.
package rbac

import (
	"cmp"
	"slices"

	appsv1 "k8s.io/api/apps/v1"
	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/annotations"
)

// defaultServiceAccount is what a pod runs as when its spec names none.
const defaultServiceAccount = "default"

// Injected tells whether d has, or is about to get, the reporter: the
// webhook's status annotation is there, or the Deployment opts in. Either is
// enough, so that the permissions are in place before the first reporter
// starts and stay until the reporter is gone.
func Injected(d *appsv1.Deployment) bool {
	if _, ok := d.Annotations[annotations.Status]; ok {
		return true
	}
	inject, err := annotations.ParseInject(annotations.OfDeployment(d))
	return err == nil && inject
}

// ServiceAccount is the ServiceAccount d's pods run as.
func ServiceAccount(d *appsv1.Deployment) string {
	return cmp.Or(d.Spec.Template.Spec.ServiceAccountName, defaultServiceAccount)
}

// Subjects are the ServiceAccounts of the injected Deployments among deps, in
// namespace, sorted by name and without duplicates.
func Subjects(namespace string, deps []appsv1.Deployment) []rbacv1.Subject {
	var names []string
	for i := range deps {
		d := &deps[i]
		// A Deployment being deleted keeps its subject: its reporters
		// still run, and release their Lease on the way out.
		if !Injected(d) {
			continue
		}
		names = append(names, ServiceAccount(d))
	}
	slices.Sort(names)
	names = slices.Compact(names)
	subjects := make([]rbacv1.Subject, 0, len(names))
	for _, n := range names {
		subjects = append(subjects, rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: n, Namespace: namespace})
	}
	return subjects
}
