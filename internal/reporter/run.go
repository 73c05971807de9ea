package reporter

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	stdlog "log"
	"net"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/addon-heartbeat/addon-heartbeat/internal/logging/slogjson"
	"github.com/addon-heartbeat/addon-heartbeat/internal/version"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat"
)

// Exit codes of the command.
const (
	ExitOK      = 0
	ExitRuntime = 1 // the reporter could not start or failed while running
	ExitConfig  = 2 // a flag or environment variable is invalid
)

// Main is the whole command: it parses args and the environment (--version
// prints the version to stdout and exits), sets up JSON logging, and runs the reporter until ctx ends (SIGTERM). It returns
// the exit code: ExitConfig for a bad setting (one line on stderr naming it),
// ExitRuntime for anything that fails afterwards.
func Main(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	cfg, err := ParseConfig(args, getenv)
	if errors.Is(err, ErrVersion) {
		fmt.Fprintln(stdout, "addon-heartbeat reporter", version.Get())
		return ExitOK
	}
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(stderr, "usage: reporter [--addon-instance=NAME] [--delete-ack=auto|manual] [--health-url=URL] "+
			"[--health-probe-bind-address=ADDR] [--metrics-bind-address=ADDR] [--leader-election-namespace=NS] "+
			"[--kubeconfig=FILE] [--log-level=debug|info|error] [--zap-log-level=LEVEL] [--version]; env "+EnvTargetNamespace+" (required), "+EnvPodName+", "+EnvPodNamespace)
		return ExitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "reporter: %v\n", err)
		return ExitConfig
	}
	log := slogjson.New(stderr, cfg.Log)
	// client-go logs through klog.
	klog.SetLogger(log)
	setup := log.WithName("setup")
	setup.Info("addon-heartbeat reporter", version.Get().KeysAndValues()...)

	restCfg, err := loadKubeconfig(cfg.Kubeconfig)
	if err != nil {
		setup.Error(err, "loading the API server configuration failed", "kubeconfig", cfg.Kubeconfig)
		return ExitRuntime
	}
	if err := Run(ctx, cfg, restCfg, log); err != nil {
		setup.Error(err, "reporter failed")
		return ExitRuntime
	}
	return ExitOK
}

// loadKubeconfig uses the file given, or else the same rules as
// controller-runtime's config.GetConfig: KUBECONFIG when it is set;
// otherwise the in-cluster configuration, then ~/.kube/config.
func loadKubeconfig(path string) (*rest.Config, error) {
	if path != "" {
		cfg, err := clientcmd.BuildConfigFromFlags("", path)
		if err != nil {
			return nil, fmt.Errorf("reading kubeconfig %s: %w", path, err)
		}
		return cfg, nil
	}
	cfg, err := discoverKubeconfig()
	if err != nil {
		return nil, fmt.Errorf("finding the API server (in-cluster, KUBECONFIG or --kubeconfig): %w", err)
	}
	// As controller-runtime does: no client-side rate limit unless the
	// kubeconfig sets one.
	if cfg.QPS == 0 {
		cfg.QPS = -1
	}
	return cfg, nil
}

