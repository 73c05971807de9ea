// Package annotations is the user-facing contract of addon-heartbeat: every
// annotation key it reads or writes on a Deployment, and the pure parsing of
// their values. The webhook validates with it at admission and the reporter
// reads the same keys to find the Deployments of its addon, so both sides
// always agree on what a value means.
package annotations

import (
	"fmt"
	"net"
	"net/url"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Prefix is shared by every key below.
const Prefix = "addon-heartbeat.io/"

const (
	// Inject opts a Deployment in ("true") or out ("false", or absent). On an
	// UPDATE of an injected Deployment, opting out removes exactly what was
	// injected.
	Inject = Prefix + "inject"

	// AddonInstance names the AddonInstance the reporter heartbeats into,
	// always in the Deployment's own namespace. Optional; DefaultAddonInstance
	// when absent.
	AddonInstance = Prefix + "addon-instance"

	// HealthURL is an optional pod-local HTTP check the reporter calls each
	// period, for example http://127.0.0.1:8081/healthz. Only loopback hosts
	// are accepted: the reporter must never be a way to reach other pods or
	// services with the addon's identity.
	HealthURL = Prefix + "health-url"

	// DeleteAck says how the reporter answers markedForDeletion: "auto" sets
	// ReadyToBeDeleted=True at once; "manual" reports it False until the
	// annotation is changed to "auto" (or, in SDK mode, the addon says so).
	// Optional; DefaultDeleteAck when absent.
	DeleteAck = Prefix + "delete-ack"

	// Status is written by the webhook only: a record of what it injected,
	// so that injection is idempotent and opting out removes exactly that.
	// It never holds a timestamp, so that re-applying a manifest is a no-op.
	Status = Prefix + "status"
)

// Defaults for the optional keys.
const (
	DefaultAddonInstance = "addon-instance"
	DefaultDeleteAck     = DeleteAckAuto
)

// DeleteAckMode is the parsed value of DeleteAck.
type DeleteAckMode string

// The accepted values of DeleteAck.
const (
	DeleteAckAuto   DeleteAckMode = "auto"
	DeleteAckManual DeleteAckMode = "manual"
)

// Error is an annotation whose value is not acceptable. Its message names the
// key, the value and what is expected, so that an admission denial tells the
// user exactly what to fix.
type Error struct {
	Key      string
	Value    string
	Expected string
}

func (e *Error) Error() string {
	return fmt.Sprintf("annotation %s: invalid value %q: expected %s", e.Key, e.Value, e.Expected)
}

// Settings are the parsed, validated user annotations of one Deployment.
type Settings struct {
	// Inject is true when the Deployment opts in.
	Inject bool
	// AddonInstance is the AddonInstance name (default applied).
	AddonInstance string
	// HealthURL is the pod-local health check, empty when not set.
	HealthURL string
	// DeleteAck is the deletion acknowledgement mode (default applied).
	DeleteAck DeleteAckMode
}

// Parse reads and validates every user-facing key in annots. It returns the
// first invalid key as an *Error. Keys other than Inject are validated only
// when the Deployment opts in: an opted-out Deployment is never denied for
// settings that are not in effect.
func Parse(annots map[string]string) (Settings, error) {
	s := Settings{AddonInstance: DefaultAddonInstance, DeleteAck: DefaultDeleteAck}
	inject, err := ParseInject(annots)
	if err != nil {
		return s, err
	}
	s.Inject = inject
	if !inject {
		return s, nil
	}
	if v, ok := annots[AddonInstance]; ok {
		if errs := validation.IsDNS1123Subdomain(v); len(errs) > 0 {
			return s, &Error{Key: AddonInstance, Value: v,
				Expected: "an AddonInstance name in the Deployment's namespace (a DNS-1123 subdomain: " + strings.Join(errs, "; ") + ")"}
		}
		s.AddonInstance = v
	}
	if v, ok := annots[HealthURL]; ok {
		if err := ValidateHealthURL(v); err != nil {
			return s, err
		}
		s.HealthURL = v
	}
	if v, ok := annots[DeleteAck]; ok {
		mode, err := ParseDeleteAck(v)
		if err != nil {
			return s, err
		}
		s.DeleteAck = mode
	}
	return s, nil
}

// ParseInject reads the opt-in key alone: absent is false.
func ParseInject(annots map[string]string) (bool, error) {
	v, ok := annots[Inject]
	switch {
	case !ok, v == "false":
		return false, nil
	case v == "true":
		return true, nil
	default:
		return false, &Error{Key: Inject, Value: v, Expected: `"true" or "false"`}
	}
}

// ParseDeleteAck parses a DeleteAck value.
func ParseDeleteAck(v string) (DeleteAckMode, error) {
	switch m := DeleteAckMode(v); m {
	case DeleteAckAuto, DeleteAckManual:
		return m, nil
	default:
		return "", &Error{Key: DeleteAck, Value: v, Expected: `"auto" or "manual"`}
	}
}

// ValidateHealthURL accepts an absolute http or https URL whose host is a
// loopback address (127.0.0.0/8, ::1) or "localhost", with an explicit port.
func ValidateHealthURL(v string) error {
	bad := func(why string) error {
		return &Error{Key: HealthURL, Value: v,
			Expected: "an http or https URL on a pod-local loopback host with a port, such as http://127.0.0.1:8081/healthz (" + why + ")"}
	}
	u, err := url.Parse(v)
	if err != nil {
		return bad("not a URL")
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return bad("scheme must be http or https")
	}
	if u.User != nil {
		// Never echo a password into an admission denial or a log.
		return &Error{Key: HealthURL, Value: u.Redacted(),
			Expected: "an http or https URL on a pod-local loopback host with a port, such as http://127.0.0.1:8081/healthz (credentials are not allowed in the URL)"}
	}
	host := u.Hostname()
	if host != "localhost" {
		ip := net.ParseIP(host)
		if ip == nil || !ip.IsLoopback() {
			return bad("host must be 127.0.0.1, ::1 or localhost")
		}
	}
	if u.Port() == "" {
		return bad("a port is required")
	}
	return nil
}
