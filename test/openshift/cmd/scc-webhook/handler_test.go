package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/addon-heartbeat/addon-heartbeat/test/openshift/sccadmit"
)

const goldenDir = "../../../../pkg/inject/testdata/golden"

func TestHandler(t *testing.T) {
	anyuidNS := sccadmit.Namespace("anyuid-ns")
	anyuidNS.Labels = map[string]string{GrantLabelPrefix + "anyuid": "true"}
	kube := fake.NewClientset(
		sccadmit.Namespace("scc-ns"), // restricted-v2 only
		anyuidNS,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "plain-ns"}}, // no SCC annotations
	)
	h := newHandler(t, kube)

	cases := map[string]struct {
		golden, namespace string
		operation         admissionv1.Operation
		wantDenied        string // a part of the denial message; "" if allowed
		wantPatch         bool
		wantSCC           string // openshift.io/scc after the patch
		wantUID           int64  // the reporter's runAsUser after the patch; 0: unset
	}{
		"openshift platform gets a UID from the namespace range": {
			golden: "minimal.openshift-native.yaml", namespace: "scc-ns", operation: admissionv1.Create,
			wantPatch: true, wantSCC: "restricted-v2", wantUID: 1000650000,
		},
		"anyuid granted by label is chosen first, by priority": {
			golden: "minimal.openshift-plain.yaml", namespace: "anyuid-ns", operation: admissionv1.Create,
			wantPatch: true, wantSCC: "anyuid",
		},
		"kubernetes platform is denied with the SCC text": {
			golden: "minimal.native.yaml", namespace: "scc-ns", operation: admissionv1.Create,
			wantDenied: "unable to validate against any security context constraint: [provider \"anyuid\": Forbidden: not usable by user or serviceaccount, " +
				"provider restricted-v2: .initContainers[0].runAsUser: Invalid value: 65532: must be in the ranges: [1000650000, 1000659999]",
		},
		"namespace without the uid-range annotation passes unchanged": {
			golden: "minimal.native.yaml", namespace: "plain-ns", operation: admissionv1.Create,
		},
		"updates pass unchanged": {
			golden: "minimal.native.yaml", namespace: "scc-ns", operation: admissionv1.Update,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			d, err := sccadmit.ReadDeployment(filepath.Join(goldenDir, tc.golden))
			if err != nil {
				t.Fatal(err)
			}
			raw, err := json.Marshal(sccadmit.PodFromDeployment(d, tc.namespace))
			if err != nil {
				t.Fatal(err)
			}
			resp := post(t, h, &admissionv1.AdmissionRequest{
				UID:       types.UID("review-1"),
				Kind:      metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
				Resource:  podResource,
				Namespace: tc.namespace,
				Operation: tc.operation,
				UserInfo: authenticationv1.UserInfo{Username: "system:serviceaccount:kube-system:replicaset-controller",
					Groups: []string{"system:serviceaccounts", "system:authenticated"}},
				Object: runtime.RawExtension{Raw: raw},
			})
			if resp.UID != "review-1" {
				t.Errorf("response UID %q, want the request's", resp.UID)
			}

			if tc.wantDenied != "" {
				if resp.Allowed || resp.Result == nil || !strings.HasPrefix(resp.Result.Message, tc.wantDenied) || resp.Result.Code != http.StatusForbidden {
					t.Fatalf("want a 403 denial starting with\n  %s\ngot allowed=%v result=%+v", tc.wantDenied, resp.Allowed, resp.Result)
				}
				return
			}
			if !resp.Allowed {
				t.Fatalf("denied: %+v", resp.Result)
			}
			if !tc.wantPatch {
				if len(resp.Patch) != 0 {
					t.Fatalf("want no patch, got %s", resp.Patch)
				}
				return
			}

			t.Logf("patch: %s", resp.Patch)
			patch, err := jsonpatch.DecodePatch(resp.Patch)
			if err != nil {
				t.Fatalf("patch %s: %v", resp.Patch, err)
			}
			patched, err := patch.Apply(raw)
			if err != nil {
				t.Fatalf("applying patch %s: %v", resp.Patch, err)
			}
			pod := &corev1.Pod{}
			if err := json.Unmarshal(patched, pod); err != nil {
				t.Fatal(err)
			}
			if got := pod.Annotations["openshift.io/scc"]; got != tc.wantSCC {
				t.Errorf("openshift.io/scc = %q, want %q (patch %s)", got, tc.wantSCC, resp.Patch)
			}
			var uid int64
			for _, c := range append(pod.Spec.InitContainers, pod.Spec.Containers...) {
				if c.Name == "heartbeat-reporter" && c.SecurityContext != nil && c.SecurityContext.RunAsUser != nil {
					uid = *c.SecurityContext.RunAsUser
				}
			}
			if uid != tc.wantUID {
				t.Errorf("heartbeat-reporter runAsUser = %d, want %d (patch %s)", uid, tc.wantUID, resp.Patch)
			}
		})
	}
}

func TestHandlerBadRequests(t *testing.T) {
	h := newHandler(t, fake.NewClientset())
	for name, tc := range map[string]struct {
		method, body string
		want         int
	}{
		"GET":                {method: http.MethodGet, want: http.StatusMethodNotAllowed},
		"not JSON":           {method: http.MethodPost, body: "{", want: http.StatusBadRequest},
		"review, no request": {method: http.MethodPost, body: `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`, want: http.StatusBadRequest},
	} {
		t.Run(name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(tc.method, "/mutate-pods", strings.NewReader(tc.body)))
			if rec.Code != tc.want {
				t.Errorf("status %d, want %d: %s", rec.Code, tc.want, rec.Body)
			}
		})
	}
}

func newHandler(t *testing.T, kube *fake.Clientset) *Handler {
	t.Helper()
	sccs, err := sccadmit.LoadSCCs("../../testdata/scc")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	admitter, err := sccadmit.New(ctx, sccs, kube, Grants("restricted-v2"))
	if err != nil {
		t.Fatal(err)
	}
	return &Handler{Kube: kube, Admitter: admitter}
}

func post(t *testing.T, h http.Handler, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	t.Helper()
	body, err := json.Marshal(&admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request:  req,
	})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/mutate-pods", bytes.NewReader(body)))
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	review := &admissionv1.AdmissionReview{}
	if err := json.Unmarshal(rec.Body.Bytes(), review); err != nil || review.Response == nil {
		t.Fatalf("not an AdmissionReview with a response (%v): %s", err, rec.Body)
	}
	return review.Response
}
