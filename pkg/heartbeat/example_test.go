package heartbeat_test

import (
	"os"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/annotations"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat"
)

// An addon reports in-process (SDK mode): it adds a Reporter to its own
// manager and tells it about its health and its own conditions. The Reporter
// elects one writer per AddonInstance by itself, so every replica can run it.
func Example() {
	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{})
	if err != nil {
		os.Exit(1)
	}
	reporter, err := heartbeat.New(mgr.GetConfig(), heartbeat.Options{
		Namespace: os.Getenv("ADDON_TARGET_NAMESPACE"),
		Name:      annotations.DefaultAddonInstance,
		// The addon decides when it can be deleted.
		DeleteAck: annotations.DeleteAckManual,
		// Also judge the addon's Deployments, as the sidecar does.
		DeploymentHealth: true,
		Logger:           ctrl.Log.WithName("heartbeat"),
		// Served on the manager's metrics endpoint.
		Registerer: metrics.Registry,
	})
	if err != nil {
		os.Exit(1)
	}
	if err := mgr.Add(reporter); err != nil {
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

	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		os.Exit(1)
	}
}
