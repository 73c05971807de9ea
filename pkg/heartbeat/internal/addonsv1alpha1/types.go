// Package addonsv1alpha1 is the AddonInstance API (addons.managed.openshift.io/v1alpha1)
// as the SDK reads and writes it: the same Go names and JSON as the
// addon-operator's github.com/openshift/addon-operator/apis/addons/v1alpha1, for
// the one kind the SDK uses.
//
// Why a copy of 80 lines: that package also holds the Addon kind, which imports
// the monitoring API of github.com/rhobs/obo-prometheus-operator, whose module
// requires sigs.k8s.io/controller-runtime; importing it put controller-runtime
// and 13 more modules into the SDK's module graph (go mod graph: 434 edges
// with it, see README.md, The SDK module, for the count without), and tied an
// addon's own pin of the addon-operator's API to the SDK's. The status is
// written whole (an update of the status subresource), so a field missing here
// would be dropped on every heartbeat: TestTypesCoverTheUpstreamCRD compares
// these types with the schema of the addon-operator's own CRD.
package addonsv1alpha1

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is the API group and version of AddonInstance.
var GroupVersion = schema.GroupVersion{Group: "addons.managed.openshift.io", Version: "v1alpha1"}

// AddToScheme registers AddonInstance and AddonInstanceList in a scheme.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &AddonInstance{}, &AddonInstanceList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}

// DefaultAddonInstanceHeartbeatUpdatePeriod is the CRD's default
// spec.heartbeatUpdatePeriod.
const DefaultAddonInstanceHeartbeatUpdatePeriod = 10 * time.Second

// AddonInstanceSpec is what the addon-operator asks of the addon.
type AddonInstanceSpec struct {
	// MarkedForDeletion: the addon is being deleted.
	MarkedForDeletion bool `json:"markedForDeletion"`
	// HeartbeatUpdatePeriod is how often heartbeats are expected.
	HeartbeatUpdatePeriod metav1.Duration `json:"heartbeatUpdatePeriod,omitempty"`
}

// AddonInstanceStatus is what the addon reports.
type AddonInstanceStatus struct {
	ObservedGeneration int64              `json:"observedGeneration,omitempty"`
	Conditions         []metav1.Condition `json:"conditions,omitempty"`
	LastHeartbeatTime  metav1.Time        `json:"lastHeartbeatTime"`
}

// AddonInstance is the object an addon heartbeats into.
type AddonInstance struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   AddonInstanceSpec   `json:"spec,omitempty"`
	Status AddonInstanceStatus `json:"status,omitempty"`
}

// AddonInstanceList is a list of AddonInstances.
type AddonInstanceList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []AddonInstance `json:"items"`
}

// AddonInstanceCondition is a condition type of an AddonInstance, without
// its group (String adds it).
type AddonInstanceCondition string

// String is the condition type as written: the group, a slash, the name.
func (c AddonInstanceCondition) String() string {
	return GroupVersion.Group + "/" + string(c)
}

// The conditions the addon-operator reads.
const (
	AddonInstanceConditionHealthy          AddonInstanceCondition = "Healthy"
	AddonInstanceConditionDegraded         AddonInstanceCondition = "Degraded"
	AddonInstanceConditionInstalled        AddonInstanceCondition = "Installed"
	AddonInstanceConditionReadyToBeDeleted AddonInstanceCondition = "ReadyToBeDeleted"
)

// Reasons of those conditions, as the addon-operator names them.
const (
	AddonInstanceHealthyReasonReceivingHeartbeats = "ReceivingHeartbeats"
	AddonInstanceInstalledReasonSetupComplete     = "SetupComplete"
	AddonInstanceInstalledReasonBlocked           = "Blocked"
	AddonInstanceReasonReadyToBeDeleted           = "AddonReadyToBeDeleted"
	AddonInstanceReasonNotReadyToBeDeleted        = "AddonNotReadyToBeDeleted"
)

// DeepCopyInto copies in into out.
func (in *AddonInstance) DeepCopyInto(out *AddonInstance) {
	*out = *in
	out.TypeMeta = in.TypeMeta
	in.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	out.Spec = in.Spec
	out.Status = in.Status
	in.Status.LastHeartbeatTime.DeepCopyInto(&out.Status.LastHeartbeatTime)
	if in.Status.Conditions != nil {
		out.Status.Conditions = make([]metav1.Condition, len(in.Status.Conditions))
		for i := range in.Status.Conditions {
			in.Status.Conditions[i].DeepCopyInto(&out.Status.Conditions[i])
		}
	}
}

// DeepCopy returns a copy of in.
func (in *AddonInstance) DeepCopy() *AddonInstance {
	if in == nil {
		return nil
	}
	out := new(AddonInstance)
	in.DeepCopyInto(out)
	return out
}

// DeepCopyObject is DeepCopy as a runtime.Object.
func (in *AddonInstance) DeepCopyObject() runtime.Object {
	if c := in.DeepCopy(); c != nil {
		return c
	}
	return nil
}

// DeepCopyObject returns a copy of in as a runtime.Object.
func (in *AddonInstanceList) DeepCopyObject() runtime.Object {
	if in == nil {
		return nil
	}
	out := new(AddonInstanceList)
	*out = *in
	in.ListMeta.DeepCopyInto(&out.ListMeta)
	if in.Items != nil {
		out.Items = make([]AddonInstance, len(in.Items))
		for i := range in.Items {
			in.Items[i].DeepCopyInto(&out.Items[i])
		}
	}
	return out
}
