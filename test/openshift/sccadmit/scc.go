package sccadmit

import (
	"fmt"
	"os"
	"path/filepath"

	securityv1 "github.com/openshift/api/security/v1"
	"sigs.k8s.io/yaml"
)

// LoadSCCs reads every *.yaml file in dir as one SecurityContextConstraints object.
// Unknown fields are an error: an SCC field that this version of openshift/api does not know
// would otherwise be dropped silently, and the plugin would enforce a weaker SCC.
func LoadSCCs(dir string) ([]*securityv1.SecurityContextConstraints, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return nil, fmt.Errorf("listing SCC files: %w", err)
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no *.yaml SCC files in %s", dir)
	}
	var sccs []*securityv1.SecurityContextConstraints
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("reading SCC: %w", err)
		}
		scc := &securityv1.SecurityContextConstraints{}
		if err := yaml.UnmarshalStrict(data, scc); err != nil {
			return nil, fmt.Errorf("parsing SCC %s: %w", f, err)
		}
		if scc.Kind != "SecurityContextConstraints" || scc.Name == "" {
			return nil, fmt.Errorf("%s: not a named SecurityContextConstraints (kind %q)", f, scc.Kind)
		}
		sccs = append(sccs, scc)
	}
	return sccs, nil
}
