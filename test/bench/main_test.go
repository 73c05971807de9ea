package bench

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	addonsv1alpha1 "github.com/openshift/addon-operator/apis/addons/v1alpha1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/addon-heartbeat/addon-heartbeat/internal/localcluster"
)

// workDir holds the binaries built for this run; empty when no benchmark
// was asked for.
var workDir string

func TestMain(m *testing.M) {
	flag.Parse()
	if f := flag.Lookup("test.bench"); f == nil || f.Value.String() == "" {
		// Plain `go test`: there is nothing to run here.
		os.Exit(m.Run())
	}
	os.Exit(runBenchmarks(m))
}

func runBenchmarks(m *testing.M) int {
	ctrllog.SetLogger(logr.Discard())
	var err error
	if workDir, err = os.MkdirTemp("", "addon-heartbeat-bench-"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(workDir)
	return m.Run()
}

var (
	buildOnce sync.Once
	bins      map[string]string
	buildErr  error
)

// binaries builds the webhook and the reporter once per run.
func binaries(b *testing.B) map[string]string {
	b.Helper()
	buildOnce.Do(func() {
		bins, buildErr = localcluster.Build(workDir, os.Stderr, "./cmd/webhook", "./cmd/reporter")
	})
	if buildErr != nil {
		b.Fatal(buildErr)
	}
	return bins
}

// envDuration reads a duration setting from the environment.
func envDuration(b *testing.B, name string, def time.Duration) time.Duration {
	b.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		b.Fatalf("%s=%q: expected a positive duration such as 30s", name, v)
	}
	return d
}

// envInt reads a count setting from the environment.
// envInts reads a comma-separated list of positive integers.
func envInts(b *testing.B, name string, def []int) []int {
	b.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	var out []int
	for f := range strings.SplitSeq(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			b.Fatalf("%s=%q: expected positive integers separated by commas", name, v)
		}
		out = append(out, n)
	}
	return out
}

func envInt(b *testing.B, name string, def int) int {
	b.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		b.Fatalf("%s=%q: expected a positive integer", name, v)
	}
	return n
}

const reporterImage = "addon-heartbeat/reporter:bench"

// env is one local control plane with the webhook installed from the chart.
type env struct {
	cluster *localcluster.Cluster
	webhook *localcluster.Webhook
	bins    map[string]string
}

// startEnv starts a control plane (with an audit log when auditLog is set)
// and the webhook, both stopped when the benchmark ends. BENCH_WEBHOOK_BIN
// and BENCH_REPORTER_BIN run other binaries instead of this checkout's, to
// compare two builds on the same machine in one sitting.
func startEnv(b *testing.B, auditLog string) *env {
	b.Helper()
	bins := binaries(b)
	ctx := context.Background()
	c, err := localcluster.Start(ctx, localcluster.Options{AuditLog: auditLog})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := c.Stop(); err != nil {
			b.Errorf("stopping the control plane: %v", err)
		}
	})
	w, err := c.InstallWebhook(ctx, cmp.Or(os.Getenv("BENCH_WEBHOOK_BIN"), bins["webhook"]), localcluster.WebhookOptions{ReporterImage: reporterImage}, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := w.Stop(15 * time.Second); err != nil {
			b.Errorf("stopping the webhook: %v", err)
		}
	})
	return &env{cluster: c, webhook: w, bins: map[string]string{
		"webhook":  cmp.Or(os.Getenv("BENCH_WEBHOOK_BIN"), bins["webhook"]),
		"reporter": cmp.Or(os.Getenv("BENCH_REPORTER_BIN"), bins["reporter"]),
	}}
}

// createNamespace creates a namespace by name.
func (e *env) createNamespace(b *testing.B, name string) {
	b.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := e.cluster.Client.Create(context.Background(), ns); err != nil {
		b.Fatal(err)
	}
}

func (e *env) createAddonInstance(b *testing.B, ns string, period time.Duration) {
	b.Helper()
	ai := &addonsv1alpha1.AddonInstance{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "addon-instance"},
		Spec:       addonsv1alpha1.AddonInstanceSpec{HeartbeatUpdatePeriod: metav1.Duration{Duration: period}},
	}
	if err := e.cluster.Client.Create(context.Background(), ai); err != nil {
		b.Fatal(err)
	}
}

// createAddon creates an opted-in Deployment (injected by the webhook, which
// also binds the reporter role to its ServiceAccount) and sets its status
// available, as the controller-manager would. It returns the stored
// Deployment.
func (e *env) createAddon(b *testing.B, ns, name, serviceAccount string, replicas int32) *appsv1.Deployment {
	b.Helper()
	ctx := context.Background()
	labels := map[string]string{"app": name}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: map[string]string{"addon-heartbeat.io/inject": "true"}},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{ServiceAccountName: serviceAccount,
					Containers: []corev1.Container{{Name: "manager", Image: "registry.example.com/" + name + ":v1"}}},
			},
		},
	}
	if err := e.cluster.Client.Create(ctx, d); err != nil {
		b.Fatal(err)
	}
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		var cur appsv1.Deployment
		if err := e.cluster.Client.Get(ctx, client.ObjectKeyFromObject(d), &cur); err != nil {
			return false, nil
		}
		now := metav1.Now()
		cur.Status = appsv1.DeploymentStatus{
			ObservedGeneration: cur.Generation, Replicas: replicas, UpdatedReplicas: replicas,
			ReadyReplicas: replicas, AvailableReplicas: replicas,
			Conditions: []appsv1.DeploymentCondition{{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionTrue,
				Reason: "MinimumReplicas", LastUpdateTime: now, LastTransitionTime: now}},
		}
		return e.cluster.Client.Status().Update(ctx, &cur) == nil, nil
	})
	if err != nil {
		b.Fatalf("setting the status of %s/%s: %v", ns, name, err)
	}
	return d
}

// startReporter runs one reporter process as pod podName of d, stopped when
// the benchmark ends.
func (e *env) startReporter(b *testing.B, d *appsv1.Deployment, podName string) *localcluster.Reporter {
	b.Helper()
	r, err := e.cluster.StartReporter(context.Background(), e.bins["reporter"], d, podName, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := r.Stop(15 * time.Second); err != nil {
			b.Errorf("stopping %s: %v (log %s)", r.Name, err, r.LogPath)
		}
	})
	return r
}
