package localcluster

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/addon-heartbeat/addon-heartbeat/internal/testenv"
)

// OLMVersion is the release of OLM (operator-framework/operator-lifecycle-manager)
// that hack/olm-binary.sh builds by default.
const OLMVersion = "v0.33.0"

// OLM's API kinds that the local install and the tests use (no Go types: the
// project does not depend on operator-framework/api).
var (
	OperatorGroupGVK         = schema.GroupVersionKind{Group: "operators.coreos.com", Version: "v1", Kind: "OperatorGroup"}
	ClusterServiceVersionGVK = schema.GroupVersionKind{Group: "operators.coreos.com", Version: "v1alpha1", Kind: "ClusterServiceVersion"}
)

// OLMDir returns the folder holding the olm binary and OLM's CRDs (crds/):
// OLM_ASSETS when set, else the cache folder hack/olm-binary.sh writes, when
// it holds both.
func OLMDir() (string, error) {
	dir := os.Getenv("OLM_ASSETS")
	if dir == "" {
		cache := os.Getenv("ADDON_HEARTBEAT_CACHE")
		if cache == "" {
			base, err := os.UserCacheDir()
			if err != nil {
				return "", fmt.Errorf("locating the cache folder: %w", err)
			}
			cache = filepath.Join(base, "addon-heartbeat")
		}
		dir = filepath.Join(cache, "bin", "olm-"+OLMVersion)
	}
	for _, name := range []string{"olm", "crds"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			return "", fmt.Errorf("no %s in %s: run hack/olm-binary.sh or set OLM_ASSETS: %w", name, dir, err)
		}
	}
	return dir, nil
}

// EnsureOLM returns the folder of OLMDir, building OLM with
// hack/olm-binary.sh (progress to progress; about 4 minutes on 2 cores the
// first time) when it is not cached yet.
func EnsureOLM(progress io.Writer) (string, error) {
	if dir, err := OLMDir(); err == nil {
		return dir, nil
	}
	cmd := exec.Command(filepath.Join(testenv.RepoRoot(), "hack", "olm-binary.sh"))
	cmd.Env = append(os.Environ(), "OLM_VERSION="+OLMVersion)
	cmd.Stderr = progress
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("building OLM %s: %w", OLMVersion, err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	dir := lines[len(lines)-1]
	for _, name := range []string{"olm", "crds"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			return "", fmt.Errorf("hack/olm-binary.sh left no %s in %s: %w", name, dir, err)
		}
	}
	return dir, nil
}

// OLMOptions say how to run OLM.
type OLMOptions struct {
	// Dir holds the olm binary and crds/ (EnsureOLM).
	Dir string
	// Namespace is OLM's own namespace; default "olm".
	Namespace string
	// Tee also receives OLM's output (it always goes to olm.log in the
	// cluster's folder).
	Tee io.Writer
}

// OLM is OLM's operator (the olm binary: ClusterServiceVersions and
// OperatorGroups; no catalog operator, so no Subscriptions or InstallPlans)
// running as a local process against the cluster.
type OLM struct {
	*Process
	Namespace string
}

// olmOperatorGroup is the OperatorGroup that OLM's own manifests put into
// its namespace (deploy/chart/templates/0000_50_olm_13-operatorgroup-default.yaml);
// StartOLM waits for OLM to report on it.
const olmOperatorGroup = "olm-operators"

// StartOLM installs OLM's CRDs (create or update, so a second start is
// fine), creates OLM's namespace with the OperatorGroup OLM's manifests put
// there, and runs
//
//	olm --namespace=<ns> --writeStatusName= --writePackageServerStatusName=
//
// with KUBECONFIG (admin), OPERATOR_NAMESPACE and OPERATOR_NAME, as OLM's
// Deployment does minus the OpenShift ClusterOperator status. It returns
// once OLM has written the status of that OperatorGroup: its informers are
// synced and it reconciles.
func (c *Cluster) StartOLM(ctx context.Context, o OLMOptions) (*OLM, error) {
	if o.Namespace == "" {
		o.Namespace = "olm"
	}
	bin := filepath.Join(o.Dir, "olm")
	if _, err := envtest.InstallCRDs(c.Config, envtest.CRDInstallOptions{
		Paths: []string{filepath.Join(o.Dir, "crds")}, ErrorIfPathMissing: true,
	}); err != nil {
		return nil, fmt.Errorf("installing OLM's CRDs: %w", err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: o.Namespace}}
	if err := c.Client.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("creating namespace %s: %w", o.Namespace, err)
	}
	og := &unstructured.Unstructured{}
	og.SetGroupVersionKind(OperatorGroupGVK)
	og.SetNamespace(o.Namespace)
	og.SetName(olmOperatorGroup)
	if err := unstructured.SetNestedStringSlice(og.Object, []string{o.Namespace}, "spec", "targetNamespaces"); err != nil {
		return nil, err
	}
	if err := c.Client.Create(ctx, og); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("creating OperatorGroup %s/%s: %w", o.Namespace, olmOperatorGroup, err)
	}

	args := []string{"--namespace=" + o.Namespace, "--writeStatusName=", "--writePackageServerStatusName="}
	env := []string{"KUBECONFIG=" + c.Kubeconfig, "OPERATOR_NAMESPACE=" + o.Namespace, "OPERATOR_NAME=olm-operator"}
	p, err := StartProcess("olm", filepath.Join(c.Dir, "olm.log"), bin, args, env, o.Tee)
	if err != nil {
		return nil, err
	}
	olm := &OLM{Process: p, Namespace: o.Namespace}
	if err := c.waitOperatorGroupStatus(ctx, olm, o.Namespace, olmOperatorGroup); err != nil {
		return nil, fmt.Errorf("%w (stopping it: %v)", err, p.Stop(10*time.Second))
	}
	return olm, nil
}

// waitOperatorGroupStatus waits for OLM to set status.lastUpdated on an
// OperatorGroup, failing early when OLM exits.
func (c *Cluster) waitOperatorGroupStatus(ctx context.Context, olm *OLM, ns, name string) error {
	ctx, cancel := context.WithTimeout(ctx, 120*time.Second)
	defer cancel()
	err := wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if exited, err := olm.Exited(); exited {
			return false, fmt.Errorf("olm exited (%v); see %s", err, olm.LogPath)
		}
		og := &unstructured.Unstructured{}
		og.SetGroupVersionKind(OperatorGroupGVK)
		if err := c.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, og); err != nil {
			return false, nil
		}
		updated, _, _ := unstructured.NestedString(og.Object, "status", "lastUpdated")
		return updated != "", nil
	})
	if err != nil {
		return fmt.Errorf("waiting for OLM to report on OperatorGroup %s/%s (log %s): %w", ns, name, olm.LogPath, err)
	}
	return nil
}
