package nodecluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/addon-heartbeat/addon-heartbeat/internal/localcluster"
)

// systemNamespaces are kept by DeleteWorkloads.
var systemNamespaces = []string{"default", "kube-system", "kube-public", "kube-node-lease"}

// DeleteWorkloads deletes every namespace but the system ones and every pod
// left, and waits until the kubelet has stopped them all, so that it stops
// their sandboxes properly (CNI results, shim sockets and netns mounts are
// released).
func (c *Cluster) DeleteWorkloads(ctx context.Context) error {
	if c.Client == nil {
		return nil
	}
	var nss corev1.NamespaceList
	if err := c.Client.List(ctx, &nss); err != nil {
		return fmt.Errorf("listing namespaces: %w", err)
	}
	for _, ns := range nss.Items {
		if !slices.Contains(systemNamespaces, ns.Name) {
			if err := c.Client.Delete(ctx, &ns); client.IgnoreNotFound(err) != nil {
				return fmt.Errorf("deleting namespace %s: %w", ns.Name, err)
			}
		}
	}
	var errs []error
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		var pods corev1.PodList
		if err := c.Client.List(ctx, &pods); err != nil {
			return false, nil
		}
		for _, p := range pods.Items {
			if p.DeletionTimestamp == nil {
				_ = c.Client.Delete(ctx, &p, &client.DeleteOptions{GracePeriodSeconds: new(int64(5))})
			}
		}
		return len(pods.Items) == 0, nil
	})
	if err != nil {
		errs = append(errs, fmt.Errorf("waiting for the pods to go: %w", err))
	}
	// The kubelet stops sandboxes of deleted pods shortly after.
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		out, err := c.CtrOutput(ctx, "tasks", "ls", "-q")
		return err == nil && strings.TrimSpace(out) == "", nil
	})
	if err != nil {
		errs = append(errs, fmt.Errorf("waiting for the kubelet to stop every sandbox: %w", err))
	}
	return errors.Join(errs...)
}

// Stop deletes the workloads while the cluster is up, stops the kubelet,
// the control plane and containerd (each by its process ID), kills whatever
// is still running in the cluster's cgroups or holds its containerd
// address, unmounts everything under the state folder, deletes the cgroups
// and the network namespace, removes the files it created at fixed paths and
// the folder. It does all of it even when a step fails.
func (c *Cluster) Stop(ctx context.Context) error {
	var errs []error
	start := time.Now()
	if c.kubelet != nil && c.apiserver != nil {
		if exited, _ := c.kubelet.Exited(); !exited {
			if err := c.DeleteWorkloads(ctx); err != nil {
				errs = append(errs, err)
			}
		}
	}
	stop := func(p *localcluster.Process, grace time.Duration) {
		if p == nil {
			return
		}
		// An exit status after SIGTERM is not a leftover; the checks for
		// processes, mounts and files below are what matter.
		if err := p.Stop(grace); err != nil {
			c.logf("%v", err)
		}
	}
	for _, p := range c.extra {
		stop(p, 5*time.Second)
	}
	stop(c.kubelet, 15*time.Second)
	stop(c.scheduler, 5*time.Second)
	stop(c.controllers, 5*time.Second)
	stop(c.apiserver, 5*time.Second)
	stop(c.etcd, 10*time.Second)
	// Whatever sandboxes are left (a kubelet that never came up, a run cut
	// short): kill and delete their tasks while containerd is up.
	if c.containerd != nil {
		if exited, _ := c.containerd.Exited(); !exited {
			c.removeTasks(ctx)
		}
	}
	stop(c.containerd, 10*time.Second)
	if err := c.killLeftovers(); err != nil {
		errs = append(errs, err)
	}
	if c.Dir != "" {
		if err := unmountUnder(c.Dir); err != nil {
			errs = append(errs, err)
		}
	}
	if c.cgroupRoot != "" {
		if err := removeCgroups(c.cgroupRoot); err != nil {
			errs = append(errs, err)
		}
	}
	if c.NetNS != nil {
		if err := c.NetNS.Delete(); err != nil {
			errs = append(errs, err)
		}
	}
	if c.files != nil {
		if err := removeNewFiles(c.files, c.Dir); err != nil {
			errs = append(errs, err)
		}
	}
	if c.Dir != "" {
		if err := os.RemoveAll(c.Dir); err != nil {
			errs = append(errs, fmt.Errorf("removing %s: %w", c.Dir, err))
		}
	}
	c.logf("teardown: %s", time.Since(start).Round(time.Millisecond))
	return errors.Join(errs...)
}

// removeTasks kills and deletes every task and container in containerd's
// k8s.io namespace.
func (c *Cluster) removeTasks(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, _ := c.CtrOutput(ctx, "tasks", "ls", "-q")
	for _, id := range strings.Fields(out) {
		_ = c.Ctr(ctx, "tasks", "kill", "-s", "SIGKILL", id)
	}
	for _, id := range strings.Fields(out) {
		_ = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 5*time.Second, true, func(ctx context.Context) (bool, error) {
			return c.Ctr(ctx, "tasks", "delete", "-f", id) == nil, nil
		})
	}
	out, _ = c.CtrOutput(ctx, "containers", "ls", "-q")
	for _, id := range strings.Fields(out) {
		_ = c.Ctr(ctx, "containers", "delete", id)
	}
}

