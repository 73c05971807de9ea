package instancewatch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

const (
	// ReportingController names the webhook as the Events' source.
	ReportingController = "addon-heartbeat.io/webhook"
	// eventAction is the Events' action: the webhook checked the period.
	eventAction = "CheckHeartbeatPeriod"
	// maxReportingInstance is the API server's limit on reportingInstance.
	maxReportingInstance = 128
)

// Recorder records one Warning Event on each AddonInstance whose period
// Check finds wrong, once per value. It runs on the elected webhook replica
// only (a controller of the webhook's manager, which has leader election),
// and creates Events and nothing else: each Event's name is derived from
// the AddonInstance's UID, the reason and the period, so a replica elected
// later finds the Event its predecessor recorded (AlreadyExists) instead of
// recording it again, with no permission to read Events. After the API
// server's event TTL (1h by default) has removed it, a newly elected replica
// records it once more.
type Recorder struct {
	// Reader reads AddonInstances: the manager's cache (the webhook's role
	// has list and watch on them, no get).
	Reader client.Reader
	// Client creates the Events.
	Client client.Client
	// Instance is the reporting instance: the webhook's pod name.
	Instance string
	Log      logr.Logger

	// recorded is, per AddonInstance, the UID and period of the last Event
	// recorded. Reconciles run one at a time (the controller's default), so
	// it needs no lock.
	recorded map[types.NamespacedName]recordedPeriod
}

type recordedPeriod struct {
	uid    types.UID
	period string
}

// SetupWithManager runs the Recorder as a controller of mgr, on the elected
// replica. Creations, deletions and spec changes reach it (the CRD has a
// status subresource, so only spec changes move the generation).
func (r *Recorder) SetupWithManager(mgr ctrl.Manager) error {
	r.recorded = map[types.NamespacedName]recordedPeriod{}
	return ctrl.NewControllerManagedBy(mgr).
		Named("addoninstance-period").
		// Status writes (every heartbeat) leave the generation as it is.
		For(&Object{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Complete(r)
}

// Reconcile records the Event the AddonInstance's period deserves, unless
// it was recorded for this period already.
func (r *Recorder) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	o := &Object{}
	if err := r.Reader.Get(ctx, req.NamespacedName, o); err != nil {
		if apierrors.IsNotFound(err) {
			delete(r.recorded, req.NamespacedName)
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, fmt.Errorf("reading AddonInstance %s: %w", req.NamespacedName, err)
	}
	in := FromObject(o)
	f, bad := Check(in)
	if !bad {
		delete(r.recorded, req.NamespacedName)
		return reconcile.Result{}, nil
	}
	if prev, ok := r.recorded[req.NamespacedName]; ok && prev == (recordedPeriod{in.UID, in.Period}) {
		return reconcile.Result{}, nil
	}
	ev := Event(in, f, r.Instance, time.Now())
	switch err := r.Client.Create(ctx, ev); {
	case apierrors.IsAlreadyExists(err):
		// Recorded by this replica before a restart, or by another one.
	case err != nil:
		return reconcile.Result{}, fmt.Errorf("recording Event %s on AddonInstance %s: %w", f.Reason, req.NamespacedName, err)
	default:
		r.Log.Info("recorded an Event on the AddonInstance", "addonInstance", req.NamespacedName.String(),
			"reason", f.Reason, "heartbeatUpdatePeriod", quoted(in.Period))
	}
	r.recorded[req.NamespacedName] = recordedPeriod{in.UID, in.Period}
	return reconcile.Result{}, nil
}

// Event is the Warning Event f on in, reported by instance at now. Its name
// is the AddonInstance's name and a hash of its UID, the reason and the
// period: the same finding always has the same name.
func Event(in Instance, f Finding, instance string, now time.Time) *eventsv1.Event {
	sum := sha256.Sum256([]byte(string(in.UID) + "\x00" + f.Reason + "\x00" + in.Period))
	// An AddonInstance's name is a DNS subdomain of at most 253 characters;
	// the suffix takes 17.
	prefix := strings.TrimRight(in.Name[:min(len(in.Name), 253-17)], ".-")
	if len(instance) > maxReportingInstance {
		instance = instance[:maxReportingInstance]
	}
	return &eventsv1.Event{
		ObjectMeta:          metav1.ObjectMeta{Namespace: in.Namespace, Name: prefix + "." + hex.EncodeToString(sum[:8])},
		EventTime:           metav1.NewMicroTime(now),
		ReportingController: ReportingController,
		ReportingInstance:   instance,
		Action:              eventAction,
		Reason:              f.Reason,
		Type:                corev1.EventTypeWarning,
		Note:                f.Note,
		Regarding: corev1.ObjectReference{
			APIVersion: GVK.GroupVersion().String(), Kind: GVK.Kind,
			Namespace: in.Namespace, Name: in.Name, UID: in.UID,
		},
	}
}
