package localcluster

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/addon-heartbeat/addon-heartbeat/internal/admission"
	"github.com/addon-heartbeat/addon-heartbeat/internal/chart"
	"github.com/addon-heartbeat/addon-heartbeat/internal/gctune"
)

// Webhook is the webhook binary running locally, installed from the chart.
type Webhook struct {
	*Process
	bin        string
	args       []string
	env        []string
	Port       int
	HealthPort int
	MetricsURL string
	// Configuration is the chart's MutatingWebhookConfiguration as installed.
	Configuration string
}

// WebhookOptions are what the local install changes from the chart's
// defaults.
type WebhookOptions struct {
	// Values override the chart's values.
	Values map[string]any
	// ReporterImage is the injected reporter's image.
	ReporterImage string
	// DropFlags are chart args (by flag name, "--name") left out: for
	// running a build from before the chart gave them, to compare builds.
	DropFlags []string
}

// Kinds of the chart that a local install applies; the webhook Deployment,
// its Service and PodDisruptionBudget are replaced by the local process.
var localKinds = []string{"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ServiceAccount", "MutatingWebhookConfiguration"}

// InstallWebhook renders the chart (default release, self-managed
// certificates unless the values say otherwise), applies its RBAC and its
// MutatingWebhookConfiguration with the clientConfig pointed at a local URL,
// and runs the webhook binary with exactly the chart's container args plus
// loopback addresses, the kubeconfig and a certificate name for 127.0.0.1.
// The webhook then creates its CA, fills the configuration's caBundle and
// reports ready once it serves, as in a cluster.
func (c *Cluster) InstallWebhook(ctx context.Context, bin string, o WebhookOptions, tee io.Writer) (*Webhook, error) {
	rel := chart.DefaultRelease
	objs, _, err := chart.Render(rel, o.Values)
	if err != nil {
		return nil, err
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: rel.Namespace}}
	if err := c.Client.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("creating namespace %s: %w", rel.Namespace, err)
	}

	var ports [3]int
	for i := range ports {
		if ports[i], err = FreePort(); err != nil {
			return nil, err
		}
	}
	w := &Webhook{bin: bin, Port: ports[0], HealthPort: ports[1], MetricsURL: "http://127.0.0.1:" + strconv.Itoa(ports[2]) + "/metrics"}

	var dep *appsv1.Deployment
	for _, obj := range objs {
		switch kind := obj.GetKind(); {
		case kind == "Deployment":
			dep = &appsv1.Deployment{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, dep); err != nil {
				return nil, fmt.Errorf("reading the chart's Deployment: %w", err)
			}
		case kind == "MutatingWebhookConfiguration":
			mwc, err := localWebhookConfiguration(obj, w.Port)
			if err != nil {
				return nil, err
			}
			if err := c.Client.Create(ctx, mwc); err != nil {
				return nil, fmt.Errorf("creating the webhook configuration: %w", err)
			}
			w.Configuration = mwc.Name
		case slices.Contains(localKinds, kind):
			if err := c.Client.Create(ctx, obj.DeepCopy()); err != nil && !apierrors.IsAlreadyExists(err) {
				return nil, fmt.Errorf("creating %s: %w", chart.Key(obj), err)
			}
		}
	}
	if dep == nil || len(dep.Spec.Template.Spec.Containers) == 0 {
		return nil, fmt.Errorf("the chart renders no webhook Deployment")
	}
	var args []string
	for _, a := range dep.Spec.Template.Spec.Containers[0].Args {
		name, _, _ := strings.Cut(a, "=")
		if !slices.Contains(o.DropFlags, name) {
			args = append(args, strings.ReplaceAll(a, "$(POD_NAMESPACE)", rel.Namespace))
		}
	}
	args = append(args,
		"--kubeconfig="+c.Kubeconfig,
		"--bind-host=127.0.0.1",
		"--port="+strconv.Itoa(ports[0]),
		"--health-probe-bind-address=127.0.0.1:"+strconv.Itoa(ports[1]),
		"--metrics-bind-address=127.0.0.1:"+strconv.Itoa(ports[2]),
		"--cert-dns-names=127.0.0.1,localhost",
	)
	if o.ReporterImage != "" {
		args = append(args, "--reporter-image="+o.ReporterImage)
	}
	w.args, w.env = args, memoryLimitEnv(dep)
	p, err := StartProcess("webhook", filepath.Join(c.Dir, "webhook.log"), bin, args, w.env, tee)
	if err != nil {
		return nil, err
	}
	w.Process = p
	if err := WaitReady(ctx, p, "http://127.0.0.1:"+strconv.Itoa(w.HealthPort)+"/readyz"); err != nil {
		_ = p.Stop(5 * time.Second)
		return nil, err
	}
	if err := c.waitCABundle(ctx, w.Configuration); err != nil {
		_ = p.Stop(5 * time.Second)
		return nil, err
	}
	return w, nil
}

// memoryLimitEnv gives the process the soft memory limit that the chart's
// memory limit gives the container (see internal/gctune), which a process
// outside a container does not get from its cgroup.
func memoryLimitEnv(dep *appsv1.Deployment) []string {
	limit := dep.Spec.Template.Spec.Containers[0].Resources.Limits.Memory().Value()
	if limit <= 0 {
		return nil
	}
	return []string{"GOMEMLIMIT=" + strconv.FormatInt(gctune.SoftLimit(limit), 10)}
}

// localWebhookConfiguration is the chart's configuration with every webhook
// sent to the local server instead of the in-cluster Service.
func localWebhookConfiguration(obj *unstructured.Unstructured, port int) (*admissionregistrationv1.MutatingWebhookConfiguration, error) {
	var mwc admissionregistrationv1.MutatingWebhookConfiguration
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, &mwc); err != nil {
		return nil, fmt.Errorf("reading the chart's webhook configuration: %w", err)
	}
	for i := range mwc.Webhooks {
		cc := &mwc.Webhooks[i].ClientConfig
		path := admission.Path
		if cc.Service != nil && cc.Service.Path != nil {
			path = *cc.Service.Path
		}
		url := fmt.Sprintf("https://127.0.0.1:%d%s", port, path)
		cc.URL, cc.Service = &url, nil
	}
	return &mwc, nil
}

func (c *Cluster) waitCABundle(ctx context.Context, name string) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		var mwc admissionregistrationv1.MutatingWebhookConfiguration
		if err := c.Client.Get(ctx, client.ObjectKey{Name: name}, &mwc); err != nil {
			return false, nil
		}
		return len(mwc.Webhooks) > 0 && len(mwc.Webhooks[0].ClientConfig.CABundle) > 0, nil
	})
	if err != nil {
		return fmt.Errorf("the webhook never filled the caBundle of %s: %w", name, err)
	}
	return nil
}

// Restart starts the webhook again after Stop, with the same flags; its CA
// and certificate come back from their Secret.
func (w *Webhook) Restart(ctx context.Context) error {
	if exited, _ := w.Exited(); !exited {
		return fmt.Errorf("the webhook is still running (pid %d)", w.Pid())
	}
	p, err := StartProcess(w.Name, w.LogPath, w.bin, w.args, w.env, nil)
	if err != nil {
		return err
	}
	w.Process = p
	return WaitReady(ctx, p, "http://127.0.0.1:"+strconv.Itoa(w.HealthPort)+"/readyz")
}

// Metric scrapes the webhook's /metrics and sums the samples of name.
func (w *Webhook) Metric(name string) (float64, error) { return scrapeSum(w.MetricsURL, name) }
