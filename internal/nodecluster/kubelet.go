package nodecluster

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// kernelDefaults are the kernel settings the kubelet insists on: it either
// writes them (protectKernelDefaults false) or refuses to start when they
// differ (true). Neither is acceptable on a shared host, so the kubelet runs
// in a mount namespace of its own where these /proc/sys files are covered by
// files holding the values it expects; the host's settings stay as they are.
var kernelDefaults = map[string]string{
	"vm/overcommit_memory":      "1",
	"vm/panic_on_oom":           "0",
	"kernel/panic":              "10",
	"kernel/panic_on_oops":      "1",
	"kernel/keys/root_maxkeys":  "1000000",
	"kernel/keys/root_maxbytes": "25000000",
}

// kubeletMountNamespace prepares the kubelet's mount namespace and returns
// the script that sets it up and execs the kubelet (run with unshare
// --mount --propagation unchanged). The kubelet's root folder is made a
// shared mount first, so that the volumes the kubelet mounts in its
// namespace appear in the host's, where containerd and runc look for them.
func (c *Cluster) kubeletMountNamespace() (string, error) {
	root := c.path("kubelet", "root")
	if err := unix.Mount(root, root, "", unix.MS_BIND, ""); err != nil {
		return "", fmt.Errorf("bind-mounting %s: %w", root, err)
	}
	if err := unix.Mount("", root, "", unix.MS_SHARED, ""); err != nil {
		return "", fmt.Errorf("making %s a shared mount: %w", root, err)
	}
	dir := c.path("kubelet", "sysctl")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	var script strings.Builder
	script.WriteString("#!/bin/sh\n# The kubelet's mount namespace: see kernelDefaults.\nset -e\n")
	for key, value := range kernelDefaults {
		file := filepath.Join(dir, strings.ReplaceAll(key, "/", "."))
		if err := os.WriteFile(file, []byte(value+"\n"), 0o644); err != nil {
			return "", err
		}
		fmt.Fprintf(&script, "mount --bind %s /proc/sys/%s\n", file, key)
	}
	script.WriteString("exec \"$@\"\n")
	path := c.path("kubelet", "start.sh")
	return path, os.WriteFile(path, []byte(script.String()), 0o755)
}
