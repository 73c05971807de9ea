package reporter

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"go.uber.org/goleak"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"

	"github.com/addon-heartbeat/addon-heartbeat/internal/version"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/annotations"
)

// logEntry is one line the code under test logged.
type logEntry struct {
	name, msg string
	err       error
	kv        map[string]any
}

// logRecorder is a logr sink that keeps every entry, to await log lines and
// read their values.
type logRecorder struct {
	mu      sync.Mutex
	entries []logEntry
}

type recordSink struct {
	rec    *logRecorder
	name   string
	values []any
}

func newLogRecorder() (*logRecorder, logr.Logger) {
	rec := &logRecorder{}
	return rec, logr.New(&recordSink{rec: rec})
}

func (s *recordSink) Init(logr.RuntimeInfo) {}
func (s *recordSink) Enabled(int) bool      { return true }
func (s *recordSink) Info(_ int, msg string, kv ...any) {
	s.add(msg, nil, kv)
}
func (s *recordSink) Error(err error, msg string, kv ...any) { s.add(msg, err, kv) }
func (s *recordSink) WithValues(kv ...any) logr.LogSink {
	return &recordSink{rec: s.rec, name: s.name, values: append(append([]any{}, s.values...), kv...)}
}

func (s *recordSink) WithName(name string) logr.LogSink {
	if s.name != "" {
		name = s.name + "/" + name
	}
	return &recordSink{rec: s.rec, name: name, values: s.values}
}

func (s *recordSink) add(msg string, err error, kv []any) {
	e := logEntry{name: s.name, msg: msg, err: err, kv: map[string]any{}}
	all := append(append([]any{}, s.values...), kv...)
	for i := 0; i+1 < len(all); i += 2 {
		e.kv[fmt.Sprint(all[i])] = all[i+1]
	}
	s.rec.mu.Lock()
	defer s.rec.mu.Unlock()
	s.rec.entries = append(s.rec.entries, e)
}

// find returns the first entry with msg.
func (r *logRecorder) find(msg string) (logEntry, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.entries {
		if e.msg == msg {
			return e, true
		}
	}
	return logEntry{}, false
}

func (r *logRecorder) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	for _, e := range r.entries {
		fmt.Fprintf(&b, "%s: %s %v %v\n", e.name, e.msg, e.kv, e.err)
	}
	return b.String()
}

// await polls cond until it holds or timeout passes.
func await(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, timeout, true,
		func(context.Context) (bool, error) { return cond(), nil })
	if err != nil {
		t.Fatalf("%s: not within %s", what, timeout)
	}
}

// unreachableAPIServer is a rest.Config whose API server refuses every
// connection: what the reporter serves must not depend on it.
func unreachableAPIServer(t *testing.T) *rest.Config {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return &rest.Config{Host: "http://" + addr}
}

func testConfig(health, metrics string) Config {
	return Config{AddonInstance: "addon-instance", Namespace: "my-addon", DeleteAck: annotations.DeleteAckAuto,
		HealthProbeAddr: health, MetricsAddr: metrics, LeaderElectionNamespace: "my-addon", Identity: "addon-7d9f-x2"}
}

// started runs Run in the background and returns a function that stops it
// and returns its error.
func started(t *testing.T, cfg Config, restCfg *rest.Config, log logr.Logger) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg, restCfg, log) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(15 * time.Second):
				err = errors.New("Run did not return within 15s of the end of its context")
			}
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

// servedAddress awaits the log line of a server and returns its address.
func servedAddress(t *testing.T, rec *logRecorder, what string) string {
	t.Helper()
	var addr string
	await(t, 10*time.Second, "log line \"serving "+what+"\"", func() bool {
		e, ok := rec.find("serving " + what)
		if ok {
			addr, _ = e.kv["address"].(string)
		}
		return ok
	})
	if addr == "" {
		t.Fatalf("log line \"serving %s\" has no address:\n%s", what, rec)
	}
	return addr
}

// noKeepAlive is an HTTP client that leaves no connection behind.
var noKeepAlive = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := noKeepAlive.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: reading the body: %v", url, err)
	}
	return resp.StatusCode, string(body)
}

