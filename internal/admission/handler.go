// Package admission is the webhook's admission handler: it decodes
// AdmissionReviews for apps/v1 Deployments, asks pkg/inject for the mutation,
// applies the escalation rule to the reporter binding (Onboarding), and
// answers with the JSON patch inject computed for the paths it owns, with
// warnings, counting each review in Metrics. It is an http.Handler and
// nothing more: the process around it (flags, the manager, the certificate,
// RBAC and signing-key controllers) is internal/webhook.
package admission

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sync/semaphore"
	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/annotations"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/inject"
)

// Path is where the API server sends Deployment admissions.
const Path = "/mutate-apps-v1-deployment"

// MaxBodyBytes bounds a request body. The API server's own limit for an
// object is 3 MiB; an AdmissionReview of an UPDATE holds two of them.
const MaxBodyBytes = 7 << 20

// maxBodyBytesInFlight bounds the request bodies all reviews hold at once,
// whoever sends them: the webhook's port is reachable by anything the
// network lets in, and 16 concurrent 10 MB bodies, each read up to the
// per-request limit before its 413, took the process to 269 MB, past the
// chart's 256Mi limit (an OOM kill; with failurePolicy Fail every opted-in
// Deployment admission then fails). The API server sends reviews of a few
// to a few hundred KB, so 48 MiB is hundreds of them at once; with the
// chart's limit it leaves the heap well under it.
const maxBodyBytesInFlight = 48 << 20

// bodyWait is how long a review waits for room among the bodies in flight
// before it is answered 503 (the API server then applies the failure
// policy, as it would for a webhook that is down).
const bodyWait = 2 * time.Second

// bodyReadTimeout bounds the reading of one body, so that a client that
// trickles one cannot hold its room among the bodies in flight: the API
// server waits at most 30 s for a webhook, and sends the body at once.
const bodyReadTimeout = 15 * time.Second

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
	// Key, when set, returns the key that signs the status record.
	Key func() []byte
	// Onboarding, when set, applies the escalation rule to reviews that
	// would give a ServiceAccount the reporter's permissions.
	Onboarding *Onboarding
	// VersionWarning, when set, is an admission warning for every review
	// that injects the reporter (see ReporterVersionWarning).
	VersionWarning string
	// now is the clock for latency; time.Now when nil.
	now func() time.Time

	// bodies holds the bytes of the request bodies being read
	// (maxBodyBytesInFlight, made on first use).
	bodiesOnce sync.Once
	bodies     *semaphore.Weighted
	// inFlight and readTimeout replace maxBodyBytesInFlight and
	// bodyReadTimeout when set (tests).
	inFlight    int64
	readTimeout time.Duration
}

// reserve waits for room to read the request's body (of its declared
// length) among those in flight, and returns the function that gives the
// room back; false when there was none in time.
func (h *Handler) reserve(r *http.Request) (release func(), ok bool) {
	bodies := h.bodyRoom()
	n := max(r.ContentLength, 0)
	ctx, cancel := context.WithTimeout(r.Context(), bodyWait)
	defer cancel()
	if err := bodies.Acquire(ctx, n); err != nil {
		return nil, false
	}
	return func() { bodies.Release(n) }, true
}

// bodyRoom is the room for bodies in flight, made on first use.
func (h *Handler) bodyRoom() *semaphore.Weighted {
	h.bodiesOnce.Do(func() { h.bodies = semaphore.NewWeighted(cmp.Or(h.inFlight, maxBodyBytesInFlight)) })
	return h.bodies
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

	buf := getBuffer()
	defer putBuffer(buf)
	var (
		req    *admissionv1.AdmissionRequest
		obj    *appsv1.Deployment
		old    *oldObject
		status int
		err    error
	)
	if r.ContentLength > MaxBodyBytes {
		// Refused by its declared length, before a byte of it is read.
		status, err = http.StatusRequestEntityTooLarge, fmt.Errorf("request body of %d bytes: larger than %d bytes", r.ContentLength, MaxBodyBytes)
	} else if r.ContentLength < 0 && r.Method == http.MethodPost {
		// The API server always says how long a review is; a body that
		// does not would have to be read (and buffered) to find out.
		status, err = http.StatusLengthRequired, errors.New("request body of unknown length: a Content-Length is required")
	} else if release, ok := h.reserve(r); !ok {
		status, err = http.StatusServiceUnavailable, errors.New("too many request bytes in flight: try again")
	} else {
		// The room is held until the answer is written: the decoded
		// object and the patch are the body's size again, or more.
		defer release()
		// The server (controller-runtime's) sets no read timeout of its
		// own; an error here only means the connection cannot have one.
		_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(cmp.Or(h.readTimeout, bodyReadTimeout)))
		req, obj, old, status, err = readRequest(w, r, buf)
	}
	if err != nil {
		h.Metrics.observe(OutcomeBadRequest, false, now().Sub(start))
		h.Log.Info("rejected a malformed admission request", "status", status, "reason", err.Error(), "remote", r.RemoteAddr)
		var uid types.UID
		if req != nil {
			uid = req.UID
		}
		writeReview(w, h.Log, buf, status, &admissionv1.AdmissionResponse{UID: uid, Allowed: false,
			Result: &metav1.Status{Status: metav1.StatusFailure, Code: int32(status), Reason: metav1.StatusReasonBadRequest, Message: err.Error()}})
		return
	}

	dryRun := req.DryRun != nil && *req.DryRun
	resp, outcome := h.review(r.Context(), req, obj, old)
	resp.UID = req.UID
	elapsed := now().Sub(start)
	h.Metrics.observe(outcome, dryRun, elapsed)
	h.logOutcome(req, outcome, dryRun, resp, elapsed)
	writeReview(w, h.Log, buf, http.StatusOK, resp)
}

