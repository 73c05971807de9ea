package promserver

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/addon-heartbeat/addon-heartbeat/internal/testenv"
)

// Version is the one hack/tools/prometheus pins (hack/prometheus-binaries.sh
// builds that one, into a folder named after it).
func TestVersionIsTheToolsModules(t *testing.T) {
	path := filepath.Join(testenv.RepoRoot(), "hack", "tools", "prometheus", "go.mod")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(strings.TrimPrefix(strings.TrimSpace(line), "require "))
		if len(f) >= 2 && f[0] == "github.com/prometheus/prometheus" {
			if f[1] != Version {
				t.Errorf("hack/tools/prometheus requires %s, promserver.Version is %s", f[1], Version)
			}
			return
		}
	}
	t.Error("hack/tools/prometheus does not require github.com/prometheus/prometheus")
}

func TestDirSaysHowToBuild(t *testing.T) {
	t.Setenv("PROMETHEUS_ASSETS", t.TempDir())
	_, err := Dir()
	if err == nil || !strings.Contains(err.Error(), "hack/prometheus-binaries.sh") {
		t.Errorf("Dir() = %v, want an error naming hack/prometheus-binaries.sh", err)
	}
}

func TestDashboardQueries(t *testing.T) {
	d, err := ReadDashboard([]byte(`{
  "templating": {"list": [{"name": "webhook_job", "type": "constant", "query": "my-job"}]},
  "panels": [
    {"id": 1, "type": "row", "title": "r"},
    {"id": 2, "type": "timeseries", "title": "p", "targets": [
      {"refId": "A", "expr": "sum(rate(x{namespace=~\"$namespace\", job=\"$webhook_job\"}[$__rate_interval]))"}]}
  ]}`))
	if err != nil {
		t.Fatal(err)
	}
	q := d.Queries("1m")
	want := `sum(rate(x{namespace=~".*", job="my-job"}[1m]))`
	if len(q) != 1 || q[0].Expr != want || q[0].Panel != "p" {
		t.Errorf("Queries = %+v, want %s", q, want)
	}
	if _, err := ReadDashboard([]byte(`{"panels": [`)); err == nil {
		t.Error("invalid JSON read without an error")
	}
}
