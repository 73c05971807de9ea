package webhook

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	appsv1ac "k8s.io/client-go/applyconfigurations/apps/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/addon-heartbeat/addon-heartbeat/internal/admission"
	"github.com/addon-heartbeat/addon-heartbeat/internal/testenv"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/annotations"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/inject"
)

func optIn() map[string]string { return map[string]string{annotations.Inject: "true"} }

// reporterOf returns the injected container and the list it is in.
func reporterOf(d *appsv1.Deployment) (*corev1.Container, string) {
	spec := d.Spec.Template.Spec
	if i := slices.IndexFunc(spec.InitContainers, func(c corev1.Container) bool { return c.Name == inject.ContainerName }); i >= 0 {
		return &spec.InitContainers[i], "initContainers"
	}
	if i := slices.IndexFunc(spec.Containers, func(c corev1.Container) bool { return c.Name == inject.ContainerName }); i >= 0 {
		return &spec.Containers[i], "containers"
	}
	return nil, ""
}

func get(t *testing.T, ns, name string) *appsv1.Deployment {
	t.Helper()
	var d appsv1.Deployment
	if err := k8s.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, &d); err != nil {
		t.Fatal(err)
	}
	return &d
}

// Must show 1: an annotated CREATE is injected; an unannotated Deployment is
// untouched, and the API server does not even call the webhook for it (nor
// for an annotated one in an excluded namespace).
func TestCreateInjectsOnlyAnnotated(t *testing.T) {
	ns := newNamespace(t)
	before := scrape(t)

	want := addon(ns, "annotated", optIn())
	if err := k8s.Create(t.Context(), want.DeepCopy()); err != nil {
		t.Fatal(err)
	}
	got := get(t, ns, "annotated")
	c, list := reporterOf(got)
	if c == nil || list != "initContainers" {
		t.Fatalf("no %s native sidecar in the created Deployment: %+v", inject.ContainerName, got.Spec.Template.Spec)
	}
	// What the API server stored is exactly what the injector computed: every
	// defaulted field is already set, so re-admission finds nothing to do.
	expected, err := inject.Mutate(want, injectCfg)
	if err != nil {
		t.Fatal(err)
	}
	wantC, _ := reporterOf(expected.Deployment)
	if !equality.Semantic.DeepEqual(c, wantC) {
		t.Errorf("stored reporter container differs from the injected one:\n got %+v\nwant %+v", c, wantC)
	}
	if c.Image != reporterImage || c.RestartPolicy == nil || *c.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Errorf("reporter image %q restartPolicy %v", c.Image, c.RestartPolicy)
	}
	mgr := got.Spec.Template.Spec.Containers[0]
	if i := slices.IndexFunc(mgr.Env, func(e corev1.EnvVar) bool { return e.Name == inject.TargetNamespaceEnv }); i < 0 ||
		mgr.Env[i].ValueFrom == nil || mgr.Env[i].ValueFrom.FieldRef.FieldPath != "metadata.namespace" {
		t.Errorf("addon container lacks the downward-API %s: %+v", inject.TargetNamespaceEnv, mgr.Env)
	}
	if got.Annotations[annotations.Status] == "" {
		t.Error("no status annotation")
	}

	mid := scrape(t)
	if d := mid.value(reviewsTotal, "outcome=injected", "dry_run=false") - before.value(reviewsTotal, "outcome=injected", "dry_run=false"); d != 1 {
		t.Errorf("injected reviews went up by %v, want 1", d)
	}

	// Not annotated, and annotated but in the webhook's own namespace
	// (left out by the namespaceSelector): never sent to the webhook.
	plain := addon(ns, "plain", map[string]string{"team": "addons"})
	if err := k8s.Create(t.Context(), plain); err != nil {
		t.Fatal(err)
	}
	own := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "addon-heartbeat-system"}}
	if err := k8s.Create(t.Context(), own); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if err := k8s.Create(t.Context(), addon(own.Name, "annotated", optIn())); err != nil {
		t.Fatal(err)
	}
	for _, key := range []client.ObjectKey{{Namespace: ns, Name: "plain"}, {Namespace: own.Name, Name: "annotated"}} {
		d := get(t, key.Namespace, key.Name)
		if c, _ := reporterOf(d); c != nil || len(d.Spec.Template.Spec.Containers[0].Env) != 1 || d.Annotations[annotations.Status] != "" {
			t.Errorf("%s was mutated: %+v", key, d.Spec.Template.Spec)
		}
	}
	after := scrape(t)
	if a, b := after.value(reviewsTotal), mid.value(reviewsTotal); a != b {
		t.Errorf("the webhook answered %v reviews for Deployments it must never see", a-b)
	}
	if a, b := after.value(requestsTotal, "webhook="+admission.Path), mid.value(requestsTotal, "webhook="+admission.Path); a != b {
		t.Errorf("the webhook server received %v requests for Deployments it must never see", a-b)
	}
}

