//go:build go1.25

package heartbeat

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/annotations"
)

type depOpt func(*appsv1.Deployment)

func dep(name string, replicas *int32, available int32, avail corev1.ConditionStatus, opts ...depOpt) appsv1.Deployment {
	d := appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", Generation: 2,
			Annotations: map[string]string{annotations.Inject: "true"}},
		Spec: appsv1.DeploymentSpec{Replicas: replicas},
		Status: appsv1.DeploymentStatus{ObservedGeneration: 2, AvailableReplicas: available,
			Conditions: []appsv1.DeploymentCondition{{Type: appsv1.DeploymentAvailable, Status: avail, Reason: "MinimumReplicasAvailable"}}},
	}
	for _, o := range opts {
		o(&d)
	}
	return d
}

func TestDeploymentComponent(t *testing.T) {
	tests := map[string]struct {
		d    appsv1.Deployment
		want Component
	}{
		"available": {
			d:    dep("op", ptr.To[int32](3), 3, corev1.ConditionTrue),
			want: Component{Name: "op", Available: true, Reason: ReasonDeploymentUnavailable, Message: "op 3/3 available"},
		},
		"nil replicas means one": {
			d:    dep("op", nil, 1, corev1.ConditionTrue),
			want: Component{Name: "op", Available: true, Reason: ReasonDeploymentUnavailable, Message: "op 1/1 available"},
		},
		"too few replicas and Available=False": {
			d:    dep("addon-operator", ptr.To[int32](3), 1, corev1.ConditionFalse),
			want: Component{Name: "addon-operator", Reason: ReasonDeploymentUnavailable, Message: "addon-operator 1/3 available"},
		},
		"Available=False": {
			d: dep("op", ptr.To[int32](1), 1, corev1.ConditionFalse, func(d *appsv1.Deployment) {
				d.Status.Conditions[0].Reason = "MinimumReplicasUnavailable"
			}),
			want: Component{Name: "op", Reason: ReasonDeploymentUnavailable, Message: "op 1/1 available, but Available=False (MinimumReplicasUnavailable)"},
		},
		"no conditions yet": {
			d:    dep("op", ptr.To[int32](1), 0, "", func(d *appsv1.Deployment) { d.Status = appsv1.DeploymentStatus{} }),
			want: Component{Name: "op", Reason: ReasonDeploymentUnavailable, Message: "op 0/1 available"},
		},
		"enough replicas but no condition": {
			d:    dep("op", ptr.To[int32](1), 1, "", func(d *appsv1.Deployment) { d.Status.Conditions = nil }),
			want: Component{Name: "op", Reason: ReasonDeploymentUnavailable, Message: "op 1/1 available, but no Available condition"},
		},
		"rollout not observed": {
			d:    dep("op", ptr.To[int32](1), 1, corev1.ConditionTrue, func(d *appsv1.Deployment) { d.Generation = 3 }),
			want: Component{Name: "op", Reason: ReasonDeploymentUnavailable, Message: "op 1/1 available, but generation 3 not yet observed"},
		},
		"scaled to zero": {
			d:    dep("op", ptr.To[int32](0), 0, corev1.ConditionTrue),
			want: Component{Name: "op", Available: true, Reason: ReasonDeploymentUnavailable, Message: "op 0/0 available"},
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, DeploymentComponent(&tt.d)); diff != "" {
				t.Errorf("DeploymentComponent (-want +got):\n%s", diff)
			}
		})
	}
}

