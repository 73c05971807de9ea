// Package demo is `make demo`: the whole path on a real local control plane.
// It builds the binaries, starts etcd and kube-apiserver, runs the webhook,
// applies the example addon (which has no heartbeat code), shows what was
// injected, runs the reporter with exactly the injected command and env, and
// prints the heartbeats as they arrive.
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	addonsv1alpha1 "github.com/openshift/addon-operator/apis/addons/v1alpha1"
	"github.com/pmezard/go-difflib/difflib"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/yaml"

	"github.com/addon-heartbeat/addon-heartbeat/internal/localcluster"
	"github.com/addon-heartbeat/addon-heartbeat/internal/testenv"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/annotations"
)

// Options of the demo.
type Options struct {
	// Duration bounds the heartbeat part of the demo.
	Duration time.Duration
	// Period is the AddonInstance's heartbeatUpdatePeriod.
	Period time.Duration
	// Verbose also prints the processes' logs.
	Verbose bool
}

const (
	exampleDir    = "examples/basic-addon"
	reporterImage = "addon-heartbeat/reporter:demo"
	podName       = "my-addon-operator-7d9f8-demo"
)

// Run runs the demo, writing to out, until ctx is done or the duration ends.
// It stops every process it started and removes its files on every path.
func Run(ctx context.Context, o Options, out io.Writer) (err error) {
	d := &driver{out: out, o: o}
	var logs io.Writer
	if o.Verbose {
		logs = out
	}
	setLibraryLoggers(out, o.Verbose)

	d.step("Building kube-apiserver and etcd from the Go module proxy (about 15 minutes the first time; cached afterwards)")
	if err := localcluster.EnsureKubeBinaries(out); err != nil {
		return err
	}
	d.step("Starting etcd and kube-apiserver on 127.0.0.1, with the upstream AddonInstance CRD (addon-operator %s)", testenv.AddonOperatorVersion)
	cluster, err := localcluster.Start(ctx, localcluster.Options{})
	if err != nil {
		return err
	}
	defer func() {
		d.step("Stopping everything the demo started")
		err = errors.Join(err, cluster.Stop())
	}()
	d.note("kubeconfig: %s", cluster.Kubeconfig)

	d.step("Building the webhook and the reporter")
	bins, err := localcluster.Build(cluster.Dir, out, "./cmd/webhook", "./cmd/reporter")
	if err != nil {
		return err
	}

	d.step("Installing the chart's RBAC and webhook configuration (pointed at 127.0.0.1), and running the webhook with the chart's arguments")
	wh, err := cluster.InstallWebhook(ctx, bins["webhook"], localcluster.WebhookOptions{ReporterImage: reporterImage}, logs)
	if wh != nil {
		defer func() { err = errors.Join(err, wh.Stop(10*time.Second)) }()
	}
	if err != nil {
		return err
	}
	d.note("self-managed certificates: the webhook created its CA and filled the caBundle of %s itself", wh.Configuration)

	c := cluster.Client
	d.step("Applying %s: a namespace, a ServiceAccount, an AddonInstance with a %s period, and a Deployment with no heartbeat code", exampleDir, o.Period)
	ns, sa, ai, manifest, err := loadExample(o.Period)
	if err != nil {
		return err
	}
	for _, obj := range []client.Object{ns, sa, ai} {
		if err := c.Create(ctx, obj); err != nil {
			return fmt.Errorf("creating %s: %w", obj.GetName(), err)
		}
	}
	// The same manifest without the opt-in, as a dry run: the API server
	// defaults it the same way, so the diff below shows only the injection.
	plain := manifest.DeepCopy()
	delete(plain.Annotations, annotations.Inject)
	if err := c.Create(ctx, plain, client.DryRunAll); err != nil {
		return fmt.Errorf("dry-run of the plain Deployment: %w", err)
	}
	dep := manifest.DeepCopy()
	if err := c.Create(ctx, dep); err != nil {
		return fmt.Errorf("creating the Deployment: %w", err)
	}
	d.step("What the webhook injected into %s/%s (annotation %s: \"true\")", dep.Namespace, dep.Name, annotations.Inject)
	if err := d.diff(plain, dep); err != nil {
		return err
	}

	if err := d.showRBAC(ctx, c, dep); err != nil {
		return err
	}

	d.step("Running the injected reporter as a local process, as pod %s would", podName)
	rep, err := cluster.StartReporter(ctx, bins["reporter"], dep, podName, logs)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, rep.Stop(10*time.Second)) }()
	d.note("command: %s %s", strings.Join(rep.Invocation.Command, " "), strings.Join(rep.Invocation.Args, " "))
	d.note("env:     %s", strings.Join(rep.Invocation.Env, " "))
	d.note("(the image's %s is %s here; probes and metrics bound to 127.0.0.1; a kubeconfig with a token of", rep.Invocation.Command[0], bins["reporter"])
	d.note(" ServiceAccount %s/%s stands in for the pod's projected token, so the reporter has only the RBAC the webhook granted)", dep.Namespace, dep.Spec.Template.Spec.ServiceAccountName)

	d.step("Heartbeats into AddonInstance %s/%s, for %s (Ctrl-C stops earlier)", ai.Namespace, ai.Name, o.Duration)
	d.note("There is no kubelet or controller-manager here: the demo sets the Deployment's status as the controller-manager would, and says so.")
	return d.watch(ctx, c, rep, client.ObjectKeyFromObject(ai), dep)
}