// discoverKubeconfig is controller-runtime's config.GetConfig without a
// --kubeconfig flag or context: the files of KUBECONFIG when it is set;
// otherwise the in-cluster configuration, and when that fails ~/.kube/config
// (the home directory of the current user when HOME is unset).
func discoverKubeconfig() (*rest.Config, error) {
	var inClusterErr error
	if os.Getenv(clientcmd.RecommendedConfigPathEnvVar) == "" {
		cfg, err := rest.InClusterConfig()
		if err == nil {
			return cfg, nil
		}
		inClusterErr = err
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if _, ok := os.LookupEnv("HOME"); !ok {
		// controller-runtime fails here when the user is unknown; without
		// a home directory there is simply no ~/.kube/config to read.
		if u, err := user.Current(); err == nil && u.HomeDir != "" {
			rules.Precedence = append(rules.Precedence,
				filepath.Join(u.HomeDir, clientcmd.RecommendedHomeDir, clientcmd.RecommendedFileName))
		}
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		if inClusterErr != nil {
			return nil, fmt.Errorf("no in-cluster configuration (%v) and no kubeconfig: %w", inClusterErr, err)
		}
		return nil, err
	}
	return cfg, nil
}

// Timeouts of the probe and metrics servers.
const (
	readHeaderTimeout = 10 * time.Second
	readTimeout       = 30 * time.Second
	writeTimeout      = 30 * time.Second
	idleTimeout       = 90 * time.Second
	// shutdownTimeout bounds the graceful stop of the HTTP servers, after
	// the Reporter has returned.
	shutdownTimeout = 5 * time.Second
)

// endpoint is one HTTP server of the reporter, bound but not yet serving.
type endpoint struct {
	what     string // what it serves, for errors and logs
	flag     string // the flag that sets its address
	addr     string // its value
	listener net.Listener
	server   *http.Server
}

// Run runs a zero-code Reporter for cfg until ctx ends, and serves its health
// probes and metrics from plain net/http servers. Both addresses are bound
// before the Reporter starts, so a bad or used address fails at once; the
// servers keep answering until the Reporter has stopped and released its
// Lease, and are shut down then.
func Run(ctx context.Context, cfg Config, restCfg *rest.Config, log logr.Logger) error {
	registry, err := newRegistry()
	if err != nil {
		return err
	}
	r, err := heartbeat.New(restCfg, heartbeat.Options{
		Namespace:        cfg.Namespace,
		Name:             cfg.AddonInstance,
		DeleteAck:        cfg.DeleteAck,
		DeploymentHealth: true,
		HealthURL:        cfg.HealthURL,
		LeaseNamespace:   cfg.LeaderElectionNamespace,
		Identity:         cfg.Identity,
		Logger:           log.WithName("heartbeat"),
		Registerer:       registry,
	})
	if err != nil {
		return fmt.Errorf("configuring the reporter: %w", err)
	}
	endpoints := newEndpoints(cfg, r.Healthz, registry, log)
	if err := listen(ctx, endpoints); err != nil {
		return err
	}

	setup := log.WithName("setup")
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	// A server that stops on its own stops the reporter, which then exits
	// with an error.
	srv := serve(endpoints, cancel, setup)
	setup.Info("starting", "addonInstance", cfg.Namespace+"/"+cfg.AddonInstance,
		"deleteAck", cfg.DeleteAck, "healthURL", cfg.HealthURL, "identity", cfg.Identity, "podNamespace", cfg.PodNamespace)
	runErr := r.Start(runCtx)

	// The Reporter has stopped heartbeating and released its Lease (or a
	// server failed): the probes and metrics, served during that hand-over,
	// stop now.
	errs := srv.stop(context.WithoutCancel(ctx), setup)
	if runErr != nil {
		errs = append(errs, fmt.Errorf("running: %w", runErr))
	}
	return errors.Join(errs...)
}

// newRegistry is a registry of the reporter's own: the Go and process
// collectors and the build info, nothing registered globally by libraries.
func newRegistry() (*prometheus.Registry, error) {
	registry := prometheus.NewRegistry()
	if err := registry.Register(collectors.NewGoCollector()); err != nil {
		return nil, fmt.Errorf("registering the Go metrics: %w", err)
	}
	if err := registry.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
		return nil, fmt.Errorf("registering the process metrics: %w", err)
	}
	if err := registry.Register(version.NewCollector("reporter", version.Get())); err != nil {
		return nil, fmt.Errorf("registering the build info metric: %w", err)
	}
	return registry, nil
}

