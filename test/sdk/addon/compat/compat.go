// Package compat holds the checks that test/sdk/addon and test/sdk/newest
// run, each at the controller-runtime, k8s.io and Go releases its module
// pins: the addon reports through the SDK from its manager against a real
// API server, and requiring the SDK changed none of the module's own pins.
package compat

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/election"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/heartbeattest"
	"github.com/addon-heartbeat/addon-heartbeat/test/sdk/addon"
)

// Pinned are the modules whose versions an addon chooses and the SDK must
// not raise.
var Pinned = []string{"k8s.io/api", "k8s.io/apimachinery", "k8s.io/client-go", "sigs.k8s.io/controller-runtime"}

var addonInstances = schema.GroupVersionResource{Group: "addons.managed.openshift.io", Version: "v1alpha1", Resource: "addoninstances"}

// ManagerReports runs the addon's manager against a real API server until
// its Reporter has heartbeaten twice with the addon's own condition and its
// metrics are in the manager's registry; stopping the manager releases the
// election Lease.
func ManagerReports(t *testing.T) {
	env, err := heartbeattest.Start(heartbeattest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Error(err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cs := kubernetes.NewForConfigOrDie(env.Config)
	dyn := dynamic.NewForConfigOrDie(env.Config)
	const ns, name = "my-addon", "addon-instance"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ai := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "addons.managed.openshift.io/v1alpha1", "kind": "AddonInstance",
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec":     map[string]any{"heartbeatUpdatePeriod": "2s"},
	}}
	if _, err := dyn.Resource(addonInstances).Namespace(ns).Create(ctx, ai, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	mgr, reporter, err := addon.NewManager(env.Config, ns, heartbeat.Options{Identity: "my-addon-0"})
	if err != nil {
		t.Fatal(err)
	}
	if err := reporter.SetHealth(heartbeat.Component{Name: "database", Available: true}); err != nil {
		t.Fatal(err)
	}
	const own = "example.com/BackupsCurrent"
	if err := reporter.SetCondition(metav1.Condition{Type: own, Status: metav1.ConditionTrue, Reason: "BackupSucceeded"}); err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- mgr.Start(runCtx) }()

	var first time.Time
	err = wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		got, err := dyn.Resource(addonInstances).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		beat, _, _ := unstructured.NestedString(got.Object, "status", "lastHeartbeatTime")
		at, err := time.Parse(time.RFC3339, beat)
		if err != nil || !hasCondition(got, own) {
			return false, nil
		}
		if first.IsZero() {
			first = at
		}
		return at.After(first), nil
	})
	if err != nil {
		t.Fatalf("waiting for two heartbeats with condition %s: %v", own, err)
	}
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var served []string
	for _, f := range families {
		if strings.HasPrefix(f.GetName(), "addon_heartbeat_") {
			served = append(served, f.GetName())
		}
	}
	if len(served) == 0 {
		t.Error("the manager's metrics registry has no addon_heartbeat_ metric")
	}
	if !reporter.IsLeader() {
		t.Error("the only Reporter does not lead")
	}

	stop()
	if err := <-done; err != nil {
		t.Fatalf("the manager stopped with %v", err)
	}
	lease, err := cs.CoordinationV1().Leases(ns).Get(ctx, election.LeaseName(name), metav1.GetOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	if err == nil && lease.Spec.HolderIdentity != nil && *lease.Spec.HolderIdentity != "" {
		t.Errorf("after the manager stopped the Lease is still held by %q", *lease.Spec.HolderIdentity)
	}
	t.Logf("%s: two heartbeats from the manager's Reporter, %d addon_heartbeat_ metrics in its registry, Lease released", runtime.Version(), len(served))
}

func hasCondition(ai *unstructured.Unstructured, condType string) bool {
	conds, _, _ := unstructured.NestedSlice(ai.Object, "status", "conditions")
	for _, c := range conds {
		if m, ok := c.(map[string]any); ok && m["type"] == condType && m["status"] == "True" {
			return true
		}
	}
	return false
}

// Module is what `go mod edit -json` says of a go.mod.
type Module struct {
	Go      string
	Require []struct{ Path, Version string }
}

// ReadModule reads the go.mod of the module in dir.
func ReadModule(t testing.TB, dir string) Module {
	t.Helper()
	var m Module
	if err := json.Unmarshal(GoCmd(t, dir, "mod", "edit", "-json"), &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// Required is the version m requires of path, "" when none.
func (m Module) Required(path string) string {
	for _, r := range m.Require {
		if r.Path == path {
			return r.Version
		}
	}
	return ""
}

// KeepsItsVersions checks that the module in dir builds with the versions it
// requires of Pinned (the SDK it also requires raised none of them) and is
// built by the Go release its go line names.
func KeepsItsVersions(t *testing.T, dir string) {
	own := ReadModule(t, dir)
	dec := json.NewDecoder(bytes.NewReader(GoCmd(t, dir, "list", "-m", "-json", "all")))
	selected := map[string]string{}
	for {
		var m struct{ Path, Version string }
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		selected[m.Path] = m.Version
	}
	for _, path := range Pinned {
		want := own.Required(path)
		if want == "" {
			t.Errorf("go.mod requires no %s", path)
			continue
		}
		if selected[path] != want {
			t.Errorf("go list -m all selects %s %s, go.mod requires %s: the SDK raised it", path, selected[path], want)
		}
		t.Logf("%s %s", path, selected[path])
	}
	major, minor, _ := strings.Cut(strings.TrimPrefix(own.Go, "go"), ".")
	minor, _, _ = strings.Cut(minor, ".")
	if want := "go" + major + "." + minor; runtime.Version() != want && !strings.HasPrefix(runtime.Version(), want+".") {
		t.Errorf("built by %s, the module's go line is %s: run it with GOTOOLCHAIN=%s.x (make test does)", runtime.Version(), own.Go, want)
	}
}

// GoCmd runs the go command in dir and returns its output.
func GoCmd(t testing.TB, dir string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			stderr = ee.Stderr
		}
		t.Fatalf("go %s in %s: %v\n%s", strings.Join(args, " "), dir, err, stderr)
	}
	return out
}
