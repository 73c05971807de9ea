package check

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
)

// PortForwarder opens a connection to a port of a pod through the API
// server (pods/portforward), as `kubectl port-forward` does, without
// listening on any local port. It is how check reaches a webhook pod from
// outside the cluster network to see the certificate it serves.
type PortForwarder struct {
	Config *rest.Config
}

// DialPod connects to port of pod ns/name. Closing the connection ends the
// forward.
func (f PortForwarder) DialPod(ctx context.Context, ns, name string, port int) (net.Conn, error) {
	u, err := url.Parse(f.Config.Host)
	if err != nil {
		return nil, fmt.Errorf("parsing the API server address %q: %w", f.Config.Host, err)
	}
	u.Path = path.Join(u.Path, "api", "v1", "namespaces", ns, "pods", name, "portforward")
	transport, upgrader, err := spdy.RoundTripperFor(f.Config)
	if err != nil {
		return nil, fmt.Errorf("port-forward transport: %w", err)
	}
	spdyDialer := spdy.NewDialer(upgrader, &http.Client{Transport: transport}, http.MethodPost, u)
	// Websockets first (Kubernetes 1.31+), SPDY where they are refused, as
	// kubectl does.
	wsDialer, err := portforward.NewSPDYOverWebsocketDialer(u, f.Config)
	if err != nil {
		return nil, fmt.Errorf("port-forward transport: %w", err)
	}
	dialer := portforward.NewFallbackDialer(wsDialer, spdyDialer, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})

	type dialed struct {
		conn httpstream.Connection
		err  error
	}
	ch := make(chan dialed, 1)
	go func() {
		conn, protocol, err := dialer.Dial(portforward.PortForwardProtocolV1Name)
		if err == nil && protocol != portforward.PortForwardProtocolV1Name {
			conn.Close()
			err = fmt.Errorf("the API server offered protocol %q, not %q", protocol, portforward.PortForwardProtocolV1Name)
		}
		ch <- dialed{conn, err}
	}()
	var d dialed
	select {
	case d = <-ch:
	case <-ctx.Done():
		go func() {
			if d := <-ch; d.conn != nil {
				d.conn.Close()
			}
		}()
		return nil, ctx.Err()
	}
	if d.err != nil {
		return nil, fmt.Errorf("port-forward to pod %s/%s: %w", ns, name, d.err)
	}
	conn := d.conn

	headers := http.Header{}
	headers.Set(corev1.StreamType, corev1.StreamTypeError)
	headers.Set(corev1.PortHeader, strconv.Itoa(port))
	headers.Set(corev1.PortForwardRequestIDHeader, "0")
	errStream, err := conn.CreateStream(headers)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("port-forward to pod %s/%s: error stream: %w", ns, name, err)
	}
	errStream.Close() // nothing is written to it
	headers.Set(corev1.StreamType, corev1.StreamTypeData)
	data, err := conn.CreateStream(headers)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("port-forward to pod %s/%s: data stream: %w", ns, name, err)
	}
	fc := &forwardConn{conn: conn, data: data, remote: fmt.Sprintf("%s/%s:%d", ns, name, port), errc: make(chan error, 1)}
	go func() {
		// The kubelet writes here when it cannot connect to the port.
		msg, _ := io.ReadAll(errStream)
		if s := strings.TrimSpace(string(msg)); s != "" {
			fc.errc <- fmt.Errorf("port-forward to pod %s/%s port %d: %s", ns, name, port, s)
		}
		close(fc.errc)
	}()
	return fc, nil
}

// forwardConn is the data stream of one port-forward as a net.Conn.
// Deadlines are not supported by the stream; a TLS handshake with a context
// closes the connection when the context ends instead.
type forwardConn struct {
	conn   httpstream.Connection
	data   httpstream.Stream
	remote string
	errc   chan error
}

func (c *forwardConn) Read(p []byte) (int, error) {
	n, err := c.data.Read(p)
	if err != nil && n == 0 {
		// Prefer the kubelet's reason ("connection refused") to a bare EOF.
		select {
		case ferr, ok := <-c.errc:
			if ok && ferr != nil {
				return 0, ferr
			}
		case <-time.After(time.Second):
		}
	}
	return n, err
}

func (c *forwardConn) Write(p []byte) (int, error) { return c.data.Write(p) }

func (c *forwardConn) Close() error {
	_ = c.data.Reset()
	return c.conn.Close()
}

func (c *forwardConn) LocalAddr() net.Addr              { return forwardAddr("local") }
func (c *forwardConn) RemoteAddr() net.Addr             { return forwardAddr(c.remote) }
func (c *forwardConn) SetDeadline(time.Time) error      { return nil }
func (c *forwardConn) SetReadDeadline(time.Time) error  { return nil }
func (c *forwardConn) SetWriteDeadline(time.Time) error { return nil }

type forwardAddr string

func (a forwardAddr) Network() string { return "portforward" }
func (a forwardAddr) String() string  { return string(a) }
