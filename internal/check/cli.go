package check

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/go-logr/logr/funcr"
	addonsv1alpha1 "github.com/openshift/addon-operator/apis/addons/v1alpha1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Exit statuses of the command.
const (
	// ExitHealthy: every check passed or only warned.
	ExitHealthy = 0
	// ExitProblems: at least one check failed.
	ExitProblems = 1
	// ExitCannotCheck: bad flags, no kubeconfig, an API server that cannot
	// be reached, or a user who may not read what check needs.
	ExitCannotCheck = 2
)

// PluginBinary is the file name kubectl runs for `kubectl addon-heartbeat`:
// kubectl turns the dashes of a command into underscores to find a plugin.
const PluginBinary = "kubectl-addon_heartbeat"

// Main runs the command line args (without the program name); progName is
// how the program was invoked (os.Args[0]), for usage messages.
func Main(ctx context.Context, progName string, args []string, stdout, stderr io.Writer) int {
	prog := "addon-heartbeat"
	if filepath.Base(progName) == PluginBinary {
		prog = "kubectl addon-heartbeat"
	}
	usage := func(w io.Writer) {
		fmt.Fprintf(w, "Usage: %s check [flags]\n\nChecks the addon-heartbeat webhook and every opted-in Deployment with the current kubeconfig.\nRun %s check -h for its flags.\n", prog, prog)
	}
	if len(args) == 0 {
		usage(stderr)
		return ExitCannotCheck
	}
	switch args[0] {
	case "check":
		return runCheck(ctx, prog, args[1:], stdout, stderr)
	case "help", "-h", "--help":
		usage(stdout)
		return ExitHealthy
	default:
		fmt.Fprintf(stderr, "%s: unknown command %q\n", prog, args[0])
		usage(stderr)
		return ExitCannotCheck
	}
}

// flags are the check command's flags, named as kubectl names them.
type flags struct {
	kubeconfig, context, namespace, output string
	allNamespaces                          bool
	timeout                                time.Duration
}

