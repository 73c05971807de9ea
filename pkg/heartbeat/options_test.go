//go:build go1.25

package heartbeat

import (
	"strings"
	"testing"

	"k8s.io/client-go/rest"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/annotations"
)

func TestNewValidatesOptions(t *testing.T) {
	cfg := &rest.Config{Host: "https://127.0.0.1:1"}
	tests := map[string]struct {
		opts    Options
		wantErr string
	}{
		"minimal":            {opts: Options{Namespace: "ns"}},
		"everything":         {opts: Options{Namespace: "ns", Name: "x", DeleteAck: annotations.DeleteAckManual, HealthURL: "http://127.0.0.1:8081/healthz", DeploymentHealth: true, Identity: "me"}},
		"no namespace":       {opts: Options{}, wantErr: "Namespace is required"},
		"bad namespace":      {opts: Options{Namespace: "Not A Namespace"}, wantErr: "namespace"},
		"bad name":           {opts: Options{Namespace: "ns", Name: "Bad_Name"}, wantErr: "AddonInstance name"},
		"bad delete-ack":     {opts: Options{Namespace: "ns", DeleteAck: "sometimes"}, wantErr: "delete-ack"},
		"non-loopback check": {opts: Options{Namespace: "ns", HealthURL: "http://10.1.2.3:80/"}, wantErr: "health URL"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			tt.opts.Registerer = nil
			r, err := New(cfg, tt.opts)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("New: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("New error = %v, want one containing %q", err, tt.wantErr)
			case err == nil:
				if r.opts.Name == "" || r.opts.DeleteAck == "" || r.opts.Identity == "" || r.opts.LeaseNamespace != r.opts.Namespace {
					t.Errorf("defaults not applied: %+v", r.opts)
				}
			}
		})
	}
}

func TestNeedLeaderElection(t *testing.T) {
	cfg := &rest.Config{Host: "https://127.0.0.1:1"}
	own, err := New(cfg, Options{Namespace: "ns"})
	if err != nil {
		t.Fatal(err)
	}
	if own.NeedLeaderElection() {
		t.Error("a Reporter with its own election must run on every replica")
	}
	managers, err := New(cfg, Options{Namespace: "ns", DisableLeaderElection: true})
	if err != nil {
		t.Fatal(err)
	}
	if !managers.NeedLeaderElection() {
		t.Error("a Reporter without its own election must be gated by the manager's")
	}
}
