package promslot

import (
	"context"
	"testing"
)

func TestSlot(t *testing.T) {
	var s Slot[string]
	if _, ok := s.Get(); ok {
		t.Fatal("a new slot holds a value")
	}
	releaseFirst := s.Set("first")
	releaseSecond := s.Set("second")
	if v, _ := s.Get(); v != "second" {
		t.Errorf("Get = %q, want the latest, second", v)
	}
	// The latest released, the one before is back.
	releaseSecond()
	if v, ok := s.Get(); !ok || v != "first" {
		t.Errorf("Get = %q, %v; want first", v, ok)
	}
	releaseThird := s.Set("third")
	// An earlier release leaves the latest.
	releaseFirst()
	if v, ok := s.Get(); !ok || v != "third" {
		t.Errorf("Get = %q, %v; want third", v, ok)
	}
	releaseThird()
	if v, ok := s.Get(); ok {
		t.Errorf("Get = %q after the last release", v)
	}
}

func TestHolder(t *testing.T) {
	var s Slot[int]
	h := s.Holder(7)
	if h.(interface{ NeedLeaderElection() bool }).NeedLeaderElection() {
		t.Error("the holder waits for leader election: the gauges of standby replicas would be missing")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- h.Start(ctx) }()
	for {
		if v, ok := s.Get(); ok {
			if v != 7 {
				t.Fatalf("Get = %d", v)
			}
			break
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Get(); ok {
		t.Error("the slot holds the value after the manager stopped")
	}
}
