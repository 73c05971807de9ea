package chart

import (
	"fmt"
	"path"
	"slices"

	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
)

// Discover asks the API server at cfg what `helm install` asks it before
// rendering: its version, and every "group/version" and "group/version/Kind"
// it serves (listed as Helm's action.GetVersionSet lists them).
func Discover(cfg *rest.Config) (Cluster, error) {
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return Cluster{}, fmt.Errorf("creating a discovery client: %w", err)
	}
	info, err := dc.ServerVersion()
	if err != nil {
		return Cluster{}, fmt.Errorf("reading the API server's version: %w", err)
	}
	groups, resources, err := dc.ServerGroupsAndResources()
	if err != nil {
		return Cluster{}, fmt.Errorf("discovering the API server's resources: %w", err)
	}
	var versions []string
	for _, g := range groups {
		for _, gv := range g.Versions {
			versions = append(versions, gv.GroupVersion)
		}
	}
	for _, list := range resources {
		for _, r := range list.APIResources {
			versions = append(versions, path.Join(list.GroupVersion, r.Kind))
		}
	}
	slices.Sort(versions)
	return Cluster{KubeVersion: info.GitVersion, APIVersions: slices.Compact(versions)}, nil
}
