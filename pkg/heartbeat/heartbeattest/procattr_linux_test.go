//go:build linux && go1.25

package heartbeattest

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// childEnv marks the test binary run by
// TestServersEndWithTheTestProcess.
const childEnv = "HEARTBEATTEST_CHILD"

// A test process that ends without Stop (a timeout, a SIGKILL) takes
// kube-apiserver and etcd with it.
func TestServersEndWithTheTestProcess(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		env, err := Start(Options{})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		fmt.Println("server", env.apiserver.cmd.Process.Pid)
		fmt.Println("server", env.etcd.cmd.Process.Pid)
		fmt.Println("dir", env.Dir)
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Fatal("set KUBEBUILDER_ASSETS")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestServersEndWithTheTestProcess$")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if ws, isWait := cmd.ProcessState.Sys().(syscall.WaitStatus); !isWait || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("the child did not die of SIGKILL: %v\n%s%s", err, out, stderr.String())
	}
	var pids []int
	var dir string
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
			dir = v
		}
	}
	if len(pids) != 2 || dir == "" {
		t.Fatalf("the child named %d servers and folder %q, want kube-apiserver, etcd and their folder:\n%s", len(pids), dir, out)
	}
	// The folder is the test's to remove (the servers' signal cannot);
	// whatever outlives the test is stopped here, not left running.
	t.Cleanup(func() {
		for _, pid := range pids {
			_ = syscall.Kill(-pid, syscall.SIGKILL)
		}
		_ = os.RemoveAll(dir)
	})
	err = wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return !running(pids[0]) && !running(pids[1]), nil
	})
	if err != nil {
		t.Fatalf("the servers %v still run after the process that started them died", pids)
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
