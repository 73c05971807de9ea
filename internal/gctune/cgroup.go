package gctune

import (
	"bufio"
	"io/fs"
	"path"
	"strconv"
	"strings"
)

// CgroupLimit is the memory limit of the cgroup this process is in, in bytes
// (0: none found), read from fsys, the root filesystem (os.DirFS("/")).
//
// The cgroup is found as containerd and automemlimit find it, not at a fixed
// path: /proc/self/cgroup names the process's cgroup in each hierarchy (the
// v1 memory controller's, else cgroup v2's), /proc/self/mountinfo says where
// that hierarchy is mounted and which of its cgroups the mount shows (a
// container without a cgroup namespace sees the node's whole hierarchy, with
// its own cgroup nested deep in it, such as
// /kubepods.slice/.../cri-containerd-<id>.scope). The limit is the lowest on
// the way from that cgroup up to the mount: a container's own "max" under a
// pod's limit is bounded by the pod's. When /proc cannot be read, the root
// of the usual mount points is read instead (cgroup v2, then v1).
func CgroupLimit(fsys fs.FS) int64 {
	dir, file, ok := memoryCgroup(fsys)
	if !ok {
		for _, f := range []string{"sys/fs/cgroup/memory.max", "sys/fs/cgroup/memory/memory.limit_in_bytes"} {
			if limit, ok := readLimit(fsys, f); ok {
				return limit
			}
		}
		return 0
	}
	var lowest int64
	for ; ; dir.rel = path.Dir(dir.rel) {
		if limit, ok := readLimit(fsys, path.Join(dir.mount, dir.rel, file)); ok && limit > 0 && (lowest == 0 || limit < lowest) {
			lowest = limit
		}
		if dir.rel == "." {
			return lowest
		}
	}
}

// cgroupDir is a cgroup's folder: the hierarchy's mount point and the path
// below it, both relative to the root of the filesystem.
type cgroupDir struct{ mount, rel string }

// memoryCgroup finds the folder of the process's memory cgroup and the name
// of its limit file: the v1 memory controller's when one is mounted (a hybrid
// host puts the memory controller there, not in the unified hierarchy), else
// cgroup v2's. ok is false when /proc/self/cgroup or /proc/self/mountinfo
// cannot be read or name no such cgroup.
func memoryCgroup(fsys fs.FS) (dir cgroupDir, file string, ok bool) {
	cgroupFile, err := fs.ReadFile(fsys, "proc/self/cgroup")
	if err != nil {
		return cgroupDir{}, "", false
	}
	mountinfo, err := fs.ReadFile(fsys, "proc/self/mountinfo")
	if err != nil {
		return cgroupDir{}, "", false
	}
	var v1, v2 string
	var hasV1, hasV2 bool
	for _, line := range strings.Split(string(cgroupFile), "\n") {
		// hierarchy-ID:controller-list:cgroup-path
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			v2, hasV2 = parts[2], true
		case hasMemory(parts[1]):
			v1, hasV1 = parts[2], true
		}
	}
	mounts := parseMountinfo(string(mountinfo))
	if hasV1 {
		for _, m := range mounts {
			if m.fstype == "cgroup" && hasMemory(m.superOptions) {
				if rel, ok := below(v1, m.root); ok {
					return cgroupDir{mount: m.point, rel: rel}, "memory.limit_in_bytes", true
				}
			}
		}
	}
	if hasV2 {
		for _, m := range mounts {
			if m.fstype == "cgroup2" {
				if rel, ok := below(v2, m.root); ok {
					return cgroupDir{mount: m.point, rel: rel}, "memory.max", true
				}
			}
		}
	}
	return cgroupDir{}, "", false
}

// hasMemory reports whether a comma-separated list of controllers (or of
// mount options) names the memory controller.
func hasMemory(list string) bool {
	for _, c := range strings.Split(list, ",") {
		if c == "memory" {
			return true
		}
	}
	return false
}

// below is cgroup's path under a mount that shows root, relative ("." for
// root itself); ok is false when cgroup is not inside root (the mount shows
// another part of the hierarchy).
func below(cgroup, root string) (rel string, ok bool) {
	cgroup, root = path.Clean("/"+cgroup), path.Clean("/"+root)
	if cgroup == root {
		return ".", true
	}
	if root == "/" {
		return strings.TrimPrefix(cgroup, "/"), true
	}
	if rest, found := strings.CutPrefix(cgroup, root+"/"); found {
		return rest, true
	}
	return "", false
}

type mount struct{ root, point, fstype, superOptions string }

// parseMountinfo reads the mounts of /proc/self/mountinfo (proc(5)):
// "id parent major:minor root point options [optional...] - fstype source
// super-options". Paths are relative to the filesystem's root, unescaped.
func parseMountinfo(content string) []mount {
	var out []mount
	sc := bufio.NewScanner(strings.NewReader(content))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		sep := -1
		for i := 6; i < len(fields); i++ {
			if fields[i] == "-" {
				sep = i
				break
			}
		}
		if len(fields) < 5 || sep < 0 || sep+3 >= len(fields) {
			continue
		}
		out = append(out, mount{
			root:         unescape(fields[3]),
			point:        strings.TrimPrefix(path.Clean(unescape(fields[4])), "/"),
			fstype:       fields[sep+1],
			superOptions: fields[sep+3],
		})
	}
	return out
}

// unescape undoes mountinfo's octal escapes of space, tab, newline and
// backslash ("\040").
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// readLimit reads one limit file; ok is false when it is missing or holds
// no number (a limit of 0 means none).
func readLimit(fsys fs.FS, name string) (int64, bool) {
	b, err := fs.ReadFile(fsys, name)
	if err != nil {
		return 0, false
	}
	limit, err := ParseLimit(string(b))
	if err != nil {
		return 0, false
	}
	return limit, true
}
