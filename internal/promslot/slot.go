// Package promslot holds what a process-wide Prometheus collector reads.
//
// A collector is registered once per process (the registry refuses a second
// one with the same descriptors), but a process may run the webhook more than
// once (tests do, one run after another or side by side): each run puts its
// own source into the collector's Slot and takes it out when it ends. The
// latest run still going is exported.
package promslot

import (
	"context"
	"slices"
	"sync"

	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// Slot holds the value of the latest Set not yet released; releasing it
// brings back the one set before, if still held.
type Slot[T any] struct {
	mu      sync.Mutex
	entries []entry[T]
	sets    int
}

type entry[T any] struct {
	id int
	v  T
}

// Set puts v into the slot until release is called.
func (s *Slot[T]) Set(v T) (release func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sets++
	id := s.sets
	s.entries = append(s.entries, entry[T]{id, v})
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.entries = slices.DeleteFunc(s.entries, func(e entry[T]) bool { return e.id == id })
	}
}

// Get returns the value, and whether there is one.
func (s *Slot[T]) Get() (T, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.entries) == 0 {
		var zero T
		return zero, false
	}
	return s.entries[len(s.entries)-1].v, true
}

// Holder returns a manager Runnable that keeps v in the slot while the
// manager runs, on every replica (it needs no leader election).
func (s *Slot[T]) Holder(v T) manager.Runnable { return holder[T]{s, v} }

type holder[T any] struct {
	slot *Slot[T]
	v    T
}

func (h holder[T]) Start(ctx context.Context) error {
	release := h.slot.Set(h.v)
	<-ctx.Done()
	release()
	return nil
}

func (holder[T]) NeedLeaderElection() bool { return false }
