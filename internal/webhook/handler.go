// Package webhook serves the mutating admission webhook: it decodes
// AdmissionReviews for apps/v1 Deployments, asks pkg/inject for the mutation
// and answers with the JSON patch inject computed for the paths it owns.
package webhook

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"time"

	"github.com/go-logr/logr"
	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/annotations"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/inject"
)

// Path is where the API server sends Deployment admissions.
const Path = "/mutate-apps-v1-deployment"

// maxBodyBytes bounds a request body. The API server's own limit for an
// object is 3 MiB; an AdmissionReview of an UPDATE holds two of them.
const maxBodyBytes = 7 << 20

// Outcomes counted and logged for each review, in addition to the
// inject.Action values (injected, unchanged, removed).
const (
	// OutcomeDenied: the Deployment was refused (invalid annotation).
	OutcomeDenied = "denied"
	// OutcomeBadRequest: the request was not a well-formed AdmissionReview
	// of an apps/v1 Deployment.
	OutcomeBadRequest = "bad_request"
)

var (
	deploymentKind     = metav1.GroupVersionKind{Group: "apps", Version: "v1", Kind: "Deployment"}
	deploymentResource = metav1.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}
	jsonPatchType      = admissionv1.PatchTypeJSONPatch
)

// Handler is the http.Handler for Path.
type Handler struct {
	Config  inject.Config
	Log     logr.Logger
	Metrics *Metrics
	// now is the clock for latency; time.Now when nil.
	now func() time.Time
}

// ServeHTTP answers one AdmissionReview. Transport-level problems (method,
// media type, size, undecodable JSON) get a 4xx status with an
// AdmissionReview body that says what is wrong; a well-formed review always
// gets 200 with allowed or denied in the response.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	now := time.Now
	if h.now != nil {
		now = h.now
	}
	start := now()

	review, status, err := readReview(w, r)
	if err != nil {
		h.Metrics.observe(OutcomeBadRequest, false, now().Sub(start))
		h.Log.Info("rejected a malformed admission request", "status", status, "reason", err.Error(), "remote", r.RemoteAddr)
		writeReview(w, h.Log, status, &admissionv1.AdmissionResponse{UID: uidOf(review), Allowed: false,
			Result: &metav1.Status{Status: metav1.StatusFailure, Code: int32(status), Reason: metav1.StatusReasonBadRequest, Message: err.Error()}})
		return
	}

	req := review.Request
	dryRun := req.DryRun != nil && *req.DryRun
	resp, outcome := h.review(req)
	resp.UID = req.UID
	elapsed := now().Sub(start)
	h.Metrics.observe(outcome, dryRun, elapsed)
	h.logOutcome(req, outcome, dryRun, resp, elapsed)
	writeReview(w, h.Log, http.StatusOK, resp)
}

// review turns one admission request into a response. It never panics on
// input: every malformed part yields a denial that says what is wrong.
func (h *Handler) review(req *admissionv1.AdmissionRequest) (*admissionv1.AdmissionResponse, string) {
	if req.Kind != deploymentKind || req.Resource != deploymentResource || req.SubResource != "" {
		return badRequest(fmt.Sprintf("expected an apps/v1 Deployment (resource deployments), got kind %s resource %s subresource %q",
			gvkString(req.Kind), gvrString(req.Resource), req.SubResource))
	}
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		// Only CREATE and UPDATE are registered; anything else passes as is.
		return &admissionv1.AdmissionResponse{Allowed: true}, string(inject.Unchanged)
	}
	if len(req.Object.Raw) == 0 {
		return badRequest("the request carries no object")
	}
	var d appsv1.Deployment
	if err := json.Unmarshal(req.Object.Raw, &d); err != nil {
		return badRequest("the object is not a valid apps/v1 Deployment: " + err.Error())
	}
	res, err := inject.Mutate(&d, h.Config)
	if err != nil {
		return &admissionv1.AdmissionResponse{Allowed: false, Result: &metav1.Status{
			Status: metav1.StatusFailure, Code: http.StatusForbidden, Reason: metav1.StatusReasonForbidden, Message: err.Error()}}, OutcomeDenied
	}
	resp := &admissionv1.AdmissionResponse{Allowed: true}
	if len(res.Patch) > 0 {
		patch, err := json.Marshal(res.Patch)
		if err != nil {
			// Patch holds only API types and strings; this cannot happen.
			return &admissionv1.AdmissionResponse{Allowed: false, Result: &metav1.Status{
				Status: metav1.StatusFailure, Code: http.StatusInternalServerError, Message: "encoding the patch: " + err.Error()}}, OutcomeDenied
		}
		resp.Patch, resp.PatchType = patch, &jsonPatchType
	}
	return resp, string(res.Action)
}

