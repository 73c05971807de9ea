//go:build node

package node

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	addonsv1alpha1 "github.com/openshift/addon-operator/apis/addons/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/inject"
)

const hostNetNS = "hostnet-addon"

// hostNetworkAddon: a hostNetwork addon gets its reporter's ports declared as
// host ports. At two replicas on the one node, the first runs and heartbeats
// and the second stays Pending by the scheduler's port rule: nothing
// crash-loops. One that declares a reporter port itself is denied.
func hostNetworkAddon(t *testing.T) {
	ctx := suiteCtx
	// Host networking needs the privileged Pod Security level: no labels.
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: hostNetNS}}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: hostNetNS, Name: addonServiceAccount}}
	ai := &addonsv1alpha1.AddonInstance{ObjectMeta: metav1.ObjectMeta{Namespace: hostNetNS, Name: instance},
		Spec: addonsv1alpha1.AddonInstanceSpec{HeartbeatUpdatePeriod: metav1.Duration{Duration: period}}}
	for _, o := range []client.Object{ns, sa, ai} {
		if err := cluster.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	hb := watchHeartbeats(t, hostNetNS, instance)

	clash := exampleAddon(hostNetNS, "clashing", instance, 1)
	clash.Spec.Template.Spec.HostNetwork = true
	clash.Spec.Template.Spec.Containers[0].Ports = []corev1.ContainerPort{{Name: "metrics", ContainerPort: 9782, Protocol: corev1.ProtocolTCP}}
	err := cluster.Client.Create(ctx, clash)
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), `container "manager" declares port 9782`) {
		t.Errorf("a hostNetwork addon declaring the reporter's metrics port: %v, want a denial naming the port", err)
	}

	d := exampleAddon(hostNetNS, "host-network", instance, 2)
	d.Spec.Template.Spec.HostNetwork = true
	if err := cluster.Client.Create(ctx, d); err != nil {
		t.Fatal(err)
	}
	for _, c := range d.Spec.Template.Spec.InitContainers {
		if c.Name == inject.ContainerName && len(c.Ports) != 2 {
			t.Errorf("the reporter of a hostNetwork pod declares ports %+v, want its two", c.Ports)
		}
	}
	sel := map[string]string{"app": "host-network"}
	var running, pending corev1.Pod
	waitFor(t, "one replica running with a ready reporter, the other Pending for its ports", 3*time.Minute, func(ctx context.Context) (bool, string) {
		var list corev1.PodList
		if err := cluster.Client.List(ctx, &list, client.InNamespace(hostNetNS), client.MatchingLabels(sel)); err != nil {
			return false, err.Error()
		}
		var states []string
		running, pending = corev1.Pod{}, corev1.Pod{}
		for _, p := range list.Items {
			states = append(states, fmt.Sprintf("%s %s", p.Name, p.Status.Phase))
			switch {
			case p.Status.Phase == corev1.PodRunning:
				if rs := reporterStatus(p); rs != nil && rs.Ready {
					running = p
				}
			case p.Status.Phase == corev1.PodPending:
				for _, c := range p.Status.Conditions {
					if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && strings.Contains(c.Message, "free ports") {
						pending = p
					}
				}
			}
		}
		return running.Name != "" && pending.Name != "", strings.Join(states, ", ")
	})
	hb.waitWrites(t, 3, 4*period)
	var p corev1.Pod
	if err := cluster.Client.Get(ctx, key(hostNetNS, running.Name), &p); err != nil {
		t.Fatal(err)
	}
	for _, s := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
		if s.RestartCount != 0 {
			t.Errorf("container %s of %s restarted %d times", s.Name, p.Name, s.RestartCount)
		}
	}
	logf("hostNetwork addon: %s runs and heartbeats; %s stays Pending (no free ports on the node)", running.Name, pending.Name)
	if err := cluster.Client.Delete(ctx, ns); err != nil {
		t.Error(err)
	}
}
