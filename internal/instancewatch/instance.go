// Package instancewatch is the webhook's view of every AddonInstance of the
// cluster: per-AddonInstance gauges (the last heartbeat, the period asked
// for and the period the reporter follows), so that a heartbeat alert still
// fires when every reporter of an addon is gone, and one Warning Event on an
// AddonInstance that asks for a period below the reporter's floor, which the
// reporter cannot record itself (its role may create nothing).
//
// The webhook watches AddonInstances cut down by a cache transform to the
// fields used here, so that its memory does not grow with their conditions
// or managed fields.
package instancewatch

import (
	"fmt"
	"time"

	addonsv1alpha1 "github.com/openshift/addon-operator/apis/addons/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat"
)

// GVK is the AddonInstance's.
var GVK = schema.GroupVersionKind{Group: "addons.managed.openshift.io", Version: "v1alpha1", Kind: "AddonInstance"}

// newObject is an empty AddonInstance as the cache holds it.
func newObject() *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(GVK)
	return u
}

func newList() *unstructured.UnstructuredList {
	l := &unstructured.UnstructuredList{}
	l.SetGroupVersionKind(GVK.GroupVersion().WithKind(GVK.Kind + "List"))
	return l
}

// CacheOptions watch AddonInstances in every namespace as unstructured
// objects, each cut down to what Instance reads (Slim). The webhook's RBAC
// controller watches them too, as metadata only: that watch cannot carry the
// spec and status read here.
func CacheOptions() map[client.Object]cache.ByObject {
	return map[client.Object]cache.ByObject{newObject(): {Transform: Slim}}
}

// Slim keeps of an AddonInstance its identity, generation, creation time,
// spec.heartbeatUpdatePeriod and status.lastHeartbeatTime: no conditions, no
// managed fields, no labels or annotations. The API server's watch still
// sends whole objects; only the cached copy is small.
func Slim(obj any) (any, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return obj, nil
	}
	meta := map[string]any{}
	// The generation tells a spec change from a status write (see Recorder).
	for _, k := range []string{"name", "namespace", "uid", "resourceVersion", "generation", "creationTimestamp"} {
		if v, ok := u.Object["metadata"].(map[string]any)[k]; ok {
			meta[k] = v
		}
	}
	slim := map[string]any{"apiVersion": u.GetAPIVersion(), "kind": u.GetKind(), "metadata": meta}
	if v, ok, _ := unstructured.NestedFieldNoCopy(u.Object, "spec", "heartbeatUpdatePeriod"); ok {
		slim["spec"] = map[string]any{"heartbeatUpdatePeriod": v}
	}
	if v, ok, _ := unstructured.NestedFieldNoCopy(u.Object, "status", "lastHeartbeatTime"); ok {
		slim["status"] = map[string]any{"lastHeartbeatTime": v}
	}
	return &unstructured.Unstructured{Object: slim}, nil
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

// FromObject reads an AddonInstance as Slim leaves it. A field of the wrong
// type reads as absent: the CRD's schema makes both strings, and a watch
// that fails on one odd object would blind the webhook to every other.
func FromObject(u *unstructured.Unstructured) Instance {
	in := Instance{Namespace: u.GetNamespace(), Name: u.GetName(), UID: u.GetUID(), Created: u.GetCreationTimestamp().Time}
	in.Period, _, _ = unstructured.NestedString(u.Object, "spec", "heartbeatUpdatePeriod")
	if s, ok, _ := unstructured.NestedString(u.Object, "status", "lastHeartbeatTime"); ok && s != "" {
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
	ai := &addonsv1alpha1.AddonInstance{Spec: addonsv1alpha1.AddonInstanceSpec{HeartbeatUpdatePeriod: metav1.Duration{Duration: d}}}
	return Periods{Requested: d, Followed: heartbeat.Period(ai)}, nil
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
