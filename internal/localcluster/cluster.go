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
	"strconv"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/addon-heartbeat/addon-heartbeat/internal/testenv"
	"github.com/addon-heartbeat/addon-heartbeat/pkg/certs"
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
	if err := os.WriteFile(c.Kubeconfig, kubeconfig, 0o600); err != nil {
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

// Build compiles the given packages of this module (such as ./cmd/webhook)
// into dir and returns the binaries' paths by base name.
func Build(dir string, progress io.Writer, pkgs ...string) (map[string]string, error) {
	out := map[string]string{}
	for _, pkg := range pkgs {
		name := filepath.Base(pkg)
		bin := filepath.Join(dir, name)
		fmt.Fprintf(progress, "building %s\n", pkg)
		cmd := exec.Command("go", "build", "-o", bin, pkg)
		cmd.Dir = testenv.RepoRoot()
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

// Webhook is the webhook binary running locally.
type Webhook struct {
	*Process
	bin        string
	args       []string
	Port       int
	HealthPort int
	MetricsURL string
	CABundle   []byte
}

// WebhookOptions are the flags the local webhook gets beyond its addresses.
type WebhookOptions struct {
	ReporterImage string
	ExtraArgs     []string
}

// StartWebhook writes a serving certificate for 127.0.0.1, starts the webhook
// binary on loopback, and waits until it reports ready.
func (c *Cluster) StartWebhook(ctx context.Context, bin string, o WebhookOptions, tee io.Writer) (*Webhook, error) {
	now := time.Now()
	ca, err := certs.NewCA("addon-heartbeat-local-ca", now, 24*time.Hour)
	if err != nil {
		return nil, err
	}
	serving, err := ca.Issue([]string{"127.0.0.1", "localhost"}, now, 24*time.Hour)
	if err != nil {
		return nil, err
	}
	certDir := filepath.Join(c.Dir, "webhook-certs")
	if err := os.MkdirAll(certDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating the cert folder: %w", err)
	}
	for name, data := range map[string][]byte{"tls.crt": serving.CertPEM, "tls.key": serving.KeyPEM} {
		if err := os.WriteFile(filepath.Join(certDir, name), data, 0o600); err != nil {
			return nil, fmt.Errorf("writing %s: %w", name, err)
		}
	}
	ports := make([]int, 3)
	for i := range ports {
		if ports[i], err = FreePort(); err != nil {
			return nil, err
		}
	}
	args := append([]string{
		"--kubeconfig=" + c.Kubeconfig,
		"--bind-host=127.0.0.1",
		"--port=" + strconv.Itoa(ports[0]),
		"--cert-dir=" + certDir,
		"--health-probe-bind-address=127.0.0.1:" + strconv.Itoa(ports[1]),
		"--metrics-bind-address=127.0.0.1:" + strconv.Itoa(ports[2]),
		"--reporter-image=" + o.ReporterImage,
	}, o.ExtraArgs...)
	p, err := StartProcess("webhook", filepath.Join(c.Dir, "webhook.log"), bin, args, nil, tee)
	if err != nil {
		return nil, err
	}
	w := &Webhook{Process: p, bin: bin, args: args, Port: ports[0], HealthPort: ports[1],
		MetricsURL: "http://127.0.0.1:" + strconv.Itoa(ports[2]) + "/metrics", CABundle: ca.CertPEM}
	if err := WaitReady(ctx, p, "http://127.0.0.1:"+strconv.Itoa(ports[1])+"/readyz"); err != nil {
		return nil, errors.Join(err, p.Stop(5*time.Second))
	}
	return w, nil
}

// Restart starts the webhook again after Stop, with the same certificate,
// ports and flags, and waits until it is ready.
func (w *Webhook) Restart(ctx context.Context) error {
	if exited, _ := w.Exited(); !exited {
		return fmt.Errorf("the webhook is still running (pid %d)", w.Pid())
	}
	p, err := StartProcess(w.Name, w.LogPath, w.bin, w.args, nil, nil)
	if err != nil {
		return err
	}
	w.Process = p
	return WaitReady(ctx, p, "http://127.0.0.1:"+strconv.Itoa(w.HealthPort)+"/readyz")
}

// Metric scrapes the webhook's /metrics and sums the samples of name.
func (w *Webhook) Metric(name string) (float64, error) { return scrapeSum(w.MetricsURL, name) }

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

// InstallWebhookConfiguration creates the webhook configuration from
// config/webhook/manifests.yaml, pointed at the local webhook with its CA.
func (c *Cluster) InstallWebhookConfiguration(ctx context.Context, w *Webhook) (*admissionregistrationv1.MutatingWebhookConfiguration, error) {
	data, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "config", "webhook", "manifests.yaml"))
	if err != nil {
		return nil, fmt.Errorf("reading the webhook configuration: %w", err)
	}
	var mwc admissionregistrationv1.MutatingWebhookConfiguration
	if err := yaml.UnmarshalStrict(data, &mwc); err != nil {
		return nil, fmt.Errorf("parsing the webhook configuration: %w", err)
	}
	for i := range mwc.Webhooks {
		cc := &mwc.Webhooks[i].ClientConfig
		url := fmt.Sprintf("https://127.0.0.1:%d%s", w.Port, *cc.Service.Path)
		cc.URL, cc.Service, cc.CABundle = &url, nil, w.CABundle
	}
	if err := c.Client.Create(ctx, &mwc); err != nil {
		return nil, fmt.Errorf("creating the webhook configuration: %w", err)
	}
	return &mwc, nil
}

// EnsureKubeBinaries builds kube-apiserver and etcd when they are not cached
// yet (hack/kube-binaries.sh, progress to progress) and points
// KUBEBUILDER_ASSETS at them.
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
