// Package webhook is the webhook process: its flags (Options, for the
// server, the certificates, leader election, RBAC provisioning and the
// injected reporter), and Run, which builds the controller-runtime manager
// and adds the admission handler (internal/admission), the serving
// certificate's source and rotation (internal/certrotator), the record
// signing key, RBAC provisioning (internal/rbac) and the AddonInstance gauges
// (internal/instancewatch). cmd/webhook only parses the flags and calls Run.
package webhook

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	authorizationv1client "k8s.io/client-go/kubernetes/typed/authorization/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/addon-heartbeat/addon-heartbeat/internal/admission"
	"github.com/addon-heartbeat/addon-heartbeat/internal/certexpiry"
	"github.com/addon-heartbeat/addon-heartbeat/internal/certrotator"
	"github.com/addon-heartbeat/addon-heartbeat/internal/instancewatch"
	"github.com/addon-heartbeat/addon-heartbeat/internal/logging"
	"github.com/addon-heartbeat/addon-heartbeat/internal/promreg"
	"github.com/addon-heartbeat/addon-heartbeat/internal/rbac"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/inject"
)

// Options configure the webhook process. Flags map one to one.
type Options struct {
	// Host the webhook server listens on; empty means every interface.
	Host string
	// Port the webhook server listens on (TLS).
	Port int
	// CertDir holds CertName and KeyName; changes are picked up without a
	// restart.
	CertDir, CertName, KeyName string
	// MetricsBindAddress serves /metrics ("0" disables).
	MetricsBindAddress string
	// HealthProbeBindAddress serves /healthz and /readyz ("0" disables).
	HealthProbeBindAddress string
	// LogLevel: debug, info or error.
	LogLevel string
	// ShutdownTimeout bounds the graceful shutdown after SIGTERM.
	ShutdownTimeout time.Duration

	// Namespace is the webhook's own namespace: where the self-managed
	// certificate Secret and the leader election Lease are.
	Namespace string
	// LeaderElect makes one replica run the controllers that write (RBAC,
	// certificate rotation); every replica serves admissions.
	LeaderElect      bool
	LeaderElectionID string

	// CertMode is CertModeDir (serve the files in CertDir, for example a
	// cert-manager Secret mounted there) or CertModeSelfManaged.
	CertMode string
	// Self-managed certificates: the Secret holding the CA and the serving
	// certificate, the names the certificate is for, the lifetimes (each
	// renewed after two thirds), and the MutatingWebhookConfiguration whose
	// caBundle is kept current.
	CertSecretName    string
	CertDNSNames      []string
	CAValidity        time.Duration
	CertValidity      time.Duration
	WebhookConfigName string

	// ReporterClusterRole is bound in each served namespace to the
	// ServiceAccounts of injected Deployments, by a RoleBinding named
	// ReporterRoleBindingName. Empty turns RBAC provisioning off.
	ReporterClusterRole     string
	ReporterRoleBindingName string
	// SigningSecretName is the Secret in Namespace holding the key that
	// signs status records (RBAC provisioning binds only signed ones).
	SigningSecretName string
	// NamespaceSelector is the webhook configuration's namespaceSelector (a
	// JSON metav1.LabelSelector): RoleBindings are only made in the
	// namespaces it selects.
	NamespaceSelector string

	// Platform is the kind of cluster (inject.Platform): it decides the
	// injected reporter's security context.
	Platform string

	// Reporter settings, turned into inject.Config by Validate.
	ReporterImage           string
	ReporterImagePullPolicy string
	NativeSidecar           bool
	ReporterCPURequest      string
	ReporterMemoryRequest   string
	ReporterMemoryLimit     string
	ReporterHealthPort      int
	ReporterMetricsPort     int
	ReporterLogLevel        string
	// ReporterAddonInstanceNames are the AddonInstances the reporter role
	// allows (empty: any); opting in for another name gets a warning.
	ReporterAddonInstanceNames []string
	// ReporterVersion is the release ReporterImage is of (empty: the one
	// its tag names), compared with the webhook's own version.
	ReporterVersion string
}

