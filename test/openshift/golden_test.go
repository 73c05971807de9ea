package openshift_test

// TestGoldenUnderSCC runs OpenShift's SCC admission plugin on the pods that the main module's
// golden injected Deployments (pkg/inject/testdata/golden, written by its TestGolden) would
// create, for every golden file there is.

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/addon-heartbeat/addon-heartbeat/test/openshift/sccadmit"
)

const (
	goldenDir = "../../pkg/inject/testdata/golden"
	inputDir  = "../../pkg/inject/testdata/input"
	sccDir    = "testdata/scc"
	reporter  = "heartbeat-reporter"
	// Every pod is admitted in this one namespace: its annotations, not its name, are what
	// the SCCs read.
	namespace = "my-addon-ns"
	// The UID block of sccadmit.Namespace.
	uidMin, uidMax = 1000650000, 1000659999
)

var (
	openshiftModes  = []string{"openshift-native", "openshift-plain"}
	kubernetesModes = []string{"native", "plain"}
	// The pods of a Deployment are created by the ReplicaSet controller.
	replicaSetController = &user.DefaultInfo{
		Name:   "system:serviceaccount:kube-system:replicaset-controller",
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"},
	}
)

// inputsRefused are the golden inputs whose own pod an SCC refuses
// ("<input>/<scc>"), with the reason the plugin gives: the injected pod must be
// refused for the same reason, and for no other input.
var inputsRefused = map[string]string{
	// Its container runs as UID 1001, outside the namespace's range.
	"fixed-uid/restricted-v2": "Invalid value: 1001: must be in the ranges",
	// Pod-level seccompProfile RuntimeDefault, as operator-sdk scaffolds it;
	// anyuid allows no seccomp profile.
	"olm-csv/anyuid": "seccomp may not be set",
}

func TestGoldenUnderSCC(t *testing.T) {
	checks := map[string]struct {
		modes []string // golden modes the check applies to
		scc   string   // the one SCC the pod's ServiceAccount may use
		// admitted: the injected pod is admitted wherever the input's own pod is.
		// Otherwise it is refused, and the error names the reporter's runAsUser.
		admitted bool
		// uidFromRange: the reporter runs with a UID that the SCC took from the namespace's range.
		uidFromRange bool
	}{
		"openshift platform is admitted by restricted-v2": {modes: openshiftModes, scc: "restricted-v2", admitted: true, uidFromRange: true},
		"openshift platform is admitted by anyuid":        {modes: openshiftModes, scc: "anyuid", admitted: true},
		"openshift platform is admitted by nonroot-v2":    {modes: openshiftModes, scc: "nonroot-v2", admitted: true},
		// Why the chart's platform setting exists: the reporter's fixed UID of the kubernetes
		// platform is outside every OpenShift namespace's range.
		"kubernetes platform is refused by restricted-v2": {modes: kubernetesModes, scc: "restricted-v2", admitted: false},
	}

	goldens := goldenFiles(t)
	admitters := map[string]*sccadmit.Admitter{}
	for name, check := range checks {
		if admitters[check.scc] == nil {
			admitters[check.scc] = newAdmitter(t, check.scc)
		}
		admitter := admitters[check.scc]

		t.Run(name, func(t *testing.T) {
			ran := 0
			for _, g := range goldens {
				if !slices.Contains(check.modes, g.mode) {
					continue
				}
				ran++
				t.Run(g.input+"."+g.mode, func(t *testing.T) {
					if check.admitted {
						_, inputErr := admit(t, admitter, filepath.Join(inputDir, g.input+".yaml"))
						why, known := inputsRefused[g.input+"/"+check.scc]
						switch {
						case inputErr != nil && !known:
							t.Fatalf("the input's own pod is refused by %s, which inputsRefused does not expect: %v", check.scc, inputErr)
						case inputErr == nil && known:
							t.Fatalf("the input's own pod is admitted by %s, which inputsRefused says refuses it (%q)", check.scc, why)
						case known:
							// The injected pod is refused for the input's reason.
							if !strings.Contains(inputErr.Error(), why) {
								t.Fatalf("the input's own pod is refused by %s, but not for %q: %v", check.scc, why, inputErr)
							}
							if _, err := admit(t, admitter, g.path); err == nil || !strings.Contains(err.Error(), why) {
								t.Fatalf("the input's own pod is refused by %s for %q; the injected one: %v", check.scc, why, err)
							}
							return
						}
					}

					admitted, err := admit(t, admitter, g.path)
					if check.admitted {
						if err != nil {
							t.Fatalf("%s: the injected pod is refused by %s (the input's own pod is admitted):\n%v", g.path, check.scc, err)
						}
						c := container(admitted, reporter)
						uid := runAsUser(admitted, c)
						t.Logf("admitted by %s; %s runs as UID %s", admitted.Annotations["openshift.io/scc"], reporter, fmtUID(uid))
						if check.uidFromRange && (uid == nil || *uid < uidMin || *uid > uidMax) {
							t.Errorf("%s: %s runs as UID %s, want one that %s assigns from [%d, %d]", g.path, reporter, fmtUID(uid), check.scc, uidMin, uidMax)
						}
						return
					}

					if err == nil {
						t.Fatalf("%s: the injected pod is admitted by %s (SCC %q), want it refused for %s's runAsUser", g.path, check.scc, admitted.Annotations["openshift.io/scc"], reporter)
					}
					pod := readPod(t, g.path)
					want := fmt.Sprintf("provider %s: %s.runAsUser: Invalid value: 65532: must be in the ranges: [%d, %d]", check.scc, containerPath(t, pod, reporter), uidMin, uidMax)
					if !errors.Is(err, sccadmit.ErrRefused) || !strings.Contains(err.Error(), want) {
						t.Fatalf("%s: refused by %s, but the error does not contain\n  %s\nerror:\n  %v", g.path, check.scc, want, err)
					}
					t.Logf("refused as expected: %v", err)
				})
			}
			if ran == 0 {
				t.Fatalf("no golden file of modes %v in %s", check.modes, goldenDir)
			}
		})
	}
}

