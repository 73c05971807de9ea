//go:build go1.25

package heartbeat

import (
	"strconv"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	addonsv1alpha1 "github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/internal/addonsv1alpha1"
)

func version(rv string) *addonsv1alpha1.AddonInstance {
	return &addonsv1alpha1.AddonInstance{ObjectMeta: metav1.ObjectMeta{ResourceVersion: rv}}
}

// The watch can lag behind this term's own writes by several heartbeats (a
// loaded API server, or heartbeats close together): each next write goes
// over the term's last write, never over the stale cached version, which
// would only meet a conflict.
func TestNextWriteGoesOverOwnWritesWhileTheWatchLags(t *testing.T) {
	var tm term
	cached := version("1") // what the watch holds, all along
	rv := 1
	for beat := range maxWrittenOver {
		base := tm.newest(cached)
		if want := rv; base.ResourceVersion != strconv.Itoa(want) {
			t.Fatalf("beat %d goes over version %s, want %d (the term's last write)", beat, base.ResourceVersion, want)
		}
		rv++
		tm.wrote(base, version(strconv.Itoa(rv)), []string{base.ResourceVersion})
	}
	// A watch more than maxWrittenOver writes behind: one conflict, then a
	// read, is the cost.
	var fresh term
	for i := range maxWrittenOver + 2 {
		base := fresh.newest(cached)
		fresh.wrote(base, version(strconv.Itoa(100+i)), []string{base.ResourceVersion})
	}
	if got := len(fresh.writtenOver); got > maxWrittenOver {
		t.Errorf("%d versions remembered, want at most %d", got, maxWrittenOver)
	}
	// Once the watch has caught up, the cached version is the one.
	caught := version("200")
	if got := tm.newest(caught); got != caught {
		t.Errorf("after the watch caught up the write goes over %s, want the cached %s", got.ResourceVersion, caught.ResourceVersion)
	}
}
