//go:build go1.25

package addonsv1alpha1

import (
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/heartbeattest"
)

// The status is written whole: a property of the addon-operator's CRD that
// these types lack would be erased by every heartbeat, and one they add would
// be pruned by the API server. Each object of the schema (spec, status, a
// condition) must have exactly the JSON fields of its Go type.
func TestTypesCoverTheUpstreamCRD(t *testing.T) {
	file, err := heartbeattest.AddonInstanceCRD()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var crd struct {
		Spec struct {
			Versions []crdVersion `json:"versions"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(data, &crd); err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(crd.Spec.Versions, func(v crdVersion) bool { return v.Name == GroupVersion.Version })
	if i < 0 {
		t.Fatalf("%s has no version %s", file, GroupVersion.Version)
	}
	root := crd.Spec.Versions[i].Schema.OpenAPIV3Schema
	spec, status := root.Properties["spec"], root.Properties["status"]
	var condition openAPI
	if items := status.Properties["conditions"].Items; items != nil {
		condition = *items
	}
	cases := map[string]struct {
		schema openAPI
		typ    reflect.Type
	}{
		"spec":              {spec, reflect.TypeOf(AddonInstanceSpec{})},
		"status":            {status, reflect.TypeOf(AddonInstanceStatus{})},
		"status.conditions": {condition, reflect.TypeOf(metav1.Condition{})},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			var inSchema []string
			for p := range c.schema.Properties {
				inSchema = append(inSchema, p)
			}
			slices.Sort(inSchema)
			inType := jsonFields(c.typ)
			if len(inSchema) == 0 || !slices.Equal(inSchema, inType) {
				t.Errorf("%s: the CRD has properties %v, the Go type %s has JSON fields %v", name, inSchema, c.typ, inType)
			}
		})
	}
}

// crdVersion is a version of a CRD, with its schema.
type crdVersion struct {
	Name   string `json:"name"`
	Schema struct {
		OpenAPIV3Schema openAPI `json:"openAPIV3Schema"`
	} `json:"schema"`
}

// openAPI is the part of an OpenAPI schema the test reads.
type openAPI struct {
	Properties map[string]openAPI `json:"properties"`
	Items      *openAPI           `json:"items"`
}

// jsonFields are the JSON names of t's fields, sorted.
func jsonFields(t reflect.Type) []string {
	var names []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name != "" && name != "-" {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}
