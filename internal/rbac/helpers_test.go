package rbac_test

import (
	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"
)

type logrLogger = logr.Logger

func yamlUnmarshal(s string, v any) error { return yaml.Unmarshal([]byte(s), v) }

func fromUnstructured(in map[string]any, out any) error {
	return runtime.DefaultUnstructuredConverter.FromUnstructured(in, out)
}
