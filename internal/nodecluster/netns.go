package nodecluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"
)

// runNetns is where `ip netns add` keeps its namespaces.
const runNetns = "/run/netns"

// NetNS is a network namespace made for one cluster. Every daemon runs in it
// (started with nsenter --net, which keeps the host's mount namespace, so
// kubelet's and containerd's mounts see each other), and the host's own
// network namespace is never changed.
type NetNS struct {
	Name string
	Path string
	// runNetnsExisted and runNetnsMounted record /run/netns before the
	// namespace was added, so that Delete leaves it as it was.
	runNetnsExisted, runNetnsMounted bool
}

// createNetNS adds the namespace and, inside it, brings up lo and a bridge
// with the node's address and the kubernetes Service's ClusterIP (there is
// no kube-proxy: pods reach the API server because that address is local to
// the node).
func createNetNS(ctx context.Context, name string, n Network) (*NetNS, error) {
	ns := &NetNS{Name: name, Path: filepath.Join(runNetns, name)}
	_, err := os.Stat(runNetns)
	ns.runNetnsExisted = err == nil
	ns.runNetnsMounted = isMountPoint(runNetns)
	if err := run(ctx, "ip", "netns", "add", name); err != nil {
		return ns, err
	}
	steps := [][]string{
		{"link", "set", "lo", "up"},
		// A bridge without an address of its own takes the lowest MAC of
		// its ports, so it changes whenever a pod's veth with a lower one
		// joins: the pods' ARP entries for the node and the API server's
		// ClusterIP then point at a MAC that is gone, and their traffic to
		// the API server stops until the entries expire (the webhook pods
		// lost it for tens of seconds when the addon's pods started). An
		// address set explicitly stays. Locally administered, so it is no
		// real device's.
		{"link", "add", n.Bridge, "address", "02:00:00:a4:b0:01", "type", "bridge"},
		{"addr", "add", n.NodeIP + "/" + n.prefixLen(), "dev", n.Bridge},
		{"addr", "add", n.APIServiceIP + "/32", "dev", n.Bridge},
		{"link", "set", n.Bridge, "up"},
	}
	for _, s := range steps {
		if err := run(ctx, "ip", append([]string{"-n", name}, s...)...); err != nil {
			return ns, err
		}
	}
	return ns, nil
}

// Delete removes the namespace, and unmounts and removes /run/netns when
// this namespace made it and no other namespace is left in it.
func (ns *NetNS) Delete() error {
	var errs []error
	if _, err := os.Stat(ns.Path); err == nil {
		if err := run(context.Background(), "ip", "netns", "delete", ns.Name); err != nil {
			errs = append(errs, err)
		}
	}
	if entries, err := os.ReadDir(runNetns); err == nil && len(entries) == 0 {
		if !ns.runNetnsMounted && isMountPoint(runNetns) {
			if err := unix.Unmount(runNetns, unix.MNT_DETACH); err != nil {
				errs = append(errs, fmt.Errorf("unmounting %s: %w", runNetns, err))
			}
		}
		if !ns.runNetnsExisted {
			if err := os.Remove(runNetns); err != nil {
				errs = append(errs, fmt.Errorf("removing %s: %w", runNetns, err))
			}
		}
	}
	return errors.Join(errs...)
}

// Command returns a command that runs name with args inside the namespace.
func (ns *NetNS) Command(name string, args ...string) *exec.Cmd {
	return exec.Command("nsenter", append([]string{"--net=" + ns.Path, "--", name}, args...)...)
}

// Wrap returns the binary and arguments that run bin with args inside the
// namespace (nsenter execs bin, so the process ID is bin's).
func (ns *NetNS) Wrap(bin string, args []string) (string, []string) {
	return "nsenter", append([]string{"--net=" + ns.Path, "--", bin}, args...)
}

// DialContext connects from inside the namespace: the socket is made on an
// OS thread that enters the namespace for the call and returns to its own
// afterwards, so the thread is never left in the namespace and never
// discarded. (Discarding threads is not harmless: a child process started
// with Pdeathsig gets its signal when the thread that forked it ends.)
func (ns *NetNS) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	type result struct {
		conn net.Conn
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		conn, restored, err := ns.dialLocked(ctx, network, addr)
		if restored {
			runtime.UnlockOSThread()
		} // else the goroutine ends locked and the runtime discards the thread
		ch <- result{conn, err}
	}()
	select {
	case r := <-ch:
		return r.conn, r.err
	case <-ctx.Done():
		go func() {
			if r := <-ch; r.conn != nil {
				r.conn.Close()
			}
		}()
		return nil, ctx.Err()
	}
}

// dialLocked dials from the namespace on the current, locked thread and
// reports whether the thread is back in its own namespace.
func (ns *NetNS) dialLocked(ctx context.Context, network, addr string) (net.Conn, bool, error) {
	own, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, true, fmt.Errorf("opening this thread's network namespace: %w", err)
	}
	defer unix.Close(own)
	target, err := unix.Open(ns.Path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, true, fmt.Errorf("opening %s: %w", ns.Path, err)
	}
	defer unix.Close(target)
	if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
		return nil, true, fmt.Errorf("entering %s: %w", ns.Path, err)
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, network, addr)
	if serr := unix.Setns(own, unix.CLONE_NEWNET); serr != nil {
		if conn != nil {
			conn.Close()
		}
		return nil, false, fmt.Errorf("returning from %s: %w", ns.Path, serr)
	}
	return conn, true, err
}

func run(ctx context.Context, name string, args ...string) error {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// isMountPoint reports whether path is a mount point of this mount
// namespace.
func isMountPoint(path string) bool {
	for _, m := range mounts() {
		if m.point == path {
			return true
		}
	}
	return false
}
