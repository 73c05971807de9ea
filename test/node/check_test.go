//go:build node

package node

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/addon-heartbeat/addon-heartbeat/internal/localcluster"
)

// checkOnNode runs `addon-heartbeat check` in the node's network namespace,
// as an operator runs it against a cluster, with the chart installed and
// the example addon heartbeating. The webhook is behind its Service here:
// check counts its ready pods from the EndpointSlices and reads the
// certificate one of them serves through a port-forward (the API server,
// the kubelet and containerd's stream server), which it verifies against
// the caBundle for the Service's name.
func checkOnNode(t *testing.T) {
	// The kubelet asks the API server whether the API server's own client
	// certificate may proxy to it (port-forward, logs, exec). kubeadm and
	// every managed control plane bind that identity to
	// system:kubelet-api-admin when they create the cluster; this one was
	// made without it.
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-apiserver-kubelet-client"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:kubelet-api-admin"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "kube-apiserver-kubelet-client"}},
	}
	if err := cluster.Client.Create(suiteCtx, crb); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	bins, err := localcluster.Build(workDir, os.Stderr, "./cmd/addon-heartbeat")
	if err != nil {
		t.Fatal(err)
	}
	out, err := run(suiteCtx, bins["addon-heartbeat"], "check", "-n", addonNamespace)
	logf("addon-heartbeat check -n %s:\n%s", addonNamespace, out)
	if exit, ok := errors.AsType[*exec.ExitError](err); ok {
		t.Fatalf("exit status %d, want 0", exit.ExitCode())
	} else if err != nil {
		t.Fatal(err)
	}
	rows := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) >= 4 && f[0] == "webhook":
			rows[f[0]+" "+f[1]] = strings.Join(f[2:], " ")
		case len(f) >= 5 && (f[0] == "deployment" || f[0] == "addoninstance"):
			rows[f[0]+" "+f[1]+" "+f[2]] = strings.Join(f[3:], " ")
		}
	}
	for row, want := range map[string][]string{
		"webhook serving": {"OK Service " + releaseNamespace + "/addon-heartbeat-webhook: 2 of 2 endpoints ready (addon-heartbeat-webhook-"},
		"webhook trusted": {"OK the caBundle verifies the certificate pod " + releaseNamespace + "/addon-heartbeat-webhook-",
			"serves for addon-heartbeat-webhook." + releaseNamespace + ".svc (issuer \"addon-heartbeat-webhook-ca\""},
		"deployment " + addonNamespace + "/" + operatorName + " rbac": {"OK ServiceAccount " + addonServiceAccount + " may do everything the reporter does"},
		// Either Deployment's reporter may lead.
		"addoninstance " + addonNamespace + "/" + instance + " lease": {"OK Lease addon-heartbeat-" + instance + " is held by pod example-", ", which is running"},
	} {
		got, ok := rows[row]
		if !ok {
			t.Errorf("no row %q", row)
			continue
		}
		for _, w := range want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: %q lacks %q", row, got, w)
			}
		}
	}
	for row, got := range rows {
		if !strings.HasPrefix(got, "OK ") {
			t.Errorf("%s: %s", row, got)
		}
	}
}
