package reporter

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/addon-heartbeat/addon-heartbeat/internal/logging/slogjson"
	"github.com/addon-heartbeat/addon-heartbeat/internal/version"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/annotations"
)

func env(kv map[string]string) func(string) string {
	return func(k string) string { return kv[k] }
}

var injectedEnv = map[string]string{EnvTargetNamespace: "my-addon", EnvPodName: "addon-7d9f-x2", EnvPodNamespace: "my-addon"}

func TestParseConfig(t *testing.T) {
	tests := map[string]struct {
		args []string
		env  map[string]string
		want Config
	}{
		"defaults": {
			env: injectedEnv,
			want: Config{AddonInstance: "addon-instance", Namespace: "my-addon", DeleteAck: annotations.DeleteAckAuto,
				HealthProbeAddr: ":9781", MetricsAddr: ":9782", LeaderElectionNamespace: "my-addon",
				Identity: "addon-7d9f-x2", PodNamespace: "my-addon"},
		},
		"exactly what the webhook injects": {
			args: []string{"--addon-instance=my-instance", "--delete-ack=manual", "--health-url=http://127.0.0.1:8081/healthz",
				"--health-probe-bind-address=:9781", "--metrics-bind-address=:9782"},
			env: injectedEnv,
			want: Config{AddonInstance: "my-instance", Namespace: "my-addon", DeleteAck: annotations.DeleteAckManual,
				HealthURL: "http://127.0.0.1:8081/healthz", HealthProbeAddr: ":9781", MetricsAddr: ":9782",
				LeaderElectionNamespace: "my-addon", Identity: "addon-7d9f-x2", PodNamespace: "my-addon"},
		},
		"log level": {
			args: []string{"--log-level=debug"},
			env:  map[string]string{EnvTargetNamespace: "my-addon"},
			want: Config{AddonInstance: "addon-instance", Namespace: "my-addon", DeleteAck: annotations.DeleteAckAuto,
				HealthProbeAddr: ":9781", MetricsAddr: ":9782", LeaderElectionNamespace: "my-addon", LogLevel: "debug"},
		},
		"local run": {
			args: []string{"--kubeconfig=/tmp/kc", "--leader-election-namespace=elsewhere", "--zap-log-level=debug",
				"--metrics-bind-address=0", "--health-probe-bind-address=127.0.0.1:0"},
			env: map[string]string{EnvTargetNamespace: "my-addon"},
			want: Config{AddonInstance: "addon-instance", Namespace: "my-addon", DeleteAck: annotations.DeleteAckAuto,
				HealthProbeAddr: "127.0.0.1:0", MetricsAddr: "0", LeaderElectionNamespace: "elsewhere", Kubeconfig: "/tmp/kc"},
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := ParseConfig(tt.args, env(tt.env))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got, cmpopts.IgnoreTypes(slogjson.Options{})); diff != "" {
				t.Errorf("ParseConfig (-want +got):\n%s", diff)
			}
			if tt.want.LogLevel == "debug" && (got.Log.Level == nil || *got.Log.Level > slogjson.LevelDebug) {
				t.Errorf("--log-level=debug did not enable debug logs")
			}
		})
	}
}

func TestParseConfigErrorsNameTheSetting(t *testing.T) {
	tests := map[string]struct {
		args    []string
		env     map[string]string
		wantErr []string
	}{
		"no target namespace":  {env: map[string]string{EnvPodName: "p"}, wantErr: []string{"ADDON_TARGET_NAMESPACE is not set"}},
		"bad target namespace": {env: map[string]string{EnvTargetNamespace: "Not_A_Namespace"}, wantErr: []string{"ADDON_TARGET_NAMESPACE", `"Not_A_Namespace"`}},
		"bad delete-ack":       {args: []string{"--delete-ack=later"}, env: injectedEnv, wantErr: []string{"--delete-ack", `"later"`, `"auto" or "manual"`}},
		"bad instance name":    {args: []string{"--addon-instance=Bad Name"}, env: injectedEnv, wantErr: []string{"--addon-instance", `"Bad Name"`}},
		"remote health URL":    {args: []string{"--health-url=http://10.0.0.1:8081/healthz"}, env: injectedEnv, wantErr: []string{"--health-url", "loopback"}},
		"health URL w/o port":  {args: []string{"--health-url=http://localhost/healthz"}, env: injectedEnv, wantErr: []string{"--health-url", "a port is required"}},
		"bad metrics address":  {args: []string{"--metrics-bind-address=9782"}, env: injectedEnv, wantErr: []string{"--metrics-bind-address", `"9782"`}},
		"bad probe address":    {args: []string{"--health-probe-bind-address=localhost"}, env: injectedEnv, wantErr: []string{"--health-probe-bind-address"}},
		"bad lease namespace":  {args: []string{"--leader-election-namespace=a.b"}, env: injectedEnv, wantErr: []string{"--leader-election-namespace"}},
		"unknown flag":         {args: []string{"--period=5s"}, env: injectedEnv, wantErr: []string{"flag provided but not defined: -period"}},
		"bad zap log level":    {args: []string{"--zap-log-level=loud"}, env: injectedEnv, wantErr: []string{"zap-log-level"}},
		"bad log level":        {args: []string{"--log-level=loud"}, env: injectedEnv, wantErr: []string{"--log-level", `"loud"`}},
		"stray argument":       {args: []string{"extra"}, env: injectedEnv, wantErr: []string{`unexpected argument "extra"`}},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := ParseConfig(tt.args, env(tt.env))
			if err == nil {
				t.Fatal("no error")
			}
			for _, want := range tt.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not contain %q", err, want)
				}
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q is not one line", err)
			}
		})
	}
}

func TestMainExitCodes(t *testing.T) {
	tests := map[string]struct {
		args     []string
		env      map[string]string
		wantCode int
		wantOut  string
		// wantStdout is all that goes to stdout.
		wantStdout string
	}{
		"missing namespace": {env: map[string]string{}, wantCode: ExitConfig, wantOut: "reporter: environment variable ADDON_TARGET_NAMESPACE is not set"},
		"bad flag value":    {args: []string{"--delete-ack=x"}, env: injectedEnv, wantCode: ExitConfig, wantOut: "reporter: --delete-ack"},
		"help":              {args: []string{"-h"}, env: injectedEnv, wantCode: ExitOK, wantOut: "usage: reporter"},
		// Anywhere, even without the injected environment (an image checked
		// on a workstation).
		"version": {args: []string{"--version"}, env: map[string]string{}, wantCode: ExitOK,
			wantStdout: "addon-heartbeat reporter " + version.Get().String() + "\n"},
		"unreadable kubeconfig": {args: []string{"--kubeconfig=/nonexistent/kubeconfig"}, env: injectedEnv,
			wantCode: ExitRuntime, wantOut: "loading the API server configuration failed"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := Main(context.Background(), tt.args, env(tt.env), &stdout, &stderr)
			if code != tt.wantCode || !strings.Contains(stderr.String(), tt.wantOut) {
				t.Errorf("Main = %d, stderr %q; want %d and %q", code, stderr.String(), tt.wantCode, tt.wantOut)
			}
			if stdout.String() != tt.wantStdout {
				t.Errorf("stdout %q, want %q", stdout.String(), tt.wantStdout)
			}
			if tt.wantCode == ExitConfig && strings.Count(strings.TrimSpace(stderr.String()), "\n") != 0 {
				t.Errorf("config error is not one line: %q", stderr.String())
			}
		})
	}
	if _, err := ParseConfig([]string{"-h"}, env(injectedEnv)); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v", err)
	}
}
