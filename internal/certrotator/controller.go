package certrotator

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// Config says where the certificates live and what they are for.
type Config struct {
	Settings
	// Namespace and SecretName locate the Secret (the webhook's namespace).
	Namespace, SecretName string
	// WebhookConfigName is the MutatingWebhookConfiguration whose caBundle
	// is kept current. No other webhook configuration is ever touched.
	WebhookConfigName string
}

// Validate reports a Config that cannot work.
func (c Config) Validate() error {
	errs := []error{c.Settings.Validate()}
	if c.Namespace == "" {
		errs = append(errs, errors.New("certificate Secret namespace: must be set"))
	}
	if c.SecretName == "" {
		errs = append(errs, errors.New("certificate Secret name: must be set"))
	}
	if c.WebhookConfigName == "" {
		errs = append(errs, errors.New("webhook configuration name: must be set"))
	}
	return errors.Join(errs...)
}

func (c Config) secretKey() types.NamespacedName {
	return types.NamespacedName{Namespace: c.Namespace, Name: c.SecretName}
}

// CacheOptions limit the manager's cache to the one Secret and the one
// webhook configuration, so that RBAC can limit list and watch to their
// names (resourceNames applies to a metadata.name field selector).
func (c Config) CacheOptions() map[client.Object]cache.ByObject {
	return map[client.Object]cache.ByObject{
		&corev1.Secret{}: {
			Namespaces: map[string]cache.Config{c.Namespace: {}},
			Field:      fields.OneTermEqualSelector("metadata.name", c.SecretName),
		},
		&admissionv1.MutatingWebhookConfiguration{}: {
			Field: fields.OneTermEqualSelector("metadata.name", c.WebhookConfigName),
		},
	}
}

// Setup registers the rotator (on the leader only) and the loader (on every
// replica), which loads the serving certificate into src.
func Setup(mgr ctrl.Manager, cfg Config, src *Source, log logr.Logger) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	isSecret := predicate.NewPredicateFuncs(func(o client.Object) bool {
		return o.GetNamespace() == cfg.Namespace && o.GetName() == cfg.SecretName
	})
	toSecret := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: cfg.secretKey()}}
	})
	rot := &Rotator{Client: mgr.GetClient(), Config: cfg, Log: log.WithName("rotator"), Now: time.Now}
	// The Secret may not exist yet: a source that fires once at start makes
	// the first reconcile create it.
	if err := ctrl.NewControllerManagedBy(mgr).
		Named("webhook-cert-rotator").
		For(&corev1.Secret{}, builder.WithPredicates(isSecret)).
		Watches(&admissionv1.MutatingWebhookConfiguration{}, toSecret,
			builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool { return o.GetName() == cfg.WebhookConfigName }))).
		WatchesRawSource(startupSource(cfg.secretKey())).
		Complete(rot); err != nil {
		return fmt.Errorf("registering the certificate rotator: %w", err)
	}
	load := &Loader{Client: mgr.GetClient(), Key: cfg.secretKey(), Source: src, Log: log.WithName("loader")}
	if err := ctrl.NewControllerManagedBy(mgr).
		Named("webhook-cert-loader").
		// Every replica serves, so every replica loads; only the leader writes.
		WithOptions(controller.Options{NeedLeaderElection: ptr.To(false)}).
		For(&corev1.Secret{}, builder.WithPredicates(isSecret)).
		Complete(load); err != nil {
		return fmt.Errorf("registering the certificate loader: %w", err)
	}
	return nil
}

// Rotator keeps the Secret's certificates valid and the webhook
// configuration's caBundle equal to the Secret's CA bundle.
type Rotator struct {
	Client client.Client
	Config Config
	Log    logr.Logger
	Now    func() time.Time
}

// Reconcile implements reconcile.Reconciler. Writes are optimistic (create,
// or update at the read resourceVersion), so two writers can never both win.
func (r *Rotator) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	key := r.Config.secretKey()
	var secret corev1.Secret
	exists := true
	if err := r.Client.Get(ctx, key, &secret); err != nil {
		if !apierrors.IsNotFound(err) {
			return reconcile.Result{}, fmt.Errorf("reading Secret %s: %w", key, err)
		}
		exists = false
	}
	var mwc admissionv1.MutatingWebhookConfiguration
	haveMWC := true
	if err := r.Client.Get(ctx, types.NamespacedName{Name: r.Config.WebhookConfigName}, &mwc); err != nil {
		if !apierrors.IsNotFound(err) {
			return reconcile.Result{}, fmt.Errorf("reading MutatingWebhookConfiguration %s: %w", r.Config.WebhookConfigName, err)
		}
		haveMWC = false
	}
	now := r.Now()
	plan, err := Next(secret.Data, webhookCABundle(&mwc), r.Config.Settings, now)
	if err != nil {
		return reconcile.Result{}, fmt.Errorf("planning certificates: %w", err)
	}
	if plan.Changed {
		if err := r.writeSecret(ctx, &secret, exists, plan.Data); err != nil {
			if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) {
				// Someone else wrote first: plan again from what they wrote.
				return reconcile.Result{Requeue: true}, nil
			}
			return reconcile.Result{}, err
		}
		r.Log.Info("wrote webhook certificates", "secret", key.String(), "waitingForTrust", plan.WaitingForTrust)
	}
	if haveMWC {
		if err := r.setCABundle(ctx, &mwc, plan.Data[KeyCABundle]); err != nil {
			if apierrors.IsConflict(err) {
				return reconcile.Result{Requeue: true}, nil
			}
			return reconcile.Result{}, err
		}
	} else {
		r.Log.Info("webhook configuration not found; its caBundle is set once it exists", "name", r.Config.WebhookConfigName)
	}
	after := max(plan.RecheckAt.Sub(now), time.Second)
	if plan.WaitingForTrust {
		// The webhook configuration's update brings the next reconcile; this
		// is a fallback.
		after = min(after, 10*time.Second)
	}
	return reconcile.Result{RequeueAfter: after}, nil
}

