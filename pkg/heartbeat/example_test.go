//go:build go1.25

package heartbeat_test

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/annotations"
)

// An addon reports in-process (SDK mode): it runs a Reporter and tells it
// about its health and its own conditions. The Reporter elects one writer per
// AddonInstance by itself, so every replica can run it. In a
// controller-runtime manager, add it with mgr.Add(reporter) instead of
// calling Start (it is a manager.Runnable), and pass metrics.Registry as the
// Registerer; test/sdk runs that example at the oldest and the newest
// controller-runtime the SDK supports.
func Example() {
	cfg, err := rest.InClusterConfig()
	if err != nil {
		os.Exit(1)
	}
	reporter, err := heartbeat.New(cfg, heartbeat.Options{
		Namespace: os.Getenv("ADDON_TARGET_NAMESPACE"),
		Name:      annotations.DefaultAddonInstance,
		// The addon decides when it can be deleted.
		DeleteAck: annotations.DeleteAckManual,
		// Also judge the addon's Deployments, as the sidecar does.
		DeploymentHealth: true,
	})
	if err != nil {
		os.Exit(1)
	}

	// Anywhere in the addon, for example in a reconciler:
	_ = reporter.SetHealth(heartbeat.Component{
		Name: "database", Available: false, Reason: "ConnectionRefused", Message: "database unreachable",
	})
	_ = reporter.SetCondition(metav1.Condition{
		Type: "example.com/BackupsCurrent", Status: metav1.ConditionTrue, Reason: "BackupSucceeded",
	})
	// When the operator marks the addon for deletion and the addon is done:
	_ = reporter.SetCondition(metav1.Condition{
		Type: "ReadyToBeDeleted", Status: metav1.ConditionTrue, Reason: "AddonReadyToBeDeleted", Message: "data exported",
	})

	// Until SIGTERM; then it releases the Lease, so that a standby takes
	// over at once.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := reporter.Start(ctx); err != nil {
		os.Exit(1)
	}
}