// sample returns the value of the first sample of metric whose line starts
// with prefix (name plus optional labels), as text.
func sample(body, prefix string) (string, bool) {
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if after, ok := strings.CutPrefix(line, prefix); ok && (strings.HasPrefix(after, " ") || strings.HasPrefix(after, "{")) {
			f := strings.Fields(line)
			return f[len(f)-1], true
		}
	}
	return "", false
}

func TestRunServesProbesAndMetrics(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	rec, log := newLogRecorder()
	stop := started(t, testConfig("127.0.0.1:0", "127.0.0.1:0"), unreachableAPIServer(t), log)
	health := servedAddress(t, rec, "health probes")
	metrics := servedAddress(t, rec, "metrics")
	if health == metrics {
		t.Fatalf("probes and metrics on the same address %s", health)
	}

	// Ready although the API server refuses every connection.
	await(t, 10*time.Second, "the reporter starting", func() bool {
		_, ok := rec.find("starting")
		return ok
	})
	for _, path := range []string{"/healthz", "/readyz"} {
		if code, body := httpGet(t, "http://"+health+path); code != http.StatusOK || body != "ok" {
			t.Errorf("GET %s = %d %q, want 200 \"ok\"", path, code, body)
		}
		if code, _ := httpGet(t, "http://"+metrics+path); code != http.StatusNotFound {
			t.Errorf("GET %s on the metrics address = %d, want 404", path, code)
		}
	}
	if code, _ := httpGet(t, "http://"+health+"/metrics"); code != http.StatusNotFound {
		t.Errorf("GET /metrics on the probe address = %d, want 404", code)
	}

	code, body := httpGet(t, "http://"+metrics+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("GET /metrics = %d:\n%s", code, body)
	}
	for _, m := range []struct{ prefix, want string }{
		// The Reporter's own series, registered on the served registry.
		{`addon_heartbeat_heartbeats_sent_total{addon_instance="addon-instance",namespace="my-addon"}`, "0"},
		{`addon_heartbeat_is_leader{addon_instance="addon-instance",namespace="my-addon"}`, "0"},
		{"addon_heartbeat_last_success_timestamp_seconds", ""},
		// Which build runs.
		{`addon_heartbeat_build_info{component="reporter",goversion="` + runtime.Version() + `",platform="` + runtime.GOOS + "/" + runtime.GOARCH +
			`",revision="",version="` + version.Devel + `"}`, "1"},
		// Go and process metrics.
		{"go_goroutines", ""},
		{"go_memstats_heap_inuse_bytes", ""},
		{"process_resident_memory_bytes", ""},
		{"process_open_fds", ""},
	} {
		v, ok := sample(body, m.prefix)
		switch {
		case !ok:
			t.Errorf("/metrics has no %s", m.prefix)
		case m.want != "" && v != m.want:
			t.Errorf("%s = %s, want %s", m.prefix, v, m.want)
		}
	}

	if err := stop(); err != nil {
		t.Fatalf("Run: %v\n%s", err, rec)
	}
	// Both servers are shut down when Run returns.
	for _, addr := range []string{health, metrics} {
		if resp, err := noKeepAlive.Get("http://" + addr + "/readyz"); err == nil {
			resp.Body.Close()
			t.Errorf("%s still answers after Run returned", addr)
		}
	}
}

func TestRunFailsFastOnAnAddressInUse(t *testing.T) {
	for _, flag := range []string{"--health-probe-bind-address", "--metrics-bind-address"} {
		t.Run(flag, func(t *testing.T) {
			defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
			taken, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer taken.Close()
			addr := taken.Addr().String()
			cfg := testConfig("127.0.0.1:0", addr)
			if flag == "--health-probe-bind-address" {
				cfg = testConfig(addr, "127.0.0.1:0")
			}
			rec, log := newLogRecorder()
			done := make(chan error, 1)
			// The context never ends: only the failure may end Run.
			go func() { done <- Run(context.Background(), cfg, unreachableAPIServer(t), log) }()
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("Run did not fail within 10s with a used address")
			}
			if err == nil {
				t.Fatal("Run returned nil")
			}
			for _, want := range []string{addr, flag} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not name %s", err, want)
				}
			}
			if !errors.Is(err, syscall.EADDRINUSE) {
				t.Errorf("error %q does not wrap EADDRINUSE", err)
			}
			// Nothing started: no server, no Reporter.
			for _, msg := range []string{"starting", "serving health probes", "serving metrics"} {
				if _, ok := rec.find(msg); ok {
					t.Errorf("logged %q before failing:\n%s", msg, rec)
				}
			}
		})
	}
}

