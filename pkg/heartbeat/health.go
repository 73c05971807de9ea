package heartbeat

import (
	"cmp"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/annotations"
)

// Reasons the reporter writes on the Degraded condition.
const (
	ReasonAllComponentsAvailable        = "AllComponentsAvailable"
	ReasonDeploymentUnavailable         = "DeploymentUnavailable"
	ReasonHealthCheckFailed             = "HealthCheckFailed"
	ReasonNoComponents                  = "NoComponents"
	ReasonMultipleComponentsUnavailable = "MultipleComponentsUnavailable"
	// ReasonComponentUnavailable is the default for an unavailable
	// component reported with SetHealth without a reason.
	ReasonComponentUnavailable = "ComponentUnavailable"
)

// HealthURLComponent names the health URL check among the components.
const HealthURLComponent = "health-url"

// Component is the health of one part of an addon: a Deployment, the health
// URL, or whatever an addon reports with SetHealth.
type Component struct {
	// Name identifies the component; components are reported sorted by it.
	Name string
	// Available is true when the component works.
	Available bool
	// Reason is a CamelCase reason for the Degraded condition when the
	// component is unavailable.
	Reason string
	// Message says what is wrong (or right) in a few words and names the
	// component, for example "addon-operator 1/3 available".
	Message string
}

// DeploymentComponent judges one Deployment: it is available when its
// Available condition is True, status.availableReplicas >= spec.replicas
// (nil replicas counts as 1), and the controller has observed its latest
// generation. The message counts available replicas, for example
// "addon-operator 1/3 available", and says what else is wrong when the count
// alone does not explain it.
func DeploymentComponent(d *appsv1.Deployment) Component {
	want := int32(1)
	if d.Spec.Replicas != nil {
		want = *d.Spec.Replicas
	}
	c := Component{Name: d.Name, Reason: ReasonDeploymentUnavailable,
		Message: fmt.Sprintf("%s %d/%d available", d.Name, d.Status.AvailableReplicas, want)}
	enough := d.Status.AvailableReplicas >= want
	var why []string
	switch cond := deploymentCondition(d, appsv1.DeploymentAvailable); {
	case cond == nil:
		why = append(why, "no Available condition")
	case cond.Status != corev1.ConditionTrue:
		why = append(why, fmt.Sprintf("Available=%s (%s)", cond.Status, cond.Reason))
	}
	if d.Status.ObservedGeneration < d.Generation {
		why = append(why, fmt.Sprintf("generation %d not yet observed", d.Generation))
	}
	c.Available = enough && len(why) == 0
	if enough && len(why) > 0 {
		c.Message += ", but " + strings.Join(why, ", ")
	}
	return c
}

func deploymentCondition(d *appsv1.Deployment, t appsv1.DeploymentConditionType) *appsv1.DeploymentCondition {
	for i := range d.Status.Conditions {
		if d.Status.Conditions[i].Type == t {
			return &d.Status.Conditions[i]
		}
	}
	return nil
}

// InjectedFor reports whether a Deployment, by its settings (see
// annotations.OfDeployment), is one of the components of the AddonInstance
// named instance: it opts in to injection and names that AddonInstance (or
// none, meaning the default), in any of the places a setting can be written.
// Settings the webhook would deny count as no opt-in.
func InjectedFor(src annotations.Sources, instance string) bool {
	s, err := annotations.Parse(src)
	return err == nil && s.Inject && s.AddonInstance == instance
}

// DeploymentComponents judges the Deployments of namespace that are injected
// for instance, sorted by name. When there are none, it returns one
// unavailable component with reason NoComponents, because an addon whose
// sidecar runs always has at least its own Deployment.
func DeploymentComponents(deps []appsv1.Deployment, namespace, instance string) []Component {
	var out []Component
	for i := range deps {
		if InjectedFor(annotations.OfDeployment(&deps[i]), instance) {
			out = append(out, DeploymentComponent(&deps[i]))
		}
	}
	if len(out) == 0 {
		return []Component{{
			Name:    "deployments",
			Reason:  ReasonNoComponents,
			Message: fmt.Sprintf("no Deployment in namespace %s is injected for AddonInstance %s", namespace, instance),
		}}
	}
	slices.SortFunc(out, func(a, b Component) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// TrimDeployment is the Deployment cache's transform: it keeps only what
// DeploymentComponent and InjectedFor read (name, generation, the settings
// keys wherever they are written, spec.replicas, status), dropping the pod
// template and managedFields that make up most of a Deployment's size.
func TrimDeployment(obj any) (any, error) {
	d, ok := obj.(*appsv1.Deployment)
	if !ok {
		return obj, nil
	}
	keys := annotations.OfDeployment(d).Keys()
	t := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{
			Name:            d.Name,
			Namespace:       d.Namespace,
			UID:             d.UID,
			ResourceVersion: d.ResourceVersion,
			Generation:      d.Generation,
			Annotations:     keys.Annotations,
			Labels:          keys.Labels,
		},
		Spec:   appsv1.DeploymentSpec{Replicas: d.Spec.Replicas},
		Status: d.Status,
	}
	t.Spec.Template.Annotations = keys.TemplateAnnotations
	return t, nil
}

// healthChecker calls the pod-local health URL the way a kubelet HTTP probe
// does: a GET, 2xx and 3xx are healthy, redirects are not followed (so the
// check can never leave the loopback host), and the certificate of an https
// endpoint is not verified (pod-local endpoints usually serve self-signed
// certificates; the URL is restricted to loopback hosts).
type healthChecker struct {
	url    string
	client *http.Client
}

func newHealthChecker(url string) *healthChecker {
	return &healthChecker{url: url, client: &http.Client{
		Transport: &http.Transport{
			Proxy:               nil,
			TLSClientConfig:     &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // loopback only, as kubelet probes
			MaxIdleConns:        1,
			MaxIdleConnsPerHost: 1,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
}

func (h *healthChecker) check(ctx context.Context) Component {
	c := Component{Name: HealthURLComponent, Reason: ReasonHealthCheckFailed}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, h.url, nil)
	if err != nil {
		c.Message = fmt.Sprintf("health check %s: %v", h.url, err)
		return c
	}
	resp, err := h.client.Do(req)
	if err != nil {
		c.Message = fmt.Sprintf("health check %s: %v", h.url, err)
		return c
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	_ = resp.Body.Close()
	c.Available = resp.StatusCode >= 200 && resp.StatusCode < 400
	c.Message = fmt.Sprintf("health check %s returned %s", h.url, resp.Status)
	return c
}

func (h *healthChecker) close() {
	h.client.CloseIdleConnections()
}
