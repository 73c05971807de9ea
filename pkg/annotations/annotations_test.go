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
			got, err := Parse(Sources{Annotations: tc.annots})
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

// OLM sets Deployment labels and pod-template annotations, not Deployment
// annotations: each setting is read from all three places, which must agree.
func TestParseFromEveryPlace(t *testing.T) {
	opted := Settings{Inject: true, AddonInstance: DefaultAddonInstance, DeleteAck: DeleteAckAuto}
	tests := map[string]struct {
		src  Sources
		want Settings
		// wantErr are parts of the error message; empty for no error.
		wantErr []string
	}{
		"label":                   {src: Sources{Labels: map[string]string{Inject: "true"}}, want: opted},
		"pod template annotation": {src: Sources{TemplateAnnotations: map[string]string{Inject: "true"}}, want: opted},
		"the same value in every place": {src: Sources{
			Annotations:         map[string]string{Inject: "true"},
			Labels:              map[string]string{Inject: "true", DeleteAck: "manual"},
			TemplateAnnotations: map[string]string{Inject: "true", DeleteAck: "manual", HealthURL: "http://127.0.0.1:8081/healthz"},
		}, want: Settings{Inject: true, AddonInstance: DefaultAddonInstance, DeleteAck: DeleteAckManual, HealthURL: "http://127.0.0.1:8081/healthz"}},
		"settings from several places": {src: Sources{
			Labels:              map[string]string{Inject: "true", AddonInstance: "mine"},
			TemplateAnnotations: map[string]string{DeleteAck: "manual"},
		}, want: Settings{Inject: true, AddonInstance: "mine", DeleteAck: DeleteAckManual}},
		"opt-in conflict": {src: Sources{
			Annotations: map[string]string{Inject: "false"},
			Labels:      map[string]string{Inject: "true"},
		}, wantErr: []string{Inject, `"false" in the Deployment's annotations`, `"true" in the Deployment's labels`, "set it in one place"}},
		"setting conflict": {src: Sources{
			Labels:              map[string]string{Inject: "true", AddonInstance: "one"},
			TemplateAnnotations: map[string]string{AddonInstance: "two"},
		}, wantErr: []string{AddonInstance, `"one" in the Deployment's labels`, `"two" in the pod template's annotations`}},
		"an invalid label names the label": {src: Sources{Labels: map[string]string{Inject: "yes"}},
			wantErr: []string{"label " + Inject, `"yes"`, `expected "true" or "false"`}},
		"an invalid template annotation names it": {src: Sources{
			Labels:              map[string]string{Inject: "true"},
			TemplateAnnotations: map[string]string{DeleteAck: "later"},
		}, wantErr: []string{"pod template annotation " + DeleteAck, `"later"`}},
		"opted out elsewhere: a conflict in a setting is not checked": {src: Sources{
			Labels:              map[string]string{AddonInstance: "one"},
			TemplateAnnotations: map[string]string{AddonInstance: "two"},
		}, want: Settings{AddonInstance: DefaultAddonInstance, DeleteAck: DeleteAckAuto}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := Parse(tc.src)
			if len(tc.wantErr) > 0 {
				if err == nil {
					t.Fatalf("no error; want one mentioning %q", tc.wantErr)
				}
				for _, w := range tc.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not mention %q", err, w)
					}
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

func TestKeysKeepsOnlyTheSettings(t *testing.T) {
	src := Sources{
		Annotations:         map[string]string{Inject: "true", Status: "{}", "other": "x"},
		Labels:              map[string]string{"app": "a", AddonInstance: "mine"},
		TemplateAnnotations: map[string]string{"olm.operatorGroup": "g", DeleteAck: "manual", HealthURL: "http://127.0.0.1:1/"},
	}
	k := src.Keys()
	if len(k.Annotations) != 1 || len(k.Labels) != 1 || len(k.TemplateAnnotations) != 2 {
		t.Errorf("Keys() = %+v", k)
	}
	a, errA := Parse(src)
	b, errB := Parse(k)
	if a != b || errA != nil || errB != nil {
		t.Errorf("Parse differs after Keys(): %+v (%v) and %+v (%v)", a, errA, b, errB)
	}
	if k := (Sources{}).Keys(); k.Annotations != nil || k.Labels != nil || k.TemplateAnnotations != nil {
		t.Errorf("Keys() of nothing is %+v", k)
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
		// Issue: a 16 KB URL, twice in the Degraded message, made every
		// status write too long for the API server.
		"at the length limit": {url: "http://127.0.0.1:8081/" + strings.Repeat("a", MaxHealthURLLength-len("http://127.0.0.1:8081/"))},
		"40 KB":               {url: "http://127.0.0.1:8081/" + strings.Repeat("a", 40<<10), wantWhy: "a URL of at most 2048 bytes (this one has 40982)"},
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
			if len(err.Error()) > 1024 {
				t.Errorf("the error is %d bytes long: it must not repeat a long value", len(err.Error()))
			}
			if strings.Contains(err.Error(), "secret") {
				t.Errorf("the error repeats a credential: %v", err)
			}
		})
	}
}

// An annotation value may be up to 256 KiB: an error quotes its first 64
// bytes and says its length, so that a denial or a log line stays short.
func TestErrorsQuoteLongValuesBounded(t *testing.T) {
	long := strings.Repeat("x", 300<<10)
	tests := map[string]struct {
		src     Sources
		wantErr []string
	}{
		"invalid value": {src: Sources{Annotations: map[string]string{Inject: "true", DeleteAck: long}},
			wantErr: []string{"annotation " + DeleteAck, `"` + strings.Repeat("x", 64) + `"... (307200 bytes)`, `expected "auto" or "manual"`}},
		"conflict": {src: Sources{
			Annotations: map[string]string{Inject: "true", AddonInstance: long},
			Labels:      map[string]string{AddonInstance: "mine"},
		}, wantErr: []string{AddonInstance, "(307200 bytes) in the Deployment's annotations", `"mine" in the Deployment's labels`}},
		"health URL": {src: Sources{Annotations: map[string]string{Inject: "true", HealthURL: "http://127.0.0.1:8081/" + long}},
			wantErr: []string{HealthURL, "(307222 bytes)", "a URL of at most 2048 bytes (this one has 307222)"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := Parse(tc.src)
			if err == nil {
				t.Fatal("no error")
			}
			msg := err.Error()
			if len(msg) > 400 {
				t.Errorf("a %d-byte message: %.200s...", len(msg), msg)
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(msg, w) {
					t.Errorf("message %.300q does not say %q", msg, w)
				}
			}
		})
	}
	// A multi-byte character is not cut in half.
	if got := quoteBounded(strings.Repeat("é", 100)); !strings.HasPrefix(got, `"`+strings.Repeat("é", 32)+`"...`) {
		t.Errorf("quoteBounded cut a character: %s", got)
	}
}