// Must show 2: re-applying the same manifest, by update and by server-side
// apply, twice each, changes nothing: same generation, same pod template.
func TestReapplyChangesNothing(t *testing.T) {
	ns := newNamespace(t)
	manifest := addon(ns, "updated", optIn())
	if err := k8s.Create(t.Context(), manifest.DeepCopy()); err != nil {
		t.Fatal(err)
	}
	first := get(t, ns, "updated")
	for i := range 2 {
		again := manifest.DeepCopy()
		again.ResourceVersion = get(t, ns, "updated").ResourceVersion
		if err := k8s.Update(t.Context(), again); err != nil {
			t.Fatalf("update %d: %v", i, err)
		}
		now := get(t, ns, "updated")
		if now.Generation != first.Generation || !equality.Semantic.DeepEqual(now.Spec.Template, first.Spec.Template) {
			t.Fatalf("update %d of the same manifest changed the Deployment: generation %d -> %d", i, first.Generation, now.Generation)
		}
	}

	// The live object re-submitted unchanged: the webhook has nothing to do.
	before := scrape(t)
	live := get(t, ns, "updated")
	if err := k8s.Update(t.Context(), live); err != nil {
		t.Fatal(err)
	}
	if d := scrape(t).value(reviewsTotal, "outcome=unchanged") - before.value(reviewsTotal, "outcome=unchanged"); d != 1 {
		t.Errorf("unchanged reviews went up by %v, want 1", d)
	}

	// Server-side apply of a manifest, as kubectl apply --server-side does.
	raw, err := yaml.Marshal(addon(ns, "applied", optIn()))
	if err != nil {
		t.Fatal(err)
	}
	var ac appsv1ac.DeploymentApplyConfiguration
	if err := yaml.Unmarshal(raw, &ac); err != nil {
		t.Fatal(err)
	}
	ac.WithAPIVersion("apps/v1").WithKind("Deployment")
	apply := func() *appsv1.Deployment {
		d, err := clientset.AppsV1().Deployments(ns).Apply(t.Context(), &ac, metav1.ApplyOptions{FieldManager: "kubectl", Force: true})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	applied := apply()
	if c, _ := reporterOf(applied); c == nil {
		t.Fatal("server-side apply was not injected")
	}
	for i := range 2 {
		now := apply()
		if now.Generation != applied.Generation || !equality.Semantic.DeepEqual(now.Spec.Template, applied.Spec.Template) {
			t.Fatalf("server-side apply %d changed the Deployment: generation %d -> %d", i, applied.Generation, now.Generation)
		}
	}
}

// Must show 3: removing the annotation, or setting it to "false", removes
// everything injected and nothing else: the Deployment ends up as one that
// was never injected.
func TestOptOutRemovesEverythingInjected(t *testing.T) {
	tests := map[string]func(map[string]string){
		"set to false":       func(a map[string]string) { a[annotations.Inject] = "false" },
		"annotation removed": func(a map[string]string) { delete(a, annotations.Inject) },
	}
	for name, optOut := range tests {
		t.Run(name, func(t *testing.T) {
			ns := newNamespace(t)
			if err := k8s.Create(t.Context(), addon(ns, "addon", optIn())); err != nil {
				t.Fatal(err)
			}
			// The control was never injected: same manifest, opted out from
			// the start, defaulted by the same API server.
			controlAnnots := optIn()
			optOut(controlAnnots)
			if err := k8s.Create(t.Context(), addon(ns, "control", controlAnnots)); err != nil {
				t.Fatal(err)
			}

			d := get(t, ns, "addon")
			if c, _ := reporterOf(d); c == nil {
				t.Fatal("not injected")
			}
			optOut(d.Annotations)
			if err := k8s.Update(t.Context(), d); err != nil {
				t.Fatal(err)
			}
			got, control := get(t, ns, "addon"), get(t, ns, "control")
			// The two differ only in their names and the labels made from them.
			if !equality.Semantic.DeepEqual(got.Spec.Template.Spec, control.Spec.Template.Spec) || got.Generation != 2 {
				t.Errorf("pod spec after opt-out (generation %d) differs from a never-injected Deployment:\n got %+v\nwant %+v", got.Generation, got.Spec.Template.Spec, control.Spec.Template.Spec)
			}
			if !equality.Semantic.DeepEqual(got.Annotations, control.Annotations) {
				t.Errorf("annotations after opt-out: got %v, want %v", got.Annotations, control.Annotations)
			}
		})
	}
}

// Must show 4: dryRun=All returns the injected object, persists nothing, and
// is counted only as a dry run.
func TestDryRunIsMutatedButNotCounted(t *testing.T) {
	ns := newNamespace(t)
	before := scrape(t)
	d := addon(ns, "dry", optIn())
	if err := k8s.Create(t.Context(), d, client.DryRunAll); err != nil {
		t.Fatal(err)
	}
	if c, _ := reporterOf(d); c == nil {
		t.Fatal("the dry-run response is not injected")
	}
	if err := k8s.Get(t.Context(), client.ObjectKeyFromObject(d), &appsv1.Deployment{}); !apierrors.IsNotFound(err) {
		t.Fatalf("dry run persisted the Deployment: %v", err)
	}
	after := scrape(t)
	if v := after.value(reviewsTotal, "outcome=injected", "dry_run=false") - before.value(reviewsTotal, "outcome=injected", "dry_run=false"); v != 0 {
		t.Errorf("a dry run counted %v real injections", v)
	}
	if v := after.value(reviewsTotal, "outcome=injected", "dry_run=true") - before.value(reviewsTotal, "outcome=injected", "dry_run=true"); v != 1 {
		t.Errorf("dry-run injections went up by %v, want 1", v)
	}
}

// Must show 5: an invalid annotation value is denied with a message naming
// the key, the value and what is expected.
func TestInvalidAnnotationDenied(t *testing.T) {
	ns := newNamespace(t)
	long := "http://127.0.0.1:8081/" + strings.Repeat("a", 40<<10)
	tests := map[string]struct {
		key, value string
		expected   string
		shown      string // how the denial shows the value; quoted in full when empty
	}{
		"inject":         {key: annotations.Inject, value: "yes", expected: `expected "true" or "false"`},
		"delete-ack":     {key: annotations.DeleteAck, value: "sometime", expected: `expected "auto" or "manual"`},
		"health-url":     {key: annotations.HealthURL, value: "http://metrics.example.com:8080/healthz", expected: "loopback host"},
		"addon-instance": {key: annotations.AddonInstance, value: "Not_Valid", expected: "DNS-1123 subdomain"},
		"status":         {key: annotations.Status, value: "done", expected: "record written by the addon-heartbeat webhook"},
		// A 40 KB URL: the denial names the key, the length and the limit,
		// and shows only the start of the value.
		"health-url of 40 KB": {key: annotations.HealthURL, value: long, shown: `"` + long[:64] + `"... (40982 bytes)`,
			expected: "a URL of at most 2048 bytes (this one has 40982)"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			annots := optIn()
			annots[tc.key] = tc.value
			before := scrape(t)
			err := k8s.Create(t.Context(), addon(ns, "invalid-"+strings.ToLower(strings.ReplaceAll(name, " ", "-")), annots))
			if !apierrors.IsForbidden(err) {
				t.Fatalf("create: got %v, want a denial", err)
			}
			shown := tc.shown
			if shown == "" {
				shown = `"` + tc.value + `"`
			}
			for _, s := range []string{tc.key, shown, tc.expected} {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("denial %q does not name %q", err, s)
				}
			}
			if v := scrape(t).value(reviewsTotal, "outcome=denied") - before.value(reviewsTotal, "outcome=denied"); v != 1 {
				t.Errorf("denied reviews went up by %v, want 1", v)
			}
		})
	}
}

