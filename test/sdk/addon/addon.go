// Package addon is an addon that reports in-process through the heartbeat SDK
// from a controller-runtime manager, as the SDK's Example says to: the
// Reporter is one more Runnable of the manager, its metrics go to the
// manager's registry and its liveness to the manager's health endpoint.
//
// Its module pins the oldest controller-runtime and k8s.io releases the SDK
// supports (and Go 1.22); test/sdk/newest runs the same addon at the newest.
package addon

import (
	"fmt"

	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat"
)

// NewManager is the addon's manager with a Reporter for the AddonInstance
// in namespace added to it. Options are the Reporter's; Namespace,
// Registerer and Logger are set here.
func NewManager(cfg *rest.Config, namespace string, opts heartbeat.Options) (manager.Manager, *heartbeat.Reporter, error) {
	mgr, err := ctrl.NewManager(cfg, manager.Options{
		// Nothing to serve in a test; an addon keeps its own addresses.
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	})
	if err != nil {
		return nil, nil, fmt.Errorf("creating the manager: %w", err)
	}
	opts.Namespace = namespace
	opts.Registerer = metrics.Registry
	opts.Logger = mgr.GetLogger().WithName("heartbeat")
	reporter, err := heartbeat.New(cfg, opts)
	if err != nil {
		return nil, nil, fmt.Errorf("creating the heartbeat reporter: %w", err)
	}
	if err := mgr.Add(reporter); err != nil {
		return nil, nil, fmt.Errorf("adding the heartbeat reporter: %w", err)
	}
	if err := mgr.AddHealthzCheck("heartbeat", reporter.Healthz); err != nil {
		return nil, nil, fmt.Errorf("adding the heartbeat liveness check: %w", err)
	}
	return mgr, reporter, nil
}
