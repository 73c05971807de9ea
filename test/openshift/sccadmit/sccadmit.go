// Package sccadmit runs OpenShift's own Security Context Constraints admission plugin
// (github.com/openshift/apiserver-library-go/pkg/securitycontextconstraints/sccadmission)
// on core/v1 Pods, outside an OpenShift API server.
//
// Nothing of the SCC logic is re-implemented here: the plugin itself orders the SCCs by
// priority and restrictiveness, asks the authorizer which of them the pod's ServiceAccount
// or the requesting user may "use", fills the pre-allocated values (UID range, MCS level,
// groups) from the namespace annotations, assigns the pod and container security contexts
// and validates them. This package only supplies what an API server would: the SCC and
// Namespace informers, an authorizer, the conversion to the internal Pod type, and the two
// admission phases (mutating Admit, then validating Validate).
package sccadmit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	securityv1 "github.com/openshift/api/security/v1"
	"github.com/openshift/apiserver-library-go/pkg/securitycontextconstraints/sccadmission"
	securityfake "github.com/openshift/client-go/security/clientset/versioned/fake"
	securityinformers "github.com/openshift/client-go/security/informers/externalversions"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	coreapi "k8s.io/kubernetes/pkg/apis/core"
	_ "k8s.io/kubernetes/pkg/apis/core/install" // registers core/v1 <-> internal conversions and defaults
)

// Grants says whether the pods of namespace ns may use the SCC named scc. On OpenShift this
// is RBAC: the "use" verb on securitycontextconstraints, e.g. restricted-v2 through the
// ClusterRoleBinding system:openshift:scc:restricted-v2 to system:authenticated.
type Grants func(scc string, ns *corev1.Namespace) bool

// GrantOnly grants the named SCCs in every namespace.
func GrantOnly(names ...string) Grants {
	return func(scc string, _ *corev1.Namespace) bool { return slices.Contains(names, scc) }
}

// Admitter admits pods the way OpenShift's kube-apiserver does for a pod CREATE.
type Admitter struct {
	plugin interface {
		admission.MutationInterface
		admission.ValidationInterface
	}
}

// New starts the informers the plugin needs (SCCs from sccs, Namespaces from kube) and
// returns once they are synced. They stop with ctx.
func New(ctx context.Context, sccs []*securityv1.SecurityContextConstraints, kube kubernetes.Interface, grants Grants) (*Admitter, error) {
	// The SCCs are static (files, not an OpenShift API server), so a fake clientset serves
	// them to a real informer: the plugin reads them through its lister as in a cluster.
	// They are added with their resource named: NewClientset(objs...) would guess it from the
	// kind as "securitycontextconstraintses", and the informer would list none.
	sccClient := securityfake.NewClientset()
	sccResource := securityv1.GroupVersion.WithResource("securitycontextconstraints")
	for _, scc := range sccs {
		if err := sccClient.Tracker().Create(sccResource, scc.DeepCopy(), ""); err != nil {
			return nil, fmt.Errorf("adding SCC %s: %w", scc.Name, err)
		}
	}
	sccFactory := securityinformers.NewSharedInformerFactory(sccClient, 0)
	kubeFactory := informers.NewSharedInformerFactory(kube, 0)
	namespaces := kubeFactory.Core().V1().Namespaces().Lister()

	plugin := sccadmission.NewConstraint()
	plugin.SetSecurityInformers(sccFactory.Security().V1().SecurityContextConstraints())
	plugin.SetExternalKubeInformerFactory(kubeFactory)
	plugin.SetAuthorizer(sccAuthorizer(namespaces, grants))
	if err := plugin.ValidateInitialization(); err != nil {
		return nil, fmt.Errorf("initializing the SCC admission plugin: %w", err)
	}

	sccFactory.Start(ctx.Done())
	kubeFactory.Start(ctx.Done())
	for typ, ok := range sccFactory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return nil, fmt.Errorf("informer for %v did not sync", typ)
		}
	}
	for typ, ok := range kubeFactory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return nil, fmt.Errorf("informer for %v did not sync", typ)
		}
	}
	return &Admitter{plugin: plugin}, nil
}

