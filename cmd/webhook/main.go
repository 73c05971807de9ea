// Command webhook is the addon-heartbeat admission webhook: it injects the
// heartbeat reporter into Deployments annotated addon-heartbeat.io/inject.
// This file is wiring only; see internal/webhook.
package main

import (
	"flag"
	"fmt"
	"os"

	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/addon-heartbeat/addon-heartbeat/internal/gctune"
	"github.com/addon-heartbeat/addon-heartbeat/internal/logging"
	"github.com/addon-heartbeat/addon-heartbeat/internal/version"
	"github.com/addon-heartbeat/addon-heartbeat/internal/webhook"
)

func main() {
	opts := webhook.DefaultOptions()
	opts.BindFlags(flag.CommandLine)
	printVersion := flag.Bool("version", false, "Print the version and exit.")
	flag.Parse()
	if *printVersion {
		fmt.Println("addon-heartbeat webhook", version.Get())
		return
	}

	log, err := logging.New(opts.LogLevel)
	if err != nil {
		fmt.Fprintf(os.Stderr, "webhook: --log-level: %v\n", err)
		os.Exit(2)
	}
	ctrl.SetLogger(log)
	setup := log.WithName("setup")
	setup.Info("addon-heartbeat webhook", version.Get().KeysAndValues()...)
	gc := gctune.Apply()
	setup.Info("garbage collector", "memoryLimitSource", gc.Source, "memoryLimit", gc.MemoryLimit, "gcPercent", gc.GCPercent)
	if err := opts.Validate(); err != nil {
		setup.Error(err, "invalid configuration")
		os.Exit(2)
	}
	restCfg, err := ctrl.GetConfig()
	if err != nil {
		setup.Error(err, "loading the kubeconfig")
		os.Exit(1)
	}
	if err := webhook.Run(ctrl.SetupSignalHandler(), opts, restCfg, log); err != nil {
		setup.Error(err, "webhook failed")
		os.Exit(1)
	}
}
