//go:build node

package node

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/addon-heartbeat/addon-heartbeat/internal/images"
	"github.com/addon-heartbeat/addon-heartbeat/internal/localcluster"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/election"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/inject"
)

// run runs a client command (helm, kubectl) inside the cluster's network
// namespace with its homes in the work folder, and returns its output.
func run(ctx context.Context, name string, args ...string) (string, error) {
	base := cluster.NetNS.Command(name, args...)
	cmd := exec.CommandContext(ctx, base.Path, base.Args[1:]...)
	home := filepath.Join(workDir, "home")
	cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + home, "KUBECONFIG=" + cluster.Kubeconfig,
		"HELM_CACHE_HOME=" + filepath.Join(home, "helm-cache"),
		"HELM_CONFIG_HOME=" + filepath.Join(home, "helm-config"),
		"HELM_DATA_HOME=" + filepath.Join(home, "helm-data"),
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// restrictedNamespace creates a namespace where Pod Security enforces the
// restricted profile.
func restrictedNamespace(t *testing.T, name string) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
		"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest",
	}}}
	if err := cluster.Client.Create(suiteCtx, ns); err != nil {
		t.Fatalf("creating namespace %s: %v", name, err)
	}
}

// restrictedContainer is the security context the restricted profile asks
// for.
func restrictedContainer() *corev1.SecurityContext {
	return &corev1.SecurityContext{
		AllowPrivilegeEscalation: ptr.To(false), ReadOnlyRootFilesystem: ptr.To(true),
		RunAsNonRoot: ptr.To(true), Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
}

// exampleAddon is an addon Deployment with no heartbeat code: the example
// addon image, readiness on /readyz checked every second, opted in.
func exampleAddon(ns, name, instance string, replicas int32) *appsv1.Deployment {
	labels := map[string]string{"app": name}
	probe := func(path string) *corev1.Probe {
		return &corev1.Probe{
			ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromInt32(8080)}},
			PeriodSeconds: 1, FailureThreshold: 1, SuccessThreshold: 1, TimeoutSeconds: 1,
		}
	}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: map[string]string{
			"addon-heartbeat.io/inject": "true", "addon-heartbeat.io/addon-instance": instance,
		}},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					ServiceAccountName:            addonServiceAccount,
					TerminationGracePeriodSeconds: ptr.To(int64(10)),
					SecurityContext: &corev1.PodSecurityContext{
						RunAsNonRoot: ptr.To(true), SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
					},
					Containers: []corev1.Container{{
						Name: "manager", Image: images.ExampleAddon + ":" + tag, ImagePullPolicy: corev1.PullNever,
						Args:            []string{"--addr=:8080"},
						Ports:           []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
						ReadinessProbe:  probe("/readyz"),
						LivenessProbe:   probe("/healthz"),
						SecurityContext: restrictedContainer(),
						Resources: corev1.ResourceRequirements{
							Requests: corev1.ResourceList{corev1.ResourceCPU: mustQuantity("5m"), corev1.ResourceMemory: mustQuantity("16Mi")},
							Limits:   corev1.ResourceList{corev1.ResourceMemory: mustQuantity("64Mi")},
						},
					}},
				},
			},
		},
	}
}

// waitFor polls cond every 200ms until it holds, failing the test with what
// it last said after timeout.
func waitFor(t *testing.T, what string, timeout time.Duration, cond func(ctx context.Context) (bool, string)) {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(suiteCtx, 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		ok, msg := cond(ctx)
		last = msg
		return ok, nil
	})
	if err != nil {
		t.Fatalf("%s: not within %s (%v); last: %s", what, timeout, err, last)
	}
}

// rolledOut reports whether d's rollout is complete with want ready
// replicas.
func rolledOut(ctx context.Context, key client.ObjectKey, want int32) (bool, string) {
	var d appsv1.Deployment
	if err := cluster.Client.Get(ctx, key, &d); err != nil {
		return false, err.Error()
	}
	s := d.Status
	msg := fmt.Sprintf("generation %d observed %d, replicas %d updated %d ready %d available %d, conditions %+v",
		d.Generation, s.ObservedGeneration, s.Replicas, s.UpdatedReplicas, s.ReadyReplicas, s.AvailableReplicas, s.Conditions)
	return s.ObservedGeneration == d.Generation && s.Replicas == want && s.UpdatedReplicas == want &&
		s.ReadyReplicas == want && s.AvailableReplicas == want, msg
}

// pods lists the running pods of a Deployment (by its app label), without
// those being deleted.
func pods(ctx context.Context, ns string, labels map[string]string) ([]corev1.Pod, error) {
	var list corev1.PodList
	if err := cluster.Client.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels(labels)); err != nil {
		return nil, err
	}
	var out []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
			out = append(out, p)
		}
	}
	return out, nil
}

