// Command reporter is the heartbeat sidecar that the addon-heartbeat webhook
// injects into addon pods. See internal/reporter for its flags and
// environment, and pkg/heartbeat for what it writes.
package main

import (
	"os"

	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/addon-heartbeat/addon-heartbeat/internal/reporter"
)

func main() {
	os.Exit(reporter.Main(ctrl.SetupSignalHandler(), os.Args[1:], os.Getenv, os.Stderr))
}