// review turns one admission request into a response. obj is the request's
// object when it was decoded with the review; otherwise it is decoded from
// req.Object here; old is what was decoded of the old object, if any. It
// never panics on input: every malformed part yields a denial that says what
// is wrong.
func (h *Handler) review(ctx context.Context, req *admissionv1.AdmissionRequest, obj *appsv1.Deployment, old *oldObject) (*admissionv1.AdmissionResponse, string) {
	if req.Kind != deploymentKind || req.Resource != deploymentResource || req.SubResource != "" {
		return badRequest(fmt.Sprintf("expected an apps/v1 Deployment (resource deployments), got kind %s resource %s subresource %q",
			gvkString(req.Kind), gvrString(req.Resource), req.SubResource))
	}
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		// Only CREATE and UPDATE are registered; anything else passes as is.
		return &admissionv1.AdmissionResponse{Allowed: true}, string(inject.Unchanged)
	}
	if obj == nil {
		if len(req.Object.Raw) == 0 {
			return badRequest("the request carries no object")
		}
		obj = &appsv1.Deployment{}
		if err := json.Unmarshal(req.Object.Raw, obj); err != nil {
			return badRequest("the object is not a valid apps/v1 Deployment: " + err.Error())
		}
	}
	if obj.Namespace == "" {
		// The signature covers the namespace; the API server sets it on the
		// object before admission, so this only guards a client that does not.
		obj.Namespace = req.Namespace
	}
	cfg := h.Config
	if h.Key != nil {
		cfg.RecordKey = h.Key()
	}
	// obj was decoded for this review alone: mutate it rather than a copy.
	res, err := inject.MutateInPlace(obj, cfg)
	if err != nil {
		return denied(http.StatusForbidden, metav1.StatusReasonForbidden, err.Error())
	}
	if msg, err := h.onboard(ctx, req, res, old, cfg.RecordKey); err != nil {
		return denied(http.StatusInternalServerError, metav1.StatusReasonInternalError, err.Error())
	} else if msg != "" {
		return denied(http.StatusForbidden, metav1.StatusReasonForbidden, msg)
	}
	resp := &admissionv1.AdmissionResponse{Allowed: true, Warnings: res.Warnings}
	if h.VersionWarning != "" && res.Action == inject.Injected {
		resp.Warnings = append(resp.Warnings, h.VersionWarning)
	}
	if len(res.Patch) > 0 {
		// The operations themselves: Patch's MarshalJSON only turns an empty
		// patch into [], and going through it would make encoding/json
		// re-scan its output.
		patch, err := json.Marshal([]inject.Operation(res.Patch))
		if err != nil {
			// Patch holds only API types and strings; this cannot happen.
			return &admissionv1.AdmissionResponse{Allowed: false, Result: &metav1.Status{
				Status: metav1.StatusFailure, Code: http.StatusInternalServerError, Message: "encoding the patch: " + err.Error()}}, OutcomeDenied
		}
		resp.Patch, resp.PatchType = patch, &jsonPatchType
	}
	return resp, string(res.Action)
}

