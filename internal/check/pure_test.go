package check

import (
	"bytes"
	"crypto/x509"
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/certs"
)

func TestVerifyServed(t *testing.T) {
	now := time.Now()
	ca, err := certs.NewCA("webhook-ca", now.Add(-time.Hour), 48*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	other, err := certs.NewCA("other-ca", now.Add(-time.Hour), 48*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := ca.Issue([]string{"svc.ns.svc", "127.0.0.1"}, now.Add(-time.Hour), 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := certs.ParseCert(kp.CertPEM)
	if err != nil {
		t.Fatal(err)
	}
	chain := []*x509.Certificate{leaf}
	tests := map[string]struct {
		bundle []byte
		name   string
		at     time.Time
		want   string // "" for success
	}{
		"the issuing CA, the Service name": {bundle: ca.CertPEM, name: "svc.ns.svc", at: now},
		"the issuing CA, an IP address":    {bundle: ca.CertPEM, name: "127.0.0.1", at: now},
		"the issuing CA among others":      {bundle: append(append([]byte{}, other.CertPEM...), ca.CertPEM...), name: "svc.ns.svc", at: now},
		"another CA": {bundle: other.CertPEM, name: "svc.ns.svc", at: now,
			want: `the caBundle does not verify the served certificate: it is issued by "webhook-ca", and the caBundle holds "other-ca"`},
		"another name": {bundle: ca.CertPEM, name: "other.ns.svc", at: now,
			want: "the served certificate is for svc.ns.svc, 127.0.0.1, not other.ns.svc, the name the API server connects to"},
		"expired": {bundle: ca.CertPEM, name: "svc.ns.svc", at: now.Add(36 * time.Hour),
			want: "the served certificate is valid from " + leaf.NotBefore.UTC().Format(time.RFC3339) + " to " + leaf.NotAfter.UTC().Format(time.RFC3339) +
				", not now (" + now.Add(36*time.Hour).UTC().Format(time.RFC3339) + ")"},
		"empty": {bundle: nil, name: "svc.ns.svc", at: now,
			want: "the caBundle is empty, so the API server trusts no certificate of the webhook"},
		"not PEM": {bundle: []byte("not a certificate"), name: "svc.ns.svc", at: now,
			want: "the caBundle holds no PEM certificate"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			err := verifyServed(chain, tc.bundle, tc.name, tc.at)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("got %v, want success", err)
			case tc.want != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.want)):
				t.Errorf("got %v\nwant %s", err, tc.want)
			}
		})
	}
}

func TestFlagValues(t *testing.T) {
	got := flagValues([]string{"--port=9443", "--reporter-image", "example.com/r:v1", "-v", "--namespace-selector={\"a\":1}", "positional"})
	want := map[string]string{"port": "9443", "reporter-image": "example.com/r:v1", "v": "", "namespace-selector": `{"a":1}`}
	if len(got) != len(want) {
		t.Errorf("got %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: got %q, want %q", k, got[k], v)
		}
	}
}

func TestReadyEndpoints(t *testing.T) {
	slice := func(port string, eps ...discoveryv1.Endpoint) discoveryv1.EndpointSlice {
		return discoveryv1.EndpointSlice{Ports: []discoveryv1.EndpointPort{{Name: ptr.To(port), Port: ptr.To(int32(9443))}}, Endpoints: eps}
	}
	ep := func(pod string, ready *bool) discoveryv1.Endpoint {
		return discoveryv1.Endpoint{Addresses: []string{"10.0.0.1"}, Conditions: discoveryv1.EndpointConditions{Ready: ready},
			TargetRef: &corev1.ObjectReference{Kind: "Pod", Name: pod}}
	}
	tests := map[string]struct {
		slices   []discoveryv1.EndpointSlice
		ready    []endpoint
		notReady int
	}{
		"none": {},
		"ready, not ready and unknown (ready) across slices": {
			slices: []discoveryv1.EndpointSlice{slice("webhook", ep("b", ptr.To(true)), ep("c", ptr.To(false))), slice("webhook", ep("a", nil))},
			ready:  []endpoint{{"a", 9443}, {"b", 9443}}, notReady: 1,
		},
		"another port's slice": {slices: []discoveryv1.EndpointSlice{slice("metrics", ep("a", ptr.To(true)))}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ready, notReady := readyEndpoints(tc.slices, "webhook")
			if len(ready) != len(tc.ready) || notReady != tc.notReady {
				t.Fatalf("got %v and %d not ready, want %v and %d", ready, notReady, tc.ready, tc.notReady)
			}
			for i := range ready {
				if ready[i] != tc.ready[i] {
					t.Errorf("got %v, want %v", ready, tc.ready)
				}
			}
		})
	}
}

