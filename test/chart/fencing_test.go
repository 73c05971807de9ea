package chart_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	addonsv1alpha1 "github.com/openshift/addon-operator/apis/addons/v1alpha1"
	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/addon-heartbeat/addon-heartbeat/internal/chart"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat"
)

// The fencing policy as the chart renders it for a 1.30+ API server, on the
// real API server with real bound service-account tokens: only the pod that
// holds an AddonInstance's election Lease may move its lastHeartbeatTime.
func TestFencingPolicy(t *testing.T) {
	ctx := t.Context()
	const ns, sa = "fencing", "addon"
	instance := "addon-instance"

	objs, _ := renderFor(t, chart.Cluster{}.With(chart.AdmissionPolicyAPIVersions...), "")
	policyName := chart.DefaultRelease.Name + "-fencing"
	for _, kind := range []string{"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} {
		o := mustFind(t, objs, kind, policyName).DeepCopy()
		if err := k8s.Create(ctx, o); err != nil {
			t.Fatalf("creating %s: %v", kind, err)
		}
		t.Cleanup(func() { _ = k8s.Delete(context.Background(), o) })
	}
	// The API server refuses a policy whose expressions do not compile, so
	// the creates above check that; status.typeChecking (types against the
	// AddonInstance and Lease schemas) is written by kube-controller-manager,
	// which envtest does not run: the writes below show each expression's
	// behaviour instead.

	mustCreate(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	mustCreate(t, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sa}})
	// The reporter role's status permission, for this test's writers.
	mustCreate(t, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "writer"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{addonsv1alpha1.GroupVersion.Group},
			Resources: []string{"addoninstances", "addoninstances/status"}, Verbs: []string{"get", "update"}}}})
	mustCreate(t, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "writer"},
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "writer"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: sa},
			{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "addon-operator"}}})
	for _, name := range []string{"pod-a", "pod-b"} {
		mustCreate(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: corev1.PodSpec{ServiceAccountName: sa, Containers: []corev1.Container{{Name: "c", Image: "example.invalid/c:1"}}}})
	}
	mustCreate(t, &addonsv1alpha1.AddonInstance{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: instance},
		Spec: addonsv1alpha1.AddonInstanceSpec{HeartbeatUpdatePeriod: metav1.Duration{Duration: 10 * time.Second}}})
	mustCreate(t, &addonsv1alpha1.AddonInstance{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "other"},
		Spec: addonsv1alpha1.AddonInstanceSpec{HeartbeatUpdatePeriod: metav1.Duration{Duration: 10 * time.Second}}})

	podA := podClient(t, ns, sa, "pod-a")
	podB := podClient(t, ns, sa, "pod-b")
	plain := saClient(t, ns, sa, nil)
	operator := userClient(t, "addon-operator")

	// The Lease as pkg/heartbeat makes and renews it, held by pod-a.
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: heartbeat.LeaseName(instance),
		Labels:      map[string]string{"app.kubernetes.io/managed-by": "addon-heartbeat"},
		Annotations: map[string]string{heartbeat.InstanceAnnotation: instance}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("pod-a"), LeaseDurationSeconds: ptr.To[int32](15)}}
	mustCreate(t, lease)

	// The binding takes a moment to be enforced: await pod-b's refusal.
	poll(t, "policy enforced", func(ctx context.Context) (bool, string) {
		err := beat(ctx, podB, ns, instance)
		return err != nil && strings.Contains(err.Error(), "may be moved only by the pod holding"), fmt.Sprint(err)
	})

	if err := beat(ctx, podA, ns, instance); err != nil {
		t.Errorf("the holder pod-a was refused: %v", err)
	}
	err := beat(ctx, podB, ns, instance)
	want := "held by pod-a); this request came from pod pod-b"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("pod-b: got %v, want a refusal containing %q", err, want)
	}
	// The reporter tells this refusal from a missing permission.
	if !heartbeat.IsFenced(err) {
		t.Errorf("heartbeat.IsFenced(%v) = false for the policy's refusal", err)
	}
	// The Lease made again after a deletion, with no holder yet (as the
	// webhook and the reporters make it): nobody may move the heartbeat.
	vacant := lease.DeepCopy()
	vacant.ResourceVersion, vacant.UID = "", ""
	if err := k8s.Delete(ctx, lease); err != nil {
		t.Fatal(err)
	}
	vacant.Spec = coordinationv1.LeaseSpec{}
	mustCreate(t, vacant)
	poll(t, "the holder refused while the Lease is made again with no holder", func(ctx context.Context) (bool, string) {
		err := beat(ctx, podA, ns, instance)
		return heartbeat.IsFenced(err) && strings.Contains(err.Error(), "held by nobody"), fmt.Sprint(err)
	})
	if err := k8s.Delete(ctx, vacant); err != nil {
		t.Fatal(err)
	}
	lease.ResourceVersion, lease.UID = "", ""
	mustCreate(t, lease)
	poll(t, "the holder admitted again", func(ctx context.Context) (bool, string) {
		err := beat(ctx, podA, ns, instance)
		return err == nil, fmt.Sprint(err)
	})
	err = beat(ctx, plain, ns, instance)
	if err == nil || !strings.Contains(err.Error(), "carries no pod name") {
		t.Errorf("plain token: got %v, want a refusal saying it carries no pod name", err)
	}
	// The addon-operator setting Healthy leaves the heartbeat alone.
	if err := setHealthy(ctx, operator, ns, instance); err != nil {
		t.Errorf("operator setting Healthy was refused: %v", err)
	}
	// Moving the heartbeat, the operator is refused like any other non-holder.
	if err := beat(ctx, operator, ns, instance); err == nil {
		t.Error("operator moving lastHeartbeatTime was admitted")
	}
	// An AddonInstance whose name no Lease carries is not fenced.
	if err := beat(ctx, podB, ns, "other"); err != nil {
		t.Errorf("pod-b writing an AddonInstance without a Lease was refused: %v", err)
	}

	// SDK identity format: "<host name>_<uuid>", the host name being the pod's.
	setHolder(t, lease, "pod-b_0f8fad5b-d9cb-469f-a165-70867728950e")
	poll(t, "SDK holder pod-b admitted", func(ctx context.Context) (bool, string) {
		err := beat(ctx, podB, ns, instance)
		return err == nil, fmt.Sprint(err)
	})
	// The former holder pod-a is refused now that pod-b_<uuid> holds.
	if err := beat(ctx, podA, ns, instance); err == nil {
		t.Error("pod-a was admitted while pod-b_<uuid> holds")
	}

	// The Lease names another instance: nobody is fenced for this one.
	lease.Annotations[heartbeat.InstanceAnnotation] = "other"
	if err := k8s.Update(ctx, lease); err != nil {
		t.Fatal(err)
	}
	poll(t, "Lease of another instance does not fence", func(ctx context.Context) (bool, string) {
		err := beat(ctx, plain, ns, instance)
		return err == nil, fmt.Sprint(err)
	})
	if err := beat(ctx, podA, ns, instance); err != nil {
		t.Errorf("pod-a with the Lease annotated for another instance: %v", err)
	}
	// ... and "other" is now fenced by it.
	if err := beat(ctx, plain, ns, "other"); err == nil {
		t.Error("plain token moved the heartbeat of the instance the Lease names")
	}

	// No Lease at all: every writer passes.
	if err := k8s.Delete(ctx, lease); err != nil {
		t.Fatal(err)
	}
	poll(t, "no Lease, no fencing", func(ctx context.Context) (bool, string) {
		err := beat(ctx, plain, ns, "other")
		return err == nil, fmt.Sprint(err)
	})
}