// setLibraryLoggers gives the libraries the demo drives a logger:
// controller-runtime's client and envtest's CRD installer log through a
// global logger that, when nothing set it within 30 seconds of the process
// starting, prints "log.SetLogger(...) was never called" with a stack trace
// to stderr at its next use; a newcomer's first `make demo` spends far
// longer than that building kube-apiserver before it makes a client.
// client-go logs through klog. The demo's output is its own lines: their
// lines are dropped, or with --verbose shown with the processes' logs. Their
// errors reach the demo as returned errors either way.
func setLibraryLoggers(out io.Writer, verbose bool) {
	log := logr.Discard()
	if verbose {
		log = funcr.New(func(prefix, args string) { fmt.Fprintf(out, "    [library log] %s %s\n", prefix, args) }, funcr.Options{})
	}
	ctrllog.SetLogger(log)
	klog.SetLogger(log)
}

type driver struct {
	out io.Writer
	o   Options
}

func (d *driver) step(format string, args ...any) {
	fmt.Fprintf(d.out, "\n==> "+format+"\n", args...)
}

func (d *driver) note(format string, args ...any) {
	fmt.Fprintf(d.out, "    "+format+"\n", args...)
}

func loadExample(period time.Duration) (*corev1.Namespace, *corev1.ServiceAccount, *addonsv1alpha1.AddonInstance, *appsv1.Deployment, error) {
	var (
		ns  corev1.Namespace
		sa  corev1.ServiceAccount
		ai  addonsv1alpha1.AddonInstance
		dep appsv1.Deployment
	)
	for file, obj := range map[string]any{"namespace.yaml": &ns, "serviceaccount.yaml": &sa, "addoninstance.yaml": &ai, "deployment.yaml": &dep} {
		data, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), exampleDir, file))
		if err != nil {
			return nil, nil, nil, nil, fmt.Errorf("reading the example: %w", err)
		}
		if err := yaml.UnmarshalStrict(data, obj); err != nil {
			return nil, nil, nil, nil, fmt.Errorf("parsing %s: %w", file, err)
		}
	}
	ai.Spec.HeartbeatUpdatePeriod = metav1.Duration{Duration: period}
	return &ns, &sa, &ai, &dep, nil
}

// diff prints the pod template of the never-injected and the injected
// Deployment as a unified diff.
func (d *driver) diff(plain, injected *appsv1.Deployment) error {
	view := func(x *appsv1.Deployment) (string, error) {
		b, err := yaml.Marshal(map[string]any{"metadata": map[string]any{"annotations": x.Annotations}, "spec": map[string]any{"template": x.Spec.Template}})
		return string(b), err
	}
	a, err := view(plain)
	if err != nil {
		return err
	}
	b, err := view(injected)
	if err != nil {
		return err
	}
	text, err := difflib.GetUnifiedDiffString(difflib.UnifiedDiff{
		A: difflib.SplitLines(a), B: difflib.SplitLines(b),
		FromFile: "as applied", ToFile: "as stored (injected)", Context: 2,
	})
	if err != nil {
		return fmt.Errorf("diffing: %w", err)
	}
	for _, line := range strings.Split(strings.TrimRight(text, "\n"), "\n") {
		fmt.Fprintln(d.out, "    "+line)
	}
	return nil
}

// phase is a change the demo makes to the Deployment's status at a point in
// time, in periods from the start.
type phase struct {
	at        int
	available int32
	say       string
}

var phases = []phase{
	{at: 3, available: 1, say: "the Deployment's pod is now available (1/1)"},
	{at: 8, available: 0, say: "the Deployment's pod became unavailable (0/1)"},
	{at: 12, available: 1, say: "the Deployment's pod is available again (1/1)"},
}

