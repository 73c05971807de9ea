// Command reporter is the heartbeat sidecar that the addon-heartbeat webhook
// injects into addon pods. See internal/reporter for its flags and
// environment, and pkg/heartbeat for what it writes.
package main

import (
	"context"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"syscall"

	"github.com/addon-heartbeat/addon-heartbeat/internal/reporter"
)

func main() {
	sizeRuntime(os.LookupEnv)
	os.Exit(reporter.Main(signalContext(), os.Args[1:], os.Getenv, os.Stderr))
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

// sizeRuntime fits the Go runtime to a sidecar that makes a few requests per
// period and idles in between; GOMAXPROCS or GOGC in the environment still
// win. test/bench BenchmarkReporterFootprint measures the effect.
func sizeRuntime(lookupEnv func(string) (string, bool)) {
	if _, set := lookupEnv("GOMAXPROCS"); !set {
		// The injected container has no CPU limit, so Go's default is the
		// node's CPU count: a P per CPU, each with its own cache of heap
		// spans, and idle Ps that spin or run GC mark workers whenever the
		// reporter wakes. One P serves a few requests a second; it kept
		// about 0.9 MiB less heap on a 2-CPU VM, more on larger nodes.
		runtime.GOMAXPROCS(1)
	}
	if _, set := lookupEnv("GOGC"); !set {
		// The live heap is 1 to 2 MiB and grows by some 30 KiB a
		// heartbeat, so the default (GOGC=100: a 4 MiB minimum goal) lets
		// it double before a collection. 50 halves that headroom, for a
		// few more collections a minute of well under a millisecond each.
		debug.SetGCPercent(50)
	}
}
