package heartbeat

import (
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"
)

// DefaultErrorLogInterval is how often the same error is logged while it
// persists (for example a missing RBAC grant that every retry runs into).
const DefaultErrorLogInterval = time.Minute

// errorLimiter lets each distinct error through at most once per interval
// and counts what it held back, so that a persistent failure is logged
// clearly once a minute instead of on every retry.
//
// Why not a logging library's sampler, such as zap's (controller-runtime's
// production logger: per message, the first 100 a second, then every
// 100th): the SDK logs through whatever logr.Logger the addon passes, whose
// sink may not sample at all; and a sampler counted per second never holds
// back a failure retried seconds apart: at the default 10 s period a
// forbidden write is retried every 10 s once its backoff is spent, 360 lines
// an hour per error, against 60 here, each with the number held back.
// Its table would also cost the sidecar memory: 448 KiB for zap's
// (BENCHMARKS.md, section 2).
type errorLimiter struct {
	clock    clock.PassiveClock
	interval time.Duration

	mu   sync.Mutex
	seen map[string]*limitEntry
}

type limitEntry struct {
	last       time.Time
	suppressed int
}

func newErrorLimiter(c clock.PassiveClock, interval time.Duration) *errorLimiter {
	return &errorLimiter{clock: c, interval: interval, seen: map[string]*limitEntry{}}
}

// allow reports whether an error with this key may be logged now, and how
// many were held back since it last was.
func (l *errorLimiter) allow(key string) (bool, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clock.Now()
	for k, e := range l.seen { // forget errors that stopped happening
		if now.Sub(e.last) > 2*l.interval {
			delete(l.seen, k)
		}
	}
	e, ok := l.seen[key]
	if !ok {
		l.seen[key] = &limitEntry{last: now}
		return true, 0
	}
	if now.Sub(e.last) < l.interval {
		e.suppressed++
		return false, 0
	}
	n := e.suppressed
	e.last, e.suppressed = now, 0
	return true, n
}

// logError logs err once per interval per distinct (message, error) pair.
func (l *errorLimiter) logError(log logr.Logger, err error, msg string, kv ...any) {
	ok, n := l.allow(msg + "\x00" + err.Error())
	if !ok {
		return
	}
	if n > 0 {
		kv = append(kv, "repeatedSinceLastLog", n)
	}
	log.Error(err, msg, kv...)
}

// limitedSink passes Info through and rate-limits Error through an
// errorLimiter. It carries the logger of client-go's reflectors, which log
// every failed list and watch.
type limitedSink struct {
	logr.LogSink
	limiter *errorLimiter
}

func rateLimited(log logr.Logger, l *errorLimiter) logr.Logger {
	if log.GetSink() == nil {
		return log
	}
	sink := log.GetSink()
	if cd, ok := sink.(logr.CallDepthLogSink); ok {
		sink = cd.WithCallDepth(1) // the frame of limitedSink itself
	}
	return logr.New(&limitedSink{LogSink: sink, limiter: l})
}

// Init is a no-op: the wrapped sink was initialised by its own logger.
func (s *limitedSink) Init(logr.RuntimeInfo) {}

func (s *limitedSink) Error(err error, msg string, kv ...any) {
	key := msg
	if err != nil {
		key += "\x00" + err.Error()
	}
	ok, n := s.limiter.allow(key)
	if !ok {
		return
	}
	if n > 0 {
		kv = append(kv, "repeatedSinceLastLog", n)
	}
	s.LogSink.Error(err, msg, kv...)
}

func (s *limitedSink) WithValues(kv ...any) logr.LogSink {
	return &limitedSink{LogSink: s.LogSink.WithValues(kv...), limiter: s.limiter}
}

func (s *limitedSink) WithName(name string) logr.LogSink {
	return &limitedSink{LogSink: s.LogSink.WithName(name), limiter: s.limiter}
}

// WithCallDepth keeps caller information right when the wrapped sink reports it.
func (s *limitedSink) WithCallDepth(depth int) logr.LogSink {
	if cd, ok := s.LogSink.(logr.CallDepthLogSink); ok {
		return &limitedSink{LogSink: cd.WithCallDepth(depth), limiter: s.limiter}
	}
	return s
}
