package leaseaudit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat"
)

const (
	ns       = "addon"
	instance = "addon-instance"
	period   = 5 * time.Second // renew deadline 7.5s
)

var lease = heartbeat.LeaseName(instance)

// logOf writes an audit log (JSON lines, as the API server does) of steps:
// "t verb holder" for a Lease write at t seconds ("" holder: a release;
// verb delete; verb vacant: the Lease made with no holder, as after a
// deletion), "t beat pod [code]" for a status write.
func logOf(t *testing.T, t0 time.Time, steps ...string) *bytes.Buffer {
	t.Helper()
	var buf bytes.Buffer
	for _, s := range steps {
		f := strings.Fields(s)
		var sec float64
		fmt.Sscanf(f[0], "%g", &sec)
		ev := map[string]any{"stage": "ResponseComplete", "stageTimestamp": metav1.NewMicroTime(t0.Add(time.Duration(sec * float64(time.Second)))),
			"responseStatus": map[string]any{"code": 200}}
		switch f[1] {
		case "beat":
			ev["verb"] = "update"
			ev["user"] = map[string]any{"username": "system:serviceaccount:addon:sa", "extra": map[string][]string{PodNameKey: {f[2]}}}
			ev["objectRef"] = map[string]any{"resource": "addoninstances", "namespace": ns, "name": instance, "subresource": "status"}
			if len(f) > 3 {
				var code int
				fmt.Sscanf(f[3], "%d", &code)
				ev["responseStatus"] = map[string]any{"code": code}
			}
		case "vacant":
			ev["verb"] = "create"
			ev["objectRef"] = map[string]any{"resource": "leases", "namespace": ns, "name": lease}
			ev["requestObject"] = coordinationv1.Lease{}
		default:
			ev["verb"] = f[1]
			ev["objectRef"] = map[string]any{"resource": "leases", "namespace": ns, "name": lease}
			holder := ""
			if len(f) > 2 {
				holder = f[2]
			}
			// A take, a renewal and a release all stamp renewTime.
			ev["requestObject"] = coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{heartbeat.PeriodAnnotation: period.String()}},
				Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(holder), RenewTime: ptr.To(metav1.NewMicroTime(t0))}}
		}
		line, err := json.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		buf.Write(append(line, '\n'))
	}
	return &buf
}

func TestJudge(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	tests := map[string]struct {
		steps       []string
		holds       int
		violation   string // "" for none
		refused     int
		writersWant int
	}{
		"a renewal and a heartbeat each period": {
			steps: []string{"0 create a", "0.1 beat a", "5 update a", "5.1 beat a", "10 update a", "10.1 beat a"}, holds: 1, writersWant: 1},
		"a takeover after the hold": {
			steps: []string{"0 create a", "0.1 beat a", "7.5 update b", "7.6 beat b"}, holds: 2, writersWant: 2},
		"a heartbeat by a pod that does not hold the Lease": {
			steps: []string{"0 create a", "0.1 beat a", "3 beat b"}, holds: 1, violation: "heartbeat by pod b applied at 12:00:03.000000 while the Lease was \"a\"'s"},
		"the old holder writing after a takeover": {
			steps: []string{"0 create a", "0.1 beat a", "5 update b", "5.5 beat a"}, holds: 2, violation: "heartbeat by pod a"},
		"a heartbeat after the hold ended": {
			steps: []string{"0 create a", "0.1 beat a", "7.6 beat a"}, holds: 1, violation: "after its hold ended"},
		"the holder finishing its hold after a deletion": {
			steps: []string{"0 create a", "2 delete", "5 beat a", "7.5 create b", "7.6 beat b"}, holds: 2, writersWant: 2},
		"the holder finishing its hold after a deletion and the Lease made again": {
			steps: []string{"0 update a", "2 delete", "2.1 vacant", "5 beat a", "8.8 update b", "8.9 beat b"}, holds: 2, writersWant: 2},
		"a standby writing between a deletion and its take": {
			steps: []string{"0 create a", "2 delete", "3 beat b"}, holds: 1, violation: "heartbeat by pod b"},
		"a heartbeat after a release": {
			steps: []string{"0 create a", "1 update", "1.1 beat a"}, holds: 1, violation: "while the Lease was \"\"'s"},
		"a refused write is no heartbeat": {
			steps: []string{"0 create a", "0.1 beat a", "0.2 beat b 403"}, holds: 1, refused: 1, writersWant: 1},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			events, err := Read(logOf(t, t0, tt.steps...), ns)
			if err != nil {
				t.Fatal(err)
			}
			rep := Judge(events, lease, instance, t0, t0.Add(time.Minute))
			if rep.Holds != tt.holds || rep.Refused != tt.refused {
				t.Errorf("holds %d, refused %d; want %d, %d", rep.Holds, rep.Refused, tt.holds, tt.refused)
			}
			switch {
			case tt.violation == "" && len(rep.Violations) > 0:
				t.Errorf("violations %q, want none", rep.Violations)
			case tt.violation != "" && (len(rep.Violations) != 1 || !strings.Contains(rep.Violations[0], tt.violation)):
				t.Errorf("violations %q, want one with %q", rep.Violations, tt.violation)
			case tt.violation == "" && len(rep.Writers) != tt.writersWant:
				t.Errorf("writers %v, want %d", rep.Writers, tt.writersWant)
			}
		})
	}
}

// The hold in force at the window's start counts, and writes before it are
// not judged; events of other namespaces are not read.
func TestJudgeWindow(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	events, err := Read(logOf(t, t0, "0 create a", "0.1 beat b", "5 update a", "5.1 beat a"), ns)
	if err != nil {
		t.Fatal(err)
	}
	rep := Judge(events, lease, instance, t0.Add(time.Second), t0.Add(time.Minute))
	if rep.Holds != 1 || rep.Heartbeats != 1 || len(rep.Violations) != 0 {
		t.Errorf("%+v; want the one hold, one heartbeat, no violation", rep)
	}
	if other, _ := Read(logOf(t, t0, "0 create a"), "elsewhere"); len(other) != 0 {
		t.Errorf("read %d events of another namespace", len(other))
	}
}