// Certificate modes.
const (
	// CertModeDir serves the certificate files in --cert-dir and reloads
	// them when they change.
	CertModeDir = "dir"
	// CertModeSelfManaged creates, rotates and serves the certificates from a
	// Secret and keeps the webhook configuration's caBundle current.
	CertModeSelfManaged = "self-managed"
)

// DefaultNamespaceSelector is config/webhook/manifests.yaml's.
const DefaultNamespaceSelector = `{"matchExpressions":[{"key":"kubernetes.io/metadata.name","operator":"NotIn",` +
	`"values":["kube-system","kube-public","kube-node-lease","addon-heartbeat-system"]}]}`

// DefaultOptions are the defaults of every flag.
func DefaultOptions() Options {
	d := inject.DefaultConfig()
	return Options{
		LeaderElectionID:        "addon-heartbeat-webhook",
		CertMode:                CertModeDir,
		CertSecretName:          "addon-heartbeat-webhook-tls",
		CAValidity:              5 * 365 * 24 * time.Hour,
		CertValidity:            365 * 24 * time.Hour,
		WebhookConfigName:       "addon-heartbeat",
		ReporterClusterRole:     "addon-heartbeat-reporter",
		ReporterRoleBindingName: "addon-heartbeat-reporter",
		SigningSecretName:       "addon-heartbeat-webhook-signing-key",
		NamespaceSelector:       DefaultNamespaceSelector,
		Port:                    9443,
		CertDir:                 "/tmp/k8s-webhook-server/serving-certs",
		CertName:                "tls.crt",
		KeyName:                 "tls.key",
		MetricsBindAddress:      ":8080",
		HealthProbeBindAddress:  ":8081",
		LogLevel:                logging.LevelInfo,
		ShutdownTimeout:         15 * time.Second,
		Platform:                string(d.Platform),
		ReporterImagePullPolicy: string(d.ImagePullPolicy),
		NativeSidecar:           d.NativeSidecar,
		ReporterCPURequest:      d.Resources.Requests.Cpu().String(),
		ReporterMemoryRequest:   d.Resources.Requests.Memory().String(),
		ReporterMemoryLimit:     d.Resources.Limits.Memory().String(),
		ReporterHealthPort:      int(d.HealthPort),
		ReporterMetricsPort:     int(d.MetricsPort),
	}
}

