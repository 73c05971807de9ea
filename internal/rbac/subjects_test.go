package rbac

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/annotations"
)

func deployment(sa string, annots map[string]string) appsv1.Deployment {
	d := appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Annotations: annots}}
	d.Spec.Template.Spec.ServiceAccountName = sa
	return d
}

func TestSubjects(t *testing.T) {
	injected := map[string]string{annotations.Inject: "true"}
	tests := map[string]struct {
		deps []appsv1.Deployment
		want []string
	}{
		"none":                         {},
		"opted in":                     {deps: []appsv1.Deployment{deployment("addon", injected)}, want: []string{"addon"}},
		"no ServiceAccount is default": {deps: []appsv1.Deployment{deployment("", injected)}, want: []string{"default"}},
		"status only (being removed)":  {deps: []appsv1.Deployment{deployment("a", map[string]string{annotations.Status: "{}"})}, want: []string{"a"}},
		"opted out":                    {deps: []appsv1.Deployment{deployment("a", map[string]string{annotations.Inject: "false"})}},
		"invalid inject value":         {deps: []appsv1.Deployment{deployment("a", map[string]string{annotations.Inject: "yes"})}},
		"not annotated":                {deps: []appsv1.Deployment{deployment("a", nil)}},
		"sorted, without duplicates":   {deps: []appsv1.Deployment{deployment("b", injected), deployment("a", injected), deployment("b", injected)}, want: []string{"a", "b"}},
		"only injected ones":           {deps: []appsv1.Deployment{deployment("a", injected), deployment("b", nil)}, want: []string{"a"}},
		"opted in by label (OLM)": {deps: []appsv1.Deployment{func() appsv1.Deployment {
			d := deployment("a", nil)
			d.Labels = injected
			return d
		}()}, want: []string{"a"}},
		"opted in by pod template annotation (OLM)": {deps: []appsv1.Deployment{func() appsv1.Deployment {
			d := deployment("a", nil)
			d.Spec.Template.Annotations = injected
			return d
		}()}, want: []string{"a"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var want []rbacv1.Subject
			for _, n := range tc.want {
				want = append(want, rbacv1.Subject{Kind: "ServiceAccount", Name: n, Namespace: "ns"})
			}
			got := Subjects("ns", tc.deps)
			if diff := cmp.Diff(want, got, cmpEmpty); diff != "" {
				t.Error(diff)
			}
		})
	}
}

// cmpEmpty treats nil and empty slices alike.
var cmpEmpty = cmp.FilterValues(func(a, b []rbacv1.Subject) bool { return len(a) == 0 && len(b) == 0 }, cmp.Ignore())