// newEndpoints are the servers cfg asks for, not yet bound. Readiness gates
// the addon pod (a native sidecar's readiness counts), so it means
// "configured and serving" and never depends on the API server or on
// leadership. Liveness fails only when the heartbeat loop is stuck
// (healthz), so that the kubelet restarts the sidecar.
func newEndpoints(cfg Config, healthz func(*http.Request) error, registry *prometheus.Registry, log logr.Logger) []*endpoint {
	errorLog := newHTTPErrorLog(log.WithName("http"))
	var endpoints []*endpoint
	if cfg.HealthProbeAddr != "0" {
		mux := http.NewServeMux()
		mux.HandleFunc("GET /healthz", checked(log.WithName("healthz"), healthz))
		mux.HandleFunc("GET /readyz", ok)
		endpoints = append(endpoints, &endpoint{what: "health probes", flag: "--health-probe-bind-address",
			addr: cfg.HealthProbeAddr, server: newServer(mux, errorLog)})
	}
	if cfg.MetricsAddr != "0" {
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{ErrorLog: errorLog}))
		endpoints = append(endpoints, &endpoint{what: "metrics", flag: "--metrics-bind-address",
			addr: cfg.MetricsAddr, server: newServer(mux, errorLog)})
	}
	return endpoints
}

// listen binds every endpoint's address; on a failure it closes those it
// bound and names the flag whose address failed.
func listen(ctx context.Context, endpoints []*endpoint) error {
	for _, e := range endpoints {
		l, err := new(net.ListenConfig).Listen(ctx, "tcp", e.addr)
		if err != nil {
			for _, bound := range endpoints {
				if bound.listener != nil {
					_ = bound.listener.Close()
				}
			}
			return fmt.Errorf("serving the %s on %s (%s): %w", e.what, e.addr, e.flag, err)
		}
		e.listener = l
	}
	return nil
}

// servers are the bound endpoints, serving.
type servers struct {
	endpoints []*endpoint
	wg        sync.WaitGroup
	errs      chan error
}

// serve serves every endpoint until stop; one that fails calls failed.
func serve(endpoints []*endpoint, failed func(), log logr.Logger) *servers {
	s := &servers{endpoints: endpoints, errs: make(chan error, len(endpoints))}
	for _, e := range endpoints {
		log.Info("serving "+e.what, "address", e.listener.Addr().String())
		s.wg.Go(func() {
			if err := e.server.Serve(e.listener); !errors.Is(err, http.ErrServerClosed) {
				s.errs <- fmt.Errorf("serving the %s on %s: %w", e.what, e.listener.Addr(), err)
				failed()
			}
		})
	}
	return s
}

// stop shuts the servers down gracefully, within shutdownTimeout, and
// returns the errors they failed with while serving.
func (s *servers) stop(ctx context.Context, log logr.Logger) []error {
	ctx, cancel := context.WithTimeout(ctx, shutdownTimeout)
	defer cancel()
	for _, e := range s.endpoints {
		if err := e.server.Shutdown(ctx); err != nil {
			log.Info("closing the "+e.what+" server after its graceful shutdown failed", "reason", err.Error())
			_ = e.server.Close()
		}
	}
	s.wg.Wait()
	close(s.errs)
	var errs []error
	for err := range s.errs {
		errs = append(errs, err)
	}
	return errs
}

func newServer(h http.Handler, errorLog *stdlog.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    1 << 16,
		ErrorLog:          errorLog,
	}
}

// checked answers 500 with the check's error when it fails (logged, since
// the kubelet only records the status), ok otherwise.
func checked(log logr.Logger, check func(*http.Request) error) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		if err := check(req); err != nil {
			log.Error(err, "liveness check failed")
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.Header().Set("X-Content-Type-Options", "nosniff")
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = io.WriteString(w, err.Error())
			return
		}
		ok(w, req)
	}
}

func ok(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	_, _ = io.WriteString(w, "ok")
}

// newHTTPErrorLog sends what net/http and promhttp would print with the
// standard log package to the structured log, so that every line on stderr
// stays JSON.
func newHTTPErrorLog(l logr.Logger) *stdlog.Logger {
	return stdlog.New(logWriter{l}, "", 0)
}

type logWriter struct{ l logr.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	w.l.Info(strings.TrimSpace(string(p)))
	return len(p), nil
}
