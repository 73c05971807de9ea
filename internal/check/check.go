// Package check is `addon-heartbeat check`: it reads a cluster with the
// current kubeconfig and reports, one line per check, whether the webhook is
// installed, serving and trusted, and whether each opted-in Deployment is
// injected and heartbeating, with a fix for every line that fails.
package check

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// PodDialer opens a connection to a port of a pod (PortForwarder).
type PodDialer interface {
	DialPod(ctx context.Context, ns, name string, port int) (net.Conn, error)
}

// Checker runs the checks against one cluster.
type Checker struct {
	// Client reads the cluster and asks SubjectAccessReviews.
	Client client.Client
	// Pods reaches webhook pods to read the certificate they serve. Nil
	// skips that check for a webhook behind a Service.
	Pods PodDialer
	// Dial connects to the host:port of a webhook configured by URL.
	// Nil uses a net.Dialer.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Now is the time heartbeats are judged at: the API server's, which the
	// reporter writes heartbeats in. Nil uses the local clock.
	Now func() time.Time

	// denied caches firstDenied by namespace, ServiceAccount and
	// AddonInstance: the Deployments of one addon often share all three.
	denied map[[3]string]string
}

// Scope is the namespace whose opted-in Deployments are checked; empty for
// every namespace. The webhook is cluster-wide and always checked.
type Scope struct {
	Namespace string
}

// ErrCannotCheck wraps errors that stop the whole check, such as an API
// server that cannot be reached or a user who may not list Deployments.
var ErrCannotCheck = errors.New("cannot check")

// Run runs every check and returns the report. An error means that the
// cluster could not be checked at all (ErrCannotCheck).
func (c *Checker) Run(ctx context.Context, s Scope) (Report, error) {
	var r Report
	c.denied = map[[3]string]string{} // answers of an earlier run may be out of date
	in, err := c.checkWebhook(ctx, &r)
	if err != nil {
		return r, err
	}
	if err := c.checkWorkloads(ctx, &r, in, s); err != nil {
		return r, err
	}
	return r, nil
}

func (c *Checker) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

// cannot wraps an error that ends the check, saying what was being read.
func cannot(what string, err error) error {
	hint := ""
	if apierrors.IsForbidden(err) {
		hint = " (check needs to read cluster-wide: run it as a cluster administrator)"
	}
	return fmt.Errorf("%w: %s: %w%s", ErrCannotCheck, what, err, hint)
}
