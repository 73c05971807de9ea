package rbac

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/annotations"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/inject"
)

// ManagedByLabel marks the RoleBindings this controller owns; one with the
// same name but without it is the user's and is never touched.
const (
	ManagedByLabel = "app.kubernetes.io/managed-by"
	ManagedByValue = "addon-heartbeat"
)

// Config is what the controller needs to know.
type Config struct {
	// ClusterRole is the reporter ClusterRole the RoleBindings refer to.
	ClusterRole string
	// RoleBindingName is the name of the RoleBinding in each namespace.
	RoleBindingName string
	// NamespaceSelector selects the namespaces served: the webhook
	// configuration's namespaceSelector. No RoleBinding exists elsewhere.
	NamespaceSelector labels.Selector
	// Key returns the key the webhook signs status records with (nil until
	// it is loaded); only signed records are bound.
	Key func() []byte
}

// Validate reports a Config that cannot work.
func (c Config) Validate() error {
	var errs []error
	if c.ClusterRole == "" {
		errs = append(errs, errors.New("reporter ClusterRole: must be set"))
	}
	if c.RoleBindingName == "" {
		errs = append(errs, errors.New("reporter RoleBinding name: must be set"))
	}
	if c.NamespaceSelector == nil {
		errs = append(errs, errors.New("namespace selector: must be set"))
	}
	return errors.Join(errs...)
}

// metadataOf is a metadata-only object of a kind, as the cache keys them.
func metadataOf(gvk schema.GroupVersionKind) *metav1.PartialObjectMetadata {
	m := &metav1.PartialObjectMetadata{}
	m.SetGroupVersionKind(gvk)
	return m
}

var (
	deploymentGVK    = appsv1.SchemeGroupVersion.WithKind("Deployment")
	addonInstanceGVK = schema.GroupVersionKind{Group: "addons.managed.openshift.io", Version: "v1alpha1", Kind: "AddonInstance"}
	leaseGVK         = coordinationv1.SchemeGroupVersion.WithKind("Lease")
)

// CacheOptions limit what the manager caches for this controller, so that
// its permissions and its memory are limited too: RoleBindings by name only
// (RBAC resourceNames then applies to list and watch), Deployments and
// AddonInstances as metadata only (the API server sends no pod template, so
// the webhook never holds the env values and images of every workload of the
// cluster), cut down further to the status record, and the election Leases
// it made (by label) as metadata.
func (c Config) CacheOptions() map[client.Object]cache.ByObject {
	return map[client.Object]cache.ByObject{
		&rbacv1.RoleBinding{}:        {Field: fields.OneTermEqualSelector("metadata.name", c.RoleBindingName)},
		metadataOf(deploymentGVK):    {Transform: slimMetadata(compactRecord)},
		metadataOf(addonInstanceGVK): {Transform: slimMetadata(nil)},
		metadataOf(leaseGVK):         {Label: labels.SelectorFromSet(labels.Set{ManagedByLabel: ManagedByValue}), Transform: slimMetadata(nil)},
	}
}

// slimMetadata keeps an object's identity and, with record, the status
// record annotation as record gives it.
func slimMetadata(record func(string) string) toolscache.TransformFunc {
	return func(obj any) (any, error) {
		m, ok := obj.(*metav1.PartialObjectMetadata)
		if !ok {
			return obj, nil
		}
		slim := &metav1.PartialObjectMetadata{TypeMeta: m.TypeMeta, ObjectMeta: metav1.ObjectMeta{
			Name: m.Name, Namespace: m.Namespace, UID: m.UID,
			ResourceVersion: m.ResourceVersion, DeletionTimestamp: m.DeletionTimestamp,
		}}
		if v, ok := m.Annotations[annotations.Status]; ok && record != nil {
			slim.Annotations = map[string]string{annotations.Status: record(v)}
		}
		return slim, nil
	}
}

// maxKeptInvalid bounds what the cache keeps of a status annotation that is
// no record: enough to say what it was, in the reason it grants nothing.
const maxKeptInvalid = 128

// compactRecord is what the cache keeps of a Deployment's status record:
// what the RBAC plan reads (the version, the ServiceAccount, the
// AddonInstance and the signature), a few hundred bytes whatever the
// annotation holds. Anyone who may write a Deployment may write that
// annotation, up to 256 KiB, in every Deployment the webhook watches; kept
// whole it would be the cache's memory to grow. A value that is no record
// grants nothing, and is kept cut (and still no record: "..." ends no JSON
// object).
func compactRecord(v string) string {
	rec, err := inject.ReadRecord(map[string]string{annotations.Status: v})
	if err != nil || rec == nil {
		if len(v) > maxKeptInvalid {
			return v[:maxKeptInvalid] + "..."
		}
		return v
	}
	rec.Env = nil
	b, err := json.Marshal(rec)
	if err != nil {
		return "" // a struct of strings and ints does not fail to encode
	}
	return string(b)
}

