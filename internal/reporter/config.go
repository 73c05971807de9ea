// Package reporter is the command of the injected sidecar: it parses the
// flags and environment the webhook sets (see pkg/inject) and runs a
// pkg/heartbeat Reporter in zero-code mode, next to two plain net/http
// servers: /healthz and /readyz on one address, /metrics (the Reporter's
// series and the Go and process metrics, from a registry of its own) on the
// other. It does not use a controller-runtime manager, whose client and
// cache would link every built-in API group into the binary.
package reporter

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/addon-heartbeat/addon-heartbeat/internal/logging/slogjson"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/annotations"
)

// Environment variables the webhook sets from the downward API.
const (
	EnvTargetNamespace = "ADDON_TARGET_NAMESPACE"
	EnvPodName         = "POD_NAME"
	EnvPodNamespace    = "POD_NAMESPACE"
)

// Config is the reporter's whole configuration.
type Config struct {
	// AddonInstance is the AddonInstance name in Namespace.
	AddonInstance string
	// Namespace is the addon's target namespace (ADDON_TARGET_NAMESPACE).
	Namespace string
	// DeleteAck is how markedForDeletion is acknowledged.
	DeleteAck annotations.DeleteAckMode
	// HealthURL is the optional pod-local health check.
	HealthURL string
	// HealthProbeAddr serves /healthz and /readyz ("0" disables).
	HealthProbeAddr string
	// MetricsAddr serves /metrics ("0" disables).
	MetricsAddr string
	// LeaderElectionNamespace holds the election Lease.
	LeaderElectionNamespace string
	// Identity in the Lease: POD_NAME, or a generated one when unset.
	Identity string
	// PodNamespace is where the reporter runs (POD_NAMESPACE), for logs.
	PodNamespace string
	// Kubeconfig is a kubeconfig file; empty means KUBECONFIG, then
	// in-cluster, then ~/.kube/config (the rules of controller-runtime's
	// config.GetConfig).
	Kubeconfig string
	// LogLevel is --log-level: debug, info or error (empty: --zap-log-level,
	// info by default).
	LogLevel string
	// Log are the logging options (--zap-log-level and
	// --zap-stacktrace-level, as controller-runtime's zap package reads
	// them), with LogLevel applied.
	Log slogjson.Options
}

// Defaults of the flags.
const (
	DefaultHealthProbeAddr = ":9781"
	DefaultMetricsAddr     = ":9782"
)

// ErrVersion is ParseConfig's answer to --version.
var ErrVersion = errors.New("--version")

// ParseConfig reads the command line (without the program name) and the
// environment. An error names the setting at fault; flag.ErrHelp means -h, ErrVersion
// --version.
func ParseConfig(args []string, getenv func(string) string) (Config, error) {
	cfg := Config{}
	fs, deleteAck, printVersion := cfg.flagSet()
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return cfg, err
		}
		return cfg, fmt.Errorf("invalid command line: %w", err)
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("invalid command line: unexpected argument %q", fs.Arg(0))
	}
	if *printVersion {
		// Before the environment is read: --version works anywhere.
		return cfg, ErrVersion
	}
	if err := cfg.applyLogLevel(); err != nil {
		return cfg, err
	}
	cfg.Namespace = strings.TrimSpace(getenv(EnvTargetNamespace))
	cfg.Identity = getenv(EnvPodName)
	cfg.PodNamespace = getenv(EnvPodNamespace)
	if cfg.LeaderElectionNamespace == "" {
		cfg.LeaderElectionNamespace = cfg.Namespace
	}
	if err := cfg.validate(); err != nil {
		return cfg, err
	}
	mode, err := annotations.ParseDeleteAck(*deleteAck)
	if err != nil {
		return cfg, fmt.Errorf(`--delete-ack: invalid value %q: expected "auto" or "manual"`, *deleteAck)
	}
	cfg.DeleteAck = mode
	return cfg, cfg.validateEndpoints()
}

