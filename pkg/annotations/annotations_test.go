package annotations

import (
	"errors"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	tests := map[string]struct {
		annots  map[string]string
		want    Settings
		wantKey string // the key an *Error must name; empty for no error
	}{
		"absent":       {annots: nil, want: Settings{AddonInstance: DefaultAddonInstance, DeleteAck: DeleteAckAuto}},
		"false":        {annots: map[string]string{Inject: "false"}, want: Settings{AddonInstance: DefaultAddonInstance, DeleteAck: DeleteAckAuto}},
		"true":         {annots: map[string]string{Inject: "true"}, want: Settings{Inject: true, AddonInstance: DefaultAddonInstance, DeleteAck: DeleteAckAuto}},
		"capitalised":  {annots: map[string]string{Inject: "True"}, wantKey: Inject},
		"empty inject": {annots: map[string]string{Inject: ""}, wantKey: Inject},
		"all settings": {
			annots: map[string]string{Inject: "true", AddonInstance: "my-instance", HealthURL: "http://localhost:8081/healthz", DeleteAck: "manual"},
			want:   Settings{Inject: true, AddonInstance: "my-instance", HealthURL: "http://localhost:8081/healthz", DeleteAck: DeleteAckManual},
		},
		"bad instance":   {annots: map[string]string{Inject: "true", AddonInstance: "UPPER"}, wantKey: AddonInstance},
		"empty instance": {annots: map[string]string{Inject: "true", AddonInstance: ""}, wantKey: AddonInstance},
		"bad delete-ack": {annots: map[string]string{Inject: "true", DeleteAck: "Auto"}, wantKey: DeleteAck},
		"opted out settings not checked": {
			annots: map[string]string{Inject: "false", DeleteAck: "never"},
			want:   Settings{AddonInstance: DefaultAddonInstance, DeleteAck: DeleteAckAuto},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := Parse(tc.annots)
			if tc.wantKey != "" {
				var aerr *Error
				if !errors.As(err, &aerr) || aerr.Key != tc.wantKey {
					t.Fatalf("error %v, want an *Error for %s", err, tc.wantKey)
				}
				if !strings.Contains(err.Error(), "expected") || !strings.Contains(err.Error(), tc.wantKey) {
					t.Errorf("message %q does not say what is expected for %s", err, tc.wantKey)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestValidateHealthURL(t *testing.T) {
	tests := map[string]struct {
		url     string
		wantWhy string // empty: valid
	}{
		"ipv4 loopback":       {url: "http://127.0.0.1:8081/healthz"},
		"other 127 address":   {url: "http://127.0.0.2:8081/"},
		"ipv6 loopback":       {url: "http://[::1]:8081/healthz"},
		"localhost https":     {url: "https://localhost:8443/readyz?verbose=1"},
		"pod IP":              {url: "http://10.1.2.3:8081/healthz", wantWhy: "host must be"},
		"service name":        {url: "http://my-svc.my-ns.svc:8081/healthz", wantWhy: "host must be"},
		"unspecified address": {url: "http://0.0.0.0:8081/healthz", wantWhy: "host must be"},
		"no port":             {url: "http://127.0.0.1/healthz", wantWhy: "port is required"},
		"file scheme":         {url: "file:///etc/passwd", wantWhy: "scheme"},
		"no scheme":           {url: "127.0.0.1:8081/healthz", wantWhy: "not a URL"},
		"credentials":         {url: "http://user:secret@127.0.0.1:8081/", wantWhy: "credentials"},
		"not a URL":           {url: "http://%zz", wantWhy: "not a URL"},
		"localhost lookalike": {url: "http://localhost.evil.example:80/", wantWhy: "host must be"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			err := ValidateHealthURL(tc.url)
			if tc.wantWhy == "" {
				if err != nil {
					t.Fatalf("rejected: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantWhy) {
				t.Fatalf("error %v, want one saying %q", err, tc.wantWhy)
			}
			if strings.Contains(err.Error(), "secret") {
				t.Errorf("the error repeats a credential: %v", err)
			}
		})
	}
}
