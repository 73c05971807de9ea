package inject

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/annotations"
)

func deployment(annots map[string]string, containers ...corev1.Container) *appsv1.Deployment {
	if len(containers) == 0 {
		containers = []corev1.Container{{Name: "manager", Image: "addon:v1"}}
	}
	d := &appsv1.Deployment{}
	d.Name, d.Namespace = "addon", "addon-ns"
	d.Annotations = annots
	d.Spec.Template.Spec.Containers = containers
	return d
}

func injected(t *testing.T, d *appsv1.Deployment, cfg Config) *appsv1.Deployment {
	t.Helper()
	return mustMutate(t, d, cfg).Deployment
}

func withAnnotation(d *appsv1.Deployment, key, value string) *appsv1.Deployment {
	d = d.DeepCopy()
	if value == "" {
		delete(d.Annotations, key)
	} else {
		d.Annotations[key] = value
	}
	return d
}

func optIn() map[string]string { return map[string]string{annotations.Inject: "true"} }

func TestMutate(t *testing.T) {
	cfg := testConfig()
	newImage := testConfig()
	newImage.Image = "registry.example.com/addon-heartbeat/reporter:v0.2.0"

	tests := map[string]struct {
		in  *appsv1.Deployment
		cfg Config
		// wantErr lists substrings of the error; empty means no error.
		wantErr    []string
		wantAction Action
		// wantOps are the patch operations as "op path".
		wantOps []string
	}{
		"not annotated": {
			in: deployment(nil), cfg: cfg, wantAction: Unchanged,
		},
		"injection disabled": {
			in: deployment(map[string]string{annotations.Inject: "false"}), cfg: cfg, wantAction: Unchanged,
		},
		"opted in": {
			in: deployment(optIn()), cfg: cfg, wantAction: Injected,
			wantOps: []string{
				"add /spec/template/spec/containers/0/env",
				"add /spec/template/spec/initContainers",
				"add /metadata/annotations/addon-heartbeat.io~1status",
			},
		},
		"opted in, plain container": {
			in: deployment(optIn()), cfg: plainConfig(), wantAction: Injected,
			wantOps: []string{
				"add /spec/template/spec/containers/0/env",
				"add /spec/template/spec/containers/-",
				"add /metadata/annotations/addon-heartbeat.io~1status",
			},
		},
		"already injected": {
			in: injected(t, deployment(optIn()), cfg), cfg: cfg, wantAction: Unchanged,
		},
		"new reporter image": {
			in: injected(t, deployment(optIn()), cfg), cfg: newImage, wantAction: Injected,
			wantOps: []string{"replace /spec/template/spec/initContainers/0"},
		},
		"native sidecar switched off": {
			in: injected(t, deployment(optIn()), cfg), cfg: plainConfig(), wantAction: Injected,
			wantOps: []string{
				"remove /spec/template/spec/initContainers",
				"add /spec/template/spec/containers/-",
				"add /metadata/annotations/addon-heartbeat.io~1status",
			},
		},
		"setting changed on an injected Deployment": {
			in:         withAnnotation(injected(t, deployment(optIn()), cfg), annotations.DeleteAck, "manual"),
			cfg:        cfg,
			wantAction: Injected,
			wantOps:    []string{"replace /spec/template/spec/initContainers/0"},
		},
		"opted out with false": {
			in:         withAnnotation(injected(t, deployment(optIn()), cfg), annotations.Inject, "false"),
			cfg:        cfg,
			wantAction: Removed,
			wantOps: []string{
				"remove /spec/template/spec/containers/0/env",
				"remove /spec/template/spec/initContainers",
				"remove /metadata/annotations/addon-heartbeat.io~1status",
			},
		},
		"opted out by removing the annotation": {
			in:         withAnnotation(injected(t, deployment(optIn()), cfg), annotations.Inject, ""),
			cfg:        cfg,
			wantAction: Removed,
			wantOps: []string{
				"remove /spec/template/spec/containers/0/env",
				"remove /spec/template/spec/initContainers",
				"remove /metadata/annotations/addon-heartbeat.io~1status",
			},
		},
		"user sets ADDON_TARGET_NAMESPACE": {
			in:  deployment(optIn(), corev1.Container{Name: "manager", Env: []corev1.EnvVar{{Name: TargetNamespaceEnv, Value: "elsewhere"}}}),
			cfg: cfg, wantAction: Injected,
			wantOps: []string{
				"add /spec/template/spec/initContainers",
				"add /metadata/annotations/addon-heartbeat.io~1status",
			},
		},
		"envFrom without prefix may set it": {
			in:  deployment(optIn(), corev1.Container{Name: "manager", EnvFrom: []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{}}}}),
			cfg: cfg, wantAction: Injected,
			wantOps: []string{
				"add /spec/template/spec/initContainers",
				"add /metadata/annotations/addon-heartbeat.io~1status",
			},
		},
		"envFrom with an unrelated prefix": {
			in: deployment(optIn(), corev1.Container{Name: "manager", Env: []corev1.EnvVar{{Name: "A", Value: "b"}},
				EnvFrom: []corev1.EnvFromSource{{Prefix: "DB_", ConfigMapRef: &corev1.ConfigMapEnvSource{}}}}),
			cfg: cfg, wantAction: Injected,
			wantOps: []string{
				"add /spec/template/spec/containers/0/env/-",
				"add /spec/template/spec/initContainers",
				"add /metadata/annotations/addon-heartbeat.io~1status",
			},
		},
		"invalid inject value": {
			in: deployment(map[string]string{annotations.Inject: "yes"}), cfg: cfg,
			wantErr: []string{"annotation addon-heartbeat.io/inject", `"yes"`, `expected "true" or "false"`},
		},
		"invalid delete-ack": {
			in: deployment(map[string]string{annotations.Inject: "true", annotations.DeleteAck: "later"}), cfg: cfg,
			wantErr: []string{"annotation addon-heartbeat.io/delete-ack", `"later"`, `expected "auto" or "manual"`},
		},
		"health URL not on loopback": {
			in: deployment(map[string]string{annotations.Inject: "true", annotations.HealthURL: "http://10.0.0.1:8081/healthz"}), cfg: cfg,
			wantErr: []string{"annotation addon-heartbeat.io/health-url", `"http://10.0.0.1:8081/healthz"`, "loopback"},
		},
		"invalid AddonInstance name": {
			in: deployment(map[string]string{annotations.Inject: "true", annotations.AddonInstance: "Not_A_Name"}), cfg: cfg,
			wantErr: []string{"annotation addon-heartbeat.io/addon-instance", `"Not_A_Name"`, "DNS-1123"},
		},
		"settings of an opted-out Deployment are not checked": {
			in: deployment(map[string]string{annotations.Inject: "false", annotations.DeleteAck: "later"}), cfg: cfg, wantAction: Unchanged,
		},
		"container name taken by the addon": {
			in: deployment(optIn(), corev1.Container{Name: ContainerName}), cfg: cfg,
			wantErr: []string{`container name "heartbeat-reporter" is reserved`, annotations.Inject},
		},
		"status annotation not ours": {
			in: deployment(map[string]string{annotations.Inject: "true", annotations.Status: "injected"}), cfg: cfg,
			wantErr: []string{"annotation addon-heartbeat.io/status", `"injected"`, "record written by the addon-heartbeat webhook"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			before := tc.in.DeepCopy()
			res, err := Mutate(tc.in, tc.cfg)
			if !equality.Semantic.DeepEqual(before, tc.in) {
				t.Fatal("Mutate modified its input")
			}
			if len(tc.wantErr) > 0 {
				if err == nil {
					t.Fatalf("no error, want one containing %q", tc.wantErr)
				}
				for _, s := range tc.wantErr {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("error %q does not contain %q", err, s)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("Mutate: %v", err)
			}
			if res.Action != tc.wantAction {
				t.Errorf("action = %s, want %s", res.Action, tc.wantAction)
			}
			var ops []string
			for _, op := range res.Patch {
				ops = append(ops, op.Op+" "+op.Path)
			}
			if !slices.Equal(ops, tc.wantOps) {
				t.Errorf("patch ops:\n got %q\nwant %q", ops, tc.wantOps)
			}
			// Whatever was done, the patch reproduces the result and a second
			// pass has nothing left to do.
			got := fromJSON(t, applyPatch(t, toJSON(t, tc.in), res.Patch))
			if !equality.Semantic.DeepEqual(got, res.Deployment) {
				t.Error("the patch applied to the input differs from the returned Deployment")
			}
			if again := mustMutate(t, res.Deployment, tc.cfg); again.Action != Unchanged {
				t.Errorf("second Mutate: action %s with patch %v, want unchanged", again.Action, again.Patch)
			}
		})
	}
}

