package heartbeat

import (
	"fmt"
	"regexp"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	addonsv1alpha1 "github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/internal/addonsv1alpha1"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/annotations"
)

// Condition types, with the group prefix the addon-operator expects.
var (
	ConditionHealthy          = addonsv1alpha1.AddonInstanceConditionHealthy.String()
	ConditionDegraded         = addonsv1alpha1.AddonInstanceConditionDegraded.String()
	ConditionInstalled        = addonsv1alpha1.AddonInstanceConditionInstalled.String()
	ConditionReadyToBeDeleted = addonsv1alpha1.AddonInstanceConditionReadyToBeDeleted.String()
)

// Observation is everything the owned conditions are computed from.
type Observation struct {
	// Components are the addon's parts and their health. Nil means none are
	// known: Degraded and Installed are then left as they are.
	Components []Component
	// Installed is true once every component has been available at least
	// once (remembered by the caller, see Installed).
	Installed bool
	// MarkedForDeletion is the AddonInstance's spec.markedForDeletion.
	MarkedForDeletion bool
	// DeleteAck is how deletion is acknowledged.
	DeleteAck annotations.DeleteAckMode
	// Overrides are conditions the addon set itself (SDK mode); each
	// replaces the computed condition of its type.
	Overrides []metav1.Condition
	// Removed are condition types the reporter owned and no longer reports.
	Removed []string
}

// Desired is what one heartbeat writes: conditions to set and condition
// types to remove. Every other condition is left untouched.
type Desired struct {
	Set    []metav1.Condition
	Remove []string
}

// Compute derives the owned conditions from an observation. It is pure:
// timestamps and observedGeneration are filled in by Apply.
//
//   - Degraded: False/AllComponentsAvailable when every component is
//     available; otherwise True, with the unavailable components' reason
//     (MultipleComponentsUnavailable when they differ) and their messages,
//     sorted by component name.
//   - Installed: True/SetupComplete once installed; otherwise False/Blocked
//     naming the components that have not yet been available.
//   - ReadyToBeDeleted: only while markedForDeletion; True/AddonReadyToBeDeleted
//     with delete-ack auto, False/AddonNotReadyToBeDeleted with manual. When
//     not marked, the condition is removed: it belongs to the addon by
//     protocol, and a True left over from a cancelled deletion would be
//     stale the next time the operator looks.
func Compute(o Observation) Desired {
	var d Desired
	if o.Components != nil {
		d.Set = append(d.Set, degraded(o.Components), installed(o.Components, o.Installed))
	}
	if o.MarkedForDeletion {
		if o.DeleteAck == annotations.DeleteAckManual {
			d.Set = append(d.Set, metav1.Condition{
				Type: ConditionReadyToBeDeleted, Status: metav1.ConditionFalse,
				Reason:  addonsv1alpha1.AddonInstanceReasonNotReadyToBeDeleted,
				Message: "deletion is acknowledged manually (delete-ack: manual)",
			})
		} else {
			d.Set = append(d.Set, metav1.Condition{
				Type: ConditionReadyToBeDeleted, Status: metav1.ConditionTrue,
				Reason:  addonsv1alpha1.AddonInstanceReasonReadyToBeDeleted,
				Message: "deletion is acknowledged automatically (delete-ack: auto)",
			})
		}
	} else {
		d.Remove = append(d.Remove, ConditionReadyToBeDeleted)
	}
	for _, ov := range o.Overrides {
		d.Set = slices.DeleteFunc(d.Set, func(c metav1.Condition) bool { return c.Type == ov.Type })
		d.Remove = slices.DeleteFunc(d.Remove, func(t string) bool { return t == ov.Type })
		d.Set = append(d.Set, ov)
	}
	for _, t := range o.Removed {
		if !slices.ContainsFunc(d.Set, func(c metav1.Condition) bool { return c.Type == t }) && !slices.Contains(d.Remove, t) {
			d.Remove = append(d.Remove, t)
		}
	}
	return d
}

func degraded(comps []Component) metav1.Condition {
	var down []Component
	for _, c := range comps {
		if !c.Available {
			down = append(down, c)
		}
	}
	if len(down) == 0 {
		names := make([]string, 0, len(comps))
		for _, c := range comps {
			names = append(names, c.Name)
		}
		return metav1.Condition{
			Type: ConditionDegraded, Status: metav1.ConditionFalse, Reason: ReasonAllComponentsAvailable,
			Message: joinBounded("available: ", names, ", ", "", MaxMessage),
		}
	}
	reason := down[0].Reason
	msgs := make([]string, 0, len(down))
	for _, c := range down {
		if c.Reason != reason {
			reason = ReasonMultipleComponentsUnavailable
		}
		msgs = append(msgs, c.Message)
	}
	if reason == "" {
		reason = ReasonComponentUnavailable
	}
	return metav1.Condition{
		Type: ConditionDegraded, Status: metav1.ConditionTrue, Reason: reason,
		Message: joinBounded("", msgs, "; ", "", MaxMessage),
	}
}