// killLeftovers kills, by process ID, every process in the cluster's
// cgroups and every process whose command line names the state folder (the
// containerd shims, which outlive containerd by design), and waits for them
// to go.
func (c *Cluster) killLeftovers() error {
	var pids []int
	if c.cgroupRoot != "" {
		pids = append(pids, cgroupProcs(c.cgroupRoot)...)
	}
	if c.Dir != "" {
		pids = append(pids, ProcessesNaming(c.Dir)...)
	}
	slices.Sort(pids)
	pids = slices.Compact(pids)
	self := os.Getpid()
	for _, pid := range pids {
		if pid != self {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, pid := range pids {
		for pid != self && processExists(pid) && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if pid != self && processExists(pid) {
			return fmt.Errorf("process %d did not exit after SIGKILL", pid)
		}
	}
	return nil
}

func processExists(pid int) bool {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// A zombie waits for its parent (ours reap theirs); it holds nothing.
	fields := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	return len(fields) > 0 && fields[0] != "Z"
}

// ProcessesNaming lists the processes whose command line contains s.
func ProcessesNaming(s string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && strings.Contains(string(cmdline), s) && processExists(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

type mount struct{ point, fstype, source string }

// mounts lists this mount namespace's mounts (mount point, type, source).
func mounts() []mount {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var ms []mount
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		sep := slices.Index(fields, "-")
		if len(fields) < 5 || sep < 0 || sep+2 >= len(fields) {
			continue
		}
		ms = append(ms, mount{point: unescape(fields[4]), fstype: fields[sep+1], source: fields[sep+2]})
	}
	return ms
}

func unescape(s string) string {
	r := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`)
	return r.Replace(s)
}

// unmountUnder unmounts every mount at or below dir, deepest first.
func unmountUnder(dir string) error {
	var errs []error
	for range 5 {
		var points []string
		for _, m := range mounts() {
			if m.point == dir || strings.HasPrefix(m.point, dir+"/") {
				points = append(points, m.point)
			}
		}
		if len(points) == 0 {
			return nil
		}
		slices.SortFunc(points, func(a, b string) int { return len(b) - len(a) })
		errs = nil
		for _, p := range points {
			if err := syscall.Unmount(p, 0); err != nil {
				if err := syscall.Unmount(p, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
					errs = append(errs, fmt.Errorf("unmounting %s: %w", p, err))
				}
			}
		}
	}
	return errors.Join(errs...)
}

// cgroupMounts are the cgroup v1 hierarchies (or the one v2 hierarchy).
func cgroupMounts() []string {
	var points []string
	for _, m := range mounts() {
		if (m.fstype == "cgroup" || m.fstype == "cgroup2") && strings.HasPrefix(m.point, "/sys/fs/cgroup") {
			points = append(points, m.point)
		}
	}
	return points
}

// createCgroups makes the kubelet's cgroup root in every hierarchy (the
// kubelet requires it to exist), with the cpuset of its parent.
func createCgroups(root string) error {
	for _, h := range cgroupMounts() {
		dir := filepath.Join(h, root)
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("creating cgroup %s: %w", dir, err)
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			if v, err := os.ReadFile(filepath.Join(h, f)); err == nil {
				if err := os.WriteFile(filepath.Join(dir, f), v, 0o644); err != nil {
					return fmt.Errorf("setting %s of %s: %w", f, dir, err)
				}
			}
		}
	}
	return nil
}

// cgroupProcs lists the processes in the cgroup tree root.
func cgroupProcs(root string) []int {
	var pids []int
	for _, h := range cgroupMounts() {
		_ = filepath.WalkDir(filepath.Join(h, root), func(p string, d fs.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return nil
			}
			data, _ := os.ReadFile(filepath.Join(p, "cgroup.procs"))
			for _, f := range strings.Fields(string(data)) {
				if pid, err := strconv.Atoi(f); err == nil {
					pids = append(pids, pid)
				}
			}
			return nil
		})
	}
	return pids
}

// removeCgroups removes the cgroup tree root in every hierarchy, deepest
// first. A cgroup whose last process just exited can be busy for a moment.
func removeCgroups(root string) error {
	var errs []error
	for _, h := range cgroupMounts() {
		var dirs []string
		_ = filepath.WalkDir(filepath.Join(h, root), func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		slices.SortFunc(dirs, func(a, b string) int { return len(b) - len(a) })
		for _, d := range dirs {
			err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
				err := os.Remove(d)
				return err == nil || errors.Is(err, fs.ErrNotExist), nil
			})
			if err != nil {
				errs = append(errs, fmt.Errorf("removing cgroup %s: %w", d, err))
			}
		}
	}
	return errors.Join(errs...)
}

// FixedPaths are the places outside the state folder that containerd 1.6,
// the CNI plugins and the kubelet write to whatever they are told.
var FixedPaths = []string{
	"/run/containerd", "/var/lib/containerd", "/opt/containerd", "/etc/containerd/certs.d",
	"/var/lib/cni", "/etc/cni", "/opt/cni", "/run/cni",
	"/var/log/containers", "/var/log/pods", "/var/lib/kubelet", "/etc/kubernetes",
}

// fileTree lists every file and folder at or below FixedPaths.
func fileTree() map[string]bool {
	files := map[string]bool{}
	for _, root := range FixedPaths {
		_ = filepath.WalkDir(root, func(p string, _ fs.DirEntry, err error) error {
			if err == nil {
				files[p] = true
			}
			return nil
		})
	}
	return files
}

// removeNewFiles removes what is below FixedPaths now and was not in before,
// deepest first.
func removeNewFiles(before map[string]bool, _ string) error {
	var added []string
	for p := range fileTree() {
		if !before[p] {
			added = append(added, p)
		}
	}
	slices.SortFunc(added, func(a, b string) int { return len(b) - len(a) })
	var errs []error
	for _, p := range added {
		if err := os.RemoveAll(p); err != nil {
			errs = append(errs, fmt.Errorf("removing %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}
