package slogjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
)

// logged runs f on a logger configured by args and returns the JSON objects
// it wrote, one per line.
func logged(t *testing.T, args []string, f func(logr.Logger)) []map[string]any {
	t.Helper()
	var o Options
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	o.BindFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	f(New(&buf, o))
	var lines []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		if line == "" {
			continue
		}
		var obj map[string]any
		if err := json.Unmarshal([]byte(line), &obj); err != nil {
			t.Fatalf("line is not one JSON object: %q", line)
		}
		lines = append(lines, obj)
	}
	return lines
}

func TestLayoutIsZapProduction(t *testing.T) {
	lines := logged(t, nil, func(l logr.Logger) {
		l = l.WithName("heartbeat").WithName("election").WithValues("addonInstance", "ns/name")
		l.Info("leading", "period", "1s")
		l.Error(errors.New("conflict"), "write failed", "attempt", 2)
	})
	if len(lines) != 2 {
		t.Fatalf("got %d lines, want 2: %v", len(lines), lines)
	}
	info, failed := lines[0], lines[1]
	for k, want := range map[string]any{"level": "info", "logger": "heartbeat.election", "msg": "leading",
		"addonInstance": "ns/name", "period": "1s"} {
		if info[k] != want {
			t.Errorf("info line %q = %v, want %v (line %v)", k, info[k], want, info)
		}
	}
	if _, err := time.Parse(time.RFC3339, info["ts"].(string)); err != nil {
		t.Errorf("ts: %v", err)
	}
	if _, ok := info["stacktrace"]; ok {
		t.Errorf("info line has a stack trace: %v", info)
	}
	for k, want := range map[string]any{"level": "error", "msg": "write failed", "error": "conflict", "attempt": 2.0} {
		if failed[k] != want {
			t.Errorf("error line %q = %v, want %v (line %v)", k, failed[k], want, failed)
		}
	}
	// The trace starts at the caller of Error, as zap's does.
	if st, _ := failed["stacktrace"].(string); !strings.HasPrefix(st, "github.com/addon-heartbeat/addon-heartbeat/internal/logging/slogjson.TestLayoutIsZapProduction") {
		t.Errorf("stacktrace = %q", st)
	}
}

func TestFlags(t *testing.T) {
	logAll := func(l logr.Logger) {
		l.V(2).Info("v2")
		l.V(1).Info("v1")
		l.Info("v0")
		l.Error(nil, "e")
	}
	tests := map[string]struct {
		args       []string
		wantLevels []string
		wantStack  []bool
	}{
		"default":              {wantLevels: []string{"info", "error"}, wantStack: []bool{false, true}},
		"debug":                {args: []string{"--zap-log-level=debug"}, wantLevels: []string{"debug", "info", "error"}, wantStack: []bool{false, false, true}},
		"integer":              {args: []string{"--zap-log-level=2"}, wantLevels: []string{"Level(-2)", "debug", "info", "error"}, wantStack: []bool{false, false, false, true}},
		"error":                {args: []string{"--zap-log-level=ERROR"}, wantLevels: []string{"error"}, wantStack: []bool{true}},
		"panic":                {args: []string{"--zap-log-level=panic"}},
		"stack traces on info": {args: []string{"--zap-stacktrace-level=info"}, wantLevels: []string{"info", "error"}, wantStack: []bool{true, true}},
		"no stack traces":      {args: []string{"--zap-stacktrace-level=panic"}, wantLevels: []string{"info", "error"}, wantStack: []bool{false, false}},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			lines := logged(t, tt.args, logAll)
			var levels []string
			var stacks []bool
			for _, l := range lines {
				levels = append(levels, l["level"].(string))
				_, st := l["stacktrace"]
				stacks = append(stacks, st)
			}
			if strings.Join(levels, ",") != strings.Join(tt.wantLevels, ",") {
				t.Errorf("levels %v, want %v", levels, tt.wantLevels)
			}
			for i := range min(len(stacks), len(tt.wantStack)) {
				if stacks[i] != tt.wantStack[i] {
					t.Errorf("line %d (%s): stack trace %v, want %v", i, levels[i], stacks[i], tt.wantStack[i])
				}
			}
		})
	}
}

// Bad values, and zap's flags that are not offered (nothing passes them),
// are refused with the flag named.
func TestBadFlagValuesNameTheFlag(t *testing.T) {
	for _, arg := range []string{"--zap-log-level=loud", "--zap-log-level=0", "--zap-stacktrace-level=debug",
		"--zap-devel", "--zap-encoder=json", "--zap-time-encoding=rfc3339"} {
		var o Options
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		o.BindFlags(fs)
		flagName, _, _ := strings.Cut(strings.TrimPrefix(arg, "--"), "=")
		if err := fs.Parse([]string{arg}); err == nil || !strings.Contains(err.Error(), flagName) {
			t.Errorf("%s: error %v does not name the flag", arg, err)
		}
	}
}
