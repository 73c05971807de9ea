// Package slogjson is the reporter's logger: the standard library's log/slog
// JSON handler behind a logr.Logger, in the line layout of
// controller-runtime's zap logger (one JSON object a line: "level", "ts",
// "logger", "msg", the key/value pairs, "error", and "stacktrace" from the
// error level up), configured by two of its flags, --zap-log-level and
// --zap-stacktrace-level, with the same meanings. The webhook injects only
// --log-level; --zap-log-level stays because it is the one way to V(2) and
// beyond. zap's --zap-devel, --zap-encoder and --zap-time-encoding are not
// offered: nothing passes them, and the layout is part of the contract with
// log queries.
//
// It exists so that the injected sidecar links neither zap nor
// controller-runtime: the reporter logs a few lines an hour, and every
// package it links costs resident memory in every addon pod (see
// BENCHMARKS.md, "Reporter footprint"). The webhook keeps zap
// (internal/logging).
//
// Differences from controller-runtime's zap logger, none of which the
// reporter relies on: lines are not sampled (zap's production sampling drops
// a message repeated more than 100 times a second; the reporter logs a few
// lines per period at most).
package slogjson

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
)

// Levels in slog terms. logr's V(n) is slog.Level(-n) (logr.FromSlogHandler),
// as V(n) is zap's Level(-n), so "debug" enables V(1) in both. Errors are
// slog.LevelError; "panic" is above any level logr logs at.
const (
	LevelDebug = slog.Level(-1)
	LevelInfo  = slog.LevelInfo
	LevelError = slog.LevelError

	levelPanic = slog.LevelError + 4
)

// Options are the settings of the flags. The zero value is the production
// default of controller-runtime's zap logger: info, stack traces on errors
// (and RFC 3339 times, the only encoding offered).
type Options struct {
	// Level is the lowest level logged; nil means the default.
	Level *slog.Level
	// StacktraceLevel is the lowest level that gets a "stacktrace"; nil
	// means the default.
	StacktraceLevel *slog.Level
}

// BindFlags registers --zap-log-level and --zap-stacktrace-level on fs, with
// the values and error messages of controller-runtime's zap.Options.BindFlags.
func (o *Options) BindFlags(fs *flag.FlagSet) {
	fs.Func("zap-log-level", "Zap Level to configure the verbosity of logging. Can be one of 'debug', 'info', 'error', 'panic'"+
		" or any integer value > 0 which corresponds to custom debug levels of increasing verbosity", func(v string) error {
		l, err := ParseLevel(v)
		if err != nil {
			return err
		}
		o.Level = &l
		return nil
	})
	fs.Func("zap-stacktrace-level", "Zap Level at and above which stacktraces are captured (one of 'info', 'error', 'panic').", func(v string) error {
		l, ok := map[string]slog.Level{"info": LevelInfo, "error": LevelError, "panic": levelPanic}[strings.ToLower(v)]
		if !ok {
			return fmt.Errorf("invalid stacktrace level %q", v)
		}
		o.StacktraceLevel = &l
		return nil
	})
}

// ParseLevel reads a --zap-log-level value: debug, info, error, panic, or an
// integer n > 0 that enables logr's V(n).
func ParseLevel(v string) (slog.Level, error) {
	if l, ok := map[string]slog.Level{"debug": LevelDebug, "info": LevelInfo, "error": LevelError, "panic": levelPanic}[strings.ToLower(v)]; ok {
		return l, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 || n > 127 {
		return 0, fmt.Errorf("invalid log level %q", v)
	}
	return slog.Level(-n), nil
}

// New returns a logger that writes to w as o says.
func New(w io.Writer, o Options) logr.Logger {
	level, stackLevel := LevelInfo, LevelError
	if o.Level != nil {
		level = *o.Level
	}
	if o.StacktraceLevel != nil {
		stackLevel = *o.StacktraceLevel
	}
	h := slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level, ReplaceAttr: replaceAttr})
	return logr.FromSlogHandler(&stackHandler{Handler: h, level: stackLevel})
}

// replaceAttr gives the built-in attributes and logr's the names and values
// zap's production encoder uses (with controller-runtime's RFC 3339 times),
// so that log queries keep working.
func replaceAttr(groups []string, a slog.Attr) slog.Attr {
	if len(groups) > 0 {
		return a
	}
	switch a.Key {
	case slog.TimeKey:
		return slog.String("ts", a.Value.Time().Format(time.RFC3339))
	case slog.LevelKey:
		if l, ok := a.Value.Any().(slog.Level); ok {
			return slog.String(slog.LevelKey, levelName(l))
		}
	case "logger":
		// logr joins WithName with "/", zap with ".".
		return slog.String("logger", strings.ReplaceAll(a.Value.String(), "/", "."))
	case "err":
		// logr's key for the error of Error; zap's is "error". A
		// caller's own "err" value that is an error is renamed too.
		if _, ok := a.Value.Any().(error); ok {
			return slog.Attr{Key: "error", Value: a.Value}
		}
	}
	return a
}

// levelName is zap's lowercase name of the level: V(n) for n >= 2 is
// "Level(-n)", as zapr logs it.
func levelName(l slog.Level) string {
	switch {
	case l == LevelDebug:
		return "debug"
	case l == LevelInfo:
		return "info"
	case l == LevelError:
		return "error"
	case l < LevelInfo:
		return "Level(" + strconv.Itoa(int(l)) + ")"
	default:
		return strings.ToLower(l.String())
	}
}

// stackHandler adds zap's "stacktrace" to records at or above level: the
// stack from the caller of the logr method, one "function\n\tfile:line" per
// frame. It also drops records below the handler's level, which logr's slog
// sink hands over for Error without asking (zap drops errors below
// --zap-log-level=panic).
type stackHandler struct {
	slog.Handler
	level slog.Level
}

func (h *stackHandler) Handle(ctx context.Context, r slog.Record) error {
	if !h.Enabled(ctx, r.Level) {
		return nil
	}
	if r.Level >= h.level {
		r.AddAttrs(slog.String("stacktrace", stacktrace(r.PC)))
	}
	return h.Handler.Handle(ctx, r)
}

func (h *stackHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &stackHandler{Handler: h.Handler.WithAttrs(attrs), level: h.level}
}

func (h *stackHandler) WithGroup(name string) slog.Handler {
	return &stackHandler{Handler: h.Handler.WithGroup(name), level: h.level}
}

// stacktrace formats the current goroutine's stack from the frame of pc (the
// logging call site that logr recorded) outwards.
func stacktrace(pc uintptr) string {
	pcs := make([]uintptr, 64)
	pcs = pcs[:runtime.Callers(2, pcs)]
	if i := slices.Index(pcs, pc); i >= 0 {
		pcs = pcs[i:]
	}
	var b strings.Builder
	frames := runtime.CallersFrames(pcs)
	for {
		f, more := frames.Next()
		if f.Function == "runtime.goexit" { // as zap: not a caller
			break
		}
		if b.Len() > 0 {
			b.WriteByte('\n')
		}
		fmt.Fprintf(&b, "%s\n\t%s:%d", f.Function, f.File, f.Line)
		if !more {
			break
		}
	}
	return b.String()
}
