//go:build node

package node

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	addonsv1alpha1 "github.com/openshift/addon-operator/apis/addons/v1alpha1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// fencing: helm install found ValidatingAdmissionPolicy on the real API
// server, so the fencing policy is installed. kube-controller-manager
// type-checks it against the AddonInstance and Lease schemas without a
// warning; the service-account token the kubelet mounts in each addon pod
// names that pod (authentication.kubernetes.io/pod-name); the leader's
// heartbeats keep arriving while a heartbeat sent with the standby pod's own
// token is refused by the policy, naming both pods.
func fencing(t *testing.T) {
	ctx := suiteCtx
	var policy admissionregistrationv1.ValidatingAdmissionPolicy
	waitFor(t, "fencing policy type-checked", time.Minute, func(ctx context.Context) (bool, string) {
		if err := cluster.Client.Get(ctx, client.ObjectKey{Name: release + "-fencing"}, &policy); err != nil {
			return false, err.Error()
		}
		return policy.Status.ObservedGeneration == policy.Generation && policy.Status.TypeChecking != nil,
			fmt.Sprintf("observedGeneration %d of %d, typeChecking %+v", policy.Status.ObservedGeneration, policy.Generation, policy.Status.TypeChecking)
	})
	if w := policy.Status.TypeChecking.ExpressionWarnings; len(w) > 0 {
		t.Errorf("type-checking warnings: %+v", w)
	}

	leader := leaderPod(t)
	addonPods, err := pods(ctx, addonNamespace, map[string]string{"app": operatorName})
	if err != nil {
		t.Fatal(err)
	}
	var standby *corev1.Pod
	for i := range addonPods {
		if addonPods[i].Name != leader.Name && addonPods[i].Status.Phase == corev1.PodRunning {
			standby = &addonPods[i]
		}
	}
	if standby == nil {
		t.Fatalf("no running standby pod besides the leader %s", leader.Name)
	}

	leaderClient := mountedTokenClient(t, leader)
	standbyClient := mountedTokenClient(t, *standby)

	// The leader's own reporter keeps writing (the policy admits it), and a
	// write with the leader's mounted token from here is admitted too.
	hb := watchHeartbeats(t, addonNamespace, instance)
	hb.waitWrites(t, 2, 4*period)
	if err := moveHeartbeat(ctx, leaderClient); err != nil {
		t.Errorf("a heartbeat with the leader %s's token was refused: %v", leader.Name, err)
	}
	err = moveHeartbeat(ctx, standbyClient)
	want := fmt.Sprintf("held by %s); this request came from pod %s", leader.Name, standby.Name)
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("a heartbeat with the standby %s's token: %v, want a refusal containing %q", standby.Name, err, want)
	}
	hb.waitWrites(t, 2, 4*period)
	logf("fencing: mounted tokens name their pods; leader %s admitted, standby %s refused: %v", leader.Name, standby.Name, err)
}

// mountedTokenClient authenticates with the service-account token the
// kubelet wrote into pod's projected volume (this test runs as root, on the
// node), after checking with a SelfSubjectReview that the API server reads
// the pod's name from it.
func mountedTokenClient(t *testing.T, pod corev1.Pod) client.Client {
	t.Helper()
	glob := filepath.Join(cluster.Dir, "kubelet", "root", "pods", string(pod.UID), "volumes", "kubernetes.io~projected", "kube-api-access-*", "token")
	files, err := filepath.Glob(glob)
	if err != nil || len(files) != 1 {
		t.Fatalf("the token the kubelet mounted for %s: %v %v (%s)", pod.Name, files, err, glob)
	}
	token, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	cfg := rest.AnonymousClientConfig(cluster.Config)
	cfg.BearerToken = strings.TrimSpace(string(token))
	c, err := client.New(cfg, client.Options{Scheme: cluster.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	var review authenticationv1.SelfSubjectReview
	if err := c.Create(suiteCtx, &review); err != nil {
		t.Fatalf("SelfSubjectReview with %s's mounted token: %v", pod.Name, err)
	}
	if got := review.Status.UserInfo.Extra["authentication.kubernetes.io/pod-name"]; len(got) != 1 || got[0] != pod.Name {
		t.Fatalf("%s's mounted token: pod-name %v in userInfo.extra, want [%s]", pod.Name, got, pod.Name)
	}
	return c
}

// moveHeartbeat writes lastHeartbeatTime one second past the stored one (the
// reporter's next would be later still, so it never goes back).
func moveHeartbeat(ctx context.Context, c client.Client) error {
	var ai addonsv1alpha1.AddonInstance
	if err := c.Get(ctx, client.ObjectKey{Namespace: addonNamespace, Name: instance}, &ai); err != nil {
		return fmt.Errorf("reading AddonInstance: %w", err)
	}
	ai.Status.LastHeartbeatTime = metav1.NewTime(ai.Status.LastHeartbeatTime.Add(time.Second))
	return c.Status().Update(ctx, &ai)
}
