// Package chart renders and lints the addon-heartbeat Helm chart in-process
// with Helm's own Go packages (loader, engine, lint), so that tests check
// exactly what `helm install` and `helm lint` would produce.
package chart

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/common/util"
	"helm.sh/helm/v4/pkg/chart/loader"
	chartv2 "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/lint"
	"helm.sh/helm/v4/pkg/chart/v2/lint/support"
	chartutil "helm.sh/helm/v4/pkg/chart/v2/util"
	"helm.sh/helm/v4/pkg/engine"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/addon-heartbeat/addon-heartbeat/internal/testenv"
)

// Release names the release a chart is rendered for.
type Release struct {
	Name      string
	Namespace string
}

// DefaultRelease is the release that config/ is equivalent to.
var DefaultRelease = Release{Name: "addon-heartbeat", Namespace: "addon-heartbeat-system"}

// Dir is the chart's folder in the checkout.
func Dir() string {
	return filepath.Join(testenv.RepoRoot(), "charts", "addon-heartbeat")
}

// Cluster is what the chart is told about the cluster it is rendered for
// (Helm's .Capabilities): Kubernetes KubeVersion, serving Helm's built-in API
// versions and APIVersions.
type Cluster struct {
	// APIVersions are served besides Helm's built-in ones, as `helm install`
	// finds them by discovery or `helm template --api-versions` is told:
	// "group/version" and "group/version/Kind".
	APIVersions []string
	// KubeVersion is the API server's version, as `helm install` finds it
	// (or `helm template --kube-version` is told); testenv.KubeVersion when
	// empty.
	KubeVersion string
}

// OpenShift is a cluster that serves OpenShift's security API
// (SecurityContextConstraints), which the chart's platform auto looks for.
var OpenShift = Cluster{APIVersions: []string{"security.openshift.io/v1", "security.openshift.io/v1/SecurityContextConstraints"}}

// AdmissionPolicyAPIVersions are what discovery gives `helm install` for
// ValidatingAdmissionPolicy on Kubernetes 1.30+. Helm's built-in API
// versions name groups and versions only, never kinds, so a render without
// them (`helm template` unless told --api-versions) has no fencing policy.
var AdmissionPolicyAPIVersions = []string{
	"admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy",
	"admissionregistration.k8s.io/v1/ValidatingAdmissionPolicyBinding",
}

// With is c serving apiVersions too.
func (c Cluster) With(apiVersions ...string) Cluster {
	return Cluster{APIVersions: slices.Concat(c.APIVersions, apiVersions), KubeVersion: c.KubeVersion}
}

// Render renders the chart with values over its defaults, validating them
// against values.schema.json as `helm install` does, and returns every object
// in a stable order (kind, namespace, name). NOTES.txt is returned apart.
// The cluster serves no API beyond Helm's built-in ones (see RenderFor).
func Render(rel Release, values map[string]any) (objs []*unstructured.Unstructured, notes string, err error) {
	return RenderFor(rel, Cluster{}, values)
}

// RenderFor is Render for a cluster that serves cluster.APIVersions.
func RenderFor(rel Release, cluster Cluster, values map[string]any) (objs []*unstructured.Unstructured, notes string, err error) {
	return RenderPath(Dir(), rel, cluster, values)
}

// RenderPath is RenderFor for the chart at path: a folder or a packaged
// chart (.tgz).
func RenderPath(path string, rel Release, cluster Cluster, values map[string]any) (objs []*unstructured.Unstructured, notes string, err error) {
	ch, err := loader.Load(path)
	if err != nil {
		return nil, "", fmt.Errorf("loading the chart: %w", err)
	}
	kubeVersion, err := common.ParseKubeVersion(cmp.Or(cluster.KubeVersion, testenv.KubeVersion))
	if err != nil {
		return nil, "", fmt.Errorf("Kubernetes version %q: %w", cluster.KubeVersion, err)
	}
	// What `helm install` (and `helm template`) checks before rendering, in
	// Helm's words.
	v2, ok := ch.(*chartv2.Chart)
	if !ok {
		return nil, "", fmt.Errorf("loading the chart: %T is not a chart of apiVersion v2", ch)
	}
	if c := v2.Metadata.KubeVersion; c != "" && !chartutil.IsCompatibleRange(c, kubeVersion.String()) {
		return nil, "", fmt.Errorf("chart requires kubeVersion: %s which is incompatible with Kubernetes %s", c, kubeVersion.Version)
	}
	caps := common.DefaultCapabilities.Copy()
	caps.KubeVersion = *kubeVersion
	// A new slice: Copy shares the default set's.
	caps.APIVersions = slices.Concat(caps.APIVersions, cluster.APIVersions)
	vals, err := util.ToRenderValues(ch, values, common.ReleaseOptions{
		Name: rel.Name, Namespace: rel.Namespace, Revision: 1, IsInstall: true,
	}, caps)
	if err != nil {
		return nil, "", fmt.Errorf("values: %w", err)
	}
	files, err := engine.Render(ch, vals)
	if err != nil {
		return nil, "", fmt.Errorf("rendering the chart: %w", err)
	}
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if strings.HasSuffix(name, "NOTES.txt") {
			notes = files[name]
			continue
		}
		if !strings.HasSuffix(name, ".yaml") {
			continue
		}
		docs, err := Decode([]byte(files[name]))
		if err != nil {
			return nil, "", fmt.Errorf("%s: %w", name, err)
		}
		objs = append(objs, docs...)
	}
	Sort(objs)
	return objs, notes, nil
}

// Decode parses a multi-document YAML stream into objects, skipping empty
// documents.
func Decode(data []byte) ([]*unstructured.Unstructured, error) {
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return objs, nil
			}
			return nil, fmt.Errorf("decoding YAML: %w", err)
		}
		if len(m) == 0 {
			continue
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
}

// Sort orders objects by kind, namespace and name.
func Sort(objs []*unstructured.Unstructured) {
	slices.SortFunc(objs, func(a, b *unstructured.Unstructured) int {
		return strings.Compare(Key(a), Key(b))
	})
}

// Key identifies an object as "Kind namespace/name".
func Key(o *unstructured.Unstructured) string {
	return o.GetKind() + " " + o.GetNamespace() + "/" + o.GetName()
}

// Find returns the object with kind and name, or nil.
func Find(objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	return nil
}

// Lint runs `helm lint` (every rule, strict about the schema) with values
// and returns its messages at warning level or above.
func Lint(rel Release, values map[string]any) []support.Message {
	linter := lint.RunAll(Dir(), values, rel.Namespace)
	var msgs []support.Message
	for _, m := range linter.Messages {
		if m.Severity >= support.WarningSev {
			msgs = append(msgs, m)
		}
	}
	return msgs
}

// DecodeFile parses a YAML file of one or more objects.
func DecodeFile(path string) ([]*unstructured.Unstructured, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	objs, err := Decode(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return objs, nil
}
