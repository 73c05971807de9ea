package bench

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	addonsv1alpha1 "github.com/openshift/addon-operator/apis/addons/v1alpha1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// recorder watches every AddonInstance in the cluster and records the local
// time of each write to it, by namespace. lastHeartbeatTime has one-second
// resolution, so heartbeats are timed by the watch instead: every status
// write of a reporter sets lastHeartbeatTime and makes a new
// resourceVersion.
type recorder struct {
	mu       sync.Mutex
	writes   map[string][]time.Time
	versions map[string]string
	changed  chan struct{}
	stop     context.CancelFunc
	done     chan struct{}
}

func (e *env) recordHeartbeats(b *testing.B) *recorder {
	b.Helper()
	wc, err := client.NewWithWatch(e.cluster.Config, client.Options{Scheme: e.cluster.Client.Scheme()})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &recorder{writes: map[string][]time.Time{}, versions: map[string]string{}, changed: make(chan struct{}, 1),
		stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		for ctx.Err() == nil {
			w, err := wc.Watch(ctx, &addonsv1alpha1.AddonInstanceList{})
			if err != nil {
				select {
				case <-ctx.Done():
				case <-time.After(200 * time.Millisecond):
				}
				continue
			}
			for ev := range w.ResultChan() {
				ai, ok := ev.Object.(*addonsv1alpha1.AddonInstance)
				if !ok || (ev.Type != watch.Added && ev.Type != watch.Modified) {
					continue
				}
				now := time.Now()
				r.mu.Lock()
				// A re-established watch replays the current object: same
				// version, not a new write.
				if !ai.Status.LastHeartbeatTime.IsZero() && r.versions[ai.Namespace] != ai.ResourceVersion {
					r.writes[ai.Namespace] = append(r.writes[ai.Namespace], now)
				}
				r.versions[ai.Namespace] = ai.ResourceVersion
				r.mu.Unlock()
				select {
				case r.changed <- struct{}{}:
				default:
				}
			}
			w.Stop()
		}
	}()
	b.Cleanup(func() { cancel(); <-r.done })
	return r
}

// times returns the writes seen in namespace ns.
func (r *recorder) times(ns string) []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.writes[ns])
}

func (r *recorder) count(ns string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.writes[ns])
}

// waitAll waits until every namespace in nss has n writes more than in
// from (missing namespaces count as 0), or timeout.
func (r *recorder) waitAll(b *testing.B, nss []string, from map[string]int, n int, timeout time.Duration) {
	b.Helper()
	ok := func() (bool, string) {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, ns := range nss {
			if len(r.writes[ns]) < from[ns]+n {
				return false, ns
			}
		}
		return true, ""
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		done, missing := ok()
		if done {
			return
		}
		select {
		case <-r.changed:
		case <-deadline.C:
			b.Fatalf("namespace %s: fewer than %d heartbeats within %s", missing, n, timeout)
		}
	}
}

// counts snapshots the number of writes per namespace.
func (r *recorder) counts() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]int{}
	for ns, w := range r.writes {
		out[ns] = len(w)
	}
	return out
}

// waitWrites waits until namespace ns has n more writes than now.
func (r *recorder) waitWrites(b *testing.B, ns string, n int, timeout time.Duration) {
	b.Helper()
	r.waitAll(b, []string{ns}, map[string]int{ns: r.count(ns)}, n, timeout)
}

// maxInterval is the longest interval between consecutive writes in
// [from, to], counting the open intervals at both ends from the last write
// before from and up to to.
func maxInterval(writes []time.Time, from, to time.Time) time.Duration {
	prev := from
	for _, w := range writes {
		if w.After(from) {
			break
		}
		prev = w
	}
	var longest time.Duration
	for _, w := range writes {
		if !w.After(from) || w.After(to) {
			continue
		}
		longest = max(longest, w.Sub(prev))
		prev = w
	}
	return max(longest, to.Sub(prev))
}

// pollUntil polls cond every interval until it holds or timeout.
func pollUntil(b *testing.B, interval, timeout time.Duration, what string, cond func() bool) {
	b.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), interval, timeout, true, func(context.Context) (bool, error) {
		return cond(), nil
	})
	if err != nil {
		b.Fatalf("%s: not within %s", what, timeout)
	}
}
