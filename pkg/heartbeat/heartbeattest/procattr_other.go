//go:build !linux

package heartbeattest

import "syscall"

// serverAttr puts a server in its own process group, so that a terminal's
// Ctrl-C meant for the test does not reach it first and Stop ends it in
// order. (Only Linux has a signal on the parent's death: elsewhere a test
// process that ends without Stop leaves its servers running.)
func serverAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
