package testenv

import (
	"fmt"
	"os"
	"testing"

	"github.com/go-logr/logr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/addon-heartbeat/addon-heartbeat/internal/logging"
)

// Suite is what RunSuite gives a test package: its environment, a client of
// it, and the logger controller-runtime was given.
type Suite struct {
	Env    *Environment
	Client client.Client
	Log    logr.Logger
}

// Setup prepares a package's fixtures on a started Suite. The teardown it
// returns (nil: none) runs after the tests, before the environment stops.
type Setup func(s *Suite) (teardown func() error, err error)

// RunSuite is a test package's TestMain against one environment: it sets
// controller-runtime's logger at level, starts the environment with opts,
// makes a client, calls setup (when not nil), runs the tests, tears down
// and stops the environment. It reports each failure on stderr and returns
// the exit code for os.Exit: the tests', or 1 when their setup or teardown
// failed (a failure to stop is reported, not counted).
func RunSuite(m *testing.M, level string, opts Options, setup Setup) int {
	code, err := runSuite(m, level, opts, setup)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return code
}

func runSuite(m *testing.M, level string, opts Options, setup Setup) (code int, err error) {
	log, err := logging.New(level)
	if err != nil {
		return 0, err
	}
	ctrl.SetLogger(log)
	env, err := Start(opts)
	if err != nil {
		return 0, err
	}
	defer func() {
		if serr := env.Stop(); serr != nil {
			fmt.Fprintln(os.Stderr, "stopping kube-apiserver and etcd:", serr)
		}
	}()
	c, err := client.New(env.Config, client.Options{Scheme: Scheme()})
	if err != nil {
		return 0, fmt.Errorf("making a client: %w", err)
	}
	s := &Suite{Env: env, Client: c, Log: log}
	var teardown func() error
	if setup != nil {
		if teardown, err = setup(s); err != nil {
			return 0, fmt.Errorf("setting up the suite: %w", err)
		}
	}
	code = m.Run()
	if teardown != nil {
		if err := teardown(); err != nil {
			return code, fmt.Errorf("tearing down the suite: %w", err)
		}
	}
	return code, nil
}