func (r *Rotator) writeSecret(ctx context.Context, s *corev1.Secret, exists bool, data map[string][]byte) error {
	if !exists {
		s = &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{
				Namespace: r.Config.Namespace, Name: r.Config.SecretName,
				Labels: map[string]string{"app.kubernetes.io/managed-by": "addon-heartbeat"},
			},
			Type: corev1.SecretTypeTLS,
			Data: data,
		}
		if err := r.Client.Create(ctx, s); err != nil {
			return fmt.Errorf("creating Secret %s: %w", r.Config.secretKey(), err)
		}
		return nil
	}
	s.Data = data
	if err := r.Client.Update(ctx, s); err != nil {
		return fmt.Errorf("updating Secret %s: %w", r.Config.secretKey(), err)
	}
	return nil
}

// setCABundle sets bundle on every webhook of the configuration.
func (r *Rotator) setCABundle(ctx context.Context, mwc *admissionv1.MutatingWebhookConfiguration, bundle []byte) error {
	changed := false
	for i := range mwc.Webhooks {
		if !bytes.Equal(mwc.Webhooks[i].ClientConfig.CABundle, bundle) {
			mwc.Webhooks[i].ClientConfig.CABundle = bundle
			changed = true
		}
	}
	if !changed {
		return nil
	}
	if err := r.Client.Update(ctx, mwc); err != nil {
		return fmt.Errorf("updating the caBundle of MutatingWebhookConfiguration %s: %w", mwc.Name, err)
	}
	r.Log.Info("updated the webhook configuration's caBundle", "name", mwc.Name)
	return nil
}

// webhookCABundle is the caBundle the API server uses now: the one every
// webhook of the configuration has (nil when they differ or are missing).
func webhookCABundle(mwc *admissionv1.MutatingWebhookConfiguration) []byte {
	var bundle []byte
	for i, w := range mwc.Webhooks {
		if i > 0 && !bytes.Equal(w.ClientConfig.CABundle, bundle) {
			return nil
		}
		bundle = w.ClientConfig.CABundle
	}
	return bundle
}

// Source serves the current certificate from memory. Its GetCertificate goes
// into the webhook server's tls.Config.
type Source struct {
	cert atomic.Pointer[tls.Certificate]
}

var errNoCertificate = errors.New("no serving certificate loaded yet")

// GetCertificate implements tls.Config.GetCertificate. Until a certificate
// is loaded every handshake fails, so the webhook server's readiness check
// (a TLS dial) fails too: a replica is ready only once it serves.
func (s *Source) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c := s.cert.Load()
	if c == nil {
		return nil, errNoCertificate
	}
	return c, nil
}

// Checker is a readiness check that passes once a certificate is loaded.
func (s *Source) Checker() healthz.Checker {
	return func(*http.Request) error {
		if s.cert.Load() == nil {
			return errNoCertificate
		}
		return nil
	}
}

// Loader loads the Secret's serving certificate into a Source.
type Loader struct {
	Client client.Client
	Key    types.NamespacedName
	Source *Source
	Log    logr.Logger
}

// Reconcile implements reconcile.Reconciler.
func (l *Loader) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	var s corev1.Secret
	if err := l.Client.Get(ctx, l.Key, &s); err != nil {
		// Not found: the rotator creates it, and its create event comes here.
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if len(s.Data[KeyCert]) == 0 {
		return reconcile.Result{}, nil
	}
	cert, err := tls.X509KeyPair(s.Data[KeyCert], s.Data[KeyKey])
	if err != nil {
		// The rotator replaces a broken pair; keep serving the last good one.
		l.Log.Error(err, "the Secret's serving certificate is unusable; keeping the current one", "secret", l.Key.String())
		return reconcile.Result{}, nil
	}
	if old := l.Source.cert.Load(); old != nil && bytes.Equal(old.Certificate[0], cert.Certificate[0]) {
		return reconcile.Result{}, nil
	}
	l.Source.cert.Store(&cert)
	l.Log.Info("serving a new certificate", "notAfter", cert.Leaf.NotAfter)
	return reconcile.Result{}, nil
}