// BindFlags registers every option on fs, with the current values as defaults.
func (o *Options) BindFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.Host, "bind-host", o.Host, "Address the webhook server listens on; empty for every interface.")
	fs.IntVar(&o.Port, "port", o.Port, "TLS port of the webhook server.")
	fs.StringVar(&o.CertDir, "cert-dir", o.CertDir, "Folder with the serving certificate and key; reloaded when they change.")
	fs.StringVar(&o.CertName, "cert-name", o.CertName, "Serving certificate file name in --cert-dir.")
	fs.StringVar(&o.KeyName, "key-name", o.KeyName, "Serving key file name in --cert-dir.")
	fs.StringVar(&o.MetricsBindAddress, "metrics-bind-address", o.MetricsBindAddress, "Address of the Prometheus /metrics endpoint; 0 disables it.")
	fs.StringVar(&o.HealthProbeBindAddress, "health-probe-bind-address", o.HealthProbeBindAddress, "Address of /healthz and /readyz; 0 disables them.")
	fs.StringVar(&o.LogLevel, "log-level", o.LogLevel, "Log level: debug, info or error.")
	fs.DurationVar(&o.ShutdownTimeout, "shutdown-timeout", o.ShutdownTimeout, "How long to finish in-flight reviews after SIGTERM.")
	fs.StringVar(&o.Platform, "platform", o.Platform, "The kind of cluster, kubernetes or openshift: the injected reporter's security context is Kubernetes' restricted profile, or what every OpenShift SCC admits (the UID, GID and seccomp profile left to the SCC).")
	fs.StringVar(&o.ReporterImage, "reporter-image", o.ReporterImage, "Image of the injected reporter (required).")
	fs.StringVar(&o.ReporterVersion, "reporter-version", o.ReporterVersion, "Release version of --reporter-image (such as v0.2.0), for an image by digest; empty: the version its tag names. A version other than the webhook's own is logged and warned about at admission.")
	fs.StringVar(&o.ReporterImagePullPolicy, "reporter-image-pull-policy", o.ReporterImagePullPolicy, "Pull policy of the injected reporter: Always, IfNotPresent or Never.")
	fs.BoolVar(&o.NativeSidecar, "native-sidecar", o.NativeSidecar, "Inject the reporter as a native sidecar (Kubernetes 1.29+); false injects a plain container.")
	fs.StringVar(&o.ReporterCPURequest, "reporter-cpu-request", o.ReporterCPURequest, "CPU request of the injected reporter.")
	fs.StringVar(&o.ReporterMemoryRequest, "reporter-memory-request", o.ReporterMemoryRequest, "Memory request of the injected reporter.")
	fs.StringVar(&o.ReporterMemoryLimit, "reporter-memory-limit", o.ReporterMemoryLimit, "Memory limit of the injected reporter.")
	fs.IntVar(&o.ReporterHealthPort, "reporter-health-port", o.ReporterHealthPort, "Pod-local port of the reporter's /healthz and /readyz.")
	fs.IntVar(&o.ReporterMetricsPort, "reporter-metrics-port", o.ReporterMetricsPort, "Pod-local port of the reporter's /metrics.")
	fs.StringVar(&o.ReporterLogLevel, "reporter-log-level", o.ReporterLogLevel, "Log level passed to injected reporters (debug, info or error); empty leaves their default.")
	fs.Func("reporter-addon-instance-names", "Comma-separated AddonInstance names the reporter role allows; a Deployment that opts in for another name gets an admission warning. Empty: any.", func(v string) error {
		o.ReporterAddonInstanceNames = splitList(v)
		return nil
	})

	fs.StringVar(&o.Namespace, "namespace", o.Namespace, "The webhook's own namespace (certificate Secret, leader election Lease).")
	fs.BoolVar(&o.LeaderElect, "leader-elect", o.LeaderElect, "Elect one replica to run the writing controllers (RBAC, certificate rotation); all replicas serve.")
	fs.StringVar(&o.LeaderElectionID, "leader-election-id", o.LeaderElectionID, "Name of the leader election Lease in --namespace.")
	fs.StringVar(&o.CertMode, "cert-mode", o.CertMode, "Serving certificate source: dir (files in --cert-dir, e.g. from cert-manager) or self-managed (a CA and certificate the webhook creates and rotates in --cert-secret-name).")
	fs.StringVar(&o.CertSecretName, "cert-secret-name", o.CertSecretName, "Self-managed mode: Secret in --namespace holding the CA and serving certificate.")
	fs.Func("cert-dns-names", "Self-managed mode: comma-separated names of the serving certificate (IP addresses become IP SANs).", func(v string) error {
		o.CertDNSNames = splitList(v)
		return nil
	})
	fs.DurationVar(&o.CAValidity, "ca-validity", o.CAValidity, "Self-managed mode: lifetime of the CA; replaced after two thirds of it.")
	fs.DurationVar(&o.CertValidity, "cert-validity", o.CertValidity, "Self-managed mode: lifetime of the serving certificate; renewed after two thirds of it.")
	fs.StringVar(&o.WebhookConfigName, "webhook-config-name", o.WebhookConfigName, "Self-managed mode: the MutatingWebhookConfiguration whose caBundle is kept current.")
	fs.StringVar(&o.ReporterClusterRole, "reporter-cluster-role", o.ReporterClusterRole, "ClusterRole bound to the ServiceAccounts of injected Deployments; empty turns RBAC provisioning off.")
	fs.StringVar(&o.ReporterRoleBindingName, "reporter-role-binding-name", o.ReporterRoleBindingName, "Name of the RoleBinding made in each namespace with injected Deployments.")
	fs.StringVar(&o.SigningSecretName, "signing-secret-name", o.SigningSecretName, "Secret in --namespace holding the key that signs the status records the RBAC controller binds (created when missing).")
	fs.StringVar(&o.NamespaceSelector, "namespace-selector", o.NamespaceSelector, "The webhook configuration's namespaceSelector as JSON; RoleBindings are only made in the namespaces it selects.")
}

