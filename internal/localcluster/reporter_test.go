package localcluster

import (
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/annotations"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/inject"
)

func TestReporterInvocation(t *testing.T) {
	d := &appsv1.Deployment{}
	d.Namespace, d.Name = "my-addon", "op"
	d.Annotations = map[string]string{annotations.Inject: "true", annotations.DeleteAck: "manual"}
	d.Spec.Template.Spec.Containers = []corev1.Container{{Name: "manager"}}
	cfg := inject.DefaultConfig()
	cfg.Image = "reporter:v1"
	res, err := inject.Mutate(d, cfg)
	if err != nil {
		t.Fatal(err)
	}
	inv, err := ReporterInvocation(res.Deployment, "op-abc")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(inv.Command, []string{inject.ReporterCommand}) || !slices.Contains(inv.Args, "--delete-ack=manual") {
		t.Errorf("invocation %+v", inv)
	}
	want := []string{"ADDON_TARGET_NAMESPACE=my-addon", "POD_NAME=op-abc", "POD_NAMESPACE=my-addon"}
	if !slices.Equal(inv.Env, want) {
		t.Errorf("env %v, want %v", inv.Env, want)
	}
	if _, err := ReporterInvocation(d, "x"); err == nil {
		t.Error("no error for a Deployment without the reporter")
	}
}
