// Package annotations is the user-facing contract of addon-heartbeat: every
// key it reads or writes on a Deployment, and the pure parsing of their
// values. The webhook validates with it at admission and the reporter reads
// the same keys to find the Deployments of its addon, so both sides always
// agree on what a value means.
//
// The settings keys can be written in three places of a Deployment (see
// Sources): its annotations, its labels, or its pod template's annotations.
// OLM builds an addon's Deployments from its ClusterServiceVersion, whose
// install strategy can set Deployment labels and pod-template annotations
// (and copies the CSV's own annotations onto every pod template) but never
// Deployment annotations; the other two places let such an addon opt in
// from its CSV. A key set in more than one place must have the same value in
// each; otherwise the Deployment is denied, with every place and value named.
package annotations

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"unicode/utf8"

	appsv1 "k8s.io/api/apps/v1"
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

// Place is where a setting is written on a Deployment.
type Place int

// The places, in the order they are read.
const (
	// DeploymentAnnotation: metadata.annotations.
	DeploymentAnnotation Place = iota
	// DeploymentLabel: metadata.labels (what a CSV's install strategy sets
	// with its "label" field).
	DeploymentLabel
	// PodTemplateAnnotation: spec.template.metadata.annotations.
	PodTemplateAnnotation
)

func (p Place) String() string {
	switch p {
	case DeploymentLabel:
		return "label"
	case PodTemplateAnnotation:
		return "pod template annotation"
	default:
		return "annotation"
	}
}

// where names the map of the place, for messages.
func (p Place) where() string {
	switch p {
	case DeploymentLabel:
		return "the Deployment's labels"
	case PodTemplateAnnotation:
		return "the pod template's annotations"
	default:
		return "the Deployment's annotations"
	}
}

// Sources are the three places of one Deployment that hold settings. Any of
// them may be nil.
type Sources struct {
	// Annotations are the Deployment's metadata.annotations.
	Annotations map[string]string
	// Labels are the Deployment's metadata.labels.
	Labels map[string]string
	// TemplateAnnotations are its spec.template.metadata.annotations.
	TemplateAnnotations map[string]string
}

// in returns the map of place p.
func (s Sources) in(p Place) map[string]string {
	switch p {
	case DeploymentLabel:
		return s.Labels
	case PodTemplateAnnotation:
		return s.TemplateAnnotations
	default:
		return s.Annotations
	}
}

var places = []Place{DeploymentAnnotation, DeploymentLabel, PodTemplateAnnotation}

// OfDeployment are the places of d.
func OfDeployment(d *appsv1.Deployment) Sources {
	return Sources{Annotations: d.Annotations, Labels: d.Labels, TemplateAnnotations: d.Spec.Template.Annotations}
}

// Lookup returns the value of key and the place it was read from (the first
// that has it). ok is false when no place has it. A key found in several
// places with different values is a *ConflictError.
func (s Sources) Lookup(key string) (v string, at Place, ok bool, err error) {
	for _, p := range places {
		pv, found := s.in(p)[key]
		switch {
		case !found:
		case !ok:
			v, at, ok = pv, p, true
		case pv != v:
			return "", at, false, s.conflict(key)
		}
	}
	return v, at, ok, nil
}

func (s Sources) conflict(key string) *ConflictError {
	c := &ConflictError{Key: key}
	for _, p := range places {
		if v, ok := s.in(p)[key]; ok {
			c.Found = append(c.Found, Found{Place: p, Value: v})
		}
	}
	return c
}

// Keys are the settings keys the Deployment's places hold: what a cache of
// Deployments must keep for Parse to give the same result.
func (s Sources) Keys() Sources {
	keep := func(m map[string]string) map[string]string {
		var out map[string]string
		for _, k := range []string{Inject, AddonInstance, HealthURL, DeleteAck} {
			if v, ok := m[k]; ok {
				if out == nil {
					out = map[string]string{}
				}
				out[k] = v
			}
		}
		return out
	}
	return Sources{Annotations: keep(s.Annotations), Labels: keep(s.Labels), TemplateAnnotations: keep(s.TemplateAnnotations)}
}

// Error is a setting whose value is not acceptable. Its message names the
// place, the key, the value and what is expected, so that an admission
// denial tells the user exactly what to fix.
type Error struct {
	Key      string
	Value    string
	Expected string
	// Place is where the value was read (DeploymentAnnotation, the zero
	// value, for the webhook's own status record).
	Place Place
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s %s: invalid value %s: expected %s", e.Place, e.Key, quoteBounded(e.Value), e.Expected)
}