// Reconciler keeps the reporter RoleBinding of one namespace (the request's
// Name) in line with the namespace's signed status records and its
// AddonInstances (see Plan), and creates the election Leases the reporters
// use, which they may not create themselves.
type Reconciler struct {
	Client client.Client
	Config Config
	Log    logr.Logger
}

// SetupWithManager registers the controller: a namespace is reconciled when
// it changes (its labels decide whether it is served), when a Deployment with
// a status record, an AddonInstance, its RoleBinding (so that a deleted or
// edited one is put back) or one of its election Leases changes.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if err := r.Config.Validate(); err != nil {
		return err
	}
	toNamespace := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: o.GetNamespace()}}}
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("reporter-rbac").
		WithOptions(controller.Options{MaxConcurrentReconciles: 2}).
		// A namespace update matters only when its labels change: they decide
		// whether the namespace is served.
		For(&corev1.Namespace{}, builder.WithPredicates(predicate.LabelChangedPredicate{})).
		WatchesMetadata(metadataOf(deploymentGVK), toNamespace, builder.WithPredicates(recordChanges())).
		WatchesMetadata(metadataOf(addonInstanceGVK), toNamespace, builder.WithPredicates(createOrDelete())).
		WatchesMetadata(metadataOf(leaseGVK), toNamespace, builder.WithPredicates(createOrDelete())).
		Watches(&rbacv1.RoleBinding{}, toNamespace).
		Complete(r)
}

// recordChanges lets through the Deployment events that can change a grant:
// those of a Deployment with a status record, before or after.
func recordChanges() predicate.Predicate {
	has := func(o client.Object) bool {
		_, ok := o.GetAnnotations()[annotations.Status]
		return ok
	}
	return predicate.Funcs{
		CreateFunc:  func(e event.CreateEvent) bool { return has(e.Object) },
		DeleteFunc:  func(e event.DeleteEvent) bool { return has(e.Object) },
		UpdateFunc:  func(e event.UpdateEvent) bool { return has(e.ObjectOld) || has(e.ObjectNew) },
		GenericFunc: func(e event.GenericEvent) bool { return has(e.Object) },
	}
}

// createOrDelete: an AddonInstance or a Lease matters by its existence.
func createOrDelete() predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc: func(event.UpdateEvent) bool { return false },
	}
}

// keyWait is how soon a namespace is looked at again while the signing key
// is not loaded yet.
const keyWait = 2 * time.Second

// Reconcile implements reconcile.Reconciler.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	nsName := req.Name
	log := r.Log.WithValues("namespace", nsName)
	var ns corev1.Namespace
	if err := r.Client.Get(ctx, types.NamespacedName{Name: nsName}, &ns); err != nil {
		if apierrors.IsNotFound(err) {
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, fmt.Errorf("reading namespace %s: %w", nsName, err)
	}
	if ns.DeletionTimestamp != nil {
		// Its RoleBindings go with it; creating one now would be refused.
		return reconcile.Result{}, nil
	}
	var key []byte
	if r.Config.Key != nil {
		if key = r.Config.Key(); key == nil {
			return reconcile.Result{RequeueAfter: keyWait}, nil
		}
	}
	var grant Grant
	if r.Config.NamespaceSelector.Matches(labels.Set(ns.Labels)) {
		deps, err := r.listMetadata(ctx, deploymentGVK, nsName)
		if err != nil {
			return reconcile.Result{}, err
		}
		instances, err := r.listMetadata(ctx, addonInstanceGVK, nsName)
		if err != nil {
			return reconcile.Result{}, err
		}
		var have rbacv1.RoleBinding
		if err := r.Client.Get(ctx, types.NamespacedName{Namespace: nsName, Name: r.Config.RoleBindingName}, &have); client.IgnoreNotFound(err) != nil {
			return reconcile.Result{}, fmt.Errorf("reading RoleBinding %s/%s: %w", nsName, r.Config.RoleBindingName, err)
		}
		var records []Deployment
		for _, d := range deps {
			records = append(records, Deployment{Name: d.Name, Annotations: d.Annotations})
		}
		var bound []string
		if have.Labels[ManagedByLabel] == ManagedByValue {
			bound = boundNames(nsName, have.Subjects)
		}
		grant = Plan(nsName, records, names(instances), bound, key)
		for d, why := range grant.Refused {
			log.V(1).Info("a status record grants nothing", "deployment", d, "reason", why)
		}
	}
	if err := r.ensureLeases(ctx, log, nsName, grant.Leases); err != nil {
		return reconcile.Result{}, err
	}
	return reconcile.Result{}, r.apply(ctx, log, nsName, grant.Subjects)
}