// sccAuthorizer answers the plugin's "may this subject use SCC x in namespace y" questions
// (the only ones it asks) from grants.
func sccAuthorizer(namespaces corev1listers.NamespaceLister, grants Grants) authorizer.Authorizer {
	return authorizer.AuthorizerFunc(func(_ context.Context, a authorizer.Attributes) (authorizer.Decision, string, error) {
		if a.GetVerb() != "use" || a.GetAPIGroup() != securityv1.GroupName || a.GetResource() != "securitycontextconstraints" {
			return authorizer.DecisionNoOpinion, "", nil
		}
		ns, err := namespaces.Get(a.GetNamespace())
		if err != nil {
			return authorizer.DecisionNoOpinion, "", fmt.Errorf("reading namespace %q: %w", a.GetNamespace(), err)
		}
		if grants(a.GetName(), ns) {
			return authorizer.DecisionAllow, "granted", nil
		}
		return authorizer.DecisionNoOpinion, "", nil
	})
}

// ErrRefused wraps the plugin's refusal, whose text is OpenShift's own:
// `pods "x" is forbidden: unable to validate against any security context constraint: [...]`.
var ErrRefused = errors.New("refused by SCC admission")

// Admit runs the SCC plugin's mutating phase on a pod CREATE, then its validating phase on
// the result, as the API server does (the validating phase sees the pod after every mutating
// admission). pod must already carry the API server's defaults and its namespace; it is not
// changed. The returned pod has the security contexts the chosen SCC assigned and the
// openshift.io/scc annotation naming that SCC. A refusal is returned as an error wrapping
// ErrRefused; other errors (an unknown namespace, a conversion failure) are not.
func (a *Admitter) Admit(ctx context.Context, pod *corev1.Pod, requester user.Info) (*corev1.Pod, error) {
	internal := &coreapi.Pod{}
	if err := legacyscheme.Scheme.Convert(pod.DeepCopy(), internal, nil); err != nil {
		return nil, fmt.Errorf("converting pod to the internal type: %w", err)
	}
	attrs := admission.NewAttributesRecord(internal, nil, coreapi.Kind("Pod").WithVersion(""), pod.Namespace,
		pod.Name, coreapi.Resource("pods").WithVersion(""), "", admission.Create, nil, false, requester)

	if err := a.plugin.Admit(ctx, attrs, nil); err != nil {
		return nil, refusal(err)
	}
	if err := a.plugin.Validate(ctx, attrs, nil); err != nil {
		return nil, refusal(err)
	}

	out := &corev1.Pod{}
	if err := legacyscheme.Scheme.Convert(internal, out, nil); err != nil {
		return nil, fmt.Errorf("converting the admitted pod back to core/v1: %w", err)
	}
	return out, nil
}

// refusal tells the plugin's verdict (a Forbidden that carries the SCC errors) apart from its
// failures to run (e.g. "error fetching namespace", also returned as Forbidden, but not a verdict
// on the pod's security contexts).
func refusal(err error) error {
	if strings.Contains(err.Error(), verdictText) {
		return fmt.Errorf("%w: %w", ErrRefused, err)
	}
	return fmt.Errorf("running SCC admission: %w", err)
}

// Verdict returns the SCC text of a refusal, from "unable to validate against any security
// context constraint: [...]" on, without the `pods "x" is forbidden: ` the API server puts
// before it; "" if err is no refusal.
func Verdict(err error) string {
	if !errors.Is(err, ErrRefused) {
		return ""
	}
	msg := err.Error()
	if i := strings.Index(msg, verdictText); i >= 0 {
		return msg[i:]
	}
	return msg
}

const verdictText = "unable to validate against any security context constraint"

// Namespace returns a namespace annotated as OpenShift's namespace controller annotates a
// project: a UID range, the same block for groups (OpenShift writes both from one allocation)
// and an MCS label. restricted-v2 takes runAsUser's range and fsGroup from them.
func Namespace(name string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{
		securityv1.UIDRangeAnnotation:           "1000650000/10000",
		securityv1.SupplementalGroupsAnnotation: "1000650000/10000",
		securityv1.MCSAnnotation:                "s0:c26,c5",
	}}}
}
