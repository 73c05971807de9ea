package localcluster

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strconv"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/inject"
)

// Invocation is how a container would be started: its command, args and env
// with downward-API values resolved for one pod.
type Invocation struct {
	Command []string
	Args    []string
	Env     []string
}

// ReporterInvocation returns the injected reporter's invocation in a pod of
// d named podName, resolving the downward-API fields the injector uses. It
// fails for any env source a local process cannot resolve.
func ReporterInvocation(d *appsv1.Deployment, podName string) (Invocation, error) {
	spec := d.Spec.Template.Spec
	all := slices.Concat(spec.InitContainers, spec.Containers)
	i := slices.IndexFunc(all, func(c corev1.Container) bool { return c.Name == inject.ContainerName })
	if i < 0 {
		return Invocation{}, fmt.Errorf("deployment %s/%s has no %s container", d.Namespace, d.Name, inject.ContainerName)
	}
	c := all[i]
	inv := Invocation{Command: c.Command, Args: c.Args}
	for _, e := range c.Env {
		v := e.Value
		if e.ValueFrom != nil {
			if e.ValueFrom.FieldRef == nil {
				return Invocation{}, fmt.Errorf("env %s: only downward-API fieldRefs can be resolved locally", e.Name)
			}
			switch e.ValueFrom.FieldRef.FieldPath {
			case "metadata.namespace":
				v = d.Namespace
			case "metadata.name":
				v = podName
			default:
				return Invocation{}, fmt.Errorf("env %s: field %s cannot be resolved locally", e.Name, e.ValueFrom.FieldRef.FieldPath)
			}
		}
		inv.Env = append(inv.Env, e.Name+"="+v)
	}
	return inv, nil
}

// Reporter is a reporter binary running locally as if in one addon pod.
type Reporter struct {
	*Process
	HealthPort  int
	MetricsPort int
	Invocation  Invocation
}

// StartReporter runs bin with exactly the injected args and env of d's
// reporter, as pod podName, with the identity of the pod's ServiceAccount: a
// kubeconfig holding a token for it (a local process has no projected
// token), so the reporter has exactly the RBAC the webhook provisioned.
// Loopback addresses are added for its probe and metrics servers, which on
// this machine must not listen on every interface; the flag parser takes the
// last value of a flag.
func (c *Cluster) StartReporter(ctx context.Context, bin string, d *appsv1.Deployment, podName string, tee io.Writer) (*Reporter, error) {
	inv, err := ReporterInvocation(d, podName)
	if err != nil {
		return nil, err
	}
	kubeconfig, err := c.ServiceAccountKubeconfig(ctx, d.Namespace, serviceAccountOf(d))
	if err != nil {
		return nil, err
	}
	health, err := FreePort()
	if err != nil {
		return nil, err
	}
	metrics, err := FreePort()
	if err != nil {
		return nil, err
	}
	args := slices.Concat(inv.Args, []string{
		"--health-probe-bind-address=127.0.0.1:" + strconv.Itoa(health),
		"--metrics-bind-address=127.0.0.1:" + strconv.Itoa(metrics),
	})
	env := append(slices.Clone(inv.Env), "KUBECONFIG="+kubeconfig)
	p, err := StartProcess("reporter "+podName, filepath.Join(c.Dir, "reporter-"+podName+".log"), bin, args, env, tee)
	if err != nil {
		return nil, err
	}
	return &Reporter{Process: p, HealthPort: health, MetricsPort: metrics, Invocation: inv}, nil
}

// Metric scrapes the reporter's /metrics and sums the samples of name.
func (r *Reporter) Metric(name string) (float64, error) {
	return scrapeSum("http://127.0.0.1:"+strconv.Itoa(r.MetricsPort)+"/metrics", name)
}

func serviceAccountOf(d *appsv1.Deployment) string {
	if sa := d.Spec.Template.Spec.ServiceAccountName; sa != "" {
		return sa
	}
	return "default"
}