func badRequest(msg string) (*admissionv1.AdmissionResponse, string) {
	return &admissionv1.AdmissionResponse{Allowed: false, Result: &metav1.Status{
		Status: metav1.StatusFailure, Code: http.StatusBadRequest, Reason: metav1.StatusReasonBadRequest, Message: msg}}, OutcomeBadRequest
}

// readReview checks the transport and decodes an admission.k8s.io/v1
// AdmissionReview with a request. On failure it returns the HTTP status to
// answer with, and the review as far as it was decoded (for its UID).
func readReview(w http.ResponseWriter, r *http.Request) (*admissionv1.AdmissionReview, int, error) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		return nil, http.StatusMethodNotAllowed, fmt.Errorf("method %s: expected POST", r.Method)
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return nil, http.StatusUnsupportedMediaType, fmt.Errorf("content type %q: expected application/json", r.Header.Get("Content-Type"))
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return nil, http.StatusRequestEntityTooLarge, fmt.Errorf("request body larger than %d bytes", maxBodyBytes)
		}
		return nil, http.StatusBadRequest, fmt.Errorf("reading the request body: %w", err)
	}
	if len(body) == 0 {
		return nil, http.StatusBadRequest, errors.New("empty request body: expected an admission.k8s.io/v1 AdmissionReview")
	}
	review := &admissionv1.AdmissionReview{}
	if err := json.Unmarshal(body, review); err != nil {
		return nil, http.StatusBadRequest, fmt.Errorf("the body is not an AdmissionReview: %w", err)
	}
	if review.APIVersion != admissionv1.SchemeGroupVersion.String() || review.Kind != "AdmissionReview" {
		return review, http.StatusBadRequest, fmt.Errorf("got apiVersion %q kind %q: expected admission.k8s.io/v1 AdmissionReview", review.APIVersion, review.Kind)
	}
	if review.Request == nil {
		return review, http.StatusBadRequest, errors.New("the AdmissionReview has no request")
	}
	return review, 0, nil
}

func writeReview(w http.ResponseWriter, log logr.Logger, status int, resp *admissionv1.AdmissionResponse) {
	out := admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: admissionv1.SchemeGroupVersion.String(), Kind: "AdmissionReview"},
		Response: resp,
	}
	body, err := json.Marshal(&out)
	if err != nil {
		log.Error(err, "encoding the admission response")
		http.Error(w, "encoding the admission response failed", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body) // the API server sees a broken connection; nothing to add
}

func (h *Handler) logOutcome(req *admissionv1.AdmissionRequest, outcome string, dryRun bool, resp *admissionv1.AdmissionResponse, elapsed time.Duration) {
	kv := []any{"outcome", outcome, "dryRun", dryRun, "deployment", types.NamespacedName{Namespace: req.Namespace, Name: req.Name}.String(),
		"operation", req.Operation, "uid", req.UID, "user", req.UserInfo.Username, "duration", elapsed}
	if resp.Result != nil {
		kv = append(kv, "reason", resp.Result.Message)
	}
	switch outcome {
	case string(inject.Unchanged):
		h.Log.V(1).Info("admission review", kv...)
	default:
		h.Log.Info("admission review", kv...)
	}
}

func uidOf(r *admissionv1.AdmissionReview) types.UID {
	if r == nil || r.Request == nil {
		return ""
	}
	return r.Request.UID
}

func gvkString(k metav1.GroupVersionKind) string {
	return fmt.Sprintf("%s/%s %s", k.Group, k.Version, k.Kind)
}

func gvrString(r metav1.GroupVersionResource) string {
	return fmt.Sprintf("%s/%s %s", r.Group, r.Version, r.Resource)
}

// Annotations that make the API server call the webhook at all; used by the
// matchConditions in config/ and the chart, and by tests that check them.
var TriggerAnnotations = []string{annotations.Inject, annotations.Status}
