package election

import (
	"context"
	"math/rand/v2"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
)

// PeriodAnnotation on the election Lease holds the period the leader
// follows, so that standbys pace their checks by it without reading what
// the leader writes.
const PeriodAnnotation = "addon-heartbeat.io/period"

// InstanceAnnotation on the election Lease names the AddonInstance it elects
// the writer for. The holder sets it with every renewal, and so does whoever
// makes the Lease; the chart's fencing policy (a ValidatingAdmissionPolicy
// with the Lease as its param) reads it to find the Lease of the
// AddonInstance whose status is written, since LeaseName's hash suffix
// cannot be computed in CEL.
const InstanceAnnotation = "addon-heartbeat.io/addon-instance"

// ProcessAnnotation on the election Lease is a random token of the holding
// process, fresh at each start: two processes given the same Identity tell
// each other apart by it (see Config.Identity).
const ProcessAnnotation = "addon-heartbeat.io/holder-process"

// ManagedByLabel and ManagedByValue label every election Lease: the
// fencing policy's binding selects its params by them.
const (
	ManagedByLabel = "app.kubernetes.io/managed-by"
	ManagedByValue = "addon-heartbeat"
)

// Leases are the Elector's requests to the API server.
type Leases interface {
	Get(ctx context.Context, key types.NamespacedName) (*coordinationv1.Lease, error)
	Create(ctx context.Context, l *coordinationv1.Lease) (*coordinationv1.Lease, error)
	Update(ctx context.Context, l *coordinationv1.Lease) (*coordinationv1.Lease, error)
	// Watch watches the one Lease named key from resourceVersion.
	Watch(ctx context.Context, key types.NamespacedName, resourceVersion string) (watch.Interface, error)
}

// NewLeases is Leases over a REST client for coordination.k8s.io/v1 (with a
// scheme that has the Lease), writing as fieldManager.
func NewLeases(c rest.Interface, fieldManager string) Leases {
	return restLeases{c: c, fieldManager: fieldManager}
}

type restLeases struct {
	c            rest.Interface
	fieldManager string
}

func (r restLeases) Get(ctx context.Context, key types.NamespacedName) (*coordinationv1.Lease, error) {
	l := &coordinationv1.Lease{}
	err := r.c.Get().Namespace(key.Namespace).Resource("leases").Name(key.Name).Do(ctx).Into(l)
	return l, err
}

func (r restLeases) Create(ctx context.Context, l *coordinationv1.Lease) (*coordinationv1.Lease, error) {
	out := &coordinationv1.Lease{}
	err := r.c.Post().Namespace(l.Namespace).Resource("leases").
		Param("fieldManager", r.fieldManager).Body(l).Do(ctx).Into(out)
	return out, err
}

func (r restLeases) Update(ctx context.Context, l *coordinationv1.Lease) (*coordinationv1.Lease, error) {
	out := &coordinationv1.Lease{}
	err := r.c.Put().Namespace(l.Namespace).Resource("leases").Name(l.Name).
		Param("fieldManager", r.fieldManager).Body(l).Do(ctx).Into(out)
	return out, err
}

// Watch uses a field selector on the name, so that RBAC can restrict it with
// resourceNames. The API server ends it after 5 to 10 minutes, as it does an
// informer's, so that load spreads over its replicas.
func (r restLeases) Watch(ctx context.Context, key types.NamespacedName, resourceVersion string) (watch.Interface, error) {
	timeout := int64((leaseWatchTimeout + rand.N(leaseWatchTimeout)) / time.Second)
	return r.c.Get().Namespace(key.Namespace).Resource("leases").
		VersionedParams(&metav1.ListOptions{
			FieldSelector:   fields.OneTermEqualSelector("metadata.name", key.Name).String(),
			ResourceVersion: resourceVersion,
			TimeoutSeconds:  &timeout,
			Watch:           true,
		}, metav1.ParameterCodec).
		Watch(ctx)
}

// leaseWatchTimeout is the shortest time a standby's watch on the Lease
// stays open (client-go's reflectors use the same).
const leaseWatchTimeout = 5 * time.Minute

// leaseMeta is the metadata of a Lease the Elector makes.
func leaseMeta(key types.NamespacedName) metav1.ObjectMeta {
	return metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name,
		Labels: map[string]string{ManagedByLabel: ManagedByValue}}
}
