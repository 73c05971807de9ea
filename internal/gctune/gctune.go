// Package gctune fits the Go runtime to the two binaries' opposite loads.
//
// The reporter sidecar (ApplySidecar) makes a few requests a period and idles
// in between: one P and a tighter heap goal keep its memory small.
//
// The webhook (Apply) allocates briskly inside a container's memory limit: about
// 56 KB to decode and answer each 8 KB AdmissionReview, so with Go's default
// GOGC=100 and its small live heap it collects tens of times a second under
// load, a fifth of its CPU. With a memory limit in place the collector can
// run less often (GOGC=400) and still never outgrow the container: the limit,
// less a tenth of headroom for what is not heap, becomes the runtime's soft
// memory limit (GOMEMLIMIT), at which it collects regardless of GOGC.
//
// GOGC and GOMEMLIMIT set in the environment always win; without any memory
// limit the defaults stay as they are, since nothing would then bound a
// heap allowed to grow to five times the live one.
//
// Why not KimMachineGun/automemlimit, which finds the container's limit the
// same way (CgroupLimit follows it and containerd): it would add only 52 KiB
// and two modules to the webhook (v1.0.2: 34,136,226 -> 34,189,474 bytes
// stripped, measured), but it sets only GOMEMLIMIT, while the larger half of
// this tuning is the GOGC that a limit makes safe and the sidecar's settings,
// and its resolver reads the live /proc only (the function taking paths is
// unexported), so the layouts CgroupLimit is tested on here (nested cgroup
// v2, v1, hybrid hosts) could not be.
package gctune

import (
	"fmt"
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
)

// GCPercent is the GOGC applied when a memory limit bounds the heap.
const GCPercent = 400

// SidecarGCPercent is the reporter's GOGC: its live heap is 1 to 2 MiB and
// grows by some 30 KiB a heartbeat, so Go's default (a 4 MiB minimum goal)
// lets it double before a collection; 50 halves that headroom, for a few more
// collections a minute of well under a millisecond each.
const SidecarGCPercent = 50

// ApplySidecar sizes the runtime of the reporter sidecar; GOMAXPROCS or GOGC
// in the environment (lookupEnv) win.
func ApplySidecar(lookupEnv func(string) (string, bool)) {
	if _, set := lookupEnv("GOMAXPROCS"); !set {
		// The injected container has no CPU limit, so Go's default is the
		// node's CPU count: a P per CPU, each with its own cache of heap
		// spans, and idle Ps that spin or run GC mark workers whenever the
		// reporter wakes. One P serves a few requests a second; it kept
		// about 0.9 MiB less heap on a 2-CPU VM, more on larger nodes.
		runtime.GOMAXPROCS(1)
	}
	if _, set := lookupEnv("GOGC"); !set {
		debug.SetGCPercent(SidecarGCPercent)
	}
}

// Settings is what Apply decided.
type Settings struct {
	// MemoryLimit is the soft memory limit in bytes; 0 when none is set
	// here (from GOMEMLIMIT, or no limit at all).
	MemoryLimit int64
	// GCPercent is the GOGC set here; 0 when left alone.
	GCPercent int
	// Source says where the memory limit came from: "GOMEMLIMIT",
	// "cgroup" or "none".
	Source string
}

// Apply reads the environment and the cgroup memory limit (CgroupLimit) and
// sets the collector accordingly. Unreadable cgroup files count as no limit.
func Apply() Settings {
	s := Decide(os.Getenv, CgroupLimit(os.DirFS("/")))
	if s.MemoryLimit > 0 {
		debug.SetMemoryLimit(s.MemoryLimit)
	}
	if s.GCPercent > 0 {
		debug.SetGCPercent(s.GCPercent)
	}
	return s
}

// Decide is Apply's choice for the environment getenv and the container's
// memory limit in bytes (0: none).
func Decide(getenv func(string) string, limit int64) Settings {
	s := Settings{Source: "none"}
	switch v := getenv("GOMEMLIMIT"); {
	case v == "off":
		// Asked for no limit: nothing bounds the heap, so GOGC stays.
		return Settings{Source: "GOMEMLIMIT"}
	case v != "":
		s.Source = "GOMEMLIMIT" // the runtime read it at start
	case limit > 0:
		s.Source = "cgroup"
		s.MemoryLimit = SoftLimit(limit)
	default:
		return s
	}
	if getenv("GOGC") == "" {
		s.GCPercent = GCPercent
	}
	return s
}

// SoftLimit is the soft memory limit for a container memory limit of limit
// bytes: a tenth is left for stacks, the runtime and the binary, which the
// collector does not count.
func SoftLimit(limit int64) int64 { return limit - limit/10 }

// ParseLimit reads a cgroup memory limit file's content: "max" (v2) and
// v1's page-rounded maximum mean no limit (0).
func ParseLimit(content string) (int64, error) {
	v := strings.TrimSpace(content)
	if v == "max" {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("cgroup memory limit %q: %w", v, err)
	}
	// cgroup v1 reports no limit as the largest page-aligned int64.
	if n <= 0 || n >= math.MaxInt64/2 {
		return 0, nil
	}
	return n, nil
}
