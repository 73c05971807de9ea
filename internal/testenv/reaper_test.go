package testenv

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

func TestParseStat(t *testing.T) {
	tests := []struct {
		line      string
		pid, ppid int
		comm      string
		ok        bool
	}{
		{line: "4242 (kube-apiserver) S 17 4242 17 0 -1", pid: 4242, comm: "kube-apiserver", ppid: 17, ok: true},
		{line: "7 (a (b) c) R 1 7 7 0", pid: 7, comm: "a (b) c", ppid: 1, ok: true},
		{line: "7 (etcd S 1", ok: false},
		{line: "x (etcd) S 1", ok: false},
		{line: "7 (etcd)", ok: false},
	}
	for _, tt := range tests {
		pid, comm, ppid, ok := parseStat([]byte(tt.line))
		if ok != tt.ok || ok && (pid != tt.pid || comm != tt.comm || ppid != tt.ppid) {
			t.Errorf("parseStat(%q) = %d, %q, %d, %v; want %d, %q, %d, %v",
				tt.line, pid, comm, ppid, ok, tt.pid, tt.comm, tt.ppid, tt.ok)
		}
	}
}

func TestFrameworkDirs(t *testing.T) {
	args := []string{
		"--data-dir=/tmp/k8s_test_framework_1",
		"--cert-dir=/tmp/k8s_test_framework_2",
		"--client-ca-file=/tmp/k8s_test_framework_2/ca.crt",
		"/tmp/k8s_test_framework_3/x",
		"--token-auth-file=/tmp/other/tokens.csv",
		"--etc=/var/k8s_test_framework_4",
		"--up=/tmp/../k8s_test_framework_5",
		"--advertise-address=127.0.0.1",
	}
	got := frameworkDirs(args, "/tmp")
	want := []string{"/tmp/k8s_test_framework_1", "/tmp/k8s_test_framework_2", "/tmp/k8s_test_framework_3"}
	if !slices.Equal(got, want) {
		t.Errorf("frameworkDirs = %v, want %v", got, want)
	}
}

// childEnv marks the test binary run by
// TestServersEndWithTheProcessThatStartedThem.
const childEnv = "ADDON_HEARTBEAT_TESTENV_CHILD"

// A test binary that dies without stopping its environment (a timeout, a
// SIGKILL) takes kube-apiserver and etcd with it.
func TestServersEndWithTheProcessThatStartedThem(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		// The child: start, name the servers, die at once.
		if _, err := Start(Options{}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		pids, err := childrenNamed(serverNames...)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		for _, pid := range pids {
			fmt.Println("server", pid)
			for _, dir := range serverDirs(pid) {
				fmt.Println("dir", dir)
			}
		}
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
	if _, err := AssetsDir(); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestServersEndWithTheProcessThatStartedThem$")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if ws, isExit := cmd.ProcessState.Sys().(syscall.WaitStatus); !isExit || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("the child did not die of SIGKILL: %v\n%s%s", err, out, stderr.String())
	}
	var pids []int
	var dirs []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "server "); ok {
			pid, err := strconv.Atoi(v)
			if err != nil {
				t.Fatal(err)
			}
			pids = append(pids, pid)
		}
		if v, ok := strings.CutPrefix(sc.Text(), "dir "); ok {
			dirs = append(dirs, v)
		}
	}
	if len(pids) != 2 || len(dirs) != 2 {
		t.Fatalf("the child named %d servers and %d folders, want kube-apiserver's and etcd's:\n%s", len(pids), len(dirs), out)
	}
	// Whatever outlives the test is stopped here, not left running.
	t.Cleanup(func() {
		for _, pid := range pids {
			_ = syscall.Kill(-pid, syscall.SIGKILL)
		}
		for _, dir := range dirs {
			_ = os.RemoveAll(dir)
		}
	})
	err = wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		for _, pid := range pids {
			if running(pid) {
				return false, nil
			}
		}
		for _, dir := range dirs {
			if _, err := os.Stat(dir); err == nil {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("the servers %v, or their folders %v, outlived the process that started them", pids, dirs)
	}
}

// running reports whether pid is a live process (not gone, not a zombie).
func running(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(data, ')')
	fields := bytes.Fields(data[i+1:])
	return len(fields) > 0 && string(fields[0]) != "Z" && string(fields[0]) != "X"
}