// golden is one injected Deployment: <input>.<mode>.yaml.
type golden struct{ input, mode, path string }

func goldenFiles(t *testing.T) []golden {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(goldenDir, "*.yaml"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no golden Deployments in %s (%v): run the main module's TestGolden", goldenDir, err)
	}
	var gs []golden
	for _, p := range paths {
		name := strings.TrimSuffix(filepath.Base(p), ".yaml")
		dot := strings.LastIndex(name, ".")
		if dot < 0 {
			t.Fatalf("%s: not named <input>.<mode>.yaml", p)
		}
		gs = append(gs, golden{input: name[:dot], mode: name[dot+1:], path: p})
	}
	return gs
}

func newAdmitter(t *testing.T, scc string) *sccadmit.Admitter {
	t.Helper()
	sccs, err := sccadmit.LoadSCCs(sccDir)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	a, err := sccadmit.New(ctx, sccs, fake.NewClientset(sccadmit.Namespace(namespace)), sccadmit.GrantOnly(scc))
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// admit runs SCC admission on the pod that the Deployment in path would create.
// Only a refusal is returned as an error; anything else fails the test.
func admit(t *testing.T, a *sccadmit.Admitter, path string) (*corev1.Pod, error) {
	t.Helper()
	pod, err := a.Admit(context.Background(), readPod(t, path), replicaSetController)
	if err != nil && !errors.Is(err, sccadmit.ErrRefused) {
		t.Fatalf("%s: %v", path, err)
	}
	return pod, err
}

// readPod returns the pod that the Deployment in path would create.
func readPod(t *testing.T, path string) *corev1.Pod {
	t.Helper()
	d, err := sccadmit.ReadDeployment(path)
	if err != nil {
		t.Fatal(err)
	}
	return sccadmit.PodFromDeployment(d, namespace)
}

func container(pod *corev1.Pod, name string) *corev1.Container {
	for _, list := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range list {
			if list[i].Name == name {
				return &list[i]
			}
		}
	}
	return nil
}

// containerPath is how the SCC errors name a container: .initContainers[i] or .containers[i].
func containerPath(t *testing.T, pod *corev1.Pod, name string) string {
	t.Helper()
	for i, c := range pod.Spec.InitContainers {
		if c.Name == name {
			return fmt.Sprintf(".initContainers[%d]", i)
		}
	}
	for i, c := range pod.Spec.Containers {
		if c.Name == name {
			return fmt.Sprintf(".containers[%d]", i)
		}
	}
	t.Fatalf("no container %s in the pod", name)
	return ""
}

// runAsUser is the UID the container runs as, from its own or the pod's security context.
func runAsUser(pod *corev1.Pod, c *corev1.Container) *int64 {
	if c == nil {
		return nil
	}
	if c.SecurityContext != nil && c.SecurityContext.RunAsUser != nil {
		return c.SecurityContext.RunAsUser
	}
	if pod.Spec.SecurityContext != nil {
		return pod.Spec.SecurityContext.RunAsUser
	}
	return nil
}

func fmtUID(uid *int64) string {
	if uid == nil {
		return "<unset: the image's USER>"
	}
	return fmt.Sprint(*uid)
}
