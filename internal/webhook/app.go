package webhook

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/addon-heartbeat/addon-heartbeat/internal/logging"
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
}

// DefaultOptions are the defaults of every flag.
func DefaultOptions() Options {
	d := inject.DefaultConfig()
	return Options{
		Port:                    9443,
		CertDir:                 "/tmp/k8s-webhook-server/serving-certs",
		CertName:                "tls.crt",
		KeyName:                 "tls.key",
		MetricsBindAddress:      ":8080",
		HealthProbeBindAddress:  ":8081",
		LogLevel:                logging.LevelInfo,
		ShutdownTimeout:         15 * time.Second,
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
	fs.StringVar(&o.ReporterImage, "reporter-image", o.ReporterImage, "Image of the injected reporter (required).")
	fs.StringVar(&o.ReporterImagePullPolicy, "reporter-image-pull-policy", o.ReporterImagePullPolicy, "Pull policy of the injected reporter: Always, IfNotPresent or Never.")
	fs.BoolVar(&o.NativeSidecar, "native-sidecar", o.NativeSidecar, "Inject the reporter as a native sidecar (Kubernetes 1.29+); false injects a plain container.")
	fs.StringVar(&o.ReporterCPURequest, "reporter-cpu-request", o.ReporterCPURequest, "CPU request of the injected reporter.")
	fs.StringVar(&o.ReporterMemoryRequest, "reporter-memory-request", o.ReporterMemoryRequest, "Memory request of the injected reporter.")
	fs.StringVar(&o.ReporterMemoryLimit, "reporter-memory-limit", o.ReporterMemoryLimit, "Memory limit of the injected reporter.")
	fs.IntVar(&o.ReporterHealthPort, "reporter-health-port", o.ReporterHealthPort, "Pod-local port of the reporter's /healthz and /readyz.")
	fs.IntVar(&o.ReporterMetricsPort, "reporter-metrics-port", o.ReporterMetricsPort, "Pod-local port of the reporter's /metrics.")
	fs.StringVar(&o.ReporterLogLevel, "reporter-log-level", o.ReporterLogLevel, "Log level passed to injected reporters (debug, info or error); empty leaves their default.")
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
	cfg := inject.Config{
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
		HealthPort:  int32(min(max(o.ReporterHealthPort, 0), 1<<16)),
		MetricsPort: int32(min(max(o.ReporterMetricsPort, 0), 1<<16)),
		LogLevel:    o.ReporterLogLevel,
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
	if o.CertDir == "" {
		errs = append(errs, errors.New("--cert-dir: must be set"))
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
	cfg, _ := o.InjectConfig() // validated above
	shutdown := o.ShutdownTimeout
	mgr, err := ctrl.NewManager(restCfg, ctrl.Options{
		Scheme:                  scheme(),
		Logger:                  log,
		Metrics:                 metricsserver.Options{BindAddress: o.MetricsBindAddress},
		HealthProbeBindAddress:  o.HealthProbeBindAddress,
		GracefulShutdownTimeout: &shutdown,
		WebhookServer: crwebhook.NewServer(crwebhook.Options{
			Host:     o.Host,
			Port:     o.Port,
			CertDir:  o.CertDir,
			CertName: o.CertName,
			KeyName:  o.KeyName,
			TLSOpts:  []func(*tls.Config){tlsDefaults},
		}),
	})
	if err != nil {
		return fmt.Errorf("creating the manager: %w", err)
	}
	metrics, err := NewMetrics(crmetrics.Registry)
	if err != nil {
		return fmt.Errorf("registering metrics: %w", err)
	}
	server := mgr.GetWebhookServer()
	server.Register(Path, &Handler{Config: cfg, Log: log.WithName("admission"), Metrics: metrics})
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return fmt.Errorf("adding the health check: %w", err)
	}
	// Ready once the TLS server answers: the API server can then call it.
	if err := mgr.AddReadyzCheck("webhook", server.StartedChecker()); err != nil {
		return fmt.Errorf("adding the readiness check: %w", err)
	}
	log.Info("starting the webhook", "port", o.Port, "certDir", o.CertDir, "reporterImage", cfg.Image, "nativeSidecar", cfg.NativeSidecar)
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("running the manager: %w", err)
	}
	log.Info("webhook stopped")
	return nil
}

// registerOrReuse registers c, or returns the collector already registered
// under the same descriptors (a second Run in one process, as in tests).
func registerOrReuse[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	if err := reg.Register(c); err != nil {
		if are, ok := errors.AsType[prometheus.AlreadyRegisteredError](err); ok {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing, nil
			}
		}
		return c, err
	}
	return c, nil
}