func TestInjectedFor(t *testing.T) {
	tests := map[string]struct {
		annots   map[string]string
		instance string
		want     bool
	}{
		"default instance":        {map[string]string{annotations.Inject: "true"}, "addon-instance", true},
		"named instance":          {map[string]string{annotations.Inject: "true", annotations.AddonInstance: "x"}, "x", true},
		"other instance":          {map[string]string{annotations.Inject: "true", annotations.AddonInstance: "y"}, "x", false},
		"default is not ours":     {map[string]string{annotations.Inject: "true"}, "x", false},
		"opted out":               {map[string]string{annotations.Inject: "false"}, "addon-instance", false},
		"no annotations":          {nil, "addon-instance", false},
		"invalid inject value":    {map[string]string{annotations.Inject: "yes"}, "addon-instance", false},
		"instance without opt-in": {map[string]string{annotations.AddonInstance: "addon-instance"}, "addon-instance", false},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			if got := InjectedFor(annotations.Sources{Annotations: tt.annots}, tt.instance); got != tt.want {
				t.Errorf("InjectedFor = %v, want %v", got, tt.want)
			}
		})
	}
	// OLM's ways in: a label, a pod-template annotation; and a conflict,
	// which the webhook denies, counts as no opt-in.
	places := map[string]struct {
		src  annotations.Sources
		want bool
	}{
		"label": {annotations.Sources{Labels: map[string]string{annotations.Inject: "true", annotations.AddonInstance: "x"}}, true},
		"pod template annotation": {annotations.Sources{Labels: map[string]string{annotations.Inject: "true"},
			TemplateAnnotations: map[string]string{annotations.AddonInstance: "x"}}, true},
		"conflict": {annotations.Sources{Labels: map[string]string{annotations.Inject: "true"},
			Annotations: map[string]string{annotations.Inject: "false", annotations.AddonInstance: "x"}}, false},
	}
	for name, tt := range places {
		t.Run(name, func(t *testing.T) {
			if got := InjectedFor(tt.src, "x"); got != tt.want {
				t.Errorf("InjectedFor = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestDeploymentComponents(t *testing.T) {
	other := dep("other", nil, 0, corev1.ConditionFalse, func(d *appsv1.Deployment) {
		d.Annotations[annotations.AddonInstance] = "someone-else"
	})
	plain := dep("plain", nil, 0, corev1.ConditionFalse, func(d *appsv1.Deployment) { d.Annotations = nil })
	got := DeploymentComponents([]appsv1.Deployment{
		dep("zeta", nil, 1, corev1.ConditionTrue), other, plain, dep("alpha", ptr.To[int32](2), 1, corev1.ConditionTrue),
	}, "ns", "addon-instance")
	var names []string
	for _, c := range got {
		names = append(names, c.Name)
	}
	if diff := cmp.Diff([]string{"alpha", "zeta"}, names); diff != "" {
		t.Errorf("components (-want +got):\n%s", diff)
	}
	none := DeploymentComponents([]appsv1.Deployment{other}, "ns", "addon-instance")
	if len(none) != 1 || none[0].Available || none[0].Reason != ReasonNoComponents ||
		none[0].Message != "no Deployment in namespace ns is injected for AddonInstance addon-instance" {
		t.Errorf("no components = %+v", none)
	}
}

func TestTrimDeploymentKeepsWhatHealthReads(t *testing.T) {
	d := dep("op", ptr.To[int32](3), 1, corev1.ConditionTrue, func(d *appsv1.Deployment) {
		delete(d.Annotations, annotations.Inject)
		d.Annotations["unrelated"] = strings.Repeat("z", 1000)
		d.Labels = map[string]string{"a": "b", annotations.Inject: "true"}
		d.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}
		d.Spec.Template.Annotations = map[string]string{annotations.AddonInstance: "x", "olm.targetNamespaces": "ns"}
		d.Spec.Template.Spec.Containers = []corev1.Container{{Name: "c", Image: "img"}}
	})
	out, err := TrimDeployment(&d)
	if err != nil {
		t.Fatal(err)
	}
	tr := out.(*appsv1.Deployment)
	if tr.ManagedFields != nil || tr.Labels["a"] != "" || len(tr.Spec.Template.Spec.Containers) != 0 ||
		tr.Annotations["unrelated"] != "" || tr.Spec.Template.Annotations["olm.targetNamespaces"] != "" {
		t.Errorf("trimmed Deployment still holds %+v", tr)
	}
	if diff := cmp.Diff(DeploymentComponent(&d), DeploymentComponent(tr)); diff != "" {
		t.Errorf("trimming changed the health verdict:\n%s", diff)
	}
	if !InjectedFor(annotations.OfDeployment(&d), "x") || !InjectedFor(annotations.OfDeployment(tr), "x") {
		t.Errorf("trimming changed the selection")
	}
	tomb := "not a deployment"
	if got, _ := TrimDeployment(tomb); got != tomb {
		t.Errorf("TrimDeployment changed a non-Deployment")
	}
}

func TestHealthChecker(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/ok":
			w.WriteHeader(http.StatusOK)
		case "/redirect":
			http.Redirect(w, r, "http://192.0.2.1:1/elsewhere", http.StatusFound)
		case "/slow":
			select {
			case <-r.Context().Done():
			case <-time.After(time.Minute):
			}
		default:
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	tests := map[string]struct {
		path      string
		available bool
		msg       string
	}{
		"2xx is healthy":                  {"/ok", true, "returned 200 OK"},
		"3xx is healthy and not followed": {"/redirect", true, "returned 302 Found"},
		"5xx is unhealthy":                {"/down", false, "returned 503 Service Unavailable"},
		"timeout is unhealthy":            {"/slow", false, "context deadline exceeded"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			h := newHealthChecker(srv.URL + tt.path)
			defer h.close()
			// A deadline the slow path always misses, and the others
			// always meet, however loaded the machine.
			timeout := 30 * time.Second
			if tt.path == "/slow" {
				timeout = 300 * time.Millisecond
			}
			ctx, cancel := context.WithTimeout(t.Context(), timeout)
			defer cancel()
			c := h.check(ctx)
			if c.Available != tt.available || !strings.Contains(c.Message, tt.msg) || c.Name != HealthURLComponent {
				t.Errorf("check = %+v, want available=%v and a message containing %q", c, tt.available, tt.msg)
			}
			if !c.Available && c.Reason != ReasonHealthCheckFailed {
				t.Errorf("reason = %q", c.Reason)
			}
		})
	}
}