// flagSet binds cfg's flags; --delete-ack is read into deleteAck, for
// ParseConfig to parse, and --version into printVersion.
func (cfg *Config) flagSet() (fs *flag.FlagSet, deleteAck *string, printVersion *bool) {
	fs = flag.NewFlagSet("reporter", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&cfg.AddonInstance, "addon-instance", annotations.DefaultAddonInstance,
		"Name of the AddonInstance in the addon's namespace.")
	deleteAck = fs.String("delete-ack", string(annotations.DefaultDeleteAck),
		`How markedForDeletion is acknowledged: "auto" or "manual".`)
	fs.StringVar(&cfg.HealthURL, "health-url", "",
		"Optional pod-local URL checked each period, e.g. http://127.0.0.1:8081/healthz (loopback hosts only).")
	fs.StringVar(&cfg.HealthProbeAddr, "health-probe-bind-address", DefaultHealthProbeAddr,
		`Address of /healthz and /readyz ("0" disables).`)
	fs.StringVar(&cfg.MetricsAddr, "metrics-bind-address", DefaultMetricsAddr,
		`Address of /metrics ("0" disables).`)
	fs.StringVar(&cfg.LeaderElectionNamespace, "leader-election-namespace", "",
		"Namespace of the election Lease; "+EnvTargetNamespace+" when empty.")
	fs.StringVar(&cfg.Kubeconfig, "kubeconfig", "",
		"Path to a kubeconfig; otherwise KUBECONFIG, the in-cluster config, or ~/.kube/config.")
	fs.StringVar(&cfg.LogLevel, "log-level", "",
		"Log level: debug, info or error (the same as --zap-log-level).")
	cfg.Log.BindFlags(fs)
	printVersion = fs.Bool("version", false, "Print the version and exit.")
	return fs, deleteAck, printVersion
}

// applyLogLevel sets the logging level from --log-level, which wins over
// --zap-log-level.
func (cfg *Config) applyLogLevel() error {
	switch cfg.LogLevel {
	case "":
	case "debug":
		cfg.Log.Level = new(slogjson.LevelDebug)
	case "info":
		cfg.Log.Level = new(slogjson.LevelInfo)
	case "error":
		cfg.Log.Level = new(slogjson.LevelError)
	default:
		return fmt.Errorf(`--log-level: invalid value %q: expected "debug", "info" or "error"`, cfg.LogLevel)
	}
	return nil
}

// validate checks the namespaces and the AddonInstance name.
func (cfg *Config) validate() error {
	if cfg.Namespace == "" {
		return fmt.Errorf("environment variable %s is not set: it must hold the addon's namespace (the webhook sets it from metadata.namespace)", EnvTargetNamespace)
	}
	if errs := validation.IsDNS1123Label(cfg.Namespace); len(errs) > 0 {
		return fmt.Errorf("environment variable %s: invalid namespace %q: %s", EnvTargetNamespace, cfg.Namespace, errs[0])
	}
	if errs := validation.IsDNS1123Label(cfg.LeaderElectionNamespace); len(errs) > 0 {
		return fmt.Errorf("--leader-election-namespace: invalid namespace %q: %s", cfg.LeaderElectionNamespace, errs[0])
	}
	if errs := validation.IsDNS1123Subdomain(cfg.AddonInstance); len(errs) > 0 {
		return fmt.Errorf("--addon-instance: invalid AddonInstance name %q: %s", cfg.AddonInstance, errs[0])
	}
	return nil
}

// validateEndpoints checks the health URL and the bind addresses.
func (cfg *Config) validateEndpoints() error {
	if cfg.HealthURL != "" {
		if err := annotations.ValidateHealthURL(cfg.HealthURL); err != nil {
			var ae *annotations.Error
			if errors.As(err, &ae) {
				return fmt.Errorf("--health-url: invalid value %q: expected %s", cfg.HealthURL, ae.Expected)
			}
			return fmt.Errorf("--health-url: %w", err)
		}
	}
	for _, a := range []struct{ flag, value string }{
		{"--health-probe-bind-address", cfg.HealthProbeAddr}, {"--metrics-bind-address", cfg.MetricsAddr},
	} {
		if err := validateBindAddress(a.value); err != nil {
			return fmt.Errorf("%s: invalid value %q: %w", a.flag, a.value, err)
		}
	}
	return nil
}

// validateBindAddress accepts "0" (disabled) or host:port.
func validateBindAddress(v string) error {
	if v == "0" {
		return nil
	}
	if _, _, err := net.SplitHostPort(v); err != nil {
		return errors.New(`expected host:port, ":port" or "0" to disable`)
	}
	return nil
}
