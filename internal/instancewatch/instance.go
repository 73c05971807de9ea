// Package instancewatch is the webhook's view of every AddonInstance of the
// cluster: per-AddonInstance gauges (the last heartbeat, the period asked
// for and the period the reporter follows), so that a heartbeat alert still
// fires when every reporter of an addon is gone, and one Warning Event on an
// AddonInstance that asks for a period below the reporter's floor, which the
// reporter cannot record itself (its role may create nothing).
//
// The webhook decodes AddonInstances into a type holding only the fields
// used here, and a cache transform drops the rest of their metadata, so that
// its memory does not grow with their conditions or managed fields.
package instancewatch

import (
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat"
)

// GVK is the AddonInstance's.
var GVK = schema.GroupVersionKind{Group: "addons.managed.openshift.io", Version: "v1alpha1", Kind: "AddonInstance"}

// Object is an AddonInstance as the webhook decodes it: only the fields read
// here. Decoding into it skips the conditions (up to 4 KB of message each)
// without allocating them, which an unstructured or a full typed object
// would decode first and a transform drop after. Both fields are strings, as
// the CRD's schema has them, so that no stored value fails the decoding (a
// period such as "1d" passes the CRD; a metav1.Duration would refuse it, and
// with it the whole list).
type Object struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              ObjectSpec   `json:"spec,omitempty"`
	Status            ObjectStatus `json:"status,omitempty"`
}

// ObjectSpec is the part of the spec read here.
type ObjectSpec struct {
	HeartbeatUpdatePeriod string `json:"heartbeatUpdatePeriod,omitempty"`
}

// ObjectStatus is the part of the status read here.
type ObjectStatus struct {
	LastHeartbeatTime string `json:"lastHeartbeatTime,omitempty"`
}

// ObjectList is a list of Objects.
type ObjectList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Object `json:"items"`
}

// DeepCopyObject copies o.
func (o *Object) DeepCopyObject() runtime.Object {
	out := *o
	o.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	return &out
}

// DeepCopyObject copies l.
func (l *ObjectList) DeepCopyObject() runtime.Object {
	out := *l
	l.ListMeta.DeepCopyInto(&out.ListMeta)
	out.Items = make([]Object, len(l.Items))
	for i := range l.Items {
		out.Items[i] = *l.Items[i].DeepCopyObject().(*Object)
	}
	return &out
}

// AddToScheme registers Object and ObjectList as the AddonInstance kinds.
// The webhook's scheme has no other AddonInstance type: a scheme that
// registers the addon-operator's own types (as the tests' does) cannot hold
// these too.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypeWithName(GVK, &Object{})
	s.AddKnownTypeWithName(GVK.GroupVersion().WithKind(GVK.Kind+"List"), &ObjectList{})
	metav1.AddToGroupVersion(s, GVK.GroupVersion())
	return nil
}

// CacheOptions watch AddonInstances in every namespace as Objects, each cut
// down further by Slim. The webhook's RBAC controller watches them too, as
// metadata only: that watch cannot carry the spec and status read here.
func CacheOptions() map[client.Object]cache.ByObject {
	return map[client.Object]cache.ByObject{&Object{}: {Transform: Slim}}
}

// Slim keeps of an AddonInstance's metadata its identity, generation and
// creation time: no managed fields, labels or annotations.
func Slim(obj any) (any, error) {
	o, ok := obj.(*Object)
	if !ok {
		return obj, nil
	}
	return &Object{
		TypeMeta: o.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name: o.Name, Namespace: o.Namespace, UID: o.UID, ResourceVersion: o.ResourceVersion,
			// The generation tells a spec change from a status write (see Recorder).
			Generation: o.Generation, CreationTimestamp: o.CreationTimestamp,
		},
		Spec:   o.Spec,
		Status: o.Status,
	}, nil
}

var _ toolscache.TransformFunc = Slim

// Instance is what the webhook knows of one AddonInstance.
type Instance struct {
	Namespace, Name string
	UID             types.UID
	Created         time.Time
	// Period is spec.heartbeatUpdatePeriod as stored: "" when absent (the
	// CRD defaults it, so only with another CRD).
	Period string
	// LastHeartbeat is status.lastHeartbeatTime; zero before the first.
	LastHeartbeat time.Time
}