func parseFlags(prog string, args []string, stderr io.Writer) (flags, error) {
	var f flags
	fs := flag.NewFlagSet(prog+" check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "Path to the kubeconfig file (default: $KUBECONFIG, then ~/.kube/config).")
	fs.StringVar(&f.context, "context", "", "The kubeconfig context to use (default: its current context).")
	for _, name := range []string{"n", "namespace"} {
		fs.StringVar(&f.namespace, name, "", "Check the opted-in Deployments of this namespace (default: the context's namespace).")
	}
	for _, name := range []string{"A", "all-namespaces"} {
		fs.BoolVar(&f.allNamespaces, name, false, "Check the opted-in Deployments of every namespace.")
	}
	for _, name := range []string{"o", "output"} {
		fs.StringVar(&f.output, name, "table", "Output format: table or json")
	}
	fs.DurationVar(&f.timeout, "timeout", time.Minute, "Give up after this long")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: %s check [flags]\n\n", prog)
		fmt.Fprintf(stderr, "Exit status: %d when no check failed, %d when one did, %d when the cluster could not be checked.\n\nFlags:\n", ExitHealthy, ExitProblems, ExitCannotCheck)
		printFlags(stderr, fs)
	}
	if err := fs.Parse(args); err != nil {
		return f, err
	}
	if fs.NArg() > 0 {
		return f, fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	if f.output != "table" && f.output != "json" {
		return f, fmt.Errorf("-o %q: expected table or json", f.output)
	}
	if f.allNamespaces && f.namespace != "" {
		return f, errors.New("-n and -A: give one or the other")
	}
	if f.timeout <= 0 {
		return f, fmt.Errorf("--timeout %s: expected a positive duration", f.timeout)
	}
	return f, nil
}

// printFlags lists each flag once with its aliases ("-n, --namespace"),
// as kubectl does, rather than the flag package's one entry per name.
func printFlags(w io.Writer, fs *flag.FlagSet) {
	var order []string
	names := map[string][]string{}
	fs.VisitAll(func(f *flag.Flag) {
		if _, ok := names[f.Usage]; !ok {
			order = append(order, f.Usage)
		}
		names[f.Usage] = append(names[f.Usage], f.Name)
	})
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	for _, usage := range order {
		var parts []string
		var f *flag.Flag
		for _, n := range names[usage] {
			f = fs.Lookup(n)
			dashes := "--"
			if len(n) == 1 {
				dashes = "-"
			}
			parts = append(parts, dashes+n)
		}
		slices.SortFunc(parts, func(a, b string) int { return len(a) - len(b) })
		arg, _ := flag.UnquoteUsage(f)
		if arg != "" {
			arg = " " + arg
		}
		def := ""
		if f.DefValue != "" && f.DefValue != "false" {
			def = " (default " + f.DefValue + ")"
		}
		fmt.Fprintf(tw, "  %s%s\t%s%s\n", strings.Join(parts, ", "), arg, usage, def)
	}
	tw.Flush()
}

func runCheck(ctx context.Context, prog string, args []string, stdout, stderr io.Writer) int {
	f, err := parseFlags(prog, args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return ExitHealthy
	}
	if err != nil {
		fmt.Fprintf(stderr, "%s check: %v\n", prog, err)
		return ExitCannotCheck
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "%s check: %v\n", prog, err)
		return ExitCannotCheck
	}
	loading := clientcmd.NewDefaultClientConfigLoadingRules()
	loading.ExplicitPath = f.kubeconfig
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(loading, &clientcmd.ConfigOverrides{CurrentContext: f.context})
	cfg, err := cc.ClientConfig()
	if err != nil {
		return fail(fmt.Errorf("loading the kubeconfig: %w", err))
	}
	scope := Scope{Namespace: f.namespace}
	if !f.allNamespaces && scope.Namespace == "" {
		if scope.Namespace, _, err = cc.Namespace(); err != nil {
			return fail(fmt.Errorf("reading the context's namespace: %w", err))
		}
	}
	clock := &serverClock{}
	cfg = rest.CopyConfig(cfg)
	// kubectl's rates: client-go's default of 5 requests a second would
	// make the SubjectAccessReviews of a large cluster take minutes.
	if cfg.QPS == 0 {
		cfg.QPS, cfg.Burst = 50, 300
	}
	cfg.Wrap(clock.wrap)
	// The checks report what matters; API deprecation warnings would only
	// interleave with the table.
	cfg.WarningHandler = rest.NoWarnings{}
	// Its own logger, so that the client never falls back to
	// controller-runtime's global one, which prints a stack trace to stderr
	// when it was never set.
	log := funcr.New(func(prefix, args string) { fmt.Fprintln(stderr, prog+" check:", prefix, args) }, funcr.Options{})
	c, err := client.New(cfg, client.Options{Scheme: scheme(), Log: log})
	if err != nil {
		return fail(fmt.Errorf("creating a client: %w", err))
	}
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	checker := &Checker{Client: c, Pods: PortForwarder{Config: cfg}, Now: clock.now}
	report, err := checker.Run(ctx, scope)
	if err != nil {
		return fail(err)
	}
	if f.output == "json" {
		err = report.WriteJSON(stdout)
	} else {
		err = report.WriteTable(stdout)
	}
	if err != nil {
		return fail(fmt.Errorf("writing the report: %w", err))
	}
	if !report.Healthy() {
		return ExitProblems
	}
	return ExitHealthy
}

// serverClock follows the API server's clock from the Date header of its
// responses: heartbeats are written in the API server's time, and the
// machine check runs on may be minutes off.
type serverClock struct {
	mu   sync.Mutex
	date time.Time // the last Date seen
	at   time.Time // when it was seen, on the local monotonic clock
}

func (s *serverClock) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		resp, err := rt.RoundTrip(req)
		if err == nil {
			if d, perr := http.ParseTime(resp.Header.Get("Date")); perr == nil {
				s.mu.Lock()
				s.date, s.at = d, time.Now()
				s.mu.Unlock()
			}
		}
		return resp, err
	})
}

// now is the API server's time, or the local time before any response.
func (s *serverClock) now() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.date.IsZero() {
		return time.Now()
	}
	// Date has one-second resolution: the server's time is within the
	// second after it.
	return s.date.Add(time.Since(s.at))
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// scheme has the built-in types and the AddonInstance API.
func scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = addonsv1alpha1.AddToScheme(s)
	return s
}
