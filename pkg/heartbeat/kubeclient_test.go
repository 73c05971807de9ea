//go:build go1.25

package heartbeat

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/watch"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	addonsv1alpha1 "github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/internal/addonsv1alpha1"
)

// testClient is the tests' own client for the few kinds they handle, in the
// shape of controller-runtime's (Create, Get, Update, Delete,
// Status().Update): the SDK's module requires no controller-runtime, for its
// tests either, so that a module requiring the SDK keeps its own.
type testClient struct {
	scheme  *runtime.Scheme
	clients map[schema.GroupVersion]*rest.RESTClient
}

// object is what the tests create, read and write.
type object interface {
	metav1.Object
	runtime.Object
}

// testResources names the resource of each kind the tests use, and whether
// it is namespaced.
var testResources = map[schema.GroupVersionKind]struct {
	resource   string
	namespaced bool
}{
	{Version: "v1", Kind: "Namespace"}:                                       {"namespaces", false},
	{Version: "v1", Kind: "ServiceAccount"}:                                  {"serviceaccounts", true},
	{Group: "apps", Version: "v1", Kind: "Deployment"}:                       {"deployments", true},
	{Group: "coordination.k8s.io", Version: "v1", Kind: "Lease"}:             {"leases", true},
	{Group: "rbac.authorization.k8s.io", Version: "v1", Kind: "Role"}:        {"roles", true},
	{Group: "rbac.authorization.k8s.io", Version: "v1", Kind: "RoleBinding"}: {"rolebindings", true},
	addonsv1alpha1.GroupVersion.WithKind("AddonInstance"):                    {"addoninstances", true},
}

func newTestClient(cfg *rest.Config) (*testClient, error) {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(addonsv1alpha1.AddToScheme(s))
	c := &testClient{scheme: s, clients: map[schema.GroupVersion]*rest.RESTClient{}}
	for gvk := range testResources {
		gv := gvk.GroupVersion()
		if c.clients[gv] != nil {
			continue
		}
		gc := rest.CopyConfig(cfg)
		gc.GroupVersion = &gv
		gc.APIPath = "/apis"
		if gv.Group == "" {
			gc.APIPath = "/api"
		}
		gc.NegotiatedSerializer = serializer.NewCodecFactory(s).WithoutConversion()
		rc, err := rest.RESTClientFor(gc)
		if err != nil {
			return nil, err
		}
		c.clients[gv] = rc
	}
	return c, nil
}

// request starts a request for obj's resource, in its namespace.
func (c *testClient) request(obj runtime.Object, verb func(*rest.RESTClient) *rest.Request, ns string) (*rest.Request, error) {
	gvks, _, err := c.scheme.ObjectKinds(obj)
	if err != nil {
		return nil, err
	}
	res, ok := testResources[gvks[0]]
	if !ok {
		return nil, fmt.Errorf("testClient: no resource for %s", gvks[0])
	}
	req := verb(c.clients[gvks[0].GroupVersion()]).Resource(res.resource)
	if res.namespaced {
		req = req.Namespace(ns)
	}
	return req, nil
}

func (c *testClient) Create(ctx context.Context, obj object) error {
	req, err := c.request(obj, (*rest.RESTClient).Post, obj.GetNamespace())
	if err != nil {
		return err
	}
	return req.Body(obj).Do(ctx).Into(obj)
}

func (c *testClient) Get(ctx context.Context, key types.NamespacedName, obj object) error {
	req, err := c.request(obj, (*rest.RESTClient).Get, key.Namespace)
	if err != nil {
		return err
	}
	return req.Name(key.Name).Do(ctx).Into(obj)
}

func (c *testClient) Update(ctx context.Context, obj object) error {
	req, err := c.request(obj, (*rest.RESTClient).Put, obj.GetNamespace())
	if err != nil {
		return err
	}
	return req.Name(obj.GetName()).Body(obj).Do(ctx).Into(obj)
}

func (c *testClient) Delete(ctx context.Context, obj object) error {
	req, err := c.request(obj, (*rest.RESTClient).Delete, obj.GetNamespace())
	if err != nil {
		return err
	}
	return req.Name(obj.GetName()).Do(ctx).Error()
}

// Status is the status subresource's writer.
func (c *testClient) Status() statusWriter { return statusWriter{c} }

type statusWriter struct{ c *testClient }

// fieldOwner is a status write's field manager.
type fieldOwner string

func (w statusWriter) Update(ctx context.Context, obj object, owner ...fieldOwner) error {
	req, err := w.c.request(obj, (*rest.RESTClient).Put, obj.GetNamespace())
	if err != nil {
		return err
	}
	req = req.Name(obj.GetName()).SubResource("status")
	for _, o := range owner {
		req = req.Param("fieldManager", string(o))
	}
	return req.Body(obj).Do(ctx).Into(obj)
}

// watchInstance watches the AddonInstance named key.
func (c *testClient) watchInstance(ctx context.Context, key types.NamespacedName) (watch.Interface, error) {
	req, err := c.request(&addonsv1alpha1.AddonInstance{}, (*rest.RESTClient).Get, key.Namespace)
	if err != nil {
		return nil, err
	}
	return req.VersionedParams(&metav1.ListOptions{
		Watch:         true,
		FieldSelector: fields.OneTermEqualSelector("metadata.name", key.Name).String(),
	}, metav1.ParameterCodec).Watch(ctx)
}

// keyOf is obj's namespace and name.
func keyOf(obj metav1.Object) types.NamespacedName {
	return types.NamespacedName{Namespace: obj.GetNamespace(), Name: obj.GetName()}
}
