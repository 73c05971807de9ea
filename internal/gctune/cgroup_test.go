package gctune

import (
	"os"
	"path/filepath"
	"testing"
	"testing/fstest"
)

// Mount lines as a node's /proc/self/mountinfo has them.
const (
	mountV2        = "30 22 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n"
	mountV1Memory  = "34 30 0:31 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:14 - cgroup cgroup rw,memory\n"
	mountV1CPU     = "31 30 0:28 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup rw,cpu,cpuacct\n"
	mountV1Unified = "40 30 0:37 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:5 - cgroup2 cgroup2 rw,nsdelegate\n"
	mountTmpfs     = "29 22 0:25 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:3 - tmpfs tmpfs ro,mode=755\n"
	mountRoot      = "22 1 253:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw\n"
	containerV2    = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice/cri-containerd-abc.scope"
	podV2          = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice"
	containerV1    = "/kubepods/burstable/pod1/abc"
	mib            = 1 << 20
	v1NoLimit      = "9223372036854771712\n"
	limit256Mi     = "268435456\n" // 256 MiB
)

func file(s string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(s)} }

// at is the path of a cgroup file in the fs.FS, rooted at "/".
func at(mount, cgroup, name string) string {
	return filepath.ToSlash(filepath.Join(mount, cgroup, name))[1:]
}

func TestCgroupLimit(t *testing.T) {
	tests := map[string]struct {
		files fstest.MapFS
		want  int64
	}{
		"v2, cgroup namespace: the container's cgroup is the mount's root": {files: fstest.MapFS{
			"proc/self/cgroup":           file("0::/\n"),
			"proc/self/mountinfo":        file(mountRoot + mountV2),
			"sys/fs/cgroup/memory.max":   file(limit256Mi),
			"sys/fs/cgroup/cgroup.procs": file("1\n"),
		}, want: 256 * mib},
		// The case the fixed root path missed: the whole hierarchy is
		// visible and the root cgroup has no memory.max at all.
		"v2, no cgroup namespace: nested container cgroup": {files: fstest.MapFS{
			"proc/self/cgroup":                              file("0::" + containerV2 + "\n"),
			"proc/self/mountinfo":                           file(mountRoot + mountV2),
			at("/sys/fs/cgroup", containerV2, "memory.max"): file(limit256Mi),
			at("/sys/fs/cgroup", podV2, "memory.max"):       file("536870912\n"),
		}, want: 256 * mib},
		"v2: a container without a limit is bounded by its pod's": {files: fstest.MapFS{
			"proc/self/cgroup":                              file("0::" + containerV2 + "\n"),
			"proc/self/mountinfo":                           file(mountRoot + mountV2),
			at("/sys/fs/cgroup", containerV2, "memory.max"): file("max\n"),
			at("/sys/fs/cgroup", podV2, "memory.max"):       file("536870912\n"),
			"sys/fs/cgroup/kubepods.slice/memory.max":       file("max\n"),
		}, want: 512 * mib},
		"v2, the container's cgroup bind-mounted (the mount shows it as root)": {files: fstest.MapFS{
			"proc/self/cgroup":         file("0::" + containerV2 + "\n"),
			"proc/self/mountinfo":      file(mountRoot + "30 22 0:26 " + containerV2 + " /sys/fs/cgroup rw,relatime - cgroup2 cgroup2 rw\n"),
			"sys/fs/cgroup/memory.max": file(limit256Mi),
		}, want: 256 * mib},
		"v2, no limit anywhere": {files: fstest.MapFS{
			"proc/self/cgroup":                              file("0::" + containerV2 + "\n"),
			"proc/self/mountinfo":                           file(mountRoot + mountV2),
			at("/sys/fs/cgroup", containerV2, "memory.max"): file("max\n"),
		}, want: 0},
		"v1: nested memory cgroup": {files: fstest.MapFS{
			"proc/self/cgroup":                           file("12:pids:" + containerV1 + "\n4:memory:" + containerV1 + "\n3:cpu,cpuacct:" + containerV1 + "\n0::/\n"),
			"proc/self/mountinfo":                        file(mountRoot + mountTmpfs + mountV1CPU + mountV1Memory + mountV1Unified),
			"sys/fs/cgroup/memory/memory.limit_in_bytes": file(v1NoLimit),
			at("/sys/fs/cgroup/memory", containerV1, "memory.limit_in_bytes"): file(limit256Mi),
		}, want: 256 * mib},
		"v1, hybrid host: the memory controller's hierarchy, not the unified one": {files: fstest.MapFS{
			"proc/self/cgroup":    file("4:memory:" + containerV1 + "\n0::" + containerV1 + "\n"),
			"proc/self/mountinfo": file(mountRoot + mountTmpfs + mountV1Unified + mountV1Memory),
			at("/sys/fs/cgroup/memory", containerV1, "memory.limit_in_bytes"): file("134217728\n"),
			at("/sys/fs/cgroup/unified", containerV1, "memory.max"):           file(limit256Mi),
		}, want: 128 * mib},
		"v1, unlimited": {files: fstest.MapFS{
			"proc/self/cgroup":    file("4:memory:" + containerV1 + "\n"),
			"proc/self/mountinfo": file(mountRoot + mountTmpfs + mountV1Memory),
			at("/sys/fs/cgroup/memory", containerV1, "memory.limit_in_bytes"): file(v1NoLimit),
		}, want: 0},
		"mount point with an escaped space": {files: fstest.MapFS{
			"proc/self/cgroup":            file("0::/\n"),
			"proc/self/mountinfo":         file(mountRoot + `30 22 0:26 / /sys/fs/my\040cgroup rw - cgroup2 cgroup2 rw` + "\n"),
			"sys/fs/my cgroup/memory.max": file(limit256Mi),
		}, want: 256 * mib},
		"no /proc: the root of the usual mounts": {files: fstest.MapFS{
			"sys/fs/cgroup/memory.max": file(limit256Mi),
		}, want: 256 * mib},
		"no /proc, v1": {files: fstest.MapFS{
			"sys/fs/cgroup/memory/memory.limit_in_bytes": file("134217728\n"),
		}, want: 128 * mib},
		"no cgroup mount": {files: fstest.MapFS{
			"proc/self/cgroup":    file("0::/\n"),
			"proc/self/mountinfo": file(mountRoot),
		}, want: 0},
		"unreadable limit": {files: fstest.MapFS{
			"proc/self/cgroup":         file("0::/\n"),
			"proc/self/mountinfo":      file(mountRoot + mountV2),
			"sys/fs/cgroup/memory.max": file("lots\n"),
		}, want: 0},
		"nothing at all": {files: fstest.MapFS{}, want: 0},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			if got := CgroupLimit(tt.files); got != tt.want {
				t.Errorf("CgroupLimit = %d, want %d", got, tt.want)
			}
		})
	}
}

// The same files in a folder on disk, read through os.DirFS as Apply reads
// the root.
func TestCgroupLimitOnDisk(t *testing.T) {
	root := t.TempDir()
	for name, content := range map[string]string{
		"proc/self/cgroup":                              "0::" + containerV2 + "\n",
		"proc/self/mountinfo":                           mountRoot + mountV2,
		at("/sys/fs/cgroup", containerV2, "memory.max"): "max\n",
		at("/sys/fs/cgroup", podV2, "memory.max"):       limit256Mi,
	} {
		p := filepath.Join(root, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if got := CgroupLimit(os.DirFS(root)); got != 256*mib {
		t.Errorf("CgroupLimit = %d, want the pod's 256 MiB", got)
	}
}