func TestRunZeroDisablesAServer(t *testing.T) {
	tests := map[string]struct {
		health, metrics string
		want            []string // what is served
	}{
		"no probes":          {health: "0", metrics: "127.0.0.1:0", want: []string{"metrics"}},
		"no metrics":         {health: "127.0.0.1:0", metrics: "0", want: []string{"health probes"}},
		"neither":            {health: "0", metrics: "0"},
		"probes and metrics": {health: "127.0.0.1:0", metrics: "127.0.0.1:0", want: []string{"health probes", "metrics"}},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
			before := listeningSockets(t)
			rec, log := newLogRecorder()
			stop := started(t, testConfig(tt.health, tt.metrics), unreachableAPIServer(t), log)
			// Listeners are bound before the reporter starts.
			await(t, 10*time.Second, "the reporter starting", func() bool {
				_, ok := rec.find("starting")
				return ok
			})
			opened := map[string]bool{}
			for port := range listeningSockets(t) {
				if !before[port] {
					opened[port] = true
				}
			}
			served := map[string]bool{}
			for _, what := range []string{"health probes", "metrics"} {
				if e, ok := rec.find("serving " + what); ok {
					served[what] = true
					addr, _ := e.kv["address"].(string)
					_, port, _ := net.SplitHostPort(addr)
					if !opened[port] {
						t.Errorf("%s logged as served on %s, but this process listens on no new port %s (new: %v)", what, addr, port, opened)
					}
				}
			}
			if len(opened) != len(tt.want) {
				t.Errorf("Run listens on %d new ports %v, want %d", len(opened), opened, len(tt.want))
			}
			for _, what := range tt.want {
				if !served[what] {
					t.Errorf("%s not served:\n%s", what, rec)
				}
			}
			if len(served) != len(tt.want) {
				t.Errorf("served %v, want only %v", served, tt.want)
			}
			if err := stop(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// listeningSockets returns the TCP ports this process listens on, from
// /proc: the sockets among its file descriptors in state LISTEN.
func listeningSockets(t *testing.T) map[string]bool {
	t.Helper()
	inodes := map[string]bool{}
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		link, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		if inode, ok := strings.CutPrefix(link, "socket:["); ok {
			inodes[strings.TrimSuffix(inode, "]")] = true
		}
	}
	ports := map[string]bool{}
	for _, table := range []string{"/proc/self/net/tcp", "/proc/self/net/tcp6"} {
		b, err := os.ReadFile(table)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
			f := strings.Fields(line)
			if len(f) < 10 || f[3] != "0A" || !inodes[f[9]] {
				continue
			}
			_, hexPort, _ := strings.Cut(f[1], ":")
			var port int
			if _, err := fmt.Sscanf(hexPort, "%X", &port); err != nil {
				t.Fatalf("%s: local address %q: %v", table, f[1], err)
			}
			ports[fmt.Sprint(port)] = true
		}
	}
	return ports
}

func TestMainFailsWithTheAddressInUse(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	addr := taken.Addr().String()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	writeKubeconfig(t, kubeconfig, unreachableAPIServer(t).Host)
	var stderr bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- Main(context.Background(), []string{"--kubeconfig=" + kubeconfig,
			"--health-probe-bind-address=" + addr, "--metrics-bind-address=127.0.0.1:0"}, env(injectedEnv), io.Discard, &stderr)
	}()
	var code int
	select {
	case code = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Main did not fail within 10s with a used address")
	}
	out := stderr.String()
	if !strings.Contains(out, `"msg":"addon-heartbeat reporter","logger":"setup","version":"`+version.Devel+`"`) {
		t.Errorf("no startup line with the version in %q", out)
	}
	if code != ExitRuntime || !strings.Contains(out, "reporter failed") || !strings.Contains(out, addr) ||
		!strings.Contains(out, "--health-probe-bind-address") || !strings.Contains(out, "address already in use") {
		t.Errorf("Main = %d, stderr %q; want %d and an error naming %s, the flag and the cause", code, out, ExitRuntime, addr)
	}
}

