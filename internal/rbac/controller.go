package rbac

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
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

// CacheOptions limit what the manager caches for this controller, so that
// its permissions can be limited too: RoleBindings are listed and watched by
// name only (RBAC resourceNames then applies to list and watch), and
// Deployments are cut down to the fields read here (a cluster-wide cache of
// whole Deployments would hold every pod template in the cluster).
func (c Config) CacheOptions() map[client.Object]cache.ByObject {
	return map[client.Object]cache.ByObject{
		&rbacv1.RoleBinding{}: {Field: fields.OneTermEqualSelector("metadata.name", c.RoleBindingName)},
		&appsv1.Deployment{}:  {Transform: slimDeployment},
	}
}

// slimDeployment keeps what Subjects and the predicates read: identity, the
// settings keys wherever they are written, the webhook's status record and
// the ServiceAccount name. Every reader of Deployments from the manager's
// cache sees only this.
func slimDeployment(obj any) (any, error) {
	d, ok := obj.(*appsv1.Deployment)
	if !ok {
		return obj, nil
	}
	keys := annotations.OfDeployment(d).Keys()
	slim := &appsv1.Deployment{
		TypeMeta: d.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name: d.Name, Namespace: d.Namespace, UID: d.UID,
			ResourceVersion: d.ResourceVersion, DeletionTimestamp: d.DeletionTimestamp,
			Annotations: keys.Annotations, Labels: keys.Labels,
		},
	}
	if v, ok := d.Annotations[annotations.Status]; ok {
		if slim.Annotations == nil {
			slim.Annotations = map[string]string{}
		}
		slim.Annotations[annotations.Status] = v
	}
	slim.Spec.Template.Annotations = keys.TemplateAnnotations
	slim.Spec.Template.Spec.ServiceAccountName = d.Spec.Template.Spec.ServiceAccountName
	return slim, nil
}

// Reconciler keeps the reporter RoleBinding of one namespace (the request's
// Name) in line with the namespace's injected Deployments.
type Reconciler struct {
	Client client.Client
	Config Config
	Log    logr.Logger
}

// SetupWithManager registers the controller: a namespace is reconciled when
// it changes (its labels decide whether it is served), when an injected
// Deployment in it changes, and when its RoleBinding changes (so that a
// deleted or edited RoleBinding is put back).
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
		Watches(&appsv1.Deployment{}, toNamespace, builder.WithPredicates(injectedChanges())).
		Watches(&rbacv1.RoleBinding{}, toNamespace).
		Complete(r)
}

// injectedChanges lets through the Deployment events that can change a
// RoleBinding: any event of an injected Deployment, and an update that
// injects or un-injects one. Status updates of injected Deployments pass
// too; they cost one cached read each.
func injectedChanges() predicate.Predicate {
	injected := func(o client.Object) bool {
		d, ok := o.(*appsv1.Deployment)
		return ok && Injected(d)
	}
	return predicate.Funcs{
		CreateFunc:  func(e event.CreateEvent) bool { return injected(e.Object) },
		DeleteFunc:  func(e event.DeleteEvent) bool { return injected(e.Object) },
		UpdateFunc:  func(e event.UpdateEvent) bool { return injected(e.ObjectOld) || injected(e.ObjectNew) },
		GenericFunc: func(e event.GenericEvent) bool { return injected(e.Object) },
	}
}

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
	var subjects []rbacv1.Subject
	if r.Config.NamespaceSelector.Matches(labels.Set(ns.Labels)) {
		var deps appsv1.DeploymentList
		if err := r.Client.List(ctx, &deps, client.InNamespace(nsName)); err != nil {
			return reconcile.Result{}, fmt.Errorf("listing Deployments in %s: %w", nsName, err)
		}
		subjects = Subjects(nsName, deps.Items)
	}
	return reconcile.Result{}, r.apply(ctx, log, nsName, subjects)
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
		log.Info("bound the reporter role", "roleBinding", key.Name, "serviceAccounts", names(subjects))
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
	log.Info("updated the reporter role binding", "roleBinding", key.Name, "serviceAccounts", names(subjects))
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

func names(subjects []rbacv1.Subject) []string {
	out := make([]string, 0, len(subjects))
	for _, s := range subjects {
		out = append(out, s.Name)
	}
	return slices.Clip(out)
}
