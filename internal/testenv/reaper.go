package testenv

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// reaper ends the servers envtest started should this process end without
// stopping them: a test binary that times out panics past every deferred
// Stop, and one killed never runs them, and kube-apiserver and etcd (each
// in a process group of its own) would run on, orphaned, holding memory and
// ports, their folders left in the temporary folder. envtest offers no
// parent-death signal, so a watchdog shell waits on a pipe whose only writer
// is this process: the kernel closes it when this process ends, however it
// ends, and the watchdog then kills the servers' groups (SIGKILL: their data
// is thrown away, and kube-apiserver, its etcd gone, does not end on SIGTERM
// for a long time) and removes their folders. A watchdog rather than a
// parent-death signal also holds when the OS thread that forked a server is
// gone, which ends such a signal's parent early.
type reaper struct {
	cmd  *exec.Cmd
	pipe *os.File
}

// reapOnExit watches the process groups led by pids, and the folders dirs:
// when this process ends, the groups are killed and the folders removed.
// Stop it once they are stopped.
func reapOnExit(pids []int, dirs []string) (*reaper, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("watching %v: %w", pids, err)
	}
	// dash's kill wants -s and -- before a negative process ID (a group).
	script := `read -r _; kill -s KILL -- $groups 2>/dev/null; sleep 1; rm -rf -- "$@"`
	var groups []string
	for _, pid := range pids {
		groups = append(groups, "-"+strconv.Itoa(pid))
	}
	args := append([]string{"-c", script, "reaper"}, dirs...)
	cmd := exec.Command("/bin/sh", args...)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "groups=" + strings.Join(groups, " ")}
	cmd.Stdin = r
	// Its own group: a terminal's Ctrl-C reaches the test, which then
	// stops everything in order, not the watchdog first.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		return nil, fmt.Errorf("starting the watchdog of %v: %w", pids, err)
	}
	r.Close() // the watchdog's now: this process keeps the writer only
	rp := &reaper{cmd: cmd, pipe: w}
	watching.Store(rp, struct{}{})
	return rp, nil
}

// watching holds every running reaper: a pipe left to the garbage collector
// would be closed by its finalizer, and the watchdog would end the servers
// while they are in use.
var watching sync.Map

// Stop ends the watchdog without its signal (the servers are then stopped
// in order, by their owner).
func (r *reaper) Stop() {
	if r == nil {
		return
	}
	_ = r.cmd.Process.Kill()
	_ = r.cmd.Wait()
	r.pipe.Close()
	watching.Delete(r)
}

// serverDirs lists the folders envtest made for the server pid (its
// data or certificate folder), from its command line: those directly in the
// temporary folder whose names envtest gives them.
func serverDirs(pid int) []string {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return nil
	}
	return frameworkDirs(strings.Split(string(data), "\x00"), os.TempDir())
}

// frameworkDirs picks from args (flags with paths) the folders directly in
// tmp named as envtest names its own.
func frameworkDirs(args []string, tmp string) []string {
	var dirs []string
	for _, a := range args {
		_, path, ok := strings.Cut(a, "=")
		if !ok {
			path = a
		}
		rel, err := filepath.Rel(tmp, path)
		if err != nil || !filepath.IsLocal(rel) {
			continue
		}
		top, _, _ := strings.Cut(rel, string(filepath.Separator))
		if strings.HasPrefix(top, "k8s_test_framework_") {
			if d := filepath.Join(tmp, top); !slices.Contains(dirs, d) {
				dirs = append(dirs, d)
			}
		}
	}
	return dirs
}

// childrenNamed lists this process's children whose command name is one of
// names, from /proc.
func childrenNamed(names ...string) ([]int, error) {
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		return nil, err
	}
	self := os.Getpid()
	var pids []int
	for _, path := range stats {
		data, err := os.ReadFile(path)
		if err != nil {
			continue // it exited meanwhile
		}
		pid, comm, ppid, ok := parseStat(data)
		if ok && ppid == self && slices.Contains(names, comm) {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// parseStat reads the process ID, command name and parent's process ID from
// a /proc/<pid>/stat line: "pid (comm) state ppid ...", where comm, in
// parentheses, may itself hold spaces and parentheses.
func parseStat(line []byte) (pid int, comm string, ppid int, ok bool) {
	open, closing := bytes.IndexByte(line, '('), bytes.LastIndexByte(line, ')')
	if open < 0 || closing < open {
		return 0, "", 0, false
	}
	pid, err := strconv.Atoi(string(bytes.TrimSpace(line[:open])))
	if err != nil {
		return 0, "", 0, false
	}
	rest := bytes.Fields(line[closing+1:])
	if len(rest) < 2 {
		return 0, "", 0, false
	}
	ppid, err = strconv.Atoi(string(rest[1]))
	if err != nil {
		return 0, "", 0, false
	}
	return pid, string(line[open+1 : closing]), ppid, true
}