func mustCreate(t *testing.T, o client.Object) {
	t.Helper()
	if err := k8s.Create(t.Context(), o); err != nil {
		t.Fatalf("creating %T %s: %v", o, o.GetName(), err)
	}
}

func setHolder(t *testing.T, lease *coordinationv1.Lease, holder string) {
	t.Helper()
	lease.Spec.HolderIdentity = ptr.To(holder)
	if err := k8s.Update(t.Context(), lease); err != nil {
		t.Fatal(err)
	}
}

// beat moves lastHeartbeatTime forward as the reporter does.
func beat(ctx context.Context, c client.Client, ns, name string) error {
	var ai addonsv1alpha1.AddonInstance
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &ai); err != nil {
		return fmt.Errorf("reading AddonInstance: %w", err)
	}
	next := time.Now().Truncate(time.Second)
	if !next.After(ai.Status.LastHeartbeatTime.Time) {
		next = ai.Status.LastHeartbeatTime.Add(time.Second)
	}
	ai.Status.LastHeartbeatTime = metav1.NewTime(next)
	return c.Status().Update(ctx, &ai)
}

// setHealthy flips the Healthy condition, leaving lastHeartbeatTime as it is.
func setHealthy(ctx context.Context, c client.Client, ns, name string) error {
	var ai addonsv1alpha1.AddonInstance
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &ai); err != nil {
		return fmt.Errorf("reading AddonInstance: %w", err)
	}
	status := metav1.ConditionTrue
	for _, c := range ai.Status.Conditions {
		if c.Type == "Healthy" && c.Status == metav1.ConditionTrue {
			status = metav1.ConditionFalse
		}
	}
	ai.Status.Conditions = []metav1.Condition{{Type: "Healthy", Status: status, Reason: "Test",
		LastTransitionTime: metav1.Now()}}
	return c.Status().Update(ctx, &ai)
}

// podClient authenticates with a token bound to the Pod, as the kubelet
// mounts it, and checks that the API server sees the pod name in it.
func podClient(t *testing.T, ns, sa, pod string) client.Client {
	t.Helper()
	var p corev1.Pod
	if err := k8s.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: pod}, &p); err != nil {
		t.Fatal(err)
	}
	c := saClient(t, ns, sa, &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod, UID: p.UID})
	var review authenticationv1.SelfSubjectReview
	if err := c.Create(t.Context(), &review); err != nil {
		t.Fatalf("SelfSubjectReview as %s: %v", pod, err)
	}
	if got := review.Status.UserInfo.Extra["authentication.kubernetes.io/pod-name"]; len(got) != 1 || got[0] != pod {
		t.Fatalf("token bound to %s: pod-name %v in userInfo.extra, want [%s]", pod, got, pod)
	}
	return c
}

// saClient authenticates with a TokenRequest token of the ServiceAccount,
// bound to bound if not nil.
func saClient(t *testing.T, ns, sa string, bound *authenticationv1.BoundObjectReference) client.Client {
	t.Helper()
	cs := kubernetes.NewForConfigOrDie(env.Config)
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(t.Context(), sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600), BoundObjectRef: bound}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("TokenRequest: %v", err)
	}
	cfg := rest.AnonymousClientConfig(env.Config)
	cfg.BearerToken = tr.Status.Token
	c, err := client.New(cfg, client.Options{Scheme: k8s.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// userClient impersonates another identity, such as the addon-operator.
func userClient(t *testing.T, user string) client.Client {
	t.Helper()
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	c, err := client.New(cfg, client.Options{Scheme: k8s.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}
