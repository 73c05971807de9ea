package inject

import (
	"bytes"
	"cmp"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/annotations"
)

// Record is the value of the addon-heartbeat.io/status annotation: what was
// injected, so that re-injection is idempotent and opting out removes exactly
// that. It has no timestamp, so that a re-applied manifest changes nothing.
//
// Since version 2 it also says which ServiceAccount the webhook admitted the
// reporter to run as, for which AddonInstance, signed with a key only the
// webhook holds: the RBAC controller binds the reporter role to exactly that
// ServiceAccount, and only for a record with a valid signature. A record
// written by anyone else (for example while the webhook was down under
// failurePolicy Ignore) grants nothing.
type Record struct {
	Version int `json:"version"`
	// Sidecar is the container list holding the reporter.
	Sidecar string `json:"sidecar"`
	// Env lists the containers that got ADDON_TARGET_NAMESPACE from us.
	Env []string `json:"env,omitempty"`
	// ServiceAccount the pods run as, and AddonInstance the reporter
	// writes, as admitted (version 2).
	ServiceAccount string `json:"serviceAccount,omitempty"`
	AddonInstance  string `json:"addonInstance,omitempty"`
	// Signature is Sign of the three above (version 2); empty when the
	// webhook has no key (Config.RecordKey).
	Signature string `json:"signature,omitempty"`
}

// RecordVersion is the version Mutate writes. Version 1 records (no
// ServiceAccount, no signature) are still read.
const RecordVersion = 2

// ReadRecord parses the status annotation of annots; nil when there is none.
// A value that is not a record is an *annotations.Error.
func ReadRecord(annots map[string]string) (*Record, error) {
	v, ok := annots[annotations.Status]
	if !ok {
		return nil, nil
	}
	bad := &annotations.Error{Key: annotations.Status, Value: v,
		Expected: "the record written by the addon-heartbeat webhook (to reset it, remove this annotation and the " + ContainerName + " container)"}
	dec := json.NewDecoder(strings.NewReader(v))
	dec.DisallowUnknownFields()
	var r Record
	if err := dec.Decode(&r); err != nil || dec.More() {
		return nil, bad
	}
	if (r.Version != 1 && r.Version != RecordVersion) || (r.Sidecar != listInit && r.Sidecar != listRegular) {
		return nil, bad
	}
	return &r, nil
}

func (r Record) encode() string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(r) // a struct of strings and ints cannot fail to encode
	return strings.TrimSuffix(b.String(), "\n")
}

// Sign is the signature of a record admitting ServiceAccount sa in namespace
// to report into AddonInstance instance, with key (empty without a key). The
// Deployment's name is not in it: a CREATE with generateName has none yet at
// admission, and what is vouched for is the ServiceAccount's access to the
// AddonInstance, which does not depend on which Deployment asked.
func Sign(key []byte, namespace, sa, instance string) string {
	if len(key) == 0 {
		return ""
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte("addon-heartbeat.io/status/v2\x00" + namespace + "\x00" + sa + "\x00" + instance))
	return base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

// ErrUnsigned is a record that carries no valid signature.
var ErrUnsigned = errors.New("the status record is not signed by the webhook")

// Verify checks that r was written by a webhook holding key for a Deployment
// in namespace.
func (r *Record) Verify(key []byte, namespace string) error {
	if r.Version < 2 || len(key) == 0 || r.Signature == "" ||
		!hmac.Equal([]byte(r.Signature), []byte(Sign(key, namespace, r.ServiceAccount, r.AddonInstance))) {
		return ErrUnsigned
	}
	return nil
}

// serviceAccount is the ServiceAccount pods of spec run as.
func serviceAccount(spec *corev1.PodSpec) string {
	return cmp.Or(spec.ServiceAccountName, spec.DeprecatedServiceAccount, "default")
}
