package gctune

import (
	"runtime"
	"runtime/debug"
	"testing"
)

func TestDecide(t *testing.T) {
	const mib = 1 << 20
	tests := map[string]struct {
		env   map[string]string
		limit int64
		want  Settings
	}{
		"container limit: 90% of it, GOGC 400": {limit: 256 * mib,
			want: Settings{MemoryLimit: 256*mib - 256*mib/10, GCPercent: GCPercent, Source: "cgroup"}},
		"no limit: defaults left alone": {want: Settings{Source: "none"}},
		"GOMEMLIMIT set: the runtime's, GOGC 400": {env: map[string]string{"GOMEMLIMIT": "200MiB"}, limit: 256 * mib,
			want: Settings{GCPercent: GCPercent, Source: "GOMEMLIMIT"}},
		"GOMEMLIMIT=off: no limit, GOGC left alone": {env: map[string]string{"GOMEMLIMIT": "off"}, limit: 100 * mib,
			want: Settings{Source: "GOMEMLIMIT"}},
		"GOGC set: kept": {env: map[string]string{"GOGC": "100"}, limit: 100 * mib,
			want: Settings{MemoryLimit: 90 * mib, Source: "cgroup"}},
		"GOGC set without a limit": {env: map[string]string{"GOGC": "50"}, want: Settings{Source: "none"}},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			if got := Decide(func(k string) string { return tt.env[k] }, tt.limit); got != tt.want {
				t.Errorf("Decide = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestParseLimit(t *testing.T) {
	tests := map[string]struct {
		content string
		want    int64
		err     bool
	}{
		"v2 bytes":     {content: "268435456\n", want: 268435456},
		"v2 max":       {content: "max\n", want: 0},
		"v1 unlimited": {content: "9223372036854771712\n", want: 0},
		"garbage":      {content: "lots", err: true},
		"empty":        {content: "", err: true},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := ParseLimit(tt.content)
			if (err != nil) != tt.err || got != tt.want {
				t.Errorf("ParseLimit(%q) = %d, %v; want %d, error %v", tt.content, got, err, tt.want, tt.err)
			}
		})
	}
}

func TestApplySidecar(t *testing.T) {
	procs, gogc := runtime.GOMAXPROCS(0), debug.SetGCPercent(100)
	t.Cleanup(func() {
		runtime.GOMAXPROCS(procs)
		debug.SetGCPercent(gogc)
	})
	unset := func(string) (string, bool) { return "", false }
	set := func(string) (string, bool) { return "x", true }

	runtime.GOMAXPROCS(2)
	ApplySidecar(unset)
	if got, gc := runtime.GOMAXPROCS(0), debug.SetGCPercent(100); got != 1 || gc != SidecarGCPercent {
		t.Errorf("unset environment: GOMAXPROCS %d, GOGC %d; want 1 and %d", got, gc, SidecarGCPercent)
	}
	runtime.GOMAXPROCS(2)
	ApplySidecar(set)
	if got, gc := runtime.GOMAXPROCS(0), debug.SetGCPercent(100); got != 2 || gc != 100 {
		t.Errorf("both set in the environment: GOMAXPROCS %d, GOGC %d; want them left at 2 and 100", got, gc)
	}
}