// Must show 6: several containers, existing init containers (one a native
// sidecar of the addon's own) and the addon's own ADDON_TARGET_NAMESPACE are
// all kept as they were.
func TestExistingContainersKept(t *testing.T) {
	ns := newNamespace(t)
	raw, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "pkg", "inject", "testdata", "input", "many-containers.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var manifest appsv1.Deployment
	if err := yaml.UnmarshalStrict(raw, &manifest); err != nil {
		t.Fatal(err)
	}
	manifest.Namespace = ns
	control := manifest.DeepCopy()
	control.Name = "control"
	delete(control.Annotations, annotations.Inject)
	for _, d := range []*appsv1.Deployment{manifest.DeepCopy(), control} {
		if err := k8s.Create(t.Context(), d); err != nil {
			t.Fatal(err)
		}
	}
	got, want := get(t, ns, manifest.Name).Spec.Template.Spec, get(t, ns, "control").Spec.Template.Spec

	names := func(cs []corev1.Container) (out []string) {
		for _, c := range cs {
			out = append(out, c.Name)
		}
		return out
	}
	if n, w := names(got.InitContainers), append(names(want.InitContainers), inject.ContainerName); !slices.Equal(n, w) {
		t.Errorf("init containers %v, want %v", n, w)
	}
	if n, w := names(got.Containers), names(want.Containers); !slices.Equal(n, w) {
		t.Errorf("containers %v, want %v", n, w)
	}
	gained := map[string]bool{}
	for _, pair := range [][2][]corev1.Container{{got.InitContainers, want.InitContainers}, {got.Containers, want.Containers}} {
		for i, w := range pair[1] {
			g := pair[0][i]
			if len(g.Env) == len(w.Env)+1 {
				gained[g.Name] = true
				g.Env = g.Env[:len(g.Env)-1]
			}
			if !equality.Semantic.DeepEqual(g, w) {
				t.Errorf("container %s changed:\n got %+v\nwant %+v", w.Name, g, w)
			}
		}
	}
	// manager sets it itself; config-watcher may get it from its ConfigMap.
	wantGained := map[string]bool{"migrate": true, "log-shipper": true, "kube-rbac-proxy": true}
	if !equality.Semantic.DeepEqual(gained, wantGained) {
		t.Errorf("containers that got %s: %v, want %v", inject.TargetNamespaceEnv, gained, wantGained)
	}
	if v := got.Containers[0].Env[0]; v.Name != inject.TargetNamespaceEnv || v.Value != "my-addon-target" {
		t.Errorf("the addon's own %s became %+v", inject.TargetNamespaceEnv, v)
	}
}