func TestReportOutput(t *testing.T) {
	var r Report
	r.ok("webhook", "serving", "answers")
	r.add("deployment ns/a", "rbac", StatusFail, "may not\nupdate  it", "rebind it")
	r.add("addoninstance ns/a", "degraded", StatusWarn, "True Down", "look")
	r.add("addoninstance ns/a", "lease", StatusSkip, "no AddonInstance", "")

	var table bytes.Buffer
	if err := r.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(table.String(), "\n"), "\n")
	want := []string{
		"SCOPE CHECK STATUS DETAIL",
		"webhook serving OK answers",
		"deployment ns/a rbac FAIL may not update it; fix: rebind it",
		"addoninstance ns/a degraded WARN True Down; fix: look",
		"addoninstance ns/a lease SKIP no AddonInstance",
		"1 failure, 1 warning: addon-heartbeat needs attention",
	}
	if len(lines) != len(want) {
		t.Fatalf("table:\n%s", table.String())
	}
	for i := range want {
		if got := strings.Join(strings.Fields(lines[i]), " "); got != want[i] {
			t.Errorf("line %d: got %q, want %q", i, got, want[i])
		}
	}

	var doc struct {
		Healthy            bool
		Failures, Warnings int
		Checks             []Result
	}
	var js bytes.Buffer
	if err := r.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(js.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Healthy || doc.Failures != 1 || doc.Warnings != 1 || len(doc.Checks) != 4 || doc.Checks[1].Fix != "rebind it" {
		t.Errorf("JSON: %s", js.String())
	}

	for name, tc := range map[string]struct {
		r    Report
		want string
	}{
		"all passed": {Report{Results: []Result{{Status: StatusOK}, {Status: StatusSkip}}}, "all 2 checks passed"},
		"warnings":   {Report{Results: []Result{{Status: StatusOK}, {Status: StatusWarn}, {Status: StatusWarn}}}, "no failures, 2 warnings"},
	} {
		if got := tc.r.Summary(); got != tc.want {
			t.Errorf("%s: summary %q, want %q", name, got, tc.want)
		}
	}
}

func TestParseFlags(t *testing.T) {
	tests := map[string]struct {
		args []string
		want flags
		err  string
	}{
		"defaults":             {want: flags{output: "table", timeout: time.Minute}},
		"kubectl's short ones": {args: []string{"-n", "ns", "-o", "json"}, want: flags{namespace: "ns", output: "json", timeout: time.Minute}},
		"long ones":            {args: []string{"--all-namespaces", "--context=c", "--kubeconfig", "k", "--timeout=5s"}, want: flags{allNamespaces: true, context: "c", kubeconfig: "k", output: "table", timeout: 5 * time.Second}},
		"-A with -n":           {args: []string{"-A", "-n", "x"}, err: "-n and -A: give one or the other"},
		"an unknown output":    {args: []string{"-o", "yaml"}, err: `-o "yaml": expected table or json`},
		"a stray argument":     {args: []string{"pods"}, err: "unexpected arguments: pods"},
		"no time at all":       {args: []string{"--timeout=0s"}, err: "--timeout 0s: expected a positive duration"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := parseFlags("addon-heartbeat", tc.args, &bytes.Buffer{})
			if tc.err != "" {
				if err == nil || err.Error() != tc.err {
					t.Errorf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("got %+v (%v), want %+v", got, err, tc.want)
			}
		})
	}
}
