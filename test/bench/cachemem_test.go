package bench

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	addonsv1alpha1 "github.com/openshift/addon-operator/apis/addons/v1alpha1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/addon-heartbeat/addon-heartbeat/internal/localcluster"
	"github.com/addon-heartbeat/addon-heartbeat/internal/testenv"
)

// beforeMetadataOnly is the last commit whose RBAC controller watched whole
// Deployments (decoding every pod template of the cluster, then cutting the
// cached copy down); the one after it watches them as metadata only.
const beforeMetadataOnly = "4a12ea1694213a73673d7dd743bfd8f3025adde9"

// BenchmarkWebhookRSSManyDeployments fills a control plane with
// BENCH_RSS_DEPLOYMENTS (10,000) Deployments of other teams (100 namespaces,
// two containers each with 20 env values and probes: about 4 KB of JSON per
// Deployment), then runs the webhook built from this checkout and the one
// built from BENCH_BEFORE_REF (beforeMetadataOnly; or the binary
// BENCH_WEBHOOK_BIN_BEFORE) in turn against it, each until its RBAC
// controller has synced its caches and bound a probe addon, and reports each
// one's resident memory: the peak (VmHWM, the initial LIST included) and
// after 10s of steady state. The ratios are after/before in the same run;
// the webhook of this checkout is also measured before the Deployments are
// created, so that the Deployments' own cost can be told apart.
func BenchmarkWebhookRSSManyDeployments(b *testing.B) {
	n := envInt(b, "BENCH_RSS_DEPLOYMENTS", 10000)
	before, after, c := rssRun(b, beforeMetadataOnly)
	measure := func(name, bin string, drop []string) (peak, steady int64) {
		return webhookRSS(b, c, name, bin, drop, nil)
	}
	// What the webhook takes with no Deployment but the probe's, to tell
	// the caches' share from the process's own.
	_, emptySteady := measure("empty", after, nil)
	start := time.Now()
	fill(b, c.Client, n)
	b.Logf("created %d Deployments in %s", n, time.Since(start).Round(time.Second))
	// The before build knows no record signing key.
	beforePeak, beforeSteady := measure("before", before, []string{"--signing-secret-name"})
	afterPeak, afterSteady := measure("after", after, nil)
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(float64(n), "deployments")
	b.ReportMetric(float64(beforePeak)/mib, "before-peak-MiB")
	b.ReportMetric(float64(beforeSteady)/mib, "before-rss-MiB")
	b.ReportMetric(float64(afterPeak)/mib, "after-peak-MiB")
	b.ReportMetric(float64(afterSteady)/mib, "after-rss-MiB")
	b.ReportMetric(float64(emptySteady)/mib, "empty-rss-MiB")
	b.ReportMetric(float64(afterPeak)/float64(beforePeak), "peak-ratio")
	b.ReportMetric(float64(afterSteady)/float64(beforeSteady), "rss-ratio")
	// The memory the 10,000 Deployments cost, after against before.
	b.ReportMetric(float64(afterSteady-emptySteady)/float64(beforeSteady-emptySteady), "deployments-cost-ratio")
}

// rssRun builds the webhooks to compare, BENCH_WEBHOOK_BIN_BEFORE or
// BENCH_BEFORE_REF (defaultRef) and this checkout's, and starts a control
// plane for the run.
func rssRun(b *testing.B, defaultRef string) (before, after string, c *localcluster.Cluster) {
	b.Helper()
	before = cmp.Or(os.Getenv("BENCH_WEBHOOK_BIN_BEFORE"), buildAt(b, cmp.Or(os.Getenv("BENCH_BEFORE_REF"), defaultRef)))
	after = binaries(b)["webhook"]
	c, err := localcluster.Start(context.Background(), localcluster.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := c.Stop(); err != nil {
			b.Errorf("stopping the control plane: %v", err)
		}
	})
	return before, after, c
}

// webhookRSS installs the webhook binary bin on c (the chart's args but the
// flags in drop), waits until its RBAC controller has synced (it binds a
// probe addon named after name) and synced(w) holds when given, lets it run
// 10s, and returns its peak and steady resident memory before stopping it.
func webhookRSS(b *testing.B, c *localcluster.Cluster, name, bin string, drop []string, synced func(w *localcluster.Webhook) bool) (peak, steady int64) {
	b.Helper()
	ctx := context.Background()
	w, err := c.InstallWebhook(ctx, bin, localcluster.WebhookOptions{ReporterImage: reporterImage, DropFlags: drop}, nil)
	if err != nil {
		b.Fatalf("%s: %v", name, err)
	}
	probe(b, c.Client, name)
	if synced != nil {
		pollUntil(b, 200*time.Millisecond, 5*time.Minute, name+" synced", func() bool { return synced(w) })
	}
	time.Sleep(10 * time.Second) // steady state: no condition to await, the point is the memory after a while
	if steady, err = procStatus(w.Pid(), "VmRSS"); err != nil {
		b.Fatal(err)
	}
	if peak, err = procStatus(w.Pid(), "VmHWM"); err != nil {
		b.Fatal(err)
	}
	if err := w.Stop(15 * time.Second); err != nil {
		b.Fatalf("stopping the %s webhook: %v", name, err)
	}
	// The next install creates its own configuration.
	if err := c.Client.Delete(ctx, &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: w.Configuration}}); err != nil {
		b.Fatal(err)
	}
	return peak, steady
}

