package webhook

import (
	"flag"
	"io"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/inject"
)

// parseOptions parses args after what every webhook is given: its namespace
// and the AddonInstance names of the reporter role.
func parseOptions(args ...string) (Options, error) {
	args = append([]string{"--namespace=addon-heartbeat-system", "--reporter-addon-instance-names=addon-instance"}, args...)
	o := DefaultOptions()
	fs := flag.NewFlagSet("webhook", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	o.BindFlags(fs)
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	return o, o.Validate()
}

func TestOptions(t *testing.T) {
	tests := map[string]struct {
		args    []string
		wantErr []string
		check   func(*testing.T, Options)
	}{
		"defaults need an image": {args: nil, wantErr: []string{"reporter image: must be set"}},
		"minimal": {args: []string{"--reporter-image=r:v1"}, check: func(t *testing.T, o Options) {
			cfg, _ := o.InjectConfig()
			if !cfg.NativeSidecar || cfg.HealthPort != 9781 || cfg.ImagePullPolicy != corev1.PullIfNotPresent || cfg.Platform != inject.Kubernetes {
				t.Errorf("defaults: %+v", cfg)
			}
		}},
		"all reporter settings": {
			args: []string{"--reporter-image=r@sha256:abc", "--native-sidecar=false", "--reporter-image-pull-policy=Never",
				"--reporter-cpu-request=20m", "--reporter-memory-request=16Mi", "--reporter-memory-limit=48Mi",
				"--reporter-health-port=19781", "--reporter-metrics-port=19782", "--reporter-log-level=debug"},
			check: func(t *testing.T, o Options) {
				cfg, _ := o.InjectConfig()
				if cfg.NativeSidecar || cfg.ImagePullPolicy != corev1.PullNever || cfg.HealthPort != 19781 || cfg.MetricsPort != 19782 || cfg.LogLevel != "debug" {
					t.Errorf("config: %+v", cfg)
				}
				if q := cfg.Resources.Limits[corev1.ResourceMemory]; q.Cmp(resource.MustParse("48Mi")) != 0 {
					t.Errorf("memory limit %s", q.String())
				}
			}},
		"openshift": {args: []string{"--reporter-image=r:v1", "--platform=openshift"}, check: func(t *testing.T, o Options) {
			if cfg, _ := o.InjectConfig(); cfg.Platform != inject.OpenShift {
				t.Errorf("platform %q", cfg.Platform)
			}
		}},
		"RBAC without AddonInstance names": {args: []string{"--reporter-image=r:v1", "--reporter-addon-instance-names="},
			wantErr: []string{"--reporter-addon-instance-names", "at least one"}},
		"RBAC off: no names needed": {args: []string{"--reporter-image=r:v1", "--reporter-addon-instance-names=", "--reporter-cluster-role="}},
		"bad platform":              {args: []string{"--reporter-image=r:v1", "--platform=okd"}, wantErr: []string{"--platform", `"okd"`, "kubernetes or openshift"}},
		"bad quantity":              {args: []string{"--reporter-image=r:v1", "--reporter-memory-limit=lots"}, wantErr: []string{`--reporter-memory-limit="lots"`, "quantity"}},
		"bad port":                  {args: []string{"--reporter-image=r:v1", "--port=0"}, wantErr: []string{"--port=0"}},
		"bad log level":             {args: []string{"--reporter-image=r:v1", "--log-level=verbose"}, wantErr: []string{"--log-level", `"verbose"`}},
		"every problem":             {args: []string{"--port=70000", "--cert-dir="}, wantErr: []string{"--port=70000", "--cert-dir", "reporter image"}},
		"unknown flag":              {args: []string{"--reporter-imag=r:v1"}, wantErr: []string{"reporter-imag"}},
		"bad pull":                  {args: []string{"--reporter-image=r:v1", "--reporter-image-pull-policy=always"}, wantErr: []string{`"always"`}},
		"same ports":                {args: []string{"--reporter-image=r:v1", "--reporter-metrics-port=9781"}, wantErr: []string{"both 9781"}},
		"port too large":            {args: []string{"--reporter-image=r:v1", "--reporter-health-port=99999"}, wantErr: []string{"health port"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			o, err := parseOptions(tc.args...)
			if len(tc.wantErr) == 0 {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				if tc.check != nil {
					tc.check(t, o)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error, want %q", tc.wantErr)
			}
			for _, s := range tc.wantErr {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
		})
	}
}
