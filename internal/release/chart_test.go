package release

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v4/pkg/chart/v2/loader"
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/addon-heartbeat/addon-heartbeat/internal/chart"
	"github.com/addon-heartbeat/addon-heartbeat/internal/images"
)

const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func TestSetValues(t *testing.T) {
	doc := `# a comment
image:
  # -- the digest
  digest: ""
  tag: ""
reporter:
  image:
    digest: ""   
  list:
  - digest: ""
`
	tests := map[string]struct {
		set     map[string]string
		want    string
		wantErr string
	}{
		"both digests": {
			set:  map[string]string{"image.digest": "sha256:a", "reporter.image.digest": "sha256:b"},
			want: strings.Replace(strings.Replace(doc, `  digest: ""`, `  digest: "sha256:a"`, 1), `    digest: ""   `, `    digest: "sha256:b"`, 1),
		},
		"a path that is no key": {set: map[string]string{"image.sha": "x"}, wantErr: "no value image.sha to set"},
		"a map is no scalar":    {set: map[string]string{"reporter.image": "x"}, wantErr: "the values no longer parse"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := SetValues([]byte(doc), tt.set)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("SetValues: %q, %v; want an error containing %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || string(got) != tt.want {
				t.Errorf("SetValues:\n%s\n(%v); want\n%s", got, err, tt.want)
			}
		})
	}
}

// The packaged chart is the chart with the release's version, appVersion
// and digests, comments kept; installed, every pod and the injected
// reporter name the image by digest and the webhook knows the reporter's
// release.
func TestPackageChart(t *testing.T) {
	out := t.TempDir()
	path, err := PackageChart(chart.Dir(), out, "v0.2.0", digest, time.Unix(1764806400, 0))
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Base(path) != "addon-heartbeat-0.2.0.tgz" {
		t.Errorf("packaged as %s", path)
	}
	ch, err := loader.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if ch.Metadata.Version != "0.2.0" || ch.Metadata.AppVersion != "v0.2.0" {
		t.Errorf("version %s appVersion %s", ch.Metadata.Version, ch.Metadata.AppVersion)
	}
	for _, f := range ch.Raw {
		if f.Name == "values.yaml" && !strings.Contains(string(f.Data), "# -- Image digest (sha256:...) of the webhook") {
			t.Errorf("the packaged values.yaml lost its comments")
		}
	}
	objs, _, err := chart.RenderPath(path, chart.DefaultRelease, chart.Cluster{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	d := chart.Find(objs, "Deployment", "addon-heartbeat-webhook")
	if d == nil {
		t.Fatal("no webhook Deployment")
	}
	var dep appsv1.Deployment
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(d.Object, &dep); err != nil {
		t.Fatal(err)
	}
	c := dep.Spec.Template.Spec.Containers[0]
	want := images.AddonHeartbeat + "@" + digest
	if c.Image != want {
		t.Errorf("webhook image %s, want %s", c.Image, want)
	}
	for _, arg := range []string{"--reporter-image=" + want, "--reporter-version=v0.2.0"} {
		if !slices.Contains(c.Args, arg) {
			t.Errorf("webhook args lack %s: %v", arg, c.Args)
		}
	}
	if got := dep.Labels["app.kubernetes.io/version"]; got != "v0.2.0" {
		t.Errorf("version label %q", got)
	}
	// The same inputs give the same archive.
	again, err := PackageChart(chart.Dir(), t.TempDir(), "v0.2.0", digest, time.Unix(1764806400, 0))
	if err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(path)
	b, _ := os.ReadFile(again)
	if string(a) != string(b) {
		t.Error("packaging twice gave two different archives")
	}
}