func TestAnnotationErrorType(t *testing.T) {
	_, err := Mutate(deployment(map[string]string{annotations.Inject: "TRUE"}), testConfig())
	var aerr *annotations.Error
	if !errors.As(err, &aerr) || aerr.Key != annotations.Inject || aerr.Value != "TRUE" {
		t.Fatalf("error %v: want an *annotations.Error for %s=TRUE", err, annotations.Inject)
	}
}

func TestOptOutRemovesOnlyWhatWasInjected(t *testing.T) {
	orig := loadDeployment(t, "testdata/input/many-containers.yaml")
	for mode, cfg := range goldenModes {
		t.Run(mode, func(t *testing.T) {
			inj := mustMutate(t, orig, cfg).Deployment
			// The user adds a container of their own after injection, with
			// its own ADDON_TARGET_NAMESPACE entry identical to ours: opting
			// out must leave it, since it was not injected.
			inj = inj.DeepCopy()
			own := corev1.Container{Name: "late", Image: "late:v1", Env: []corev1.EnvVar{targetNamespaceEnv()}}
			inj.Spec.Template.Spec.Containers = append(inj.Spec.Template.Spec.Containers, own)
			inj.Annotations[annotations.Inject] = "false"

			res := mustMutate(t, inj, cfg)
			if res.Action != Removed {
				t.Fatalf("action = %s, want removed", res.Action)
			}
			want := orig.DeepCopy()
			want.Annotations[annotations.Inject] = "false"
			want.Spec.Template.Spec.Containers = append(want.Spec.Template.Spec.Containers, own)
			if !equality.Semantic.DeepEqual(res.Deployment, want) {
				t.Errorf("after opt-out:\n got %s\nwant %s", toJSON(t, res.Deployment), toJSON(t, want))
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	tests := map[string]struct {
		mutate  func(*Config)
		wantErr string
	}{
		"default with image": {mutate: func(*Config) {}},
		"no image":           {mutate: func(c *Config) { c.Image = "" }, wantErr: "reporter image: must be set"},
		"bad pull policy":    {mutate: func(c *Config) { c.ImagePullPolicy = "Sometimes" }, wantErr: `pull policy "Sometimes"`},
		"port out of range":  {mutate: func(c *Config) { c.MetricsPort = 70000 }, wantErr: "metrics port 70000"},
		"same ports":         {mutate: func(c *Config) { c.MetricsPort = c.HealthPort }, wantErr: "both 9781"},
		"no memory limit":    {mutate: func(c *Config) { c.Resources.Limits = nil }, wantErr: "memory limit is required"},
		"bad log level":      {mutate: func(c *Config) { c.LogLevel = "loud" }, wantErr: `log level "loud"`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			cfg := testConfig()
			tc.mutate(&cfg)
			err := cfg.Validate()
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestAnInstanceTheReporterRoleDoesNotAllowGetsAWarning(t *testing.T) {
	cfg := testConfig()
	cfg.AddonInstanceNames = []string{"addon-instance", "second"}
	withInstance := func(name string) map[string]string {
		a := map[string]string{annotations.Inject: "true"}
		if name != "" {
			a[annotations.AddonInstance] = name
		}
		return a
	}
	tests := map[string]struct {
		annots   map[string]string
		names    []string
		warnings int
	}{
		"the default name, allowed":  {annots: withInstance(""), names: cfg.AddonInstanceNames},
		"another allowed name":       {annots: withInstance("second"), names: cfg.AddonInstanceNames},
		"a name not allowed":         {annots: withInstance("third"), names: cfg.AddonInstanceNames, warnings: 1},
		"no restriction":             {annots: withInstance("third")},
		"opted out: nothing to warn": {annots: map[string]string{annotations.Inject: "false", annotations.AddonInstance: "third"}, names: cfg.AddonInstanceNames},
		"not annotated: no reporter": {annots: nil, names: cfg.AddonInstanceNames},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			c := cfg
			c.AddonInstanceNames = tc.names
			res := mustMutate(t, deployment(tc.annots), c)
			if len(res.Warnings) != tc.warnings {
				t.Fatalf("warnings %q, want %d", res.Warnings, tc.warnings)
			}
			if tc.warnings == 0 {
				return
			}
			if res.Action != Injected {
				t.Errorf("action %s, want %s: the warning does not stop the injection", res.Action, Injected)
			}
			// Applied again, the Deployment is unchanged and still warned about.
			again := mustMutate(t, res.Deployment, c)
			if again.Action != Unchanged || len(again.Warnings) != 1 {
				t.Errorf("again: action %s, warnings %q; want unchanged with the warning", again.Action, again.Warnings)
			}
		})
	}
}

func TestInstanceWarning(t *testing.T) {
	many := make([]string, 40)
	for i := range many {
		many[i] = fmt.Sprintf("addon-instance-%02d", i)
	}
	tests := map[string]struct {
		names    []string
		contains []string
	}{
		"a few names, all listed": {names: []string{"a", "b"}, contains: []string{annotations.AddonInstance, `"x"`, "a, b", "reporter.addonInstanceNames"}},
		"many names, shortened":   {names: many, contains: []string{`"x"`, "addon-instance-00 and 39 more", "reporter.addonInstanceNames"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			w := instanceWarning("x", tc.names)
			if len(w) > maxWarning {
				t.Errorf("warning of %d characters, over the %d the API server keeps: %q", len(w), maxWarning, w)
			}
			for _, s := range tc.contains {
				if !strings.Contains(w, s) {
					t.Errorf("warning %q does not contain %q", w, s)
				}
			}
		})
	}
	if w := instanceWarning("a", []string{"a"}); w != "" {
		t.Errorf("warning %q for an allowed name", w)
	}
}

// The opt-in a CSV can carry (a Deployment label or a pod-template
// annotation) injects the same reporter as the annotation; setting it to
// "false" in the same place removes it again, and a conflict between places
// is refused.
func TestOptInByLabelOrPodTemplateAnnotation(t *testing.T) {
	cfg := testConfig()
	want := injected(t, deployment(optIn()), cfg)
	forms := map[string]func(d *appsv1.Deployment, v string){
		"label": func(d *appsv1.Deployment, v string) { d.Labels = map[string]string{annotations.Inject: v} },
		"pod template annotation": func(d *appsv1.Deployment, v string) {
			d.Spec.Template.Annotations = map[string]string{annotations.Inject: v}
		},
	}
	for name, set := range forms {
		t.Run(name, func(t *testing.T) {
			d := deployment(nil)
			set(d, "true")
			res := mustMutate(t, d, cfg)
			if res.Action != Injected || !equality.Semantic.DeepEqual(res.Deployment.Spec.Template.Spec, want.Spec.Template.Spec) ||
				res.Deployment.Annotations[annotations.Status] != want.Annotations[annotations.Status] {
				t.Fatalf("action %s, pod spec %+v; want the annotation's injection", res.Action, res.Deployment.Spec.Template.Spec)
			}
			out := res.Deployment.DeepCopy()
			set(out, "false")
			removed := mustMutate(t, out, cfg)
			if removed.Action != Removed || !equality.Semantic.DeepEqual(removed.Deployment.Spec.Template.Spec, deployment(nil).Spec.Template.Spec) {
				t.Errorf("opting out by %s: action %s, pod spec %+v", name, removed.Action, removed.Deployment.Spec.Template.Spec)
			}
			conflict := d.DeepCopy()
			conflict.Annotations = map[string]string{annotations.Inject: "false"}
			var cerr *annotations.ConflictError
			if _, err := Mutate(conflict, cfg); !errors.As(err, &cerr) || cerr.Key != annotations.Inject {
				t.Errorf("conflicting opt-in: error %v, want an *annotations.ConflictError", err)
			}
		})
	}
}