// onboard applies the escalation rule (see Onboarding) to a review that
// leaves the Deployment injected: when the ServiceAccount its record names is
// not the one the old object's signed record already vouched for, the user
// must be allowed to give it the reporter's permissions. It returns the
// denial's message, empty when the review may pass.
func (h *Handler) onboard(ctx context.Context, req *admissionv1.AdmissionRequest, res inject.Result, old *oldObject, key []byte) (string, error) {
	if h.Onboarding == nil || res.Action == inject.Removed {
		return "", nil
	}
	rec, err := inject.ReadRecord(res.Deployment.Annotations)
	if err != nil || rec == nil {
		return "", nil // not injected: no subject
	}
	if req.UserInfo.Username == "" && len(req.UserInfo.Groups) == 0 {
		// Only a client other than the API server sends none.
		return "the admission request names no user, so nobody can be checked for the right to give ServiceAccount " +
			req.Namespace + "/" + rec.ServiceAccount + " the heartbeat reporter's permissions", nil
	}
	if old != nil {
		if prev, err := inject.ReadRecord(old.Metadata.Annotations); err == nil && prev != nil &&
			prev.ServiceAccount == rec.ServiceAccount && prev.Verify(key, req.Namespace) == nil {
			return "", nil // vouched for at an earlier admission
		}
	}
	ok, why, err := h.Onboarding.Check(ctx, req.UserInfo, req.Namespace, rec.ServiceAccount)
	if err != nil {
		return "", fmt.Errorf("could not check whether %q may onboard ServiceAccount %s/%s: %w", req.UserInfo.Username, req.Namespace, rec.ServiceAccount, err)
	}
	if ok {
		return "", nil
	}
	return fmt.Sprintf("user %q may not give ServiceAccount %s/%s the heartbeat reporter's permissions (ClusterRole %q), which this Deployment's %s would: %s. "+
		"A cluster admin, or whoever may bind that ClusterRole in %s (OLM installing the addon does), must create this Deployment or set its ServiceAccount",
		req.UserInfo.Username, req.Namespace, rec.ServiceAccount, h.Onboarding.ClusterRole, annotations.Inject, why, req.Namespace), nil
}

func denied(code int32, reason metav1.StatusReason, msg string) (*admissionv1.AdmissionResponse, string) {
	return &admissionv1.AdmissionResponse{Allowed: false, Result: &metav1.Status{
		Status: metav1.StatusFailure, Code: code, Reason: reason, Message: msg}}, OutcomeDenied
}

func badRequest(msg string) (*admissionv1.AdmissionResponse, string) {
	return &admissionv1.AdmissionResponse{Allowed: false, Result: &metav1.Status{
		Status: metav1.StatusFailure, Code: http.StatusBadRequest, Reason: metav1.StatusReasonBadRequest, Message: msg}}, OutcomeBadRequest
}

// readRequest checks the transport, reads the body into buf and decodes an
// admission.k8s.io/v1 AdmissionReview with a request. The object is
// returned decoded when the review decoded in one pass (see fastReview);
// otherwise it is nil and req.Object holds it raw. On failure it returns the
// HTTP status to answer with, and the request as far as it was decoded (for
// its UID).
func readRequest(w http.ResponseWriter, r *http.Request, buf *bytes.Buffer) (*admissionv1.AdmissionRequest, *appsv1.Deployment, *oldObject, int, error) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		return nil, nil, nil, http.StatusMethodNotAllowed, fmt.Errorf("method %s: expected POST", r.Method)
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return nil, nil, nil, http.StatusUnsupportedMediaType, fmt.Errorf("content type %q: expected application/json", r.Header.Get("Content-Type"))
	}
	if n := r.ContentLength; n > 0 && n <= MaxBodyBytes {
		buf.Grow(int(n) + bytes.MinRead)
	}
	if _, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, MaxBodyBytes)); err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return nil, nil, nil, http.StatusRequestEntityTooLarge, fmt.Errorf("request body larger than %d bytes", MaxBodyBytes)
		}
		return nil, nil, nil, http.StatusBadRequest, fmt.Errorf("reading the request body: %w", err)
	}
	body := buf.Bytes()
	if len(body) == 0 {
		return nil, nil, nil, http.StatusBadRequest, errors.New("empty request body: expected an admission.k8s.io/v1 AdmissionReview")
	}
	var fast fastReview
	if err := json.Unmarshal(body, &fast); err == nil && fast.isV1() && fast.Request != nil {
		return &fast.Request.AdmissionRequest, fast.Request.Object, fast.Request.OldObject, 0, nil
	}
	// Anything unexpected is decoded again the plain way, which says
	// precisely what is wrong: the error paths are not worth a second
	// implementation.
	review := &admissionv1.AdmissionReview{}
	if err := json.Unmarshal(body, review); err != nil {
		return nil, nil, nil, http.StatusBadRequest, fmt.Errorf("the body is not an AdmissionReview: %w", err)
	}
	if review.APIVersion != admissionv1.SchemeGroupVersion.String() || review.Kind != "AdmissionReview" {
		return review.Request, nil, nil, http.StatusBadRequest, fmt.Errorf("got apiVersion %q kind %q: expected admission.k8s.io/v1 AdmissionReview", review.APIVersion, review.Kind)
	}
	if review.Request == nil {
		return nil, nil, nil, http.StatusBadRequest, errors.New("the AdmissionReview has no request")
	}
	var old *oldObject
	if raw := review.Request.OldObject.Raw; len(raw) > 0 {
		// The API server's stored object; one that does not decode is
		// treated as vouching for nothing.
		if err := json.Unmarshal(raw, &old); err != nil {
			old = nil
		}
	}
	return review.Request, nil, old, 0, nil
}