func splitList(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// RBACConfig is the RBAC controller's configuration; ok is false when RBAC
// provisioning is off.
func (o Options) RBACConfig() (cfg rbac.Config, ok bool, err error) {
	if o.ReporterClusterRole == "" {
		return rbac.Config{}, false, nil
	}
	var ls metav1.LabelSelector
	if err := json.Unmarshal([]byte(o.NamespaceSelector), &ls); err != nil {
		return rbac.Config{}, true, fmt.Errorf("--namespace-selector: expected a JSON label selector: %w", err)
	}
	sel, err := metav1.LabelSelectorAsSelector(&ls)
	if err != nil {
		return rbac.Config{}, true, fmt.Errorf("--namespace-selector: %w", err)
	}
	cfg = rbac.Config{ClusterRole: o.ReporterClusterRole, RoleBindingName: o.ReporterRoleBindingName, NamespaceSelector: sel}
	var errs []error
	if len(o.ReporterAddonInstanceNames) == 0 {
		// An empty list would be a reporter role without resourceNames:
		// every AddonInstance and Lease of a bound namespace.
		errs = append(errs, errors.New("--reporter-addon-instance-names: at least one AddonInstance name (the reporter role is limited to them)"))
	}
	if o.Namespace == "" || o.SigningSecretName == "" {
		errs = append(errs, errors.New("--namespace and --signing-secret-name: must be set to provision RBAC (the record signing key's Secret)"))
	}
	return cfg, true, errors.Join(append(errs, cfg.Validate())...)
}

// CertConfig is the self-managed certificates' configuration.
func (o Options) CertConfig() certrotator.Config {
	return certrotator.Config{
		Settings: certrotator.Settings{
			CAValidity: o.CAValidity, CertValidity: o.CertValidity,
			DNSNames: o.CertDNSNames, CACommonName: "addon-heartbeat-webhook-ca",
		},
		Namespace:         o.Namespace,
		SecretName:        o.CertSecretName,
		WebhookConfigName: o.WebhookConfigName,
	}
}

// InjectConfig validates the options and returns the injector's Config.
func (o Options) InjectConfig() (inject.Config, error) {
	var errs []error
	quantity := func(flagName, v string) resource.Quantity {
		q, err := resource.ParseQuantity(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("--%s=%q: expected a Kubernetes quantity such as 10m or 32Mi", flagName, v))
		}
		return q
	}
	platform, err := inject.ParsePlatform(o.Platform)
	if err != nil {
		errs = append(errs, fmt.Errorf("--platform: %w", err))
	}
	cfg := inject.Config{
		Platform:        platform,
		Image:           o.ReporterImage,
		ImagePullPolicy: corev1.PullPolicy(o.ReporterImagePullPolicy),
		NativeSidecar:   o.NativeSidecar,
		Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{
				corev1.ResourceCPU:    quantity("reporter-cpu-request", o.ReporterCPURequest),
				corev1.ResourceMemory: quantity("reporter-memory-request", o.ReporterMemoryRequest),
			},
			Limits: corev1.ResourceList{corev1.ResourceMemory: quantity("reporter-memory-limit", o.ReporterMemoryLimit)},
		},
		HealthPort:         int32(min(max(o.ReporterHealthPort, 0), 1<<16)),
		MetricsPort:        int32(min(max(o.ReporterMetricsPort, 0), 1<<16)),
		LogLevel:           o.ReporterLogLevel,
		AddonInstanceNames: o.ReporterAddonInstanceNames,
	}
	if len(errs) == 0 {
		errs = append(errs, cfg.Validate())
	}
	return cfg, errors.Join(errs...)
}

