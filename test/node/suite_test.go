//go:build node

package node

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/addon-heartbeat/addon-heartbeat/internal/images"
	"github.com/addon-heartbeat/addon-heartbeat/internal/nodecluster"
	"github.com/addon-heartbeat/addon-heartbeat/internal/testenv"
)

// Tags of the addon-heartbeat image: the install uses the first, the
// upgrade the second (the same binaries under a new tag).
const (
	tag         = "node-1"
	upgradedTag = "node-2"
)

var (
	cluster *nodecluster.Cluster
	helmBin string
	workDir string
	// suiteCtx ends before the test binary's -timeout, so that a run that
	// hangs still tears the cluster down; and on SIGINT or SIGTERM.
	suiteCtx context.Context
)

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(runSuite(m))
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s node-e2e: %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}

func runSuite(m *testing.M) (code int) {
	suiteStart := time.Now()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if f := flag.Lookup("test.timeout"); f != nil {
		if d, err := time.ParseDuration(f.Value.String()); err == nil && d > 0 {
			var cancelT context.CancelFunc
			ctx, cancelT = context.WithTimeout(ctx, d-2*time.Minute)
			defer cancelT()
		}
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	go func() {
		if s, ok := <-sigs; ok {
			logf("%s: stopping the tests and tearing the cluster down", s)
			cancel()
		}
	}()
	suiteCtx = ctx
	ctrllog.SetLogger(logr.Discard())

	if os.Geteuid() != 0 {
		logf("FAIL: the real-node test needs root (network namespace, containerd, kubelet)")
		return 1
	}
	for _, bin := range []string{"containerd", "runc", "ctr", "ip", "nsenter", "/usr/lib/cni/bridge", "/usr/lib/cni/host-local"} {
		if _, err := exec.LookPath(bin); err != nil {
			logf("FAIL: %s is missing: run `make e2e-node` (hack/node-binaries.sh installs containerd, runc and the CNI plugins)", bin)
			return 1
		}
	}
	var err error
	if helmBin, err = findHelm(); err != nil {
		logf("FAIL: %v", err)
		return 1
	}
	assets, err := testenv.AssetsDir()
	if err != nil {
		logf("FAIL: %v", err)
		return 1
	}
	if _, err := os.Stat(filepath.Join(assets, "kubelet")); err != nil {
		logf("FAIL: no kubelet in %s: run `make e2e-node`", assets)
		return 1
	}

	before, err := nodecluster.SnapshotHost()
	if err != nil {
		logf("FAIL: recording the host's state: %v", err)
		return 1
	}
	if workDir, err = os.MkdirTemp("", "ahb-node-e2e-"); err != nil {
		logf("FAIL: %v", err)
		return 1
	}
	defer func() {
		// Teardown and the host check run on every way out.
		if cluster != nil {
			if err := cluster.Stop(context.Background()); err != nil {
				logf("FAIL: teardown: %v", err)
				code = 1
			}
		}
		if err := os.RemoveAll(workDir); err != nil {
			logf("FAIL: removing %s: %v", workDir, err)
			code = 1
		}
		if c := checkHost(before); c != 0 {
			code = c
		}
		logf("total: %s", time.Since(suiteStart).Round(time.Second))
	}()

	start := time.Now()
	built, err := images.Project(testenv.RepoRoot(), filepath.Join(workDir, "images"), tag, os.Stderr, upgradedTag)
	if err != nil {
		logf("FAIL: building the images: %v", err)
		return 1
	}
	var tarballs []string
	for _, b := range built {
		tarballs = append(tarballs, b.Path)
	}
	logf("cost: images built in %s", time.Since(start).Round(time.Millisecond))

	start = time.Now()
	cluster, err = nodecluster.Start(ctx, nodecluster.Options{
		AssetsDir: assets, Images: tarballs, PauseImage: images.Pause + ":" + tag, Log: os.Stderr,
		AuditPolicy: auditPolicy,
	})
	if err != nil {
		cluster = nil // Start cleaned up after itself.
		logf("FAIL: starting the cluster: %v", err)
		return 1
	}
	logf("cost: cluster up (node Ready, images imported) in %s", time.Since(start).Round(time.Millisecond))
	return m.Run()
}

// checkHost compares the host with the state recorded before the cluster
// started, and looks for anything of the run that is left.
func checkHost(before nodecluster.HostState) int {
	code := 0
	after, err := nodecluster.SnapshotHost()
	if err != nil {
		logf("FAIL: recording the host's state after teardown: %v", err)
		return 1
	}
	if diff := before.Diff(after); len(diff) > 0 {
		logf("FAIL: the host changed:\n  %s", strings.Join(diff, "\n  "))
		code = 1
	}
	var left []string
	if cluster != nil {
		if _, err := os.Stat(cluster.Dir); err == nil {
			left = append(left, "state folder "+cluster.Dir)
		}
		for _, pid := range nodecluster.ProcessesNaming(cluster.Dir) {
			left = append(left, fmt.Sprintf("process %d", pid))
		}
	}
	if len(left) > 0 {
		logf("FAIL: left behind: %s", strings.Join(left, ", "))
		code = 1
	}
	if code == 0 {
		logf("host unchanged after teardown: %d links, %d addresses, %d routes, %d iptables lines, %d sysctls, %d mounts, %d cgroups, %d files at fixed paths compared",
			len(after["links"]), len(after["addresses"]), len(after["routes"])+len(after["routes6"]),
			len(after["iptables"])+len(after["ip6tables"]), len(after["sysctls"]), len(after["mounts"]),
			len(after["cgroups"]), len(after["files"]))
	}
	return code
}

// findHelm is HELM, or the CLI hack/node-binaries.sh builds.
func findHelm() (string, error) {
	if h := os.Getenv("HELM"); h != "" {
		return h, nil
	}
	out, err := exec.Command(filepath.Join(testenv.RepoRoot(), "hack", "node-binaries.sh")).Output()
	if err != nil {
		return "", fmt.Errorf("hack/node-binaries.sh: %w", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	h := filepath.Join(lines[len(lines)-1], "helm")
	if _, err := os.Stat(h); err != nil {
		return "", fmt.Errorf("no helm CLI: %w", err)
	}
	return h, nil
}