// fastReview is an AdmissionReview whose object is decoded as a Deployment
// in the same pass as the review, instead of being copied out as raw bytes
// and parsed again: on a typical 8 KB review that halves the JSON scanning.
// Of oldObject only the annotations are kept, and options, which the
// handler does not read, are skipped without a copy. Decoding fails exactly where the two-pass decoding of an
// admissionv1.AdmissionReview and then its object would fail, and those
// cases take that path (readRequest) for its error messages.
type fastReview struct {
	metav1.TypeMeta `json:",inline"`
	Request         *fastRequest `json:"request,omitempty"`
}

type fastRequest struct {
	admissionv1.AdmissionRequest
	// These shadow the embedded request's fields of the same names.
	Object    *appsv1.Deployment `json:"object,omitempty"`
	OldObject *oldObject         `json:"oldObject,omitempty"`
	Options   skippedValue       `json:"options,omitempty"`
}

// oldObject is what the handler reads of an UPDATE's old Deployment: its
// annotations (the status record the webhook signed), nothing else decoded.
type oldObject struct {
	Metadata struct {
		Annotations map[string]string `json:"annotations"`
	} `json:"metadata"`
}

func (f *fastReview) isV1() bool {
	return f.APIVersion == admissionv1.SchemeGroupVersion.String() && f.Kind == "AdmissionReview"
}

// skippedValue accepts any JSON value and keeps nothing.
type skippedValue struct{}

func (*skippedValue) UnmarshalJSON([]byte) error { return nil }

// Request and response bodies are read and written through pooled buffers;
// one that grew past maxPooledBuffer for a large review is left to the GC.
const maxPooledBuffer = 64 << 10

var buffers = sync.Pool{New: func() any { return new(bytes.Buffer) }}

func getBuffer() *bytes.Buffer { return buffers.Get().(*bytes.Buffer) }

func putBuffer(b *bytes.Buffer) {
	if b.Cap() > maxPooledBuffer {
		return
	}
	b.Reset()
	buffers.Put(b)
}

// writeReview answers with resp, encoded into buf (reset first).
func writeReview(w http.ResponseWriter, log logr.Logger, buf *bytes.Buffer, status int, resp *admissionv1.AdmissionResponse) {
	out := admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: admissionv1.SchemeGroupVersion.String(), Kind: "AdmissionReview"},
		Response: resp,
	}
	buf.Reset()
	if err := json.NewEncoder(buf).Encode(&out); err != nil {
		log.Error(err, "encoding the admission response")
		http.Error(w, "encoding the admission response failed", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(buf.Len()))
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes()) // the API server sees a broken connection; nothing to add
}

func (h *Handler) logOutcome(req *admissionv1.AdmissionRequest, outcome string, dryRun bool, resp *admissionv1.AdmissionResponse, elapsed time.Duration) {
	kv := []any{"outcome", outcome, "dryRun", dryRun, "deployment", types.NamespacedName{Namespace: req.Namespace, Name: req.Name}.String(),
		"operation", req.Operation, "uid", req.UID, "user", req.UserInfo.Username, "duration", elapsed}
	if resp.Result != nil {
		kv = append(kv, "reason", resp.Result.Message)
	}
	if len(resp.Warnings) > 0 {
		kv = append(kv, "warnings", resp.Warnings)
	}
	switch outcome {
	case string(inject.Unchanged):
		h.Log.V(1).Info("admission review", kv...)
	default:
		h.Log.Info("admission review", kv...)
	}
}

func gvkString(k metav1.GroupVersionKind) string {
	return fmt.Sprintf("%s/%s %s", k.Group, k.Version, k.Kind)
}

func gvrString(r metav1.GroupVersionResource) string {
	return fmt.Sprintf("%s/%s %s", r.Group, r.Version, r.Resource)
}
