package chart_test

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/addon-heartbeat/addon-heartbeat/internal/chart"
	"github.com/addon-heartbeat/addon-heartbeat/internal/testenv"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/inject"
)

// Helm refuses to install the chart on a Kubernetes older than it supports,
// with Helm's own message; pre-release and vendor builds of a supported
// release install.
func TestKubeVersionRefusedBeforeSupported(t *testing.T) {
	tests := map[string]struct {
		version string
		refused bool
	}{
		"1.29, the last minor before":  {version: "v1.29.15", refused: true},
		"1.30.0, the first supported":  {version: "v1.30.0"},
		"a vendor build of 1.30 (EKS)": {version: "v1.30.4-eks-a737599"},
		"1.33 (OpenShift 4.20)":        {version: "v1.33.13"},
		"1.37":                         {version: "v1.37.2"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, _, err := chart.RenderFor(chart.DefaultRelease, chart.Cluster{KubeVersion: tc.version}, nil)
			want := "chart requires kubeVersion: >=1.30.0-0 which is incompatible with Kubernetes " + tc.version
			switch {
			case tc.refused && (err == nil || err.Error() != want):
				t.Errorf("rendering for %s: error %v, want %q", tc.version, err, want)
			case !tc.refused && err != nil:
				t.Errorf("rendering for %s: %v", tc.version, err)
			}
		})
	}
}

// What `helm install` renders on this API server (its version and the APIs it
// serves, found by discovery as Helm finds them) is accepted by it, and
// includes the fencing policy, which every supported minor serves. The
// matrix (make test-matrix) runs this on each Kubernetes minor it covers.
func TestChartOnThisAPIServer(t *testing.T) {
	cluster, err := chart.Discover(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Kubernetes %s", cluster.KubeVersion)
	for _, v := range chart.AdmissionPolicyAPIVersions {
		if !slices.Contains(cluster.APIVersions, v) {
			t.Errorf("the API server does not serve %s", v)
		}
	}
	objs, notes := renderFor(t, cluster, "")
	mustFind(t, objs, "ValidatingAdmissionPolicy", chart.DefaultRelease.Name+"-fencing")
	mustFind(t, objs, "ValidatingAdmissionPolicyBinding", chart.DefaultRelease.Name+"-fencing")
	for _, o := range objs {
		if err := k8s.Create(t.Context(), o.DeepCopy(), client.DryRunAll); err != nil {
			t.Errorf("%s refused: %v", chart.Key(o), err)
		}
	}
	if !strings.Contains(notes, "addon-heartbeat.io/inject=true") {
		t.Errorf("NOTES.txt:\n%s", notes)
	}
}

// betaGates are the feature gates the product needs that a supported
// Kubernetes release still lets a cluster turn off, each with what the API
// server then does to the product (shown by effect on an API server with the
// gate off). The pod name in bound service-account tokens, which fencing
// reads, is not one: ServiceAccountTokenPodNodeInfo (beta before 1.32) gates
// only the node's name and UID.
var betaGates = map[string]struct {
	// note is what NOTES.txt says when the gate can be turned off.
	note   string
	effect func(t *testing.T, cfg *rest.Config)
}{
	"SidecarContainers": {
		note:   "native sidecar, which is beta before Kubernetes 1.33\n(feature gate SidecarContainers",
		effect: nativeSidecarRefused,
	},
}

// NOTES.txt warns about a feature gate exactly where this Kubernetes release
// lets a cluster turn it off: kube-apiserver accepts --feature-gates=<gate>=false
// (and then does what the note says), or refuses it as locked or unknown (and
// the note is absent). The matrix runs this on releases on both sides.
func TestNotesWarnWhereAGateCanBeOff(t *testing.T) {
	cluster, err := chart.Discover(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	_, notes := renderFor(t, cluster, "")
	assets, err := testenv.AssetsDir()
	if err != nil {
		t.Fatal(err)
	}
	for gate, tc := range betaGates {
		t.Run(gate, func(t *testing.T) {
			var stderr bytes.Buffer
			cmd := exec.CommandContext(t.Context(), filepath.Join(assets, "kube-apiserver"), "--feature-gates="+gate+"=false", "--version")
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			warned := strings.Contains(notes, tc.note)
			var exit *exec.ExitError
			switch {
			case err == nil:
				t.Logf("Kubernetes %s accepts %s=false (%s)", cluster.KubeVersion, gate, strings.TrimSpace(string(out)))
				if !warned {
					t.Errorf("Kubernetes %s lets a cluster turn %s off, and NOTES.txt does not say %q:\n%s", cluster.KubeVersion, gate, tc.note, notes)
				}
				env, err := testenv.Start(testenv.Options{APIServerArgs: map[string]string{"feature-gates": gate + "=false"}})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() {
					if err := env.Stop(); err != nil {
						t.Error(err)
					}
				})
				tc.effect(t, env.Config)
			case errors.As(err, &exit) && (strings.Contains(stderr.String(), "cannot set feature gate "+gate+" to false, feature is locked to true") ||
				strings.Contains(stderr.String(), "unrecognized feature gate: "+gate)):
				t.Logf("Kubernetes %s: %s is always on", cluster.KubeVersion, gate)
				if warned {
					t.Errorf("NOTES.txt warns about %s, which Kubernetes %s cannot turn off:\n%s", gate, cluster.KubeVersion, notes)
				}
			default:
				t.Fatalf("kube-apiserver --feature-gates=%s=false --version: %v: %s", gate, err, stderr.String())
			}
		})
	}
}

// Which notes each minor gets, and that the choice that avoids the gate
// (reporter.nativeSidecar=false) silences it.
// TestNotesWarnWhereAGateCanBeOff checks the same boundaries against each
// release's own kube-apiserver.
func TestNotesPerKubernetesVersion(t *testing.T) {
	const sidecar = "SidecarContainers"
	tests := map[string]struct {
		version, values string
		want            []string
	}{
		"1.30":                        {version: "v1.30.14", want: []string{sidecar}},
		"1.32":                        {version: "v1.32.13", want: []string{sidecar}},
		"1.33":                        {version: "v1.33.13"},
		"1.37":                        {version: "v1.37.2"},
		"1.30 with a plain container": {version: "v1.30.14", values: `reporter: {nativeSidecar: false}`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			cluster := chart.Cluster{KubeVersion: tc.version}.With(chart.AdmissionPolicyAPIVersions...)
			_, notes := renderFor(t, cluster, tc.values)
			for gate, g := range betaGates {
				if got, want := strings.Contains(notes, g.note), slices.Contains(tc.want, gate); got != want {
					t.Errorf("Kubernetes %s, values %q: NOTES.txt mentions %s: %v, want %v:\n%s", tc.version, tc.values, gate, got, want, notes)
				}
			}
		})
	}
}

