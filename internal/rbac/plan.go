// Package rbac provisions the reporter's permissions: in every served
// namespace that is an addon's (an AddonInstance exists there), one
// RoleBinding binds the reporter ClusterRole to the ServiceAccounts the
// webhook admitted injected Deployments to run as (their signed status
// records), and nothing else; and the election Leases the reporters use are
// created for them. The RoleBinding follows the records: a ServiceAccount no
// record names any more is removed from it, and the RoleBinding is deleted
// when none is left.
package rbac

import (
	"cmp"
	"fmt"
	"slices"

	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/inject"
)

// Deployment is what the controller knows of a Deployment: its name and its
// annotations (it watches Deployments as metadata only; the status record
// says which ServiceAccount the webhook admitted).
type Deployment struct {
	Name        string
	Annotations map[string]string
}

// Lease is an election Lease and the AddonInstance it elects the writer for.
type Lease struct {
	Name, Instance string
}

// Grant is what one namespace is given.
type Grant struct {
	// Subjects of the reporter RoleBinding, sorted; none means no
	// RoleBinding.
	Subjects []rbacv1.Subject
	// Leases are the election Leases to create (the reporters may not),
	// sorted by name.
	Leases []Lease
	// Refused says, per Deployment, why its record grants nothing.
	Refused map[string]string
}

// Plan decides a namespace's grant from its injected Deployments' status
// records, the AddonInstances that exist in it, the ServiceAccounts its
// RoleBinding binds now, and the record signing key.
//
// A ServiceAccount is bound only for a record the webhook signed (so the
// escalation check at admission passed for it) that names an AddonInstance
// of the namespace: annotating a Deployment binds nothing by itself, and
// nothing at all is bound in a namespace that is not an addon's (where the
// operator created no AddonInstance, or deleted it). A record the webhook did
// not sign adds nothing. While a version 1 record (written before records
// were signed) is there, the ServiceAccounts bound now stay bound: an upgrade
// takes no permission away from a running addon, and its next admission
// signs the record. Anyone who may write a Deployment can write such a record
// too, so it keeps only what an admin onboarded, and only while the
// namespace is an addon's; an unsigned or mis-signed version 2 record keeps
// nothing.
func Plan(namespace string, deps []Deployment, instances, bound []string, key []byte) Grant {
	g := Grant{Refused: map[string]string{}}
	var names []string
	var leases []Lease
	keep := false
	for _, d := range deps {
		rec, err := inject.ReadRecord(d.Annotations)
		switch {
		case err != nil:
			g.Refused[d.Name] = err.Error()
			continue
		case rec == nil:
			continue
		}
		if err := rec.Verify(key, namespace); err != nil {
			g.Refused[d.Name] = err.Error() + ": nothing is bound for it until its next admission"
			keep = keep || rec.Version == 1
			continue
		}
		if !slices.Contains(instances, rec.AddonInstance) {
			g.Refused[d.Name] = fmt.Sprintf("AddonInstance %s does not exist in namespace %s", rec.AddonInstance, namespace)
			continue
		}
		names = append(names, rec.ServiceAccount)
		leases = append(leases, Lease{Name: heartbeat.LeaseName(rec.AddonInstance), Instance: rec.AddonInstance})
	}
	if keep && len(instances) > 0 {
		names = append(names, bound...)
	}
	slices.Sort(names)
	for _, n := range slices.Compact(names) {
		g.Subjects = append(g.Subjects, rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: n, Namespace: namespace})
	}
	slices.SortFunc(leases, func(a, b Lease) int { return cmp.Compare(a.Name, b.Name) })
	g.Leases = slices.Compact(leases)
	return g
}

// boundNames are the ServiceAccounts of namespace among subjects.
func boundNames(namespace string, subjects []rbacv1.Subject) []string {
	var out []string
	for _, s := range subjects {
		if s.Kind == rbacv1.ServiceAccountKind && cmp.Or(s.Namespace, namespace) == namespace {
			out = append(out, s.Name)
		}
	}
	return out
}
