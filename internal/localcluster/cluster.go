// Package localcluster runs addon-heartbeat the way `make demo` and the
// end-to-end tests do: a real etcd and kube-apiserver on loopback, the
// project's binaries built and started as local processes, and the webhook
// configuration from config/ pointed at the local webhook.
package localcluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/addon-heartbeat/addon-heartbeat/internal/testenv"
)

// Cluster is a local control plane with a work folder for its processes.
type Cluster struct {
	ControlPlane *ControlPlane
	Config       *rest.Config
	Client       client.Client
	Dir          string
	Kubeconfig   string
}

// Options of a local cluster.
type Options struct {
	// AuditLog asks the API server for a metadata-level audit log there.
	AuditLog string
}

// Start starts etcd and kube-apiserver with the upstream AddonInstance CRD
// installed. Dir is a new temporary folder that Stop removes.
func Start(ctx context.Context, o Options) (c *Cluster, err error) {
	assets, err := testenv.AssetsDir()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "addon-heartbeat-")
	if err != nil {
		return nil, fmt.Errorf("creating the work folder: %w", err)
	}
	c = &Cluster{Dir: dir, Kubeconfig: filepath.Join(dir, "kubeconfig")}
	defer func() {
		if err != nil {
			err = errors.Join(err, c.Stop())
		}
	}()
	if c.ControlPlane, err = StartControlPlane(ctx, dir, assets, o.AuditLog); err != nil {
		return c, err
	}
	c.Config = c.ControlPlane.Config()
	kubeconfig, err := c.ControlPlane.Kubeconfig()
	if err != nil {
		return c, fmt.Errorf("encoding the kubeconfig: %w", err)
	}
	if err := writeFileAtomic(c.Kubeconfig, kubeconfig); err != nil {
		return c, fmt.Errorf("writing the kubeconfig: %w", err)
	}
	crd, err := testenv.AddonInstanceCRD()
	if err != nil {
		return c, err
	}
	if _, err := envtest.InstallCRDs(c.Config, envtest.CRDInstallOptions{Paths: []string{crd}, ErrorIfPathMissing: true}); err != nil {
		return c, fmt.Errorf("installing the AddonInstance CRD: %w", err)
	}
	if c.Client, err = client.New(c.Config, client.Options{Scheme: testenv.Scheme()}); err != nil {
		return c, fmt.Errorf("creating a client: %w", err)
	}
	return c, nil
}

// Stop stops the control plane and removes the work folder.
func (c *Cluster) Stop() error {
	var errs []error
	if c.ControlPlane != nil {
		errs = append(errs, c.ControlPlane.Stop())
	}
	return errors.Join(append(errs, os.RemoveAll(c.Dir))...)
}

// ServiceAccountKubeconfig writes a kubeconfig that authenticates as
// ServiceAccount ns/name with a bound token (TokenRequest), creating the
// ServiceAccount when it does not exist, as the controller-manager does for
// "default" in every namespace. It returns the file's path. Every call mints
// a new token into the same file, which processes started from an earlier
// call may be reading at that moment: the file is replaced atomically, so a
// reader sees the old or the new file whole, never a truncated one.
func (c *Cluster) ServiceAccountKubeconfig(ctx context.Context, ns, name string) (string, error) {
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if err := c.Client.Create(ctx, sa); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("creating ServiceAccount %s/%s: %w", ns, name, err)
	}
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(24 * 3600))}}
	if err := c.Client.SubResource("token").Create(ctx, sa, tr); err != nil {
		return "", fmt.Errorf("requesting a token for ServiceAccount %s/%s: %w", ns, name, err)
	}
	data, err := c.ControlPlane.kubeconfigFor("system:serviceaccount:"+ns+":"+name, tr.Status.Token)
	if err != nil {
		return "", fmt.Errorf("encoding the kubeconfig: %w", err)
	}
	path := filepath.Join(c.Dir, "kubeconfig-"+ns+"-"+name)
	if err := writeFileAtomic(path, data); err != nil {
		return "", fmt.Errorf("writing the kubeconfig: %w", err)
	}
	return path, nil
}

// writeFileAtomic writes data to a new file beside path and renames it over
// path (owner-only permissions), so that a concurrent reader never sees a
// partly written file.
func writeFileAtomic(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	_, werr := f.Write(data)
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Rename(f.Name(), path)
	}
	if werr != nil {
		_ = os.Remove(f.Name())
	}
	return werr
}

// Build compiles the given packages of this module (such as ./cmd/webhook)
// into dir and returns the binaries' paths by base name. It uses the flags
// the images are built with (Dockerfile, internal/images), so that tests and
// benchmarks run, and measure, what ships.
func Build(dir string, progress io.Writer, pkgs ...string) (map[string]string, error) {
	out := map[string]string{}
	for _, pkg := range pkgs {
		name := filepath.Base(pkg)
		bin := filepath.Join(dir, name)
		fmt.Fprintf(progress, "building %s\n", pkg)
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin, pkg)
		cmd.Dir = testenv.RepoRoot()
		// Static, as in the image: a cgo build links libc (through net and
		// os/user), whose pages a benchmark would count in the binaries'
		// resident memory although no container has them.
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		cmd.Stdout, cmd.Stderr = progress, progress
		if err := cmd.Run(); err != nil {
			return nil, fmt.Errorf("building %s: %w", pkg, err)
		}
		out[name] = bin
	}
	return out, nil
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// WaitReady polls url until it answers 200, failing early if p exits.
func WaitReady(ctx context.Context, p *Process, url string) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if exited, err := p.Exited(); exited {
			return false, fmt.Errorf("%s exited (%v); see %s", p.Name, err, p.LogPath)
		}
		resp, err := http.Get(url)
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for %s to be ready at %s: %w", p.Name, url, err)
	}
	return nil
}

// EnsureKubeBinaries builds kube-apiserver and etcd (of KUBE_VERSION, v1.37.2
// by default) when they are not cached yet, and points KUBEBUILDER_ASSETS at
// them. hack/kube-binaries.sh builds them, writing a progress line to progress
// every 100 packages; it builds nothing else (no kubelet, controller-manager or
// scheduler, which only the real-node e2e runs).
func EnsureKubeBinaries(progress io.Writer) error {
	if dir, err := testenv.AssetsDir(); err == nil {
		return os.Setenv("KUBEBUILDER_ASSETS", dir)
	}
	cmd := exec.Command(filepath.Join(testenv.RepoRoot(), "hack", "kube-binaries.sh"))
	cmd.Stderr = progress
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("building kube-apiserver and etcd: %w", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return os.Setenv("KUBEBUILDER_ASSETS", lines[len(lines)-1])
}