// warningRecorder keeps the warnings the API server relays to a client.
type warningRecorder struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warningRecorder) HandleWarningHeader(_ int, _ string, msg string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, msg)
}

func (w *warningRecorder) all() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.msgs)
}

func TestAnInstanceTheReporterRoleDoesNotAllowIsInjectedWithAWarning(t *testing.T) {
	ns := newNamespace(t)
	tests := map[string]struct {
		deployment string
		instance   string // empty: the default
		warn       bool
	}{
		"the default name, allowed": {deployment: "allowed", warn: false},
		"another name":              {deployment: "not-allowed", instance: "other-instance", warn: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var rec warningRecorder
			cfg := rest.CopyConfig(env.Config)
			cfg.WarningHandler = &rec
			cs := kubernetes.NewForConfigOrDie(cfg)
			annots := optIn()
			if tc.instance != "" {
				annots[annotations.AddonInstance] = tc.instance
			}
			created, err := cs.AppsV1().Deployments(ns).Create(t.Context(), addon(ns, tc.deployment, annots), metav1.CreateOptions{})
			if err != nil {
				t.Fatalf("create: %v", err)
			}
			if c, _ := reporterOf(created); c == nil {
				t.Errorf("the reporter was not injected")
			}
			got := rec.all()
			if !tc.warn {
				if len(got) != 0 {
					t.Errorf("warnings %q, want none", got)
				}
				return
			}
			if len(got) != 1 {
				t.Fatalf("warnings %q, want one", got)
			}
			for _, s := range []string{annotations.AddonInstance, `"` + tc.instance + `"`, "addon-instance", "reporter.addonInstanceNames"} {
				if !strings.Contains(got[0], s) {
					t.Errorf("warning %q does not name %q", got[0], s)
				}
			}
		})
	}
}
