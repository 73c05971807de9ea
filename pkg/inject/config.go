package inject

import (
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Names and values of what is injected. They are part of the contract with
// the reporter (cmd/reporter), which reads the same flags and env.
const (
	// ContainerName is the injected reporter container.
	ContainerName = "heartbeat-reporter"
	// ReporterCommand is the reporter's path in its image.
	ReporterCommand = "/reporter"
	// TargetNamespaceEnv is set (downward API) in the reporter and in every
	// addon container that does not set it already.
	TargetNamespaceEnv = "ADDON_TARGET_NAMESPACE"
	// PodNameEnv and PodNamespaceEnv give the reporter its identity for
	// leader election.
	PodNameEnv      = "POD_NAME"
	PodNamespaceEnv = "POD_NAMESPACE"

	// DefaultHealthPort and DefaultMetricsPort are where the reporter serves
	// its probes and metrics inside the pod. They are chosen away from the
	// ports addons and their proxies commonly use (8080, 8081, 8443, 9090,
	// 9443, 15000-15090).
	DefaultHealthPort  int32 = 9781
	DefaultMetricsPort int32 = 9782

	// reporterUID is the non-root user the reporter runs as on Kubernetes
	// (distroless "nonroot"). On OpenShift the SCC assigns one instead.
	reporterUID int64 = 65532
)

// Platform is the kind of cluster the reporter is injected on; it decides the
// reporter's security context.
type Platform string

const (
	// Kubernetes: the restricted Pod Security profile, set in full on the
	// container (a fixed non-root UID and GID, RuntimeDefault seccomp), so
	// that the pod passes whatever its own security context says.
	Kubernetes Platform = "kubernetes"
	// OpenShift: what every SCC admits. The SCC assigns the UID (from the
	// namespace's openshift.io/sa.scc.uid-range under restricted-v2, which
	// refuses a fixed UID such as 65532), and a container-level seccomp
	// profile is refused by the anyuid, restricted and nonroot SCCs, which
	// allow none; every container of a pod must pass under one SCC. So
	// runAsUser, runAsGroup and seccompProfile are left unset for the SCC
	// to fill in (restricted-v2 sets RuntimeDefault at pod level), and
	// only what every SCC allows is kept: non-root, no privilege
	// escalation, no capabilities, a read-only root filesystem. The image
	// runs under any UID with GID 0.
	OpenShift Platform = "openshift"
)

// ParsePlatform accepts the names of the platforms.
func ParsePlatform(v string) (Platform, error) {
	switch p := Platform(v); p {
	case Kubernetes, OpenShift:
		return p, nil
	default:
		return "", fmt.Errorf("platform %q: expected %s or %s", v, Kubernetes, OpenShift)
	}
}

// Config is what the cluster admin chooses for every injected reporter (chart
// values, webhook flags). It is the same for every Deployment; per-Deployment
// settings come from the Deployment's annotations.
type Config struct {
	// Image is the reporter image reference (repository:tag or @digest).
	Image string
	// ImagePullPolicy of the reporter container.
	ImagePullPolicy corev1.PullPolicy
	// Platform decides the reporter's security context; Kubernetes when
	// empty.
	Platform Platform
	// NativeSidecar injects the reporter as an initContainer with
	// restartPolicy Always (Kubernetes 1.29+). When false, it is a plain
	// container, for older clusters.
	NativeSidecar bool
	// Resources of the reporter container: requests and a memory limit.
	Resources corev1.ResourceRequirements
	// HealthPort and MetricsPort are the reporter's pod-local ports.
	HealthPort  int32
	MetricsPort int32
	// LogLevel is passed to the reporter when set (debug, info, error).
	LogLevel string
	// RecordKey signs the status record (see Record): the RBAC controller
	// binds the reporter role only for records signed with it. Empty leaves
	// records unsigned.
	RecordKey []byte
	// AddonInstanceNames are the AddonInstances the reporter role allows
	// (the chart's reporter.addonInstanceNames); empty means any. A
	// Deployment that opts in for another name is still injected, with an
	// admission warning: its reporter's requests would be forbidden.
	AddonInstanceNames []string
}

// DefaultConfig is a Config with sensible defaults and no image.
func DefaultConfig() Config {
	return Config{
		Platform:        Kubernetes,
		ImagePullPolicy: corev1.PullIfNotPresent,
		NativeSidecar:   true,
		// Measured (BENCHMARKS.md): about 20 MiB resident after minutes at
		// a 1 s period, three quarters of it the binary's own pages, which
		// the container's memory accounting counts too. The request covers
		// that with room to spare; the limit leaves room for a burst of
		// Deployments in the cache.
		Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{
				corev1.ResourceCPU:    resource.MustParse("5m"),
				corev1.ResourceMemory: resource.MustParse("32Mi"),
			},
			Limits: corev1.ResourceList{
				corev1.ResourceMemory: resource.MustParse("64Mi"),
			},
		},
		HealthPort:  DefaultHealthPort,
		MetricsPort: DefaultMetricsPort,
	}
}

// Validate reports the first setting that cannot produce a valid container.
func (c Config) Validate() error {
	var errs []error
	if c.Image == "" {
		errs = append(errs, errors.New("reporter image: must be set"))
	}
	if c.Platform != "" {
		if _, err := ParsePlatform(string(c.Platform)); err != nil {
			errs = append(errs, err)
		}
	}
	switch c.ImagePullPolicy {
	case corev1.PullAlways, corev1.PullIfNotPresent, corev1.PullNever:
	default:
		errs = append(errs, fmt.Errorf("reporter image pull policy %q: expected Always, IfNotPresent or Never", c.ImagePullPolicy))
	}
	for _, p := range []struct {
		name string
		port int32
	}{{"health", c.HealthPort}, {"metrics", c.MetricsPort}} {
		if p.port < 1 || p.port > 65535 {
			errs = append(errs, fmt.Errorf("reporter %s port %d: expected 1-65535", p.name, p.port))
		}
	}
	if c.HealthPort == c.MetricsPort {
		errs = append(errs, fmt.Errorf("reporter health and metrics ports are both %d: expected two different ports", c.HealthPort))
	}
	if _, ok := c.Resources.Limits[corev1.ResourceMemory]; !ok {
		errs = append(errs, errors.New("reporter resources: a memory limit is required"))
	}
	switch c.LogLevel {
	case "", "debug", "info", "error":
	default:
		errs = append(errs, fmt.Errorf("reporter log level %q: expected debug, info or error", c.LogLevel))
	}
	for _, n := range c.AddonInstanceNames {
		if msgs := validation.IsDNS1123Subdomain(n); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("AddonInstance name %q: expected a DNS subdomain name: %s", n, strings.Join(msgs, "; ")))
		}
	}
	return errors.Join(errs...)
}