func writeKubeconfig(t *testing.T, path, server string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "`+server+`"}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
users: [{name: u, user: {token: t}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
}

// loadKubeconfigEnv, when set, makes the test binary run loadKubeconfig
// with its value as --kubeconfig, print the outcome as JSON and exit:
// client-go reads HOME once, when it is loaded, so each case runs in a
// process with an environment of its own.
const loadKubeconfigEnv = "REPORTER_TEST_LOAD_KUBECONFIG"

type loadOutcome struct {
	Host string
	QPS  float32
	Err  string
}

func TestMain(m *testing.M) {
	if path, ok := os.LookupEnv(loadKubeconfigEnv); ok {
		var out loadOutcome
		cfg, err := loadKubeconfig(path)
		if err != nil {
			out.Err = err.Error()
		} else {
			out.Host, out.QPS = cfg.Host, cfg.QPS
		}
		_ = json.NewEncoder(os.Stdout).Encode(out)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestLoadKubeconfig(t *testing.T) {
	dir := t.TempDir()
	explicit, fromEnv, home := filepath.Join(dir, "explicit"), filepath.Join(dir, "env"), filepath.Join(dir, "home")
	writeKubeconfig(t, explicit, "https://explicit.example:6443")
	writeKubeconfig(t, fromEnv, "https://env.example:6443")
	writeKubeconfig(t, filepath.Join(home, ".kube", "config"), "https://home.example:6443")
	empty := filepath.Join(dir, "empty-home")
	if err := os.Mkdir(empty, 0o700); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing")

	tests := map[string]struct {
		flag, kubeconfigEnv, home string
		inCluster                 bool // KUBERNETES_SERVICE_HOST and _PORT set, but no service account files
		want                      loadOutcome
		wantErr                   []string
	}{
		// The file given is used as it is: client-go's default rate limit.
		"--kubeconfig wins": {flag: explicit, kubeconfigEnv: fromEnv, home: home, want: loadOutcome{Host: "https://explicit.example:6443"}},
		// Otherwise no client-side rate limit, as controller-runtime did.
		"then KUBECONFIG":     {kubeconfigEnv: fromEnv, home: home, want: loadOutcome{Host: "https://env.example:6443", QPS: -1}},
		"then ~/.kube/config": {home: home, want: loadOutcome{Host: "https://home.example:6443", QPS: -1}},
		"~/.kube/config when the in-cluster config fails": {home: home, inCluster: true,
			want: loadOutcome{Host: "https://home.example:6443", QPS: -1}},
		"unreadable --kubeconfig": {flag: missing, home: home, wantErr: []string{"reading kubeconfig " + missing}},
		"nothing": {home: empty, wantErr: []string{"finding the API server (in-cluster, KUBECONFIG or --kubeconfig)",
			"unable to load in-cluster configuration", "no configuration has been provided"}},
		"KUBECONFIG names no file": {kubeconfigEnv: missing, home: home, wantErr: []string{"finding the API server"}},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0])
			cmd.Env = []string{loadKubeconfigEnv + "=" + tt.flag, "HOME=" + tt.home}
			if tt.kubeconfigEnv != "" {
				cmd.Env = append(cmd.Env, "KUBECONFIG="+tt.kubeconfigEnv)
			}
			if tt.inCluster {
				cmd.Env = append(cmd.Env, "KUBERNETES_SERVICE_HOST=10.0.0.1", "KUBERNETES_SERVICE_PORT=443")
			}
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Run(); err != nil {
				t.Fatalf("%v: %s", err, stderr.String())
			}
			var got loadOutcome
			if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
				t.Fatalf("output %q: %v", stdout.String(), err)
			}
			if tt.wantErr != nil {
				if got.Err == "" {
					t.Fatalf("no error; host %s", got.Host)
				}
				for _, want := range tt.wantErr {
					if !strings.Contains(got.Err, want) {
						t.Errorf("error %q does not contain %q", got.Err, want)
					}
				}
				return
			}
			if got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}