// nativeSidecarRefused: the API server drops the injected native sidecar's
// restartPolicy, and then refuses the Deployment, since a plain init container
// may have no probes; the plain container that reporter.nativeSidecar false
// injects is stored as injected, so that admitting it again changes nothing
// (no rollout).
func nativeSidecarRefused(t *testing.T, cfg *rest.Config) {
	c, err := client.New(cfg, client.Options{Scheme: testenv.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "sidecar-"}}
	if err := c.Create(t.Context(), ns); err != nil {
		t.Fatal(err)
	}
	for name, native := range map[string]bool{"native": true, "plain": false} {
		injectCfg := inject.DefaultConfig()
		injectCfg.Image = "registry.example.com/addon-heartbeat:v0.1.0"
		injectCfg.NativeSidecar = native
		d := optedIn()
		d.Namespace, d.Name = ns.Name, name
		res, err := inject.Mutate(d, injectCfg)
		if err != nil {
			t.Fatal(err)
		}
		err = c.Create(t.Context(), res.Deployment)
		if native {
			const refusal = "may not be set for init containers without restartPolicy=Always"
			if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), refusal) {
				t.Errorf("with SidecarContainers off, creating a Deployment with the native sidecar: %v, want it refused: %q", err, refusal)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		again, err := inject.Mutate(res.Deployment, injectCfg)
		if err != nil {
			t.Fatal(err)
		}
		if again.Action != inject.Unchanged {
			t.Errorf("the stored plain-container Deployment is not as injected: admitting it again is %q, patch %s", again.Action, again.Patch)
		}
	}
}

// README's support table names, for each feature, the tests that prove it on
// every release of the matrix: each named test exists in the package named
// before it, and every package it names runs in the matrix (it starts an API
// server through internal/testenv or the SDK's heartbeattest), or is
// test/node.
func TestREADMESupportTableNamesRealTests(t *testing.T) {
	section := readmeSection(t, "Supported Kubernetes versions")
	section, _, _ = strings.Cut(section, "\n### ") // the table, not the subsections after it
	cell := regexp.MustCompile("`((?:test|internal|pkg)/[a-z0-9]+)`(?::((?: ?`Test[A-Za-z]+`,?)+))?")
	rows := 0
	for line := range strings.SplitSeq(section, "\n") {
		cells := strings.Split(line, " | ")
		if len(cells) != 3 || !strings.HasPrefix(line, "| ") || strings.HasPrefix(line, "| feature") {
			continue
		}
		rows++
		found := cell.FindAllStringSubmatch(cells[2], -1)
		if len(found) == 0 {
			t.Errorf("row %q names no test package", line)
		}
		for _, m := range found {
			dir := filepath.Join(testenv.RepoRoot(), m[1])
			sources, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
			if err != nil || len(sources) == 0 {
				t.Errorf("row %q: %s has no tests (%v)", cells[0], m[1], err)
				continue
			}
			var code strings.Builder
			for _, f := range sources {
				data, err := os.ReadFile(f)
				if err != nil {
					t.Fatal(err)
				}
				code.Write(data)
			}
			if m[1] != "test/node" && !strings.Contains(code.String(), "internal/testenv\"") && !strings.Contains(code.String(), "internal/localcluster\"") &&
				!strings.Contains(code.String(), "pkg/heartbeat/heartbeattest\"") {
				t.Errorf("row %q: %s does not start an API server, so the matrix does not run it", cells[0], m[1])
			}
			for _, name := range regexp.MustCompile("Test[A-Za-z]+").FindAllString(m[2], -1) {
				if !strings.Contains(code.String(), "\nfunc "+name+"(t *testing.T)") {
					t.Errorf("row %q: no %s in %s", cells[0], name, m[1])
				}
			}
		}
	}
	if rows < 5 {
		t.Errorf("README's support table has %d rows", rows)
	}
}
