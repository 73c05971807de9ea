package inject

import (
	"errors"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/annotations"
)

// The record vouches for the ServiceAccount and AddonInstance the webhook
// admitted, and only a webhook with the key can write one that verifies.
func TestRecordSignature(t *testing.T) {
	cfg := testConfig()
	d := deployment(optIn())
	d.Spec.Template.Spec.ServiceAccountName = "my-addon"
	rec, err := ReadRecord(injected(t, d, cfg).Annotations)
	if err != nil || rec == nil {
		t.Fatalf("record %v, %v", rec, err)
	}
	if rec.Version != RecordVersion || rec.ServiceAccount != "my-addon" || rec.AddonInstance != annotations.DefaultAddonInstance {
		t.Errorf("record %+v", rec)
	}
	if err := rec.Verify(cfg.RecordKey, d.Namespace); err != nil {
		t.Errorf("the webhook's own record: %v", err)
	}
	tests := map[string]struct {
		change    func(r *Record)
		key       []byte
		namespace string
	}{
		"another ServiceAccount":     {change: func(r *Record) { r.ServiceAccount = "admin-sa" }},
		"another AddonInstance":      {change: func(r *Record) { r.AddonInstance = "other" }},
		"another namespace":          {namespace: "elsewhere"},
		"another key":                {key: []byte("not the webhook's key")},
		"no signature":               {change: func(r *Record) { r.Signature = "" }},
		"version 1 (before signing)": {change: func(r *Record) { r.Version = 1 }},
		"no key to verify with":      {key: []byte{}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			r := *rec
			if tc.change != nil {
				tc.change(&r)
			}
			key, ns := cfg.RecordKey, d.Namespace
			if tc.key != nil {
				key = tc.key
			}
			if tc.namespace != "" {
				ns = tc.namespace
			}
			if err := r.Verify(key, ns); !errors.Is(err, ErrUnsigned) {
				t.Errorf("Verify = %v, want ErrUnsigned", err)
			}
		})
	}
}

// A Deployment injected before records were signed gets a signed record at
// its next admission, with no change to its pod template (no rollout); a
// new ServiceAccount is a new record.
func TestRecordUpgradesWithoutARollout(t *testing.T) {
	cfg := testConfig()
	out := injected(t, deployment(optIn()), cfg)
	old := out.DeepCopy()
	old.Annotations[annotations.Status] = `{"version":1,"sidecar":"initContainers","env":["manager"]}`
	res := mustMutate(t, old, cfg)
	if res.Action != Injected || len(res.Patch) != 1 || res.Deployment.Annotations[annotations.Status] != out.Annotations[annotations.Status] {
		t.Fatalf("upgrading a version 1 record: action %s, patch %v", res.Action, res.Patch)
	}
	if !equality.Semantic.DeepEqual(res.Deployment.Spec.Template, out.Spec.Template) {
		t.Errorf("the pod template changed with the record")
	}
	moved := out.DeepCopy()
	moved.Spec.Template.Spec.ServiceAccountName = "other"
	rec, _ := ReadRecord(mustMutate(t, moved, cfg).Deployment.Annotations)
	if rec.ServiceAccount != "other" || rec.Verify(cfg.RecordKey, moved.Namespace) != nil {
		t.Errorf("after a ServiceAccount change: %+v", rec)
	}
}