// FromObject reads an AddonInstance. A lastHeartbeatTime that is not a
// time (the CRD's schema checks it) reads as none.
func FromObject(o *Object) Instance {
	in := Instance{Namespace: o.Namespace, Name: o.Name, UID: o.UID, Created: o.CreationTimestamp.Time, Period: o.Spec.HeartbeatUpdatePeriod}
	if s := o.Status.LastHeartbeatTime; s != "" {
		var t metav1.Time
		if err := t.UnmarshalQueryParameter(s); err == nil {
			in.LastHeartbeat = t.Time
		}
	}
	return in
}

// Periods are the period an AddonInstance asks for and the one its reporter
// follows.
type Periods struct {
	// Requested is spec.heartbeatUpdatePeriod: what the addon-operator
	// judges heartbeats by (3 of them).
	Requested time.Duration
	// Followed is what the reporter heartbeats at (heartbeat.Period): the
	// requested period, or heartbeat.MinPeriod when that is below it.
	Followed time.Duration
}

// Periods parses the requested period as the reporter and the
// addon-operator do (metav1.Duration: Go's duration syntax; an absent field
// is a zero one to both).
func (in Instance) Periods() (Periods, error) {
	var d time.Duration
	if in.Period != "" {
		var err error
		if d, err = time.ParseDuration(in.Period); err != nil {
			return Periods{}, fmt.Errorf("spec.heartbeatUpdatePeriod %q: expected a duration such as 10s or 1m: %w", in.Period, err)
		}
	}
	return Periods{Requested: d, Followed: heartbeat.Period(d)}, nil
}

// Reasons of the Warning Events recorded on AddonInstances.
const (
	// ReasonPeriodBelowFloor: spec.heartbeatUpdatePeriod is below
	// heartbeat.MinPeriod (0s included).
	ReasonPeriodBelowFloor = "HeartbeatPeriodBelowFloor"
	// ReasonPeriodInvalid: spec.heartbeatUpdatePeriod is not a duration.
	ReasonPeriodInvalid = "HeartbeatPeriodInvalid"
)

// maxQuoted bounds a stored value quoted in an Event's note (at most 1 KiB).
const maxQuoted = 64

// Finding is what an AddonInstance's Warning Event says.
type Finding struct {
	Reason, Note string
}

// Check returns the Event an AddonInstance's period deserves, if any: one
// the reporter cannot follow (below its floor, which the addon-operator
// still judges heartbeats by, so the addon reads as timed out whatever the
// reporter does), or one nobody can read.
func Check(in Instance) (Finding, bool) {
	p, err := in.Periods()
	if err != nil {
		return Finding{Reason: ReasonPeriodInvalid, Note: fmt.Sprintf(
			"spec.heartbeatUpdatePeriod %q is not a duration (expected Go's syntax, such as 10s or 1m): "+
				"the heartbeat reporter and the addon-operator read it as one, so this addon gets no heartbeat until it is corrected",
			quoted(in.Period))}, true
	}
	if p.Requested >= heartbeat.MinPeriod {
		return Finding{}, false
	}
	return Finding{Reason: ReasonPeriodBelowFloor, Note: fmt.Sprintf(
		"spec.heartbeatUpdatePeriod is %s, below the heartbeat reporter's floor of %s: the reporter heartbeats every %s, "+
			"but the addon-operator judges heartbeats against 3 requested periods (%s) and reports this addon as timed out "+
			"(HeartbeatTimeout) until the period is at least %s",
		p.Requested, heartbeat.MinPeriod, p.Followed, 3*p.Requested, heartbeat.MinPeriod)}, true
}

// quoted is s cut to maxQuoted bytes, with a marker when cut.
func quoted(s string) string {
	if len(s) <= maxQuoted {
		return s
	}
	return s[:maxQuoted] + fmt.Sprintf("... (%d bytes more)", len(s)-maxQuoted)
}
