package localcluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// ErrKilled says a process did not exit within its grace period after
// SIGTERM and was killed.
var ErrKilled = errors.New("killed after the grace period")

// Process is a binary of ours running as a local process, with its output
// going to a log file (and optionally a writer).
type Process struct {
	Name    string
	LogPath string
	cmd     *exec.Cmd
	done    chan struct{}
	mu      sync.Mutex
	err     error
}

// StartProcess starts bin with args and env (added to a minimal environment).
func StartProcess(name, logPath, bin string, args, env []string, tee io.Writer) (*Process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening the log of %s: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}, env...)
	var out io.Writer = logFile
	if tee != nil {
		out = io.MultiWriter(logFile, tee)
	}
	cmd.Stdout, cmd.Stderr = out, out
	// Own process group, so that a Ctrl-C in the terminal reaches only the
	// driver, which then stops each process in order. Should the driver die
	// without stopping them (killed, or a test binary timing out), the
	// kernel sends SIGTERM, so that no daemon outlives it. The kernel ties
	// that signal to the OS thread that started the process, and the Go
	// runtime only ends a thread when a goroutine locked to it exits: never
	// start a process from a goroutine that locks its thread and then exits.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &Process{Name: name, LogPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		logFile.Close()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(p.done)
	}()
	return p, nil
}

// Pid is the process ID.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has exited, and its error.
func (p *Process) Exited() (bool, error) {
	select {
	case <-p.done:
		p.mu.Lock()
		defer p.mu.Unlock()
		return true, p.err
	default:
		return false, nil
	}
}

// Signal sends sig to the process.
func (p *Process) Signal(sig syscall.Signal) error {
	if err := p.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("signalling %s: %w", p.Name, err)
	}
	return nil
}

// Stop sends SIGTERM and waits up to grace for the process to exit, then
// kills it. It returns the exit error of a process that did not stop cleanly
// on SIGTERM.
func (p *Process) Stop(grace time.Duration) error {
	if exited, _ := p.Exited(); exited {
		return nil
	}
	_ = p.Signal(syscall.SIGTERM)
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	select {
	case <-p.done:
		_, err := p.Exited()
		if killedBy(err, syscall.SIGTERM) {
			// Some daemons (etcd) end by the signal's default action.
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s exited with %w after SIGTERM", p.Name, err)
		}
		return nil
	case <-ctx.Done():
		_ = p.Signal(syscall.SIGKILL)
		<-p.done
		return fmt.Errorf("%s did not stop within %s of SIGTERM: %w", p.Name, grace, ErrKilled)
	}
}

func killedBy(err error, sig syscall.Signal) bool {
	exit, ok := errors.AsType[*exec.ExitError](err)
	if !ok {
		return false
	}
	ws, ok := exit.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == sig
}
