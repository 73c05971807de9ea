// Package logging builds the webhook's JSON logger: zap's production encoder
// behind a logr.Logger (go-logr/zapr), so that every line is one JSON object
// with key/value pairs. The injected reporter logs the same way through the
// standard library instead (package slogjson), to link less.
package logging

import (
	"fmt"

	"github.com/go-logr/logr"
	"github.com/go-logr/zapr"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Levels accepted by New.
const (
	LevelDebug = "debug"
	LevelInfo  = "info"
	LevelError = "error"
)

// New returns a JSON logger at level (debug, info or error). Debug enables
// logr V(1) lines.
func New(level string) (logr.Logger, error) {
	var zl zapcore.Level
	switch level {
	case LevelDebug:
		zl = zapcore.DebugLevel
	case LevelInfo, "":
		zl = zapcore.InfoLevel
	case LevelError:
		zl = zapcore.ErrorLevel
	default:
		return logr.Discard(), fmt.Errorf("log level %q: expected debug, info or error", level)
	}
	cfg := zap.NewProductionConfig()
	cfg.Level = zap.NewAtomicLevelAt(zl)
	cfg.EncoderConfig.TimeKey = "ts"
	cfg.EncoderConfig.EncodeTime = zapcore.RFC3339NanoTimeEncoder
	// Sampling would drop repeated lines such as per-review logs; keep all.
	cfg.Sampling = nil
	z, err := cfg.Build()
	if err != nil {
		return logr.Discard(), fmt.Errorf("building the logger: %w", err)
	}
	return zapr.NewLogger(z), nil
}
