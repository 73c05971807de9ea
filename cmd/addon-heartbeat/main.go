// Command addon-heartbeat is the operator's command line: `addon-heartbeat
// check` checks an installation with the current kubeconfig. Installed as
// kubectl-addon_heartbeat on the PATH, it is also `kubectl addon-heartbeat
// check`. This file is wiring only; see internal/check.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/addon-heartbeat/addon-heartbeat/internal/check"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := check.Main(ctx, os.Args[0], os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
