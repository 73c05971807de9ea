package chart_test

import (
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/addon-heartbeat/addon-heartbeat/internal/admission"
	"github.com/addon-heartbeat/addon-heartbeat/internal/chart"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/certs"
)

// The chart's matchConditions, as the API server evaluates them: it calls the
// webhook for a Deployment whose new or old object has addon-heartbeat.io/inject
// as an annotation, as a label or as a pod template annotation (the two that
// an OLM ClusterServiceVersion can set), or the addon-heartbeat.io/status
// annotation, and for no other Deployment. Each case creates a Deployment and
// then updates it, and checks which of the two admissions reached the webhook,
// a server that records its calls and admits everything unchanged. The
// failure policy is Fail, so an expression that failed to evaluate on some
// Deployment (a missing has()) would refuse it.
func TestMatchConditions(t *testing.T) {
	rel := chart.Release{Name: "matchconditions", Namespace: "matchconditions-system"}
	objs := install(t, rel, "")
	rec := startRecorder(t)
	createWebhookConfiguration(t, objs, "matchconditions-addon-heartbeat", rec.port, rec.ca)
	ns := servedNamespace(t, rel)

	const inject, status = "addon-heartbeat.io/inject", "addon-heartbeat.io/status"
	type change func(d *appsv1.Deployment)
	set := func(m *map[string]string, key, value string) {
		if *m == nil {
			*m = map[string]string{}
		}
		(*m)[key] = value
	}
	annotate := func(key string) change {
		return func(d *appsv1.Deployment) { set(&d.Annotations, key, "true") }
	}
	label := func(key string) change {
		return func(d *appsv1.Deployment) { set(&d.Labels, key, "true") }
	}
	annotateTemplate := func(key string) change {
		return func(d *appsv1.Deployment) { set(&d.Spec.Template.Annotations, key, "true") }
	}
	labelTemplate := func(key string) change {
		return func(d *appsv1.Deployment) { set(&d.Spec.Template.Labels, key, "true") }
	}
	unannotate := func(key string) change { return func(d *appsv1.Deployment) { delete(d.Annotations, key) } }
	unlabel := func(key string) change { return func(d *appsv1.Deployment) { delete(d.Labels, key) } }
	unannotateTemplate := func(key string) change {
		return func(d *appsv1.Deployment) { delete(d.Spec.Template.Annotations, key) }
	}
	// newImage is an update that neither opts in nor out.
	newImage := func(d *appsv1.Deployment) { d.Spec.Template.Spec.Containers[0].Image = "registry.example.com/addon:v2" }
	both := func(cs ...change) change {
		return func(d *appsv1.Deployment) {
			for _, c := range cs {
				c(d)
			}
		}
	}

	tests := map[string]struct {
		create, update         change
		wantCreate, wantUpdate bool
	}{
		"Deployment annotation": {
			create: annotate(inject), update: newImage, wantCreate: true, wantUpdate: true,
		},
		"Deployment label": {
			create: label(inject), update: newImage, wantCreate: true, wantUpdate: true,
		},
		"pod template annotation": {
			create: annotateTemplate(inject), update: newImage, wantCreate: true, wantUpdate: true,
		},
		"status annotation on the old object only": {
			create: annotate(status), update: unannotate(status), wantCreate: true, wantUpdate: true,
		},
		"annotation taken away: on the old object only": {
			create: annotate(inject), update: unannotate(inject), wantCreate: true, wantUpdate: true,
		},
		"label taken away: on the old object only": {
			create: label(inject), update: unlabel(inject), wantCreate: true, wantUpdate: true,
		},
		"pod template annotation taken away: on the old object only": {
			create: annotateTemplate(inject), update: unannotateTemplate(inject), wantCreate: true, wantUpdate: true,
		},
		"label added by an update: on the new object only": {
			update: label(inject), wantUpdate: true,
		},
		"pod template annotation added by an update: on the new object only": {
			update: annotateTemplate(inject), wantUpdate: true,
		},
		"none": {
			update: newImage,
		},
		"other annotations, labels and pod template annotations": {
			create: both(annotate("example.com/inject"), label("app.kubernetes.io/part-of"), annotateTemplate("kubectl.kubernetes.io/restartedAt")),
			update: newImage,
		},
		"settings without the opt-in": {
			create: both(annotate("addon-heartbeat.io/delete-ack"), label("addon-heartbeat.io/addon-instance")),
			update: newImage,
		},
		"pod template label: not an opt-in": {
			create: labelTemplate(inject), update: newImage,
		},
		"status as a label or a pod template annotation: not the webhook's record": {
			create: both(label(status), annotateTemplate(status)), update: newImage,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			d := plainDeployment(ns, slug(name))
			if tc.create != nil {
				tc.create(d)
			}
			key := d.Namespace + "/" + d.Name
			if err := k8s.Create(t.Context(), d); err != nil {
				t.Fatalf("create refused: %v", err)
			}
			// The API server calls a webhook before it answers: the calls for
			// an admission are all recorded once Create and Update return.
			if got := rec.count("CREATE " + key); got != btoi(tc.wantCreate) {
				t.Errorf("create: the webhook was called %d times, want %d", got, btoi(tc.wantCreate))
			}
			tc.update(d)
			if err := k8s.Update(t.Context(), d); err != nil {
				t.Fatalf("update refused: %v", err)
			}
			if got := rec.count("UPDATE " + key); got != btoi(tc.wantUpdate) {
				t.Errorf("update: the webhook was called %d times, want %d", got, btoi(tc.wantUpdate))
			}
		})
	}
	if err := rec.failed(); err != nil {
		t.Error(err)
	}
}

