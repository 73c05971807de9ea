package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"maps"
	"net/http"
	"slices"
	"strings"

	securityv1 "github.com/openshift/api/security/v1"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/client-go/kubernetes"

	"github.com/addon-heartbeat/addon-heartbeat/test/openshift/sccadmit"
)

// Handler answers AdmissionReviews (admission.k8s.io/v1) for Pod CREATE.
type Handler struct {
	Kube     kubernetes.Interface // reads the pod's Namespace (its SCC annotations)
	Admitter *sccadmit.Admitter
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(w, "POST an AdmissionReview", http.StatusMethodNotAllowed)
		return
	}
	review := &admissionv1.AdmissionReview{}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 8<<20)).Decode(review); err != nil || review.Request == nil {
		http.Error(w, fmt.Sprintf("not an AdmissionReview with a request: %v", err), http.StatusBadRequest)
		return
	}
	resp := h.review(r, review.Request)
	resp.UID = review.Request.UID
	review.Response, review.Request = resp, nil
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(review); err != nil {
		log.Printf("writing the response: %v", err)
	}
}

var podResource = metav1.GroupVersionResource{Version: "v1", Resource: "pods"}

func (h *Handler) review(r *http.Request, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	allow := &admissionv1.AdmissionResponse{Allowed: true}
	// The webhook configuration should send only these; anything else passes untouched, as
	// SCC admission ignores it too (CREATE is where it assigns security contexts).
	if req.Resource != podResource || req.SubResource != "" || req.Operation != admissionv1.Create {
		return allow
	}
	ns, err := h.Kube.CoreV1().Namespaces().Get(r.Context(), req.Namespace, metav1.GetOptions{})
	if err != nil {
		return failed(http.StatusInternalServerError, fmt.Errorf("reading namespace %q: %w", req.Namespace, err))
	}
	if _, ok := ns.Annotations[securityv1.UIDRangeAnnotation]; !ok {
		return allow // not an "OpenShift" namespace
	}

	pod := &corev1.Pod{}
	if err := json.Unmarshal(req.Object.Raw, pod); err != nil {
		return failed(http.StatusBadRequest, fmt.Errorf("decoding the pod: %w", err))
	}
	pod.Namespace = req.Namespace // empty in the object of a CREATE with generateName

	admitted, err := h.Admitter.Admit(r.Context(), pod, requester(req))
	if errors.Is(err, sccadmit.ErrRefused) {
		log.Printf("denied pod %s/%s%s: %v", req.Namespace, pod.Name, pod.GenerateName, err)
		return &admissionv1.AdmissionResponse{Result: &metav1.Status{
			Status: metav1.StatusFailure, Code: http.StatusForbidden, Reason: metav1.StatusReasonForbidden,
			Message: sccadmit.Verdict(err),
		}}
	}
	if err != nil {
		return failed(http.StatusInternalServerError, err)
	}

	patch, err := json.Marshal(securityPatch(pod, admitted))
	if err != nil {
		return failed(http.StatusInternalServerError, fmt.Errorf("encoding the patch: %w", err))
	}
	log.Printf("admitted pod %s/%s%s under SCC %s", req.Namespace, pod.Name, pod.GenerateName, admitted.Annotations[securityv1.ValidatedSCCAnnotation])
	patchType := admissionv1.PatchTypeJSONPatch
	return &admissionv1.AdmissionResponse{Allowed: true, PatchType: &patchType, Patch: patch}
}

func failed(code int32, err error) *admissionv1.AdmissionResponse {
	log.Print(err)
	return &admissionv1.AdmissionResponse{Result: &metav1.Status{Status: metav1.StatusFailure, Code: code, Message: err.Error()}}
}

// requester is the user who creates the pod (the ReplicaSet controller, for a Deployment's):
// the plugin also accepts an SCC that this user, rather than the pod's ServiceAccount, may use.
func requester(req *admissionv1.AdmissionRequest) user.Info {
	extra := map[string][]string{}
	for k, v := range req.UserInfo.Extra {
		extra[k] = v
	}
	return &user.DefaultInfo{Name: req.UserInfo.Username, UID: req.UserInfo.UID, Groups: req.UserInfo.Groups, Extra: extra}
}

type patchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value,omitempty"`
}

// securityPatch sets what SCC admission changed: the pod's and every container's security
// context, and the annotations it adds (openshift.io/scc and the subject type; a seccomp
// annotation where it defaulted one). Only those paths: the rest of the pod is left exactly
// as sent, whatever the round trip through the internal types would do to it.
func securityPatch(before, after *corev1.Pod) []patchOp {
	ops := []patchOp{}
	if before.Annotations == nil && len(after.Annotations) > 0 {
		ops = append(ops, patchOp{Op: "add", Path: "/metadata/annotations", Value: map[string]string{}})
	}
	for _, k := range slices.Sorted(maps.Keys(after.Annotations)) {
		if old, ok := before.Annotations[k]; !ok || old != after.Annotations[k] {
			ops = append(ops, patchOp{Op: "add", Path: "/metadata/annotations/" + escape(k), Value: after.Annotations[k]})
		}
	}
	ops = setOp(ops, "/spec/securityContext", before.Spec.SecurityContext, after.Spec.SecurityContext)
	for i, c := range after.Spec.InitContainers {
		ops = setOp(ops, fmt.Sprintf("/spec/initContainers/%d/securityContext", i), before.Spec.InitContainers[i].SecurityContext, c.SecurityContext)
	}
	for i, c := range after.Spec.Containers {
		ops = setOp(ops, fmt.Sprintf("/spec/containers/%d/securityContext", i), before.Spec.Containers[i].SecurityContext, c.SecurityContext)
	}
	for i, c := range after.Spec.EphemeralContainers {
		ops = setOp(ops, fmt.Sprintf("/spec/ephemeralContainers/%d/securityContext", i), before.Spec.EphemeralContainers[i].SecurityContext, c.SecurityContext)
	}
	return ops
}

// setOp appends the operation that turns old into new at path, if they differ.
func setOp[T any](ops []patchOp, path string, old, new *T) []patchOp {
	switch {
	case apiequality.Semantic.DeepEqual(old, new):
		return ops
	case new == nil:
		return append(ops, patchOp{Op: "remove", Path: path})
	default:
		return append(ops, patchOp{Op: "add", Path: path, Value: new}) // "add" replaces a present member
	}
}

// escape makes a map key a JSON pointer segment (RFC 6901).
func escape(s string) string {
	return strings.NewReplacer("~", "~0", "/", "~1").Replace(s)
}