// maxQuoted bounds how much of a value an error quotes: an annotation value
// may be up to 256 KiB, and a denial, a log line or an event that repeated it
// whole would carry all of it.
const maxQuoted = 64

// quoteBounded quotes v, or its first maxQuoted bytes (at a character
// boundary) and its length when it is longer.
func quoteBounded(v string) string {
	if len(v) <= maxQuoted {
		return strconv.Quote(v)
	}
	cut := maxQuoted
	for cut > 0 && !utf8.RuneStart(v[cut]) {
		cut--
	}
	return fmt.Sprintf("%q... (%d bytes)", v[:cut], len(v))
}

// Found is one place where a key was found, with its value there.
type Found struct {
	Place Place
	Value string
}

// ConflictError is a key set in more than one place with different values.
type ConflictError struct {
	Key   string
	Found []Found
}

func (e *ConflictError) Error() string {
	parts := make([]string, len(e.Found))
	for i, f := range e.Found {
		parts[i] = fmt.Sprintf("%s in %s", quoteBounded(f.Value), f.Place.where())
	}
	return fmt.Sprintf("%s is %s: set it in one place, or to the same value in each", e.Key, strings.Join(parts, " and "))
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

// Parse reads and validates every user-facing key in src. It returns the
// first invalid key as an *Error, or a *ConflictError. Keys other than Inject
// are validated only when the Deployment opts in: an opted-out Deployment is
// never denied for settings that are not in effect.
func Parse(src Sources) (Settings, error) {
	s := Settings{AddonInstance: DefaultAddonInstance, DeleteAck: DefaultDeleteAck}
	inject, err := ParseInject(src)
	if err != nil {
		return s, err
	}
	s.Inject = inject
	if !inject {
		return s, nil
	}
	v, at, ok, err := src.Lookup(AddonInstance)
	switch {
	case err != nil:
		return s, err
	case ok:
		if errs := validation.IsDNS1123Subdomain(v); len(errs) > 0 {
			return s, &Error{Key: AddonInstance, Value: v, Place: at,
				Expected: "an AddonInstance name in the Deployment's namespace (a DNS-1123 subdomain: " + strings.Join(errs, "; ") + ")"}
		}
		s.AddonInstance = v
	}
	v, at, ok, err = src.Lookup(HealthURL)
	switch {
	case err != nil:
		return s, err
	case ok:
		if err := ValidateHealthURL(v); err != nil {
			return s, placed(err, at)
		}
		s.HealthURL = v
	}
	v, at, ok, err = src.Lookup(DeleteAck)
	switch {
	case err != nil:
		return s, err
	case ok:
		mode, err := ParseDeleteAck(v)
		if err != nil {
			return s, placed(err, at)
		}
		s.DeleteAck = mode
	}
	return s, nil
}

// placed records where the value of an *Error was read.
func placed(err error, p Place) error {
	if e, ok := errors.AsType[*Error](err); ok {
		e.Place = p
	}
	return err
}

// ParseInject reads the opt-in key alone: absent is false.
func ParseInject(src Sources) (bool, error) {
	v, at, ok, err := src.Lookup(Inject)
	switch {
	case err != nil:
		return false, err
	case !ok, v == "false":
		return false, nil
	case v == "true":
		return true, nil
	default:
		return false, &Error{Key: Inject, Value: v, Place: at, Expected: `"true" or "false"`}
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

// MaxHealthURLLength bounds the health URL: it reaches the reporter's
// arguments and, when the check fails, the Degraded message, which the API
// server limits to 32,768 bytes for the whole condition; a pod-local health
// endpoint needs nothing near this.
const MaxHealthURLLength = 2048

// ValidateHealthURL accepts an absolute http or https URL whose host is a
// loopback address (127.0.0.0/8, ::1) or "localhost", with an explicit port,
// of at most MaxHealthURLLength bytes.
func ValidateHealthURL(v string) error {
	if len(v) > MaxHealthURLLength {
		// The value is cut in the message: a denial must stay readable.
		return &Error{Key: HealthURL, Value: v,
			Expected: fmt.Sprintf("a URL of at most %d bytes (this one has %d)", MaxHealthURLLength, len(v))}
	}
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
