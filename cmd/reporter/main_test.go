package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	addonsv1alpha1 "github.com/openshift/addon-operator/apis/addons/v1alpha1"
	coordinationv1 "k8s.io/api/coordination/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/addon-heartbeat/addon-heartbeat/internal/testenv"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/election"
)

var soak = flag.Duration("soak", 0, "keep the reporter process running this long at a 1s period and report its memory")

var (
	env    *testenv.Environment
	k8s    client.Client
	binary string
)

func TestMain(m *testing.M) {
	flag.Parse()
	ctrllog.SetLogger(logr.Discard())
	code, err := run(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	os.Exit(code)
}

func run(m *testing.M) (int, error) {
	dir, err := os.MkdirTemp("", "reporter-test-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	binary = filepath.Join(dir, "reporter")
	if out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput(); err != nil {
		return 0, fmt.Errorf("building the reporter: %w: %s", err, out)
	}
	env, err = testenv.Start(testenv.Options{})
	if err != nil {
		return 0, err
	}
	defer func() { _ = env.Stop() }()
	k8s, err = client.New(env.Config, client.Options{Scheme: testenv.Scheme()})
	if err != nil {
		return 0, err
	}
	return m.Run(), nil
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// lockedBuffer collects a process's stderr.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func TestBadConfigurationExitsWithCode2AndOneLine(t *testing.T) {
	tests := map[string]struct {
		args []string
		env  []string
		want string
	}{
		"no namespace": {env: []string{"POD_NAME=p"}, want: "reporter: environment variable ADDON_TARGET_NAMESPACE is not set"},
		"bad health URL": {args: []string{"--health-url=http://example.com:80/"}, env: []string{"ADDON_TARGET_NAMESPACE=ns"},
			want: `reporter: --health-url: invalid value "http://example.com:80/"`},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			cmd := exec.Command(binary, tt.args...)
			cmd.Env = tt.env
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != 2 {
				t.Fatalf("exit: %v, want code 2", err)
			}
			out := strings.TrimSpace(stderr.String())
			if !strings.HasPrefix(out, tt.want) || strings.Contains(out, "\n") {
				t.Errorf("stderr %q, want one line starting with %q", out, tt.want)
			}
		})
	}
}

// TestInjectedReporterProcess runs the binary exactly as the webhook injects
// it (command, args, downward-API env), as a user that has nothing but the
// reporter's Role, against a real API server.
func TestInjectedReporterProcess(t *testing.T) {
	ctx := t.Context()
	ns, err := testenv.CreateAddon(ctx, k8s, "addon-instance", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "reporter"}, Rules: heartbeat.PolicyRules("addon-instance")}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "reporter"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "reporter"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "reporter-" + ns}},
	}
	// The reporter role has no create: whoever binds it makes the election
	// Lease, empty, as the webhook does.
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: election.LeaseName("addon-instance")}}
	for _, o := range []client.Object{role, binding, lease} {
		if err := k8s.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	user, err := env.AddUser(envtest.User{Name: "reporter-" + ns}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig, err := user.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	kcFile := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kcFile, kubeconfig, 0o600); err != nil {
		t.Fatal(err)
	}

	health, metrics := freePort(t), freePort(t)
	cmd := exec.Command(binary,
		"--addon-instance=addon-instance", "--delete-ack=auto",
		"--health-probe-bind-address=:9781", "--metrics-bind-address=:9782",
		// A local process: loopback ports of its own (the last value wins).
		"--health-probe-bind-address=127.0.0.1:"+strconv.Itoa(health),
		"--metrics-bind-address=127.0.0.1:"+strconv.Itoa(metrics),
		"--kubeconfig="+kcFile)
	cmd.Env = []string{"ADDON_TARGET_NAMESPACE=" + ns, "POD_NAME=addon-7d9f-x2", "POD_NAMESPACE=" + ns}
	stderr := &lockedBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		if t.Failed() {
			t.Logf("reporter stderr:\n%s", stderr)
		}
	})

	// Ready at once, whatever the API server does.
	poll(t, 10*time.Second, "/readyz", func() bool { return get(health, "/readyz") == http.StatusOK })
	if code := get(health, "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz = %d", code)
	}
	var first time.Time
	poll(t, 15*time.Second, "heartbeats", func() bool {
		cur := &addonsv1alpha1.AddonInstance{}
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "addon-instance"}, cur); err != nil {
			return false
		}
		if first.IsZero() {
			first = cur.Status.LastHeartbeatTime.Time
		}
		return !first.IsZero() && cur.Status.LastHeartbeatTime.Time.Sub(first) >= 2*time.Second
	})
	poll(t, 10*time.Second, "metrics", func() bool { return scrape(t, metrics, "addon_heartbeat_heartbeats_sent_total") >= 3 })
	if v := scrape(t, metrics, "addon_heartbeat_is_leader"); v != 1 {
		t.Errorf("is_leader = %v", v)
	}
	// The Go runtime's and the process's own metrics are served too.
	for _, name := range []string{"go_goroutines", "go_memstats_heap_inuse_bytes", "process_resident_memory_bytes"} {
		if v := scrape(t, metrics, name); v <= 0 {
			t.Errorf("%s = %v, want > 0", name, v)
		}
	}
	if *soak > 0 {
		start := readMemory(t, cmd.Process.Pid)
		time.Sleep(*soak)
		end := readMemory(t, cmd.Process.Pid)
		t.Logf("reporter process memory after start: %s; after %s more at a 1s period: %s; heartbeats sent %v",
			start, *soak, end, scrape(t, metrics, "addon_heartbeat_heartbeats_sent_total"))
	} else {
		t.Logf("reporter process memory: %s", readMemory(t, cmd.Process.Pid))
	}

	// Logs are JSON, one object a line.
	for _, line := range strings.Split(strings.TrimSpace(stderr.String()), "\n") {
		var obj map[string]any
		if err := json.Unmarshal([]byte(line), &obj); err != nil {
			t.Errorf("log line is not JSON: %q", line)
		}
	}

	// SIGTERM: exit 0 promptly and release the Lease for a successor.
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no exit within 10s of SIGTERM")
	}
	lease = &coordinationv1.Lease{}
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: election.LeaseName("addon-instance")}, lease); err != nil {
		t.Fatal(err)
	}
	if holder := ptr.Deref(lease.Spec.HolderIdentity, ""); holder != "" {
		t.Errorf("Lease still held by %q after SIGTERM", holder)
	}
}

func poll(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		return cond(), nil
	})
	if err != nil {
		t.Fatalf("%s: not within %s", what, timeout)
	}
}

func get(port int, path string) int {
	resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(port) + path)
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode
}

// scrape sums the samples of one metric on the reporter's /metrics.
func scrape(t *testing.T, port int, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(port) + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sum := 0.0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		fields := strings.Fields(line)
		v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
		if err == nil {
			sum += v
		}
	}
	return sum
}

// readMemory reports the resident memory of a process (total, peak, anonymous, file-backed).
func readMemory(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return "unknown (" + err.Error() + ")"
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "VmRSS:") || strings.HasPrefix(line, "VmHWM:") || strings.HasPrefix(line, "RssAnon:") || strings.HasPrefix(line, "RssFile:") || strings.HasPrefix(line, "Threads:") {
			out = append(out, strings.Join(strings.Fields(line), " "))
		}
	}
	return strings.Join(out, ", ")
}
