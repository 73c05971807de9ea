// Command reporter is the heartbeat sidecar that the addon-heartbeat webhook
// injects into addon pods. See internal/reporter for its flags and
// environment, and pkg/heartbeat for what it writes.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/addon-heartbeat/addon-heartbeat/internal/gctune"
	"github.com/addon-heartbeat/addon-heartbeat/internal/reporter"
)

func main() {
	gctune.ApplySidecar(os.LookupEnv)
	os.Exit(reporter.Main(signalContext(), os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

// signalContext ends on the first SIGTERM or SIGINT, so that the reporter
// stops and releases its Lease; a second signal exits at once with code 1
// (as controller-runtime's SetupSignalHandler did).
func signalContext() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	c := make(chan os.Signal, 2)
	signal.Notify(c, syscall.SIGTERM, os.Interrupt)
	go func() {
		<-c
		cancel()
		<-c
		os.Exit(reporter.ExitRuntime)
	}()
	return ctx
}
