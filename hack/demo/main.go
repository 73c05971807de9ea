// Command demo is `make demo`: addon-heartbeat end to end on a real local
// control plane, with nothing but Go on the machine. See internal/demo.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/addon-heartbeat/addon-heartbeat/internal/demo"
)

func main() {
	var o demo.Options
	flag.DurationVar(&o.Duration, "duration", 45*time.Second, "How long to show heartbeats before stopping.")
	flag.DurationVar(&o.Period, "period", 2*time.Second, "The AddonInstance's heartbeatUpdatePeriod.")
	flag.BoolVar(&o.Verbose, "verbose", false, "Also print the webhook's and the reporter's logs.")
	flag.Parse()
	if o.Duration <= 0 || o.Period <= 0 {
		fmt.Fprintln(os.Stderr, "demo: --duration and --period must be positive")
		os.Exit(2)
	}
	// Output piped into a command that exits early (| head) must not kill
	// the demo before it has stopped its processes: ignore SIGPIPE and let
	// the writes fail instead.
	signal.Ignore(syscall.SIGPIPE)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := demo.Run(ctx, o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}
