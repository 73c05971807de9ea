package inject

import (
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/annotations"
)

// reporterContainer is the container the webhook injects for one Deployment.
//
// Every field the API server would default is set explicitly, with the value
// it would default to: the container that comes back from the API server is
// then exactly the one computed here, so a later admission of the same
// Deployment finds nothing to change (no patch, no rollout).
//
// In a hostNetwork pod the reporter's ports are the node's: they are declared
// as container ports (the API server makes them host ports), so that the
// scheduler's port rule keeps a second replica off a node that runs one,
// instead of a reporter that cannot bind and exits.
func reporterContainer(s annotations.Settings, cfg Config, hostNetwork bool) corev1.Container {
	args := []string{
		"--addon-instance=" + s.AddonInstance,
		"--delete-ack=" + string(s.DeleteAck),
	}
	if s.HealthURL != "" {
		args = append(args, "--health-url="+s.HealthURL)
	}
	args = append(args,
		"--health-probe-bind-address=:"+strconv.Itoa(int(cfg.HealthPort)),
		"--metrics-bind-address=:"+strconv.Itoa(int(cfg.MetricsPort)),
	)
	if cfg.LogLevel != "" {
		args = append(args, "--log-level="+cfg.LogLevel)
	}
	c := corev1.Container{
		Name:    ContainerName,
		Image:   cfg.Image,
		Command: []string{ReporterCommand},
		Args:    args,
		Env: []corev1.EnvVar{
			fieldRefEnv(TargetNamespaceEnv, "metadata.namespace"),
			fieldRefEnv(PodNameEnv, "metadata.name"),
			fieldRefEnv(PodNamespaceEnv, "metadata.namespace"),
		},
		Resources:                *cfg.Resources.DeepCopy(),
		LivenessProbe:            httpProbe("/healthz", cfg.HealthPort),
		ReadinessProbe:           httpProbe("/readyz", cfg.HealthPort),
		TerminationMessagePath:   corev1.TerminationMessagePathDefault,
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
		ImagePullPolicy:          cfg.ImagePullPolicy,
		SecurityContext:          securityContext(cfg.Platform),
	}
	if cfg.NativeSidecar {
		c.RestartPolicy = ptr.To(corev1.ContainerRestartPolicyAlways)
	}
	if hostNetwork {
		c.Ports = []corev1.ContainerPort{
			{Name: "hb-health", ContainerPort: cfg.HealthPort, HostPort: cfg.HealthPort, Protocol: corev1.ProtocolTCP},
			{Name: "hb-metrics", ContainerPort: cfg.MetricsPort, HostPort: cfg.MetricsPort, Protocol: corev1.ProtocolTCP},
		}
	}
	return c
}

// portClash is the first port of the addon's own containers that the
// reporter of a hostNetwork pod would also bind on the node, as an error
// that says what to change; nil when there is none or the pod is not on the
// host's network.
func portClash(spec *corev1.PodSpec, cfg Config) error {
	if !spec.HostNetwork {
		return nil
	}
	ours := map[int32]string{cfg.HealthPort: "health probes", cfg.MetricsPort: "metrics"}
	for _, list := range [][]corev1.Container{spec.InitContainers, spec.Containers} {
		for _, c := range list {
			if c.Name == ContainerName {
				continue
			}
			for _, p := range c.Ports {
				if p.Protocol != "" && p.Protocol != corev1.ProtocolTCP {
					continue
				}
				for _, port := range []int32{p.ContainerPort, p.HostPort} {
					if what, ok := ours[port]; ok {
						return fmt.Errorf("this hostNetwork pod's container %q declares port %d, which the injected heartbeat reporter binds on the node for its %s "+
							"(reporter ports %d and %d, the chart's reporter.healthPort and reporter.metricsPort): move that port, or remove annotation %s",
							c.Name, port, what, cfg.HealthPort, cfg.MetricsPort, annotations.Inject)
					}
				}
			}
		}
	}
	return nil
}

// securityContext is the reporter's security context on platform (see
// Platform): restricted pod security on Kubernetes whatever the pod itself
// sets, and on OpenShift what every SCC admits.
func securityContext(platform Platform) *corev1.SecurityContext {
	sc := &corev1.SecurityContext{
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		RunAsNonRoot:             ptr.To(true),
		ReadOnlyRootFilesystem:   ptr.To(true),
		AllowPrivilegeEscalation: ptr.To(false),
	}
	if platform != OpenShift {
		sc.RunAsUser = ptr.To(reporterUID)
		sc.RunAsGroup = ptr.To(reporterUID)
		sc.SeccompProfile = &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}
	}
	return sc
}

// targetNamespaceEnv is the entry added to addon containers.
func targetNamespaceEnv() corev1.EnvVar {
	return fieldRefEnv(TargetNamespaceEnv, "metadata.namespace")
}

func fieldRefEnv(name, fieldPath string) corev1.EnvVar {
	return corev1.EnvVar{
		Name: name,
		ValueFrom: &corev1.EnvVarSource{
			FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: fieldPath},
		},
	}
}

// isInjectedTargetEnv tells whether e is exactly the entry we add (the API
// server defaults an empty fieldRef apiVersion to v1).
func isInjectedTargetEnv(e corev1.EnvVar) bool {
	return e.Name == TargetNamespaceEnv && e.Value == "" && e.ValueFrom != nil &&
		e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.namespace" &&
		(e.ValueFrom.FieldRef.APIVersion == "v1" || e.ValueFrom.FieldRef.APIVersion == "") &&
		e.ValueFrom.ConfigMapKeyRef == nil && e.ValueFrom.SecretKeyRef == nil &&
		e.ValueFrom.ResourceFieldRef == nil && e.ValueFrom.FileKeyRef == nil
}

func httpProbe(path string, port int32) *corev1.Probe {
	return &corev1.Probe{
		ProbeHandler: corev1.ProbeHandler{
			HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromInt32(port), Scheme: corev1.URISchemeHTTP},
		},
		TimeoutSeconds:   1,
		PeriodSeconds:    10,
		SuccessThreshold: 1,
		FailureThreshold: 3,
	}
}
