// Package leaseaudit judges, from a kube-apiserver audit log, whether the
// heartbeats of one AddonInstance had one writer per hold of its election
// Lease: the real-node soak's proof of the election, made by the API server's
// own record rather than by the reporters' word.
//
// The log must hold the writes to the Lease at level Request (their bodies
// carry the holder and the period announced) and the status writes to the
// AddonInstance at level Metadata or more; a reporter's credential is its
// pod's bound service-account token, so user.extra names the pod that wrote.
package leaseaudit

import (
	"bufio"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat"
)

// PodNameKey is the user.extra key of a pod-bound service-account token.
const PodNameKey = "authentication.kubernetes.io/pod-name"

// Event is what the judgement reads of an audit.k8s.io/v1 Event.
type Event struct {
	Verb  string `json:"verb"`
	Stage string `json:"stage"`
	User  struct {
		Username string              `json:"username"`
		Extra    map[string][]string `json:"extra"`
	} `json:"user"`
	ObjectRef struct {
		Resource    string `json:"resource"`
		Namespace   string `json:"namespace"`
		Name        string `json:"name"`
		Subresource string `json:"subresource"`
	} `json:"objectRef"`
	ResponseStatus struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
	RequestObject  json.RawMessage  `json:"requestObject"`
	StageTimestamp metav1.MicroTime `json:"stageTimestamp"`
}

// Pod is the pod whose bound token made the request ("" for any other
// credential).
func (e Event) Pod() string {
	if v := e.User.Extra[PodNameKey]; len(v) > 0 {
		return v[0]
	}
	return ""
}

func (e Event) applied() bool { return e.ResponseStatus.Code >= 200 && e.ResponseStatus.Code < 300 }

// Read returns the completed requests of namespace in a JSON-lines audit
// log, in the order the API server completed them.
func Read(r io.Reader, namespace string) ([]Event, error) {
	var events []Event
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for line := 1; sc.Scan(); line++ {
		var e Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, fmt.Errorf("audit log line %d: %w", line, err)
		}
		if e.Stage == "ResponseComplete" && e.ObjectRef.Namespace == namespace {
			events = append(events, e)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading the audit log: %w", err)
	}
	slices.SortStableFunc(events, func(a, b Event) int { return a.StageTimestamp.Time.Compare(b.StageTimestamp.Time) })
	return events, nil
}

// Report is the judgement of a window.
type Report struct {
	// Holds are the holds that ran in the window: the one in force at its
	// start, and each take (a new holder, or a create) in it.
	Holds int
	// Heartbeats are the status writes by pods the API server applied.
	Heartbeats int
	// Writers are the pods of those heartbeats, in the order they first wrote.
	Writers []string
	// Refused are the status writes by pods the API server refused (the
	// fencing policy's 403s among them).
	Refused int
	// Violations describe each heartbeat applied outside its writer's hold.
	Violations []string
}

// Judge checks the heartbeats to instance applied in [from, to] (by the
// events' completion): each must come from the pod whose Lease write (a take
// or a renewal of the Lease named lease) was the last applied before it, and
// within that write's renew deadline for the period it announced
// (heartbeat.Timings; the longest the holder may lead on it). A deletion of
// the Lease keeps the hold, and so does the Lease made again with no holder
// (by the webhook or a reporter): its holder alone may still write until its
// hold ends, and the next take starts another; a release ends it. Events before
// from only establish the hold in force at from.
func Judge(events []Event, lease, instance string, from, to time.Time) Report {
	var rep Report
	var holder string
	var renewed time.Time
	var announced time.Duration
	inWindow := false
	for _, e := range events {
		at := e.StageTimestamp.Time
		if at.After(to) {
			break
		}
		if !inWindow && !at.Before(from) {
			inWindow = true
			if holder != "" {
				rep.Holds = 1
			}
		}
		switch {
		case e.ObjectRef.Resource == "leases" && e.ObjectRef.Name == lease:
			if !e.applied() || e.Verb == "delete" {
				continue
			}
			var l coordinationv1.Lease
			if err := json.Unmarshal(e.RequestObject, &l); err != nil {
				rep.Violations = append(rep.Violations, fmt.Sprintf("a Lease write at %s without a readable body: %v", stamp(at), err))
				continue
			}
			h := ptr.Deref(l.Spec.HolderIdentity, "")
			switch {
			case h == "" && l.Spec.RenewTime == nil:
				// Made again with no holder after a deletion: the hold
				// of the one deleted stands to its end.
				continue
			case h == "":
				holder, renewed = "", time.Time{} // released: the hold ended
				continue
			}
			if inWindow && (h != holder || renewed.IsZero() || e.Verb == "create") {
				rep.Holds++
			}
			holder, renewed = h, at
			announced, _ = time.ParseDuration(l.Annotations[heartbeat.PeriodAnnotation])
			announced = cmp.Or(announced, heartbeat.DefaultPeriod)
		case e.ObjectRef.Resource == "addoninstances" && e.ObjectRef.Name == instance && e.ObjectRef.Subresource == "status" && e.Pod() != "":
			if !inWindow {
				continue
			}
			if !e.applied() {
				rep.Refused++
				continue
			}
			rep.Heartbeats++
			if !slices.Contains(rep.Writers, e.Pod()) {
				rep.Writers = append(rep.Writers, e.Pod())
			}
			switch {
			case e.Pod() != holder:
				rep.Violations = append(rep.Violations, fmt.Sprintf("heartbeat by pod %s applied at %s while the Lease was %q's (last written %s)",
					e.Pod(), stamp(at), holder, stamp(renewed)))
			case at.After(renewed.Add(heartbeat.Timings(announced).RenewDeadline)):
				rep.Violations = append(rep.Violations, fmt.Sprintf("heartbeat by pod %s applied at %s, after its hold ended (renewed %s for a period of %s)",
					e.Pod(), stamp(at), stamp(renewed), announced))
			}
		}
	}
	return rep
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return t.UTC().Format("15:04:05.000000")
}
