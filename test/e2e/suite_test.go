// Package e2e runs addon-heartbeat end to end with real binaries as
// processes: etcd and kube-apiserver, the webhook binary with the chart's
// arguments, RBAC and webhook configuration (self-managed certificates), and
// reporter binaries started with exactly the
// command, args and env the webhook injected. There is no kubelet: each
// reporter process stands for one addon pod, and tests set Deployment status
// as the controller-manager would.
package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	addonsv1alpha1 "github.com/openshift/addon-operator/apis/addons/v1alpha1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/addon-heartbeat/addon-heartbeat/internal/localcluster"
	"github.com/addon-heartbeat/addon-heartbeat/internal/logging"
)

var (
	cluster *localcluster.Cluster
	webhook *localcluster.Webhook
	bins    map[string]string
)

const reporterImage = "addon-heartbeat/reporter:e2e"

// suiteValues are the chart values the webhook is installed with. The
// reporter role is limited to the AddonInstance names the chart lists; the
// tests use one besides the default.
var suiteValues = map[string]any{"reporter": map[string]any{"addonInstanceNames": []any{"addon-instance", "not-yet"}}}

func TestMain(m *testing.M) { os.Exit(runSuite(m)) }

func runSuite(m *testing.M) (code int) {
	ctx := context.Background()
	log, err := logging.New(logging.LevelError)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctrl.SetLogger(log)
	if cluster, err = localcluster.Start(ctx, localcluster.Options{}); err != nil {
		fmt.Fprintln(os.Stderr, "starting the control plane:", err)
		return 1
	}
	defer func() {
		if err := cluster.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stopping the control plane:", err)
			code = 1
		}
	}()
	if bins, err = localcluster.Build(cluster.Dir, os.Stderr, "./cmd/webhook", "./cmd/reporter"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	webhook, err = cluster.InstallWebhook(ctx, bins["webhook"], localcluster.WebhookOptions{ReporterImage: reporterImage, Values: suiteValues}, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() {
		if err := webhook.Stop(15 * time.Second); err != nil {
			fmt.Fprintln(os.Stderr, "stopping the webhook:", err)
			code = 1
		}
	}()
	return m.Run()
}

// newNamespace creates a namespace for one test.
func newNamespace(t *testing.T, prefix string) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"}}
	if err := cluster.Client.Create(t.Context(), ns); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

func createAddonInstance(t *testing.T, ns, name string, period time.Duration) *addonsv1alpha1.AddonInstance {
	t.Helper()
	ai := &addonsv1alpha1.AddonInstance{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       addonsv1alpha1.AddonInstanceSpec{HeartbeatUpdatePeriod: metav1.Duration{Duration: period}},
	}
	if err := cluster.Client.Create(t.Context(), ai); err != nil {
		t.Fatal(err)
	}
	return ai
}

// addonDeployment is an addon with no heartbeat code, opted in.
func addonDeployment(ns, name string, replicas int32, annots map[string]string) *appsv1.Deployment {
	labels := map[string]string{"app": name}
	a := map[string]string{"addon-heartbeat.io/inject": "true"}
	for k, v := range annots {
		a[k] = v
	}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: a},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "manager", Image: "registry.example.com/" + name + ":v1"}}},
			},
		},
	}
}

// createInjected creates d and returns the stored (injected) Deployment.
func createInjected(t *testing.T, d *appsv1.Deployment) *appsv1.Deployment {
	t.Helper()
	if err := cluster.Client.Create(t.Context(), d); err != nil {
		t.Fatal(err)
	}
	return d
}

// startReporters runs one reporter process per replica of d, as its pods
// would, and stops them when the test ends.
func startReporters(t *testing.T, d *appsv1.Deployment, replicas int) []*localcluster.Reporter {
	t.Helper()
	var out []*localcluster.Reporter
	for i := range replicas {
		r, err := cluster.StartReporter(t.Context(), bins["reporter"], d, fmt.Sprintf("%s-pod-%d", d.Name, i), nil)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
		t.Cleanup(func() {
			if err := r.Stop(15 * time.Second); err != nil {
				t.Errorf("%v (log %s)", err, r.LogPath)
			}
			if t.Failed() {
				data, _ := os.ReadFile(r.LogPath)
				lines := strings.Split(strings.TrimSpace(string(data)), "\n")
				t.Logf("last lines of %s:\n%s", r.Name, strings.Join(lines[max(0, len(lines)-15):], "\n"))
			}
		})
	}
	return out
}

// setAvailable writes the status the controller-manager would write for d
// with available of its replicas available.
func setAvailable(t *testing.T, d *appsv1.Deployment, available int32) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		var cur appsv1.Deployment
		if err := cluster.Client.Get(ctx, client.ObjectKeyFromObject(d), &cur); err != nil {
			return false, nil
		}
		replicas := *cur.Spec.Replicas
		status := corev1.ConditionTrue
		if available < replicas {
			status = corev1.ConditionFalse
		}
		now := metav1.Now()
		cur.Status = appsv1.DeploymentStatus{
			ObservedGeneration: cur.Generation, Replicas: replicas, UpdatedReplicas: replicas,
			ReadyReplicas: available, AvailableReplicas: available, UnavailableReplicas: replicas - available,
			Conditions: []appsv1.DeploymentCondition{{Type: appsv1.DeploymentAvailable, Status: status,
				Reason: "MinimumReplicas", LastUpdateTime: now, LastTransitionTime: now}},
		}
		return cluster.Client.Status().Update(ctx, &cur) == nil, nil
	})
	if err != nil {
		t.Fatalf("setting the status of %s: %v", d.Name, err)
	}
}

// heartbeatRecorder times the writes to one AddonInstance from the outside.
type heartbeatRecorder struct{ *localcluster.Heartbeats }

func recordHeartbeats(t *testing.T, ns, name string) *heartbeatRecorder {
	t.Helper()
	h, err := localcluster.WatchHeartbeats(cluster.Config, cluster.Client.Scheme(), ns, name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Stop)
	return &heartbeatRecorder{h}
}

// waitWrites waits until n more writes than now have been seen.
func (r *heartbeatRecorder) waitWrites(t *testing.T, n int, timeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	if err := r.WaitWrites(ctx, n); err != nil {
		t.Fatalf("within %s: %v", timeout, err)
	}
}

// waitCondition waits until the AddonInstance has condition typ with status
// and a message containing every part.
func (r *heartbeatRecorder) waitCondition(t *testing.T, typ string, status metav1.ConditionStatus, timeout time.Duration, parts ...string) metav1.Condition {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	c, err := r.WaitCondition(ctx, typ, status, parts...)
	if err != nil {
		t.Fatalf("within %s: %v", timeout, err)
	}
	return c
}
