package heartbeattest

import "syscall"

// serverAttr puts a server in its own process group, so that a terminal's
// Ctrl-C meant for the test does not reach it first and Stop ends it in
// order, and kills it when the test process ends without Stop (a binary
// that times out panics past every deferred Stop; one killed runs none):
// no server outlives its test. The kernel ties that signal to the OS thread
// that started the server, which the Go runtime ends only when a goroutine
// locked to it exits: Start is not to be called from such a goroutine.
func serverAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