func (d *driver) watch(ctx context.Context, c client.Client, rep *localcluster.Reporter, key client.ObjectKey, dep *appsv1.Deployment) error {
	ctx, cancel := context.WithTimeout(ctx, d.o.Duration)
	defer cancel()
	start := time.Now()
	fmt.Fprintf(d.out, "\n    %-8s  %-14s  %-5s  %-20s  %-64s\n", "TIME", "LAST HEARTBEAT", "GAP", "INSTALLED", "DEGRADED")
	var last metav1.Time
	next := 0
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if exited, err := rep.Exited(); exited {
			return false, fmt.Errorf("the reporter exited (%v); its log is %s", err, rep.LogPath)
		}
		// A change in the demo's last period would not be seen any more.
		if next < len(phases) && time.Duration(phases[next].at+1)*d.o.Period > d.o.Duration {
			next = len(phases)
		}
		if next < len(phases) && time.Since(start) >= time.Duration(phases[next].at)*d.o.Period {
			p := phases[next]
			next++
			// Its own deadline: the demo's may be about to end.
			setCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			err := setAvailability(setCtx, c, dep, p.available)
			cancel()
			if err != nil {
				return false, err
			}
			fmt.Fprintf(d.out, "    %s  [demo] %s: status set as the controller-manager would\n", time.Now().Format("15:04:05"), p.say)
		}
		var ai addonsv1alpha1.AddonInstance
		if err := c.Get(ctx, key, &ai); err != nil {
			return false, nil // shown as a gap; the reporter copes with outages too
		}
		hb := ai.Status.LastHeartbeatTime
		if hb.IsZero() || hb.Equal(&last) {
			return false, nil
		}
		gap := "-"
		if !last.IsZero() {
			gap = hb.Sub(last.Time).Round(100 * time.Millisecond).String()
		}
		last = hb
		fmt.Fprintf(d.out, "    %-8s  %-14s  %-5s  %-20s  %s\n", time.Now().Format("15:04:05"), hb.Format("15:04:05"), gap,
			condition(ai.Status.Conditions, addonsv1alpha1.AddonInstanceConditionInstalled.String(), false),
			condition(ai.Status.Conditions, addonsv1alpha1.AddonInstanceConditionDegraded.String(), true))
		return false, nil
	})
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		if last.IsZero() {
			return fmt.Errorf("no heartbeat arrived within %s; the reporter's log is %s", d.o.Duration, rep.LogPath)
		}
		return nil
	}
	return err
}

func condition(conds []metav1.Condition, typ string, withMessage bool) string {
	c := meta.FindStatusCondition(conds, typ)
	if c == nil {
		return "-"
	}
	s := fmt.Sprintf("%s %s", c.Status, c.Reason)
	if withMessage && c.Message != "" {
		s += ": " + c.Message
	}
	return s
}

// setAvailability writes the Deployment status the controller-manager would
// write for one replica, available or not.
func setAvailability(ctx context.Context, c client.Client, dep *appsv1.Deployment, available int32) error {
	var cur appsv1.Deployment
	if err := c.Get(ctx, client.ObjectKeyFromObject(dep), &cur); err != nil {
		return fmt.Errorf("reading the Deployment: %w", err)
	}
	cond := appsv1.DeploymentCondition{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionTrue,
		Reason: "MinimumReplicasAvailable", Message: "Deployment has minimum availability.",
		LastUpdateTime: metav1.Now(), LastTransitionTime: metav1.Now()}
	if available == 0 {
		cond.Status, cond.Reason, cond.Message = corev1.ConditionFalse, "MinimumReplicasUnavailable", "Deployment does not have minimum availability."
	}
	replicas := int32(1)
	if cur.Spec.Replicas != nil {
		replicas = *cur.Spec.Replicas
	}
	cur.Status = appsv1.DeploymentStatus{
		ObservedGeneration: cur.Generation, Replicas: replicas, UpdatedReplicas: replicas,
		ReadyReplicas: available, AvailableReplicas: available, UnavailableReplicas: replicas - available,
		Conditions: []appsv1.DeploymentCondition{cond},
	}
	if err := c.Status().Update(ctx, &cur); err != nil {
		return fmt.Errorf("setting the Deployment status: %w", err)
	}
	return nil
}

// showRBAC waits for the RoleBinding the webhook provisions for the
// Deployment's ServiceAccount and prints it.
func (d *driver) showRBAC(ctx context.Context, c client.Client, dep *appsv1.Deployment) error {
	d.step("RBAC the webhook provisioned for %s/%s (no RBAC in the addon's manifests)", dep.Namespace, dep.Name)
	var rb rbacv1.RoleBinding
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		var list rbacv1.RoleBindingList
		if err := c.List(ctx, &list, client.InNamespace(dep.Namespace)); err != nil {
			return false, nil
		}
		for _, item := range list.Items {
			for _, s := range item.Subjects {
				if s.Kind == rbacv1.ServiceAccountKind && s.Name == dep.Spec.Template.Spec.ServiceAccountName {
					rb = item
					return true, nil
				}
			}
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("no RoleBinding for ServiceAccount %s appeared: %w", dep.Spec.Template.Spec.ServiceAccountName, err)
	}
	d.note("RoleBinding %s/%s binds ServiceAccount %s to ClusterRole %s", rb.Namespace, rb.Name, dep.Spec.Template.Spec.ServiceAccountName, rb.RoleRef.Name)
	var role rbacv1.ClusterRole
	if err := c.Get(ctx, client.ObjectKey{Name: rb.RoleRef.Name}, &role); err != nil {
		return fmt.Errorf("reading ClusterRole %s: %w", rb.RoleRef.Name, err)
	}
	for _, r := range role.Rules {
		names := ""
		if len(r.ResourceNames) > 0 {
			names = " named " + strings.Join(r.ResourceNames, ", ")
		}
		d.note("  %-28s %s%s", strings.Join(r.Resources, ","), strings.Join(r.Verbs, ","), names)
	}
	return nil
}
