package sccadmit

import (
	"fmt"
	"os"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	"sigs.k8s.io/yaml"
)

// ReadDeployment reads one Deployment from a YAML file. Unknown fields are an error: a field
// that these k8s.io/api types do not know would be dropped, and the SCCs would judge a
// different pod than a cluster would.
func ReadDeployment(path string) (*appsv1.Deployment, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading Deployment: %w", err)
	}
	d := &appsv1.Deployment{}
	if err := yaml.UnmarshalStrict(data, d); err != nil {
		return nil, fmt.Errorf("parsing Deployment %s: %w", path, err)
	}
	return d, nil
}

// PodFromDeployment returns the pod that the ReplicaSet controller would create from d's
// template in namespace, as the API server hands it to SCC admission: with its defaults
// applied, and the ServiceAccount "default" if it names none (the ServiceAccount admission
// plugin runs before SCC admission).
func PodFromDeployment(d *appsv1.Deployment, namespace string) *corev1.Pod {
	pod := &corev1.Pod{
		ObjectMeta: *d.Spec.Template.ObjectMeta.DeepCopy(),
		Spec:       *d.Spec.Template.Spec.DeepCopy(),
	}
	pod.GenerateName = d.Name + "-"
	pod.Namespace = namespace
	if pod.Spec.ServiceAccountName == "" {
		pod.Spec.ServiceAccountName = "default"
	}
	legacyscheme.Scheme.Default(pod)
	return pod
}