// buildAt builds cmd/webhook as of git ref into the run's work folder.
func buildAt(b *testing.B, ref string) string {
	b.Helper()
	src := filepath.Join(workDir, "src-"+ref)
	if err := os.MkdirAll(src, 0o755); err != nil {
		b.Fatal(err)
	}
	archive := exec.Command("sh", "-c", fmt.Sprintf("git -C %q archive %q | tar -x -C %q", testenv.RepoRoot(), ref, src))
	if out, err := archive.CombinedOutput(); err != nil {
		b.Fatalf("extracting %s: %v\n%s", ref, err, out)
	}
	bin := filepath.Join(workDir, "webhook-"+ref)
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin, "./cmd/webhook")
	cmd.Dir, cmd.Env = src, append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("building the webhook at %s: %v\n%s", ref, err, out)
	}
	return bin
}

// fill creates n Deployments in 100 namespaces, eight at a time.
func fill(b *testing.B, c client.Client, n int) {
	b.Helper()
	ctx := context.Background()
	const namespaces = 100
	for i := range namespaces {
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("team-%03d", i)}}); err != nil {
			b.Fatal(err)
		}
	}
	inParallel(b, n, func(i int) error {
		return c.Create(ctx, teamDeployment(fmt.Sprintf("team-%03d", i%namespaces), fmt.Sprintf("app-%05d", i)))
	})
}

// inParallel runs do(0) to do(n-1), eight at a time, failing b on the first
// error.
func inParallel(b *testing.B, n int, do func(i int) error) {
	b.Helper()
	work := make(chan int)
	errs := make(chan error, 8)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := range work {
				if err := do(i); err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		})
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	select {
	case err := <-errs:
		b.Fatal(err)
	default:
	}
}

// teamDeployment is another team's workload: not opted in, with what such
// Deployments carry (env values, probes, resources, labels).
func teamDeployment(ns, name string) *appsv1.Deployment {
	labels := map[string]string{"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": ns, "team": ns}
	var env []corev1.EnvVar
	for i := range 20 {
		env = append(env, corev1.EnvVar{Name: fmt.Sprintf("SETTING_%02d", i), Value: strings.Repeat("v", 40) + fmt.Sprint(i)})
	}
	container := func(n string) corev1.Container {
		return corev1.Container{
			Name: n, Image: "registry.example.com/" + ns + "/" + name + ":v1.2.3", Env: env,
			Args:  []string{"--listen=:8080", "--metrics=:9090", "--log-level=info"},
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}, {Name: "metrics", ContainerPort: 9090}},
			Resources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")},
				Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")},
			},
			ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/readyz", Port: intstr.FromString("http")}}},
			LivenessProbe:  &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromString("http")}}},
		}
	}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{container("app"), container("proxy")}},
			},
		},
	}
}

// probe onboards one addon (an AddonInstance and an opted-in Deployment,
// created by the cluster admin) and waits for its RoleBinding: the RBAC
// controller reconciles only once its caches have synced.
func probe(b *testing.B, c client.Client, name string) {
	b.Helper()
	ctx := context.Background()
	ns := "probe-" + name
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		b.Fatal(err)
	}
	ai := &addonsv1alpha1.AddonInstance{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "addon-instance"},
		Spec: addonsv1alpha1.AddonInstanceSpec{HeartbeatUpdatePeriod: metav1.Duration{Duration: 10 * time.Second}}}
	if err := c.Create(ctx, ai); err != nil {
		b.Fatal(err)
	}
	d := teamDeployment(ns, "addon")
	d.Annotations = map[string]string{"addon-heartbeat.io/inject": "true"}
	if err := c.Create(ctx, d); err != nil {
		b.Fatal(err)
	}
	pollUntil(b, 200*time.Millisecond, 5*time.Minute, "the probe addon's RoleBinding in "+ns, func() bool {
		var rb rbacv1.RoleBinding
		return c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "addon-heartbeat-reporter"}, &rb) == nil
	})
}