// plainDeployment is a Deployment with no annotation, no label but its
// selector's, and no pod template annotation.
func plainDeployment(ns, name string) *appsv1.Deployment {
	labels := map[string]string{"app": strings.TrimSuffix(name[:min(len(name), 63)], "-")}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "manager", Image: "registry.example.com/addon:v1"}}},
			},
		},
	}
}

// slug turns a test name into an object name.
func slug(name string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(name) {
		switch {
		case r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
		case b.Len() > 0 && !strings.HasSuffix(b.String(), "-"):
			b.WriteByte('-')
		}
	}
	return strings.TrimSuffix(b.String(), "-")
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// recorder is an admission webhook on 127.0.0.1 that admits every request
// unchanged and counts the calls by "OPERATION namespace/name".
type recorder struct {
	port int
	// ca is the CA of its serving certificate, for the caBundle.
	ca []byte

	mu    sync.Mutex
	calls map[string]int
	errs  []error
}

func startRecorder(t *testing.T) *recorder {
	t.Helper()
	now := time.Now()
	ca, err := certs.NewCA("matchconditions-ca", now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := ca.Issue([]string{"127.0.0.1"}, now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(kp.CertPEM, kp.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, p, _ := net.SplitHostPort(l.Addr().String())
	r := &recorder{ca: ca.CertPEM, calls: map[string]int{}}
	r.port, _ = strconv.Atoi(p)
	mux := http.NewServeMux()
	mux.HandleFunc(admission.Path, r.serve)
	srv := &http.Server{
		Handler:           mux,
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		ReadHeaderTimeout: 5 * time.Second,
	}
	done := make(chan error, 1)
	go func() { done <- srv.ServeTLS(l, "", "") }()
	t.Cleanup(func() {
		_ = srv.Close()
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("recording webhook: %v", err)
		}
	})
	return r
}

func (r *recorder) serve(w http.ResponseWriter, req *http.Request) {
	var review admissionv1.AdmissionReview
	if err := json.NewDecoder(req.Body).Decode(&review); err != nil || review.Request == nil {
		r.fail(fmt.Errorf("an AdmissionReview that does not decode: %v", err))
		http.Error(w, "bad AdmissionReview", http.StatusBadRequest)
		return
	}
	in := review.Request
	r.mu.Lock()
	r.calls[fmt.Sprintf("%s %s/%s", in.Operation, in.Namespace, in.Name)]++
	r.mu.Unlock()
	review.Request = nil
	review.Response = &admissionv1.AdmissionResponse{UID: in.UID, Allowed: true}
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(review); err != nil {
		r.fail(err)
	}
}

func (r *recorder) count(key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls[key]
}

func (r *recorder) fail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, err)
}

func (r *recorder) failed() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return errors.Join(r.errs...)
}
