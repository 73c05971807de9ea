package webhook

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"

	"github.com/addon-heartbeat/addon-heartbeat/internal/admission"
)

func webhookClient(cfg *tls.Config) *http.Client {
	return &http.Client{Transport: &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: true}}
}

const validDeploymentReview = `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u-1",
"kind":{"group":"apps","version":"v1","kind":"Deployment"},"resource":{"group":"apps","version":"v1","resource":"deployments"},
"operation":"CREATE","namespace":"ns","name":"d","userInfo":{"username":"admin","groups":["system:masters"]},"object":%s}}`

func review(object string) string { return strings.Replace(validDeploymentReview, "%s", object, 1) }

// Must show 7: malformed or non-Deployment AdmissionReviews sent straight to
// the webhook get a clear 4xx or denial, never a panic; the server keeps
// serving afterwards.
func TestMalformedRequests(t *testing.T) {
	tests := map[string]struct {
		method, contentType, body string
		wantStatus                int
		wantAllowed               bool
		wantMessage               string
	}{
		"GET": {method: http.MethodGet, wantStatus: http.StatusMethodNotAllowed, wantMessage: "expected POST"},
		"wrong content type": {contentType: "text/plain", body: "{}", wantStatus: http.StatusUnsupportedMediaType,
			wantMessage: "expected application/json"},
		"empty body":   {wantStatus: http.StatusBadRequest, wantMessage: "empty request body"},
		"not JSON":     {body: "<xml/>", wantStatus: http.StatusBadRequest, wantMessage: "not an AdmissionReview"},
		"JSON array":   {body: "[1,2]", wantStatus: http.StatusBadRequest, wantMessage: "not an AdmissionReview"},
		"truncated":    {body: review(`{"metadata":`)[:90], wantStatus: http.StatusBadRequest, wantMessage: "not an AdmissionReview"},
		"no request":   {body: `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`, wantStatus: http.StatusBadRequest, wantMessage: "no request"},
		"v1beta1":      {body: `{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{"uid":"x"}}`, wantStatus: http.StatusBadRequest, wantMessage: "expected admission.k8s.io/v1 AdmissionReview"},
		"not a review": {body: `{"apiVersion":"v1","kind":"Pod"}`, wantStatus: http.StatusBadRequest, wantMessage: "expected admission.k8s.io/v1 AdmissionReview"},
		"a Pod": {body: `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u-2",
"kind":{"group":"","version":"v1","kind":"Pod"},"resource":{"group":"","version":"v1","resource":"pods"},"operation":"CREATE","object":{}}}`,
			wantStatus: http.StatusOK, wantMessage: "expected an apps/v1 Deployment"},
		"Deployment scale subresource": {body: strings.Replace(review(`{}`), `"operation"`, `"subResource":"scale","operation"`, 1),
			wantStatus: http.StatusOK, wantMessage: `subresource "scale"`},
		"no object":         {body: review(`null`), wantStatus: http.StatusOK, wantMessage: "carries no object"},
		"object not a map":  {body: review(`[1]`), wantStatus: http.StatusOK, wantMessage: "not a valid apps/v1 Deployment"},
		"wrong field types": {body: review(`{"spec":{"replicas":"three"}}`), wantStatus: http.StatusOK, wantMessage: "not a valid apps/v1 Deployment"},
		"annotations not strings": {body: review(`{"metadata":{"annotations":{"addon-heartbeat.io/inject":true}}}`),
			wantStatus: http.StatusOK, wantMessage: "not a valid apps/v1 Deployment"},
		"valid but not opted in": {body: review(`{"metadata":{"name":"d"}}`), wantStatus: http.StatusOK, wantAllowed: true},
		"opted in, no containers": {body: review(`{"metadata":{"name":"d","annotations":{"addon-heartbeat.io/inject":"true"}}}`),
			wantStatus: http.StatusOK, wantAllowed: true},
		// Only the API server may ask: it always names the user, whom
		// the escalation rule checks.
		"opted in, no user": {body: strings.Replace(review(`{"metadata":{"name":"d","annotations":{"addon-heartbeat.io/inject":"true"}}}`),
			`"userInfo":{"username":"admin","groups":["system:masters"]},`, "", 1),
			wantStatus: http.StatusOK, wantMessage: "names no user"},
	}
	c := webhookClient(webhookTLS)
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			method, ct := tc.method, tc.contentType
			if method == "" {
				method = http.MethodPost
			}
			if ct == "" {
				ct = "application/json"
			}
			req, err := http.NewRequestWithContext(t.Context(), method, webhookURL, strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", ct)
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.wantStatus {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.wantStatus, body)
			}
			var out admissionv1.AdmissionReview
			if err := json.Unmarshal(body, &out); err != nil || out.Response == nil {
				t.Fatalf("response is not an AdmissionReview (%v): %s", err, body)
			}
			if out.Response.Allowed != tc.wantAllowed {
				t.Fatalf("allowed = %v, want %v: %s", out.Response.Allowed, tc.wantAllowed, body)
			}
			if tc.wantMessage != "" && (out.Response.Result == nil || !strings.Contains(out.Response.Result.Message, tc.wantMessage)) {
				t.Fatalf("message does not say %q: %s", tc.wantMessage, body)
			}
		})
	}
	// A body over the limit is refused without being read in full.
	big := bytes.Repeat([]byte(" "), admission.MaxBodyBytes+1)
	resp, err := c.Post(webhookURL, "application/json", bytes.NewReader(big))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("oversized body: status %d, want 413", resp.StatusCode)
	}
	if err := waitHTTP(readyURL, http.StatusOK); err != nil {
		t.Fatalf("the webhook is not ready after malformed requests: %v", err)
	}
}

// TLS 1.2 is the floor and HTTP/2 is never negotiated.
func TestTLSSettings(t *testing.T) {
	addr := strings.TrimPrefix(strings.TrimSuffix(webhookURL, admission.Path), "https://")
	old := webhookTLS.Clone()
	old.MinVersion, old.MaxVersion = tls.VersionTLS10, tls.VersionTLS11
	if conn, err := tls.Dial("tcp", addr, old); err == nil {
		conn.Close()
		t.Error("a TLS 1.1 handshake succeeded")
	}
	h2 := webhookTLS.Clone()
	h2.NextProtos = []string{"h2", "http/1.1"}
	conn, err := tls.Dial("tcp", addr, h2)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if p := conn.ConnectionState().NegotiatedProtocol; p == "h2" {
		t.Error("HTTP/2 was negotiated")
	}
	if v := conn.ConnectionState().Version; v < tls.VersionTLS12 {
		t.Errorf("TLS version %x", v)
	}
}
