package inject

import (
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// In a hostNetwork pod the reporter's ports are declared (so that the
// scheduler keeps a second replica off a node that runs one); an addon
// container that declares one of them is refused with what to change.
// Outside the host's network nothing is declared.
func TestHostNetworkPorts(t *testing.T) {
	cfg := testConfig()
	hostNet := func(ports ...corev1.ContainerPort) *corev1.Container {
		return &corev1.Container{Name: "manager", Image: "addon:v1", Ports: ports}
	}
	plain := injected(t, deployment(optIn()), cfg)
	if c, _ := find(plain, ContainerName); len(c.Ports) != 0 {
		t.Errorf("ports %v declared outside the host's network", c.Ports)
	}

	d := deployment(optIn(), *hostNet(corev1.ContainerPort{ContainerPort: 8080, Protocol: corev1.ProtocolTCP}))
	d.Spec.Template.Spec.HostNetwork = true
	res := mustMutate(t, d, cfg)
	c, _ := find(res.Deployment, ContainerName)
	want := map[int32]bool{cfg.HealthPort: true, cfg.MetricsPort: true}
	for _, p := range c.Ports {
		if !want[p.ContainerPort] || p.HostPort != p.ContainerPort || p.Protocol != corev1.ProtocolTCP {
			t.Errorf("port %+v", p)
		}
		delete(want, p.ContainerPort)
	}
	if len(want) != 0 {
		t.Errorf("ports %v not declared: %+v", want, c.Ports)
	}
	if again := mustMutate(t, res.Deployment, cfg); again.Action != Unchanged {
		t.Errorf("injected again: %s, want unchanged", again.Action)
	}

	for name, port := range map[string]corev1.ContainerPort{
		"container port": {ContainerPort: cfg.HealthPort},
		"host port":      {ContainerPort: 18080, HostPort: cfg.MetricsPort, Protocol: corev1.ProtocolTCP},
	} {
		t.Run("clash by "+name, func(t *testing.T) {
			d := deployment(optIn(), *hostNet(port))
			d.Spec.Template.Spec.HostNetwork = true
			_, err := Mutate(d, cfg)
			if err == nil {
				t.Fatal("injected; want a denial")
			}
			for _, s := range []string{`container "manager"`, "hostNetwork", "reporter.healthPort", "9781 and 9782"} {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not say %q", err, s)
				}
			}
		})
	}
	// UDP on the same number does not clash with the reporter's TCP.
	udp := deployment(optIn(), *hostNet(corev1.ContainerPort{ContainerPort: cfg.HealthPort, Protocol: corev1.ProtocolUDP}))
	udp.Spec.Template.Spec.HostNetwork = true
	if _, err := Mutate(udp, cfg); err != nil {
		t.Errorf("a UDP port of the same number: %v", err)
	}
}

// find returns the container named name and the list it is in.
func find(dep *appsv1.Deployment, name string) (corev1.Container, string) {
	for _, l := range []struct {
		name string
		cs   []corev1.Container
	}{{listInit, dep.Spec.Template.Spec.InitContainers}, {listRegular, dep.Spec.Template.Spec.Containers}} {
		for _, c := range l.cs {
			if c.Name == name {
				return c, l.name
			}
		}
	}
	return corev1.Container{}, ""
}
