package localcluster

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	addonsv1alpha1 "github.com/openshift/addon-operator/apis/addons/v1alpha1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Heartbeats watches one AddonInstance and records when each status write
// arrived, for tests that time heartbeats from the outside (e2e, real node).
// lastHeartbeatTime has one-second resolution, so a write is told apart by
// its resourceVersion and timed by when the watch delivered it. The watch is
// re-established when it ends (an API server restart), and a re-established
// watch replays the current object, which is not counted again.
type Heartbeats struct {
	mu     sync.Mutex
	writes []time.Time
	last   *addonsv1alpha1.AddonInstance
	cancel context.CancelFunc
	done   chan struct{}
}

// WatchHeartbeats starts recording writes to AddonInstance ns/name. Stop it
// with Stop.
func WatchHeartbeats(cfg *rest.Config, scheme *runtime.Scheme, ns, name string) (*Heartbeats, error) {
	wc, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("creating a watch client: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &Heartbeats{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(h.done)
		seen := map[string]bool{}
		for ctx.Err() == nil {
			w, err := wc.Watch(ctx, &addonsv1alpha1.AddonInstanceList{}, client.InNamespace(ns),
				client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("metadata.name", name)})
			if err != nil {
				select {
				case <-ctx.Done():
				case <-time.After(200 * time.Millisecond):
				}
				continue
			}
			for ev := range w.ResultChan() {
				ai, ok := ev.Object.(*addonsv1alpha1.AddonInstance)
				if !ok {
					continue
				}
				now := time.Now()
				h.mu.Lock()
				// Every status write of a reporter sets lastHeartbeatTime.
				if !ai.Status.LastHeartbeatTime.IsZero() && !seen[ai.ResourceVersion] {
					h.writes = append(h.writes, now)
				}
				seen[ai.ResourceVersion] = true
				h.last = ai.DeepCopy()
				h.mu.Unlock()
			}
			w.Stop()
		}
	}()
	return h, nil
}

// Stop ends the watch and waits for it.
func (h *Heartbeats) Stop() {
	h.cancel()
	<-h.done
}

// Count is the number of writes seen so far.
func (h *Heartbeats) Count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.writes)
}

// Latest is the last AddonInstance seen, or nil.
func (h *Heartbeats) Latest() *addonsv1alpha1.AddonInstance {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.last == nil {
		return nil
	}
	return h.last.DeepCopy()
}

// Since lists the writes seen at or after from.
func (h *Heartbeats) Since(from time.Time) []time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []time.Time
	for _, w := range h.writes {
		if !w.Before(from) {
			out = append(out, w)
		}
	}
	return out
}

// FirstWriteAfter is the first write seen after t, or the zero time.
func (h *Heartbeats) FirstWriteAfter(t time.Time) time.Time {
	for _, w := range h.Since(t) {
		if w.After(t) {
			return w
		}
	}
	return time.Time{}
}

// MaxGap is the longest time without a write between from and to, counting
// from from to the first write and from the last write to to.
func (h *Heartbeats) MaxGap(from, to time.Time) time.Duration {
	prev, gap := from, time.Duration(0)
	for _, w := range h.Since(from) {
		if w.After(to) {
			break
		}
		gap = max(gap, w.Sub(prev))
		prev = w
	}
	return max(gap, to.Sub(prev))
}

// pollInterval is how often the Wait methods look at what was recorded.
const pollInterval = 50 * time.Millisecond

// WaitWrites waits until n more writes than now have been recorded, or ctx
// ends.
func (h *Heartbeats) WaitWrites(ctx context.Context, n int) error {
	from := h.Count()
	err := wait.PollUntilContextCancel(ctx, pollInterval, true, func(context.Context) (bool, error) {
		return h.Count()-from >= n, nil
	})
	if err != nil {
		return fmt.Errorf("%d heartbeat writes, want %d: %w", h.Count()-from, n, err)
	}
	return nil
}

// WaitCondition waits until the AddonInstance has condition typ with status
// and a message containing each of parts, and returns it; when ctx ends
// first, the error says what was seen last.
func (h *Heartbeats) WaitCondition(ctx context.Context, typ string, status metav1.ConditionStatus, parts ...string) (metav1.Condition, error) {
	var got metav1.Condition
	last := "no AddonInstance seen"
	err := wait.PollUntilContextCancel(ctx, pollInterval, true, func(context.Context) (bool, error) {
		ai := h.Latest()
		if ai == nil {
			return false, nil
		}
		c := apimeta.FindStatusCondition(ai.Status.Conditions, typ)
		if c == nil {
			last = fmt.Sprintf("no %s condition: %+v", typ, ai.Status.Conditions)
			return false, nil
		}
		got = *c
		last = fmt.Sprintf("%s=%s (%s: %s)", typ, c.Status, c.Reason, c.Message)
		if c.Status != status {
			return false, nil
		}
		for _, p := range parts {
			if !strings.Contains(c.Message, p) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return got, fmt.Errorf("condition %s=%s mentioning %q: last %s: %w", typ, status, parts, last, err)
	}
	return got, nil
}