func installed(comps []Component, done bool) metav1.Condition {
	if done {
		return metav1.Condition{
			Type: ConditionInstalled, Status: metav1.ConditionTrue,
			Reason:  addonsv1alpha1.AddonInstanceInstalledReasonSetupComplete,
			Message: "every component has been available",
		}
	}
	var waiting []string
	for _, c := range comps {
		if !c.Available {
			waiting = append(waiting, c.Name)
		}
	}
	return metav1.Condition{
		Type: ConditionInstalled, Status: metav1.ConditionFalse,
		Reason:  addonsv1alpha1.AddonInstanceInstalledReasonBlocked,
		Message: joinBounded("waiting for ", waiting, ", ", " to become available", MaxMessage),
	}
}

// Installed tells whether setup is complete: it was already (an earlier
// heartbeat of this process, or Installed=True on the AddonInstance from an
// earlier leader), or every component has now been available at least once.
// seen records the components that have been available; Installed adds the
// currently available ones to it.
func Installed(already bool, existing []metav1.Condition, comps []Component, seen map[string]bool) bool {
	for _, c := range comps {
		if c.Available {
			seen[c.Name] = true
		}
	}
	if already || meta.IsStatusConditionTrue(existing, ConditionInstalled) {
		return true
	}
	if len(comps) == 0 {
		return false
	}
	for _, c := range comps {
		if !seen[c.Name] {
			return false
		}
	}
	return true
}

// Apply writes d into conditions with meta.SetStatusCondition semantics
// (lastTransitionTime changes only when the status does) and observedGeneration
// = generation, and removes d.Remove. Conditions of other types are kept as
// they are, in their order.
func Apply(conditions *[]metav1.Condition, d Desired, generation int64, now time.Time) {
	for _, c := range d.Set {
		c.ObservedGeneration = generation
		c.LastTransitionTime = metav1.NewTime(now)
		meta.SetStatusCondition(conditions, c)
	}
	for _, t := range d.Remove {
		meta.RemoveStatusCondition(conditions, t)
	}
}

// typePattern is metav1.Condition's type validation.
var typePattern = regexp.MustCompile(`^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$`)

// normalizeType gives the short upstream condition names (Degraded,
// Installed, ReadyToBeDeleted, Healthy) their group prefix; other types are
// returned as they are.
func normalizeType(t string) string {
	switch addonsv1alpha1.AddonInstanceCondition(t) {
	case addonsv1alpha1.AddonInstanceConditionDegraded, addonsv1alpha1.AddonInstanceConditionInstalled,
		addonsv1alpha1.AddonInstanceConditionReadyToBeDeleted, addonsv1alpha1.AddonInstanceConditionHealthy:
		return addonsv1alpha1.AddonInstanceCondition(t).String()
	}
	return t
}

// reasonPattern is metav1.Condition's reason validation.
var reasonPattern = regexp.MustCompile(`^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`)

// ValidateCondition checks a condition an addon sets in SDK mode: never
// Healthy (the addon-operator computes it), a type, a status of True, False
// or Unknown, a CamelCase reason, and a message the API server accepts.
func ValidateCondition(c metav1.Condition) error {
	switch {
	case c.Type == ConditionHealthy || c.Type == string(addonsv1alpha1.AddonInstanceConditionHealthy):
		return fmt.Errorf("condition %s is computed by the addon-operator and cannot be set", c.Type)
	case !typePattern.MatchString(c.Type) || len(c.Type) > 316:
		return fmt.Errorf("condition type %s: expected a qualified name of at most 316 bytes such as %s", quoteBounded(c.Type), ConditionDegraded)
	case c.Status != metav1.ConditionTrue && c.Status != metav1.ConditionFalse && c.Status != metav1.ConditionUnknown:
		return fmt.Errorf("condition %s: status %s: expected True, False or Unknown", c.Type, quoteBounded(string(c.Status)))
	case !reasonPattern.MatchString(c.Reason) || len(c.Reason) > maxReason:
		return fmt.Errorf("condition %s: reason %s: expected a CamelCase word of at most %d bytes", c.Type, quoteBounded(c.Reason), maxReason)
	case len(c.Message) > 32768:
		return fmt.Errorf("condition %s: message longer than 32768 characters", c.Type)
	}
	return nil
}