// Validate reports every invalid option.
func (o Options) Validate() error {
	var errs []error
	if o.Port < 1 || o.Port > 65535 {
		errs = append(errs, fmt.Errorf("--port=%d: expected 1-65535", o.Port))
	}
	switch o.CertMode {
	case CertModeDir:
		if o.CertDir == "" {
			errs = append(errs, errors.New("--cert-dir: must be set"))
		}
	case CertModeSelfManaged:
		if err := o.CertConfig().Validate(); err != nil {
			errs = append(errs, fmt.Errorf("--cert-mode=self-managed: %w", err))
		}
	default:
		errs = append(errs, fmt.Errorf("--cert-mode=%q: expected %s or %s", o.CertMode, CertModeDir, CertModeSelfManaged))
	}
	if o.LeaderElect && (o.Namespace == "" || o.LeaderElectionID == "") {
		errs = append(errs, errors.New("--leader-elect: --namespace and --leader-election-id must be set"))
	}
	if _, _, err := o.RBACConfig(); err != nil {
		errs = append(errs, err)
	}
	if _, err := logging.New(o.LogLevel); err != nil {
		errs = append(errs, fmt.Errorf("--log-level: %w", err))
	}
	if _, err := o.InjectConfig(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func scheme() *k8sruntime.Scheme {
	s := k8sruntime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	// AddonInstances as the per-AddonInstance gauges read them.
	utilruntime.Must(instancewatch.AddToScheme(s))
	return s
}

// tlsDefaults sets TLS 1.2 as the floor and turns HTTP/2 off: HTTP/2 has had
// rapid-reset and stream-exhaustion vulnerabilities (CVE-2023-44487,
// CVE-2023-39325), and the API server talks HTTP/1.1 to webhooks anyway.
func tlsDefaults(c *tls.Config) {
	c.MinVersion = tls.VersionTLS12
	c.NextProtos = []string{"http/1.1"}
}

// Run serves the webhook until ctx is done, then shuts down gracefully.
func Run(ctx context.Context, o Options, restCfg *rest.Config, log logr.Logger) error {
	if err := o.Validate(); err != nil {
		return fmt.Errorf("invalid options: %w", err)
	}
	a := &app{o: o, restCfg: restCfg, log: log}
	a.inject, _ = o.InjectConfig()           // validated above
	a.rbac, a.manageRBAC, _ = o.RBACConfig() // validated above
	a.selfManaged = o.CertMode == CertModeSelfManaged
	if err := a.loadServingCert(); err != nil {
		return err
	}
	var err error
	if a.mgr, err = a.newManager(); err != nil {
		return fmt.Errorf("creating the manager: %w", err)
	}
	for _, add := range []func(context.Context) error{a.addMetrics, a.addAdmission, a.addControllers, a.addChecks} {
		if err := add(ctx); err != nil {
			return err
		}
	}
	log.Info("starting the webhook", "port", o.Port, "certMode", o.CertMode, "certDir", o.CertDir, "platform", a.inject.Platform,
		"reporterImage", a.inject.Image, "nativeSidecar", a.inject.NativeSidecar, "leaderElect", o.LeaderElect, "rbac", a.manageRBAC)
	if err := a.mgr.Start(ctx); err != nil {
		return fmt.Errorf("running the manager: %w", err)
	}
	log.Info("webhook stopped")
	return nil
}

// app is one Run: the options, what was derived from them, and the manager
// the parts are added to.
type app struct {
	o           Options
	restCfg     *rest.Config
	log         logr.Logger
	inject      inject.Config
	rbac        rbac.Config
	manageRBAC  bool
	selfManaged bool
	mgr         ctrl.Manager

	// The serving certificate: the Secret's, kept in memory (self-managed
	// mode), or the files in CertDir (the other modes); serving returns it
	// in either mode.
	src     *certrotator.Source
	files   *certwatcher.CertWatcher
	serving certexpiry.Source
	// signing is the record signing key, when RBAC is provisioned.
	signing *SigningKey
}

// loadServingCert picks where the served certificate comes from. Serving
// from memory in self-managed mode: the certificate is in the manager's cache
// as soon as the Secret changes, with no Secret volume (whose kubelet sync
// lags by up to a minute) and no writable folder. The other modes serve the
// files in CertDir, by a watcher made here rather than by the webhook server,
// so that the served certificate's expiry can be exported in every mode.
func (a *app) loadServingCert() error {
	if a.selfManaged {
		a.src = &certrotator.Source{}
		a.serving = a.src.GetCertificate
		return nil
	}
	files, err := certwatcher.New(filepath.Join(a.o.CertDir, a.o.CertName), filepath.Join(a.o.CertDir, a.o.KeyName))
	if err != nil {
		return fmt.Errorf("loading the serving certificate from %s: %w", a.o.CertDir, err)
	}
	a.files, a.serving = files, files.GetCertificate
	return nil
}

// newManager makes the manager: its cache limited to the objects the
// controllers read, its leader election for the writing controllers, and
// the webhook server.
func (a *app) newManager() (ctrl.Manager, error) {
	o := a.o
	byObject := instancewatch.CacheOptions()
	if a.manageRBAC {
		maps.Copy(byObject, a.rbac.CacheOptions())
	}
	if a.selfManaged {
		maps.Copy(byObject, o.CertConfig().CacheOptions())
	}
	shutdown := o.ShutdownTimeout
	return ctrl.NewManager(a.restCfg, ctrl.Options{
		Scheme:                  scheme(),
		Logger:                  a.log,
		Metrics:                 metricsserver.Options{BindAddress: o.MetricsBindAddress},
		HealthProbeBindAddress:  o.HealthProbeBindAddress,
		GracefulShutdownTimeout: &shutdown,
		LeaderElection:          o.LeaderElect,
		LeaderElectionID:        o.LeaderElectionID,
		LeaderElectionNamespace: o.Namespace,
		// Hand over at once on SIGTERM, so a rollout never waits a lease out.
		LeaderElectionReleaseOnCancel: true,
		// A replica that cannot renew within the renew deadline stops, and
		// takes its webhook server down with it: with client-go's 15s/10s,
		// a kube-apiserver restart of over 10 s (an upgrade, a slow start)
		// stopped every replica, and with failurePolicy Fail no Deployment
		// could be admitted until the kubelet restarted them. OpenShift's
		// values for its own operators (library-go's LeaderElectionDefaulting)
		// ride out 60 s of API server downtime; the writing controllers only
		// take over later on a real failover, which nothing waits for.
		// The retry period stays client-go's 2 s, not OpenShift's 26 s: a
		// candidate looks at the Lease only once a retry period, so after
		// the release at a rollout the next leader (which provisions the
		// reporters' RBAC and writes the caBundle) started up to 31 s
		// later; the real-node test's addon, created right after a rollout,
		// had no RoleBinding for 20 s. The price is the leader's renewal
		// every 2 s instead of every 26 s.
		LeaseDuration: ptr.To(137 * time.Second),
		RenewDeadline: ptr.To(107 * time.Second),
		RetryPeriod:   ptr.To(2 * time.Second),
		Cache: cache.Options{
			ByObject:         byObject,
			DefaultTransform: cache.TransformStripManagedFields(),
		},
		// A second Run in one process (tests) registers the same controllers.
		Controller: ctrlconfig.Controller{SkipNameValidation: ptr.To(true)},
		WebhookServer: crwebhook.NewServer(crwebhook.Options{
			Host:     o.Host,
			Port:     o.Port,
			CertDir:  o.CertDir,
			CertName: o.CertName,
			KeyName:  o.KeyName,
			TLSOpts:  []func(*tls.Config){tlsDefaults, func(c *tls.Config) { c.GetCertificate = a.serving }},
		}),
	})
}

// addMetrics registers the gauges of the served certificate and of the
// AddonInstances, and watches the certificate files when they are served.
func (a *app) addMetrics(ctx context.Context) error {
	if a.files != nil {
		if err := a.mgr.Add(a.files); err != nil {
			return fmt.Errorf("adding the serving certificate watcher: %w", err)
		}
	}
	certGauges, err := promreg.RegisterOrReuse(crmetrics.Registry, &certexpiry.Collector{})
	if err != nil {
		return fmt.Errorf("registering the serving certificate metrics: %w", err)
	}
	if err := a.mgr.Add(certGauges.Holder(a.serving)); err != nil {
		return fmt.Errorf("adding the serving certificate metrics: %w", err)
	}
	instanceGauges, err := promreg.RegisterOrReuse(crmetrics.Registry, &instancewatch.Collector{})
	if err != nil {
		return fmt.Errorf("registering the AddonInstance metrics: %w", err)
	}
	return instancewatch.Setup(ctx, a.mgr, instanceGauges, "", a.log.WithName("addoninstances"))
}

// addAdmission registers the admission handler on the webhook server. With
// RBAC provisioning, it signs the status records with the key every replica
// loads (the signing key's readiness check holds a replica back until it
// has it) and applies the escalation rule to new reporter subjects.
func (a *app) addAdmission(context.Context) error {
	metrics, err := admission.NewMetrics(crmetrics.Registry)
	if err != nil {
		return fmt.Errorf("registering metrics: %w", err)
	}
	h := &admission.Handler{Config: a.inject, Log: a.log.WithName("admission"), Metrics: metrics,
		VersionWarning: admission.ReporterVersionWarning(a.log.WithName("setup"), a.o.ReporterVersion, a.inject.Image)}
	if a.manageRBAC {
		a.signing = &SigningKey{Reader: a.mgr.GetAPIReader(), Writer: a.mgr.GetClient(),
			Secret: types.NamespacedName{Namespace: a.o.Namespace, Name: a.o.SigningSecretName}, Log: a.log.WithName("signing-key")}
		if err := a.mgr.Add(a.signing); err != nil {
			return fmt.Errorf("adding the signing key loader: %w", err)
		}
		if err := a.mgr.AddReadyzCheck("signing-key", a.signing.Checker()); err != nil {
			return fmt.Errorf("adding the readiness check: %w", err)
		}
		reviews, err := authorizationv1client.NewForConfig(a.restCfg)
		if err != nil {
			return fmt.Errorf("creating the authorization client: %w", err)
		}
		var rules []rbacv1.PolicyRule
		for _, n := range a.inject.AddonInstanceNames {
			rules = append(rules, heartbeat.PolicyRules(n)...)
		}
		h.Key = a.signing.Key
		h.Onboarding = &admission.Onboarding{Bindings: a.mgr.GetClient(), Reviews: reviews.SubjectAccessReviews(),
			ClusterRole: a.rbac.ClusterRole, BindingName: a.rbac.RoleBindingName, Rules: rules}
	}
	a.mgr.GetWebhookServer().Register(admission.Path, h)
	return nil
}

// addControllers adds the writing controllers, which run on the elected
// replica: certificate rotation (self-managed mode) and RBAC provisioning.
func (a *app) addControllers(context.Context) error {
	if a.selfManaged {
		if err := certrotator.Setup(a.mgr, a.o.CertConfig(), a.src, a.log.WithName("certificates")); err != nil {
			return fmt.Errorf("setting up self-managed certificates: %w", err)
		}
	}
	if a.manageRBAC {
		cfg := a.rbac
		cfg.Key = a.signing.Key
		r := &rbac.Reconciler{Client: a.mgr.GetClient(), Config: cfg, Log: a.log.WithName("rbac")}
		if err := r.SetupWithManager(a.mgr); err != nil {
			return fmt.Errorf("setting up RBAC provisioning: %w", err)
		}
	}
	return nil
}

// addChecks adds liveness, and readiness once the TLS server answers with a
// certificate: the API server can then call it. In self-managed mode the
// handshake fails until the certificate is loaded from the Secret.
func (a *app) addChecks(context.Context) error {
	if err := a.mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return fmt.Errorf("adding the health check: %w", err)
	}
	if err := a.mgr.AddReadyzCheck("webhook", a.mgr.GetWebhookServer().StartedChecker()); err != nil {
		return fmt.Errorf("adding the readiness check: %w", err)
	}
	return nil
}
