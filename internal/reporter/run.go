package reporter

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat"
)

// Exit codes of the command.
const (
	ExitOK      = 0
	ExitRuntime = 1 // the reporter could not start or failed while running
	ExitConfig  = 2 // a flag or environment variable is invalid
)

// Main is the whole command: it parses args and the environment, sets up
// JSON logging, and runs the reporter until ctx ends (SIGTERM). It returns
// the exit code: ExitConfig for a bad setting (one line on stderr naming it),
// ExitRuntime for anything that fails afterwards.
func Main(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) int {
	cfg, err := ParseConfig(args, getenv)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(stderr, "usage: reporter [--addon-instance=NAME] [--delete-ack=auto|manual] [--health-url=URL] "+
			"[--health-probe-bind-address=ADDR] [--metrics-bind-address=ADDR] [--leader-election-namespace=NS] "+
			"[--kubeconfig=FILE] [--zap-log-level=LEVEL]; env "+EnvTargetNamespace+" (required), "+EnvPodName+", "+EnvPodNamespace)
		return ExitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "reporter: %v\n", err)
		return ExitConfig
	}
	cfg.Zap.DestWriter = stderr
	log := zap.New(zap.UseFlagOptions(&cfg.Zap))
	ctrl.SetLogger(log)
	klog.SetLogger(log)
	setup := log.WithName("setup")

	restCfg, err := loadKubeconfig(cfg.Kubeconfig)
	if err != nil {
		setup.Error(err, "loading the API server configuration failed", "kubeconfig", cfg.Kubeconfig)
		return ExitRuntime
	}
	if err := Run(ctx, cfg, restCfg, log); err != nil {
		setup.Error(err, "reporter failed")
		return ExitRuntime
	}
	return ExitOK
}

// loadKubeconfig uses the file given, or controller-runtime's rules
// (KUBECONFIG, in-cluster, ~/.kube/config).
func loadKubeconfig(path string) (*rest.Config, error) {
	if path != "" {
		cfg, err := clientcmd.BuildConfigFromFlags("", path)
		if err != nil {
			return nil, fmt.Errorf("reading kubeconfig %s: %w", path, err)
		}
		return cfg, nil
	}
	cfg, err := config.GetConfig()
	if err != nil {
		return nil, fmt.Errorf("finding the API server (in-cluster, KUBECONFIG or --kubeconfig): %w", err)
	}
	return cfg, nil
}

// Run runs a zero-code Reporter for cfg in a manager that serves health
// probes and metrics, until ctx ends.
func Run(ctx context.Context, cfg Config, restCfg *rest.Config, log logr.Logger) error {
	r, err := heartbeat.New(restCfg, heartbeat.Options{
		Namespace:        cfg.Namespace,
		Name:             cfg.AddonInstance,
		DeleteAck:        cfg.DeleteAck,
		DeploymentHealth: true,
		HealthURL:        cfg.HealthURL,
		LeaseNamespace:   cfg.LeaderElectionNamespace,
		Identity:         cfg.Identity,
		Logger:           log.WithName("heartbeat"),
	})
	if err != nil {
		return fmt.Errorf("configuring the reporter: %w", err)
	}
	mgr, err := manager.New(restCfg, manager.Options{
		Scheme:                 runtime.NewScheme(),
		Logger:                 log,
		Metrics:                metricsserver.Options{BindAddress: cfg.MetricsAddr},
		HealthProbeBindAddress: cfg.HealthProbeAddr,
		// The Reporter elects one writer per AddonInstance itself.
		LeaderElection: false,
		// The manager's own client and cache are unused (the Reporter has
		// its own, scoped to what it reads): no discovery at start.
		MapperProvider: func(*rest.Config, *http.Client) (meta.RESTMapper, error) {
			return meta.NewDefaultRESTMapper(nil), nil
		},
	})
	if err != nil {
		return fmt.Errorf("creating the manager: %w", err)
	}
	// Readiness gates the addon pod (a native sidecar's readiness counts),
	// so it means "configured and serving" and never depends on the API
	// server or on leadership.
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return fmt.Errorf("adding the health check: %w", err)
	}
	if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
		return fmt.Errorf("adding the readiness check: %w", err)
	}
	if err := mgr.Add(r); err != nil {
		return fmt.Errorf("adding the reporter: %w", err)
	}
	log.WithName("setup").Info("starting", "addonInstance", cfg.Namespace+"/"+cfg.AddonInstance,
		"deleteAck", cfg.DeleteAck, "healthURL", cfg.HealthURL, "identity", cfg.Identity, "podNamespace", cfg.PodNamespace)
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("running: %w", err)
	}
	return nil
}
