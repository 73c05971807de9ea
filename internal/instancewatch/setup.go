package instancewatch

import (
	"context"
	"fmt"
	"os"

	"github.com/go-logr/logr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
)

// Setup adds to mgr (whose cache has CacheOptions) the gauges of every
// AddonInstance, exported by every replica through collector (registered
// once per process), and the Recorder of period Events, run by the elected
// replica. instance names the replica in its Events; the host name (the pod
// name) when empty.
func Setup(ctx context.Context, mgr ctrl.Manager, collector *Collector, instance string, log logr.Logger) error {
	// Every replica watches, not only the one running the Recorder.
	if _, err := mgr.GetCache().GetInformer(ctx, &Object{}, cache.BlockUntilSynced(false)); err != nil {
		return fmt.Errorf("watching AddonInstances: %w", err)
	}
	if err := mgr.Add(collector.Holder(CacheLister(mgr.GetCache()))); err != nil {
		return fmt.Errorf("adding the AddonInstance gauges: %w", err)
	}
	if instance == "" {
		host, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("reading the host name for the Events' reporting instance: %w", err)
		}
		instance = host
	}
	r := &Recorder{Reader: mgr.GetCache(), Client: mgr.GetClient(), Instance: instance, Log: log}
	if err := r.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the AddonInstance period Events: %w", err)
	}
	return nil
}
