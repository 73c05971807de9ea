package release

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"

	"helm.sh/helm/v4/pkg/chart/v2/loader"
	chartutil "helm.sh/helm/v4/pkg/chart/v2/util"
	"sigs.k8s.io/yaml"
)

// DigestValues are the chart values a release fills with its image index's
// digest.
var DigestValues = []string{"image.digest", "reporter.image.digest"}

// PackageChart packages the chart in dir as `helm package --version
// --app-version` does (with Helm's own loader and archive writer), after setting each of
// DigestValues to digest in its values.yaml, into out; it returns the
// archive's path. Chart version is v without its "v"; appVersion is v.
// Files are dated at modTime, so that the same inputs give the same archive.
func PackageChart(dir, out, v, digest string, modTime time.Time) (string, error) {
	tmp, err := os.MkdirTemp("", "addon-heartbeat-chart-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	staged := filepath.Join(tmp, filepath.Base(dir))
	if err := os.CopyFS(staged, os.DirFS(dir)); err != nil {
		return "", fmt.Errorf("copying the chart %s: %w", dir, err)
	}
	valuesPath := filepath.Join(staged, "values.yaml")
	values, err := os.ReadFile(valuesPath)
	if err != nil {
		return "", err
	}
	set := map[string]string{}
	for _, k := range DigestValues {
		set[k] = digest
	}
	values, err = SetValues(values, set)
	if err != nil {
		return "", fmt.Errorf("%s: %w", filepath.Join(dir, "values.yaml"), err)
	}
	if err := os.WriteFile(valuesPath, values, 0o644); err != nil {
		return "", err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return "", err
	}
	// What `helm package --version --app-version` does (action.Package),
	// for a chart without dependencies or a signature.
	ch, err := loader.LoadDir(staged)
	if err != nil {
		return "", fmt.Errorf("loading the chart %s: %w", dir, err)
	}
	ch.Metadata.Version, ch.Metadata.AppVersion = strings.TrimPrefix(v, "v"), v
	ch.StampModTimes(modTime)
	path, err := chartutil.Save(ch, out)
	if err != nil {
		return "", fmt.Errorf("packaging the chart: %w", err)
	}
	return path, nil
}

var keyRE = regexp.MustCompile(`^(\s*)([A-Za-z0-9_.-]+):(\s.*)?$`)

// SetValues sets scalar values of a values.yaml, each named by its dotted
// path, to strings, changing only their lines so that every comment stays.
// It fails when a path is not a key of the document, and checks that the
// result parses to the document with exactly those values changed.
func SetValues(doc []byte, set map[string]string) ([]byte, error) {
	type level struct {
		indent int
		key    string
	}
	var stack []level
	done := map[string]bool{}
	lines := strings.Split(string(doc), "\n")
	for i, line := range lines {
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "#") {
			continue
		}
		m := keyRE.FindStringSubmatch(line)
		if m == nil {
			continue // a list item or a continued value
		}
		indent := len(m[1])
		for len(stack) > 0 && stack[len(stack)-1].indent >= indent {
			stack = stack[:len(stack)-1]
		}
		stack = append(stack, level{indent, m[2]})
		var path []string
		for _, l := range stack {
			path = append(path, l.key)
		}
		key := strings.Join(path, ".")
		if v, ok := set[key]; ok {
			lines[i] = m[1] + m[2] + ": " + strconv.Quote(v)
			done[key] = true
		}
	}
	for k := range set {
		if !done[k] {
			return nil, fmt.Errorf("no value %s to set", k)
		}
	}
	out := []byte(strings.Join(lines, "\n"))
	// The check: parsed, the result is the document with those values set.
	var before, after map[string]any
	if err := yaml.Unmarshal(doc, &before); err != nil {
		return nil, fmt.Errorf("parsing the values: %w", err)
	}
	if err := yaml.Unmarshal(out, &after); err != nil {
		return nil, fmt.Errorf("the values no longer parse after setting %v: %w", set, err)
	}
	for k, v := range set {
		m := before
		parts := strings.Split(k, ".")
		for _, p := range parts[:len(parts)-1] {
			next, ok := m[p].(map[string]any)
			if !ok {
				return nil, fmt.Errorf("value %s: %s is not a map", k, p)
			}
			m = next
		}
		if _, ok := m[parts[len(parts)-1]].(string); !ok {
			return nil, fmt.Errorf("value %s: not a string in the values", k)
		}
		m[parts[len(parts)-1]] = v
	}
	if !reflect.DeepEqual(before, after) {
		return nil, fmt.Errorf("setting %v changed more than those values", set)
	}
	return out, nil
}