// podHTTP sends a request to a pod's IP from inside the node's network.
func podHTTP(ctx context.Context, method, url string) (int, string, error) {
	hc := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DialContext: cluster.NetNS.DialContext}}
	defer hc.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// metric scrapes a Prometheus endpoint and sums the samples of name whose
// labels contain every label given as k="v".
func metric(ctx context.Context, url, name string, labels ...string) (float64, error) {
	code, body, err := podHTTP(ctx, http.MethodGet, url)
	if err != nil {
		return 0, err
	}
	if code != http.StatusOK {
		return 0, fmt.Errorf("GET %s: %d", url, code)
	}
	var sum float64
	found := false
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+" ") && !strings.HasPrefix(line, name+"{") {
			continue
		}
		ok := true
		for _, l := range labels {
			ok = ok && strings.Contains(line, l)
		}
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", line, err)
		}
		sum += v
		found = true
	}
	if !found {
		return 0, fmt.Errorf("no %s%v at %s", name, labels, url)
	}
	return sum, nil
}

// reporterMetric scrapes the injected reporter of pod.
func reporterMetric(ctx context.Context, pod corev1.Pod, name string) (float64, error) {
	return metric(ctx, fmt.Sprintf("http://%s:9782/metrics", pod.Status.PodIP), name)
}

// reporterStatus is the status of the pod's heartbeat-reporter sidecar.
func reporterStatus(pod corev1.Pod) *corev1.ContainerStatus {
	for i, s := range pod.Status.InitContainerStatuses {
		if s.Name == inject.ContainerName {
			return &pod.Status.InitContainerStatuses[i]
		}
	}
	return nil
}

// heartbeats times the writes to one AddonInstance from the outside.
type heartbeats struct{ *localcluster.Heartbeats }

func watchHeartbeats(t *testing.T, ns, name string) *heartbeats {
	t.Helper()
	h, err := localcluster.WatchHeartbeats(cluster.Config, cluster.Client.Scheme(), ns, name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Stop)
	return &heartbeats{h}
}

// waitWrites waits for n more writes.
func (h *heartbeats) waitWrites(t *testing.T, n int, timeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(suiteCtx, timeout)
	defer cancel()
	if err := h.WaitWrites(ctx, n); err != nil {
		t.Fatalf("within %s: %v", timeout, err)
	}
}

// waitCondition waits until the AddonInstance has condition typ with status
// (and a message containing each of msgs), and returns it.
func (h *heartbeats) waitCondition(t *testing.T, typ string, status metav1.ConditionStatus, timeout time.Duration, msgs ...string) metav1.Condition {
	t.Helper()
	ctx, cancel := context.WithTimeout(suiteCtx, timeout)
	defer cancel()
	c, err := h.WaitCondition(ctx, typ, status, msgs...)
	if err != nil {
		t.Fatalf("within %s: %v", timeout, err)
	}
	return c
}

// leaderPod is the pod whose reporter holds the addon's election Lease.
func leaderPod(t *testing.T) corev1.Pod {
	t.Helper()
	var lease coordinationv1.Lease
	if err := cluster.Client.Get(suiteCtx, key(addonNamespace, election.LeaseName(instance)), &lease); err != nil {
		t.Fatal(err)
	}
	holder := ptr.Deref(lease.Spec.HolderIdentity, "")
	var pod corev1.Pod
	if err := cluster.Client.Get(suiteCtx, key(addonNamespace, holder), &pod); err != nil {
		t.Fatalf("the Lease holder %q is no pod: %v", holder, err)
	}
	return pod
}

// runStep runs one step of a test that goes on only when it passes: it logs
// how long it took, and on failure the pods' last log lines; with
// NODE_E2E_HOLD set it keeps the cluster up that long for a look.
func runStep(t *testing.T, name string, f func(t *testing.T)) {
	start := time.Now()
	ok := t.Run(name, f)
	logf("step %s: %s (%s)", name, map[bool]string{true: "ok", false: "FAILED"}[ok], time.Since(start).Round(time.Millisecond))
	if !ok {
		dumpPodLogs(40)
		if d, err := time.ParseDuration(os.Getenv("NODE_E2E_HOLD")); err == nil {
			logf("holding the cluster for %s: state in %s, kubeconfig %s, netns %s", d, cluster.Dir, cluster.Kubeconfig, cluster.NetNS.Path)
			select {
			case <-time.After(d):
			case <-suiteCtx.Done():
			}
		}
		t.FailNow()
	}
}
