package chart_test

import (
	"encoding/json"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func jsonSelector(s string) (*metav1.LabelSelector, error) {
	var ls metav1.LabelSelector
	return &ls, json.Unmarshal([]byte(s), &ls)
}

// equalJSON compares two values by their JSON form.
func equalJSON(t *testing.T, a, b any) bool {
	t.Helper()
	ja, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	jb, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	return string(ja) == string(jb)
}
