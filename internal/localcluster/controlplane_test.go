package localcluster

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The control plane survives an API server restart with its data, address
// and credentials, so that clients created before it keep working, and it
// writes the audit log it is asked for.
func TestControlPlaneRestart(t *testing.T) {
	audit := filepath.Join(t.TempDir(), "audit.log")
	c, err := Start(t.Context(), Options{AuditLog: audit})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Error(err)
		}
		if _, err := os.Stat(c.Dir); !os.IsNotExist(err) {
			t.Errorf("work folder %s left behind", c.Dir)
		}
	})
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kept-across-restart"}}
	if err := c.Client.Create(t.Context(), ns); err != nil {
		t.Fatal(err)
	}
	if err := c.ControlPlane.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	if err := c.Client.Get(t.Context(), client.ObjectKeyFromObject(ns), &corev1.Namespace{}); err == nil {
		t.Fatal("the API server still answers after it was stopped")
	}
	if err := c.ControlPlane.StartAPIServer(t.Context()); err != nil {
		t.Fatal(err)
	}
	// The same client, created before the restart, works again.
	err = wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		return c.Client.Get(ctx, client.ObjectKeyFromObject(ns), &corev1.Namespace{}) == nil, nil
	})
	if err != nil {
		t.Fatalf("the namespace is not readable after the restart: %v", err)
	}
	data, err := os.ReadFile(audit)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(data, []byte(`"kept-across-restart"`)) {
		t.Error("the audit log does not record the namespace creation")
	}
}