// listMetadata lists one kind's objects of namespace as metadata.
func (r *Reconciler) listMetadata(ctx context.Context, gvk schema.GroupVersionKind, ns string) ([]metav1.PartialObjectMetadata, error) {
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
	if err := r.Client.List(ctx, list, client.InNamespace(ns)); err != nil {
		return nil, fmt.Errorf("listing %ss in %s: %w", gvk.Kind, ns, err)
	}
	return list.Items, nil
}

// ensureLeases creates the election Leases that do not exist yet, with no
// holder: the reporter role has no create (RBAC cannot limit create by name,
// so a create permission would let a tenant make any Lease of its namespace).
// Each names its AddonInstance (heartbeat.InstanceAnnotation) from the start,
// so that the fencing policy admits no heartbeat until a reporter takes it.
func (r *Reconciler) ensureLeases(ctx context.Context, log logr.Logger, ns string, leases []Lease) error {
	for _, l := range leases {
		name := l.Name
		existing := metadataOf(leaseGVK)
		err := r.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, existing)
		if err == nil {
			continue
		}
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("reading Lease %s/%s: %w", ns, name, err)
		}
		lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
			Labels:      map[string]string{ManagedByLabel: ManagedByValue},
			Annotations: map[string]string{heartbeat.InstanceAnnotation: l.Instance}}}
		switch err := r.Client.Create(ctx, lease); {
		case apierrors.IsAlreadyExists(err):
			// Made by a reporter that could still create Leases (an
			// earlier version), so without the label the cache filters on.
		case err != nil:
			return fmt.Errorf("creating Lease %s/%s: %w", ns, name, err)
		default:
			log.Info("created the election Lease", "lease", name)
		}
	}
	return nil
}

// apply makes the namespace's RoleBinding bind exactly subjects, deleting it
// when there are none.
func (r *Reconciler) apply(ctx context.Context, log logr.Logger, ns string, subjects []rbacv1.Subject) error {
	key := types.NamespacedName{Namespace: ns, Name: r.Config.RoleBindingName}
	want := r.desired(ns, subjects)
	var have rbacv1.RoleBinding
	err := r.Client.Get(ctx, key, &have)
	switch {
	case apierrors.IsNotFound(err):
		if len(subjects) == 0 {
			return nil
		}
		if err := r.Client.Create(ctx, want); err != nil {
			return fmt.Errorf("creating RoleBinding %s: %w", key, err)
		}
		log.Info("bound the reporter role", "roleBinding", key.Name, "serviceAccounts", subjectNames(subjects))
		return nil
	case err != nil:
		return fmt.Errorf("reading RoleBinding %s: %w", key, err)
	}
	if have.Labels[ManagedByLabel] != ManagedByValue {
		log.Info("leaving a RoleBinding that addon-heartbeat did not create alone", "roleBinding", key.Name)
		return nil
	}
	if len(subjects) == 0 || have.RoleRef != want.RoleRef {
		// roleRef is immutable: a changed ClusterRole means a new RoleBinding.
		if err := r.Client.Delete(ctx, &have, client.Preconditions{UID: &have.UID, ResourceVersion: &have.ResourceVersion}); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("deleting RoleBinding %s: %w", key, err)
		}
		// With subjects left, its delete event brings the next reconcile,
		// which creates it anew.
		log.Info("removed the reporter role binding", "roleBinding", key.Name)
		return nil
	}
	if equality.Semantic.DeepEqual(have.Subjects, want.Subjects) {
		return nil
	}
	have.Subjects = want.Subjects
	if err := r.Client.Update(ctx, &have); err != nil {
		return fmt.Errorf("updating RoleBinding %s: %w", key, err)
	}
	log.Info("updated the reporter role binding", "roleBinding", key.Name, "serviceAccounts", subjectNames(subjects))
	return nil
}

func (r *Reconciler) desired(ns string, subjects []rbacv1.Subject) *rbacv1.RoleBinding {
	return &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns,
			Name:      r.Config.RoleBindingName,
			Labels:    map[string]string{ManagedByLabel: ManagedByValue},
		},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: r.Config.ClusterRole},
		Subjects: subjects,
	}
}

func subjectNames(subjects []rbacv1.Subject) []string {
	out := make([]string, 0, len(subjects))
	for _, s := range subjects {
		out = append(out, s.Name)
	}
	return slices.Clip(out)
}

func names(objs []metav1.PartialObjectMetadata) []string {
	out := make([]string, 0, len(objs))
	for _, o := range objs {
		out = append(out, o.Name)
	}
	return out
}
