package nodecluster

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// HostState is what a cluster must leave as it found on the host: the host
// network namespace's links, addresses, routes, rules and firewall, the
// kernel settings the node components care about, the mounts, the network
// namespaces, the top-level cgroups and the files at FixedPaths.
type HostState map[string][]string

// Sysctls are the kernel settings compared before and after.
var Sysctls = []string{
	"net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding", "net/ipv4/conf/all/forwarding",
	"net/ipv4/conf/default/forwarding", "net/ipv4/conf/all/route_localnet",
	"net/bridge/bridge-nf-call-iptables", "net/bridge/bridge-nf-call-ip6tables",
	"net/ipv4/conf/all/rp_filter", "net/ipv4/ip_local_port_range",
	"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes", "fs/inotify/max_user_instances",
	"fs/inotify/max_user_watches", "net/core/somaxconn",
}

var counters = regexp.MustCompile(`\[\d+:\d+\]`)

// SnapshotHost records the host's state.
func SnapshotHost() (HostState, error) {
	s := HostState{}
	for key, cmd := range map[string][]string{
		"links":     {"ip", "-o", "link", "show"},
		"addresses": {"ip", "-o", "addr", "show"},
		"routes":    {"ip", "route", "show", "table", "all"},
		"routes6":   {"ip", "-6", "route", "show", "table", "all"},
		"rules":     {"ip", "rule", "show"},
		"netns":     {"ip", "netns", "list"},
		"iptables":  {"iptables-save"},
		"ip6tables": {"ip6tables-save"},
	} {
		if _, err := exec.LookPath(cmd[0]); err != nil {
			s[key] = []string{"(no " + cmd[0] + ")"}
			continue
		}
		out, err := exec.Command(cmd[0], cmd[1:]...).Output()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", strings.Join(cmd, " "), err)
		}
		var lines []string
		for _, l := range strings.Split(string(out), "\n") {
			if l = strings.TrimSpace(l); l == "" || strings.HasPrefix(l, "#") {
				continue
			}
			lines = append(lines, counters.ReplaceAllString(l, "[0:0]"))
		}
		s[key] = lines
	}
	for _, k := range Sysctls {
		v, err := os.ReadFile(filepath.Join("/proc/sys", k))
		val := strings.Join(strings.Fields(string(v)), " ")
		if err != nil {
			val = "(absent)"
		}
		s["sysctls"] = append(s["sysctls"], k+"="+val)
	}
	for _, m := range mounts() {
		s["mounts"] = append(s["mounts"], m.point+" "+m.fstype+" "+m.source)
	}
	for _, h := range cgroupMounts() {
		entries, _ := os.ReadDir(h)
		for _, e := range entries {
			if e.IsDir() {
				s["cgroups"] = append(s["cgroups"], filepath.Join(h, e.Name()))
			}
		}
	}
	for p := range fileTree() {
		s["files"] = append(s["files"], p)
	}
	for _, v := range s {
		slices.Sort(v)
	}
	return s, nil
}

// Diff lists what differs between two snapshots, as "+" (appeared) and "-"
// (vanished) lines per section.
func (s HostState) Diff(after HostState) []string {
	var keys []string
	for k := range s {
		keys = append(keys, k)
	}
	for k := range after {
		if _, ok := s[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	var diff []string
	for _, k := range keys {
		for _, l := range s[k] {
			if !slices.Contains(after[k], l) {
				diff = append(diff, k+": - "+l)
			}
		}
		for _, l := range after[k] {
			if !slices.Contains(s[k], l) {
				diff = append(diff, k+": + "+l)
			}
		}
	}
	return diff
}
