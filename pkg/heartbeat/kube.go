package heartbeat

import (
	"context"
	"fmt"
	"net/http"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"

	addonsv1alpha1 "github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/internal/addonsv1alpha1"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/election"
)

// kube is the Reporter's whole access to the API server: one REST client per
// API group it touches, over one HTTP client, with a scheme of exactly the
// kinds it reads and writes.
//
// It is built on client-go's REST client rather than controller-runtime's
// client on purpose: that client (and its cache) registers every built-in API
// group at start, which more than doubles the sidecar's binary and resident
// memory for three kinds.
type kube struct {
	addons *rest.RESTClient // addons.managed.openshift.io/v1alpha1 (a CRD: JSON only)
	apps   *rest.RESTClient // apps/v1, protobuf
	leases *rest.RESTClient // coordination.k8s.io/v1, protobuf
}

func newKube(cfg *rest.Config, httpClient *http.Client) (*kube, error) {
	scheme := runtime.NewScheme()
	utilruntime.Must(addonsv1alpha1.AddToScheme(scheme))
	utilruntime.Must(appsv1.AddToScheme(scheme))
	utilruntime.Must(coordinationv1.AddToScheme(scheme))
	codecs := serializer.NewCodecFactory(scheme)

	restClient := func(gv schema.GroupVersion, protobuf bool) (*rest.RESTClient, error) {
		c := rest.CopyConfig(cfg)
		c.GroupVersion = &gv
		c.APIPath = "/apis"
		c.NegotiatedSerializer = codecs.WithoutConversion()
		if protobuf {
			// Built-in kinds decode several times faster from protobuf.
			c.ContentType = runtime.ContentTypeProtobuf
			c.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
		} else {
			c.ContentType = runtime.ContentTypeJSON
			c.AcceptContentTypes = runtime.ContentTypeJSON
		}
		rc, err := rest.RESTClientForConfigAndClient(c, httpClient)
		if err != nil {
			return nil, fmt.Errorf("REST client for %s: %w", gv, err)
		}
		return rc, nil
	}
	var k kube
	var err error
	if k.addons, err = restClient(addonsv1alpha1.GroupVersion, false); err != nil {
		return nil, err
	}
	if k.apps, err = restClient(appsv1.SchemeGroupVersion, true); err != nil {
		return nil, err
	}
	if k.leases, err = restClient(coordinationv1.SchemeGroupVersion, true); err != nil {
		return nil, err
	}
	return &k, nil
}

// getInstance reads the AddonInstance from the API server.
func (k *kube) getInstance(ctx context.Context, key types.NamespacedName) (*addonsv1alpha1.AddonInstance, error) {
	ai := &addonsv1alpha1.AddonInstance{}
	err := k.addons.Get().Namespace(key.Namespace).Resource("addoninstances").Name(key.Name).Do(ctx).Into(ai)
	return ai, err
}

// updateInstanceStatus writes ai's status against its resourceVersion.
func (k *kube) updateInstanceStatus(ctx context.Context, ai *addonsv1alpha1.AddonInstance) error {
	return k.addons.Put().Namespace(ai.Namespace).Resource("addoninstances").Name(ai.Name).SubResource("status").
		Param("fieldManager", FieldManager).Body(ai).Do(ctx).Into(ai)
}

// version asks the API server for its version (GET /version, which every
// client may read): the cheapest request there is, for the Date of its
// answer (see serverClock.probeAt).
func (k *kube) version(ctx context.Context) error {
	return k.leases.Get().AbsPath("/version").Do(ctx).Error()
}

// resyncCheck is how often the informers' reflectors ask whether a handler
// wants a resync. None does (handlers are added with a resync period of 0),
// so the check finds nothing to do; it is set only because with a period of
// 0 client-go before v0.36 waits on one channel made at package init, which
// testing/synctest (the election simulation, run here with the SDK's oldest
// client-go, v0.30) cannot tell from a goroutine that may still wake, so
// simulated time never advanced.
const resyncCheck = 12 * time.Hour

// instanceInformer watches the one AddonInstance (a field selector on its
// name, so that RBAC can restrict list and watch with resourceNames).
func (k *kube) instanceInformer(key types.NamespacedName) toolscache.SharedIndexInformer {
	lw := toolscache.NewListWatchFromClient(k.addons, "addoninstances", key.Namespace,
		fields.OneTermEqualSelector("metadata.name", key.Name))
	return toolscache.NewSharedIndexInformerWithOptions(lw, &addonsv1alpha1.AddonInstance{},
		toolscache.SharedIndexInformerOptions{ObjectDescription: "AddonInstance " + key.String(), ResyncPeriod: resyncCheck})
}

// deploymentInformer watches the Deployments of namespace, trimmed to what
// health reads before they are stored.
func (k *kube) deploymentInformer(namespace string) (toolscache.SharedIndexInformer, error) {
	lw := toolscache.NewListWatchFromClient(k.apps, "deployments", namespace, fields.Everything())
	inf := toolscache.NewSharedIndexInformerWithOptions(lw, &appsv1.Deployment{},
		toolscache.SharedIndexInformerOptions{ObjectDescription: "Deployments in " + namespace, ResyncPeriod: resyncCheck})
	if err := inf.SetTransform(TrimDeployment); err != nil {
		return nil, fmt.Errorf("trimming Deployments: %w", err)
	}
	return inf, nil
}

// leaseKey is the election Lease of the AddonInstance named instance.
func leaseKey(namespace, instance string) types.NamespacedName {
	return types.NamespacedName{Namespace: namespace, Name: election.LeaseName(instance)}
}
