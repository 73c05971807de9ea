// Package nodecluster runs a real single-node Kubernetes cluster on this
// machine for the real-node end-to-end test: containerd, runc and the CNI
// bridge plugin from the distribution, etcd and the Kubernetes binaries that
// hack/kube-binaries.sh builds, all inside a network namespace of its own
// and with every piece of state in one temporary folder. Stop leaves the
// host as it was: no process, mount, network namespace, shim socket, cgroup
// or file.
package nodecluster

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/certs"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/addon-heartbeat/addon-heartbeat/internal/localcluster"
	"github.com/addon-heartbeat/addon-heartbeat/internal/testcerts"
	"github.com/addon-heartbeat/addon-heartbeat/internal/testenv"
)

// NodeName is the one node's name.
const NodeName = "ahb-node"

// Options of a cluster.
type Options struct {
	// AssetsDir holds kube-apiserver, kube-controller-manager,
	// kube-scheduler, kubelet and etcd (hack/kube-binaries.sh).
	AssetsDir string
	// Images are image tarballs to import into containerd before kubelet
	// starts.
	Images []string
	// PauseImage is the sandbox image, one of Images.
	PauseImage string
	// Log receives progress lines; nil for none.
	Log io.Writer
	// AuditPolicy, when set, is an audit.k8s.io/v1 Policy (YAML) the API
	// server logs by, as JSON lines, to AuditLogPath, each event written
	// before the response is sent (blocking mode), so that the log has
	// every request answered by the time a client saw the answer.
	AuditPolicy string
}

// AuditLogPath is where the API server writes its audit log (Options.AuditPolicy).
func (c *Cluster) AuditLogPath() string { return c.path("logs", "audit.log") }

// Cluster is a running single-node cluster.
type Cluster struct {
	Dir     string
	NetNS   *NetNS
	Network Network
	// Config is an admin client configuration that dials inside the
	// namespace.
	Config *rest.Config
	Client client.Client
	// Kubeconfig is an admin kubeconfig file for kubectl and helm run inside
	// the namespace (NetNS.Command).
	Kubeconfig string
	// Timings are how long each start-up step took.
	Timings []Timing

	o           Options
	id          string
	cgroupRoot  string
	containerd  *localcluster.Process
	etcd        *localcluster.Process
	apiserver   *localcluster.Process
	controllers *localcluster.Process
	scheduler   *localcluster.Process
	kubelet     *localcluster.Process
	extra       []*localcluster.Process
	files       map[string]bool
	adminToken  string
	caPEM       []byte
}

// Timing is one step's duration.
type Timing struct {
	Step     string
	Duration time.Duration
}

func (c *Cluster) logf(format string, args ...any) {
	if c.o.Log != nil {
		fmt.Fprintf(c.o.Log, "nodecluster: "+format+"\n", args...)
	}
}

func (c *Cluster) step(name string, f func() error) error {
	start := time.Now()
	err := f()
	d := time.Since(start)
	c.Timings = append(c.Timings, Timing{name, d})
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	c.logf("%s: %s", name, d.Round(time.Millisecond))
	return nil
}

// Start starts the cluster and waits until the node is Ready. On error it
// has already cleaned up what it started.
func Start(ctx context.Context, o Options) (c *Cluster, err error) {
	idBytes := make([]byte, 3)
	if _, err := rand.Read(idBytes); err != nil {
		return nil, err
	}
	c = &Cluster{o: o, id: hex.EncodeToString(idBytes), Network: DefaultNetwork, files: fileTree()}
	c.cgroupRoot = "/ahb-" + c.id
	if c.Dir, err = os.MkdirTemp("", "ahb-node-"); err != nil {
		return nil, fmt.Errorf("creating the state folder: %w", err)
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, c.Stop(context.WithoutCancel(ctx)))
		}
	}()
	for _, d := range []string{"logs", "pki", "cni/net.d", "cni/ipam", "containerd", "kubelet/pod-logs", "kubelet/volume-plugins", "kubelet/root", "kubelet/certs", "apiserver-certs", "controller-manager-certs"} {
		if err := os.MkdirAll(c.path(d), 0o755); err != nil {
			return c, err
		}
	}
	if err := c.step("network namespace", func() error {
		c.NetNS, err = createNetNS(ctx, "ahb-"+c.id, c.Network)
		return err
	}); err != nil {
		return c, err
	}
	if err := c.step("containerd", func() error { return c.startContainerd(ctx) }); err != nil {
		return c, err
	}
	if err := c.step("image import", func() error { return c.importImages(ctx, o.Images...) }); err != nil {
		return c, err
	}
	if err := c.step("credentials", c.writeCredentials); err != nil {
		return c, err
	}
	if err := c.step("etcd and kube-apiserver", func() error { return c.startControlPlane(ctx) }); err != nil {
		return c, err
	}
	if err := c.step("controller-manager, scheduler, kubelet; node Ready", func() error { return c.startNode(ctx) }); err != nil {
		return c, err
	}
	return c, nil
}

func (c *Cluster) path(elem ...string) string {
	return filepath.Join(append([]string{c.Dir}, elem...)...)
}

// start runs bin inside the namespace with its log in logs/<name>.log.
func (c *Cluster) start(name, bin string, args []string, env ...string) (*localcluster.Process, error) {
	nbin, nargs := c.NetNS.Wrap(bin, args)
	return localcluster.StartProcess(name, c.path("logs", name+".log"), nbin, nargs, env, nil)
}

// StartProcess runs bin inside the cluster's network namespace (so that it
// reaches the API server at 127.0.0.1 and the API server reaches it there)
// with its log in LogPath(name), and stops it with the cluster, after the
// workloads are deleted and before the kubelet: for a test's own admission
// webhook, for example.
func (c *Cluster) StartProcess(name, bin string, args ...string) (*localcluster.Process, error) {
	p, err := c.start(name, bin, args)
	if err != nil {
		return nil, err
	}
	c.extra = append(c.extra, p)
	return p, nil
}

// LogPath is the log file of a component (containerd, etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler, kubelet).
func (c *Cluster) LogPath(name string) string { return c.path("logs", name+".log") }

// Tail is the last n lines of a component's log.
func (c *Cluster) Tail(name string, n int) string {
	data, err := os.ReadFile(c.LogPath(name))
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

func (c *Cluster) containerdSock() string { return c.path("containerd", "containerd.sock") }

func (c *Cluster) startContainerd(ctx context.Context) error {
	cni := cniConfig("ahb-"+c.id, c.Dir, c.Network)
	if err := os.WriteFile(c.path("cni", "net.d", "10-ahb.conflist"), []byte(cni), 0o644); err != nil {
		return err
	}
	cfg := c.path("containerd", "config.toml")
	if err := os.WriteFile(cfg, []byte(containerdConfig(c.Dir, c.o.PauseImage)), 0o644); err != nil {
		return err
	}
	p, err := c.start("containerd", "containerd", []string{"--config", cfg})
	if err != nil {
		return err
	}
	c.containerd = p
	return c.poll(ctx, 30*time.Second, "containerd", p, func(ctx context.Context) (bool, error) {
		return c.Ctr(ctx, "version") == nil, nil
	})
}

// Ctr runs ctr against the cluster's containerd in the k8s.io namespace.
func (c *Cluster) Ctr(ctx context.Context, args ...string) error {
	_, err := c.CtrOutput(ctx, args...)
	return err
}

// CtrOutput runs ctr and returns its output.
func (c *Cluster) CtrOutput(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "ctr", append([]string{"--address", c.containerdSock(), "-n", "k8s.io"}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

func (c *Cluster) importImages(ctx context.Context, tarballs ...string) error {
	for _, t := range tarballs {
		if err := c.Ctr(ctx, "images", "import", t); err != nil {
			return err
		}
	}
	return nil
}

// ImportImages imports image tarballs into the node's containerd.
func (c *Cluster) ImportImages(ctx context.Context, tarballs ...string) error {
	return c.importImages(ctx, tarballs...)
}

// Users of the cluster's static tokens.
const (
	adminUser      = "admin"
	controllerUser = "system:kube-controller-manager"
	schedulerUser  = "system:kube-scheduler"
	nodeUser       = "system:node:" + NodeName
)

func (c *Cluster) writeCredentials() error {
	now := time.Now()
	ca, err := certs.NewCA("addon-heartbeat-node-ca", now, pkiValidity)
	if err != nil {
		return err
	}
	c.caPEM = ca.CertPEM
	n := c.Network
	serving, err := testcerts.Issue(ca, testcerts.Subject{CommonName: "kube-apiserver", Names: []string{
		"127.0.0.1", n.NodeIP, n.APIServiceIP, "localhost", "kubernetes", "kubernetes.default",
		"kubernetes.default.svc", "kubernetes.default.svc.cluster.local",
	}, Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}, now, pkiValidity)
	if err != nil {
		return err
	}
	kubeletClient, err := testcerts.Issue(ca, testcerts.Subject{CommonName: "kube-apiserver-kubelet-client", Organizations: []string{"kubelet-api-clients"},
		Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, now, pkiValidity)
	if err != nil {
		return err
	}
	kubeletServing, err := testcerts.Issue(ca, testcerts.Subject{CommonName: NodeName, Names: []string{n.NodeIP, NodeName},
		Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}, now, pkiValidity)
	if err != nil {
		return err
	}
	saKey, saPub, err := serviceAccountKey()
	if err != nil {
		return err
	}
	tokens := map[string]string{}
	var csv strings.Builder
	for _, u := range []struct{ user, groups string }{
		{adminUser, "system:masters"}, {controllerUser, ""}, {schedulerUser, ""}, {nodeUser, "system:nodes"},
	} {
		b := make([]byte, 16)
		if _, err := rand.Read(b); err != nil {
			return err
		}
		tokens[u.user] = hex.EncodeToString(b)
		fmt.Fprintf(&csv, "%s,%s,%s,%q\n", tokens[u.user], u.user, u.user, u.groups)
	}
	c.adminToken = tokens[adminUser]
	files := map[string][]byte{
		"pki/ca.crt": ca.CertPEM, "pki/ca.key": ca.KeyPEM,
		"pki/apiserver.crt": serving.CertPEM, "pki/apiserver.key": serving.KeyPEM,
		"pki/kubelet-client.crt": kubeletClient.CertPEM, "pki/kubelet-client.key": kubeletClient.KeyPEM,
		"kubelet/certs/kubelet.crt": kubeletServing.CertPEM, "kubelet/certs/kubelet.key": kubeletServing.KeyPEM,
		"pki/sa.key": saKey, "pki/sa.pub": saPub,
		"pki/tokens.csv": []byte(csv.String()),
		"resolv.conf":    []byte("nameserver " + n.NodeIP + "\n"),
	}
	for user, file := range map[string]string{adminUser: "admin.kubeconfig", controllerUser: "controller-manager.kubeconfig", schedulerUser: "scheduler.kubeconfig", nodeUser: "kubelet.kubeconfig"} {
		if files[file], err = c.kubeconfig(user, tokens[user]); err != nil {
			return err
		}
	}
	for name, data := range files {
		if err := os.WriteFile(c.path(name), data, 0o600); err != nil {
			return err
		}
	}
	c.Kubeconfig = c.path("admin.kubeconfig")
	return nil
}

func (c *Cluster) kubeconfig(user, token string) ([]byte, error) {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["node"] = &clientcmdapi.Cluster{Server: c.apiURL(), CertificateAuthorityData: c.caPEM}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["node"] = &clientcmdapi.Context{Cluster: "node", AuthInfo: user}
	cfg.CurrentContext = "node"
	return clientcmd.Write(*cfg)
}

// apiURL is the API server's address inside the namespace.
func (c *Cluster) apiURL() string { return "https://127.0.0.1:" + strconv.Itoa(APIServerPort) }

func (c *Cluster) startControlPlane(ctx context.Context) error {
	var err error
	c.etcd, err = c.start("etcd", filepath.Join(c.o.AssetsDir, "etcd"), []string{
		"--name=node", "--data-dir=" + c.path("etcd"),
		"--listen-client-urls=http://127.0.0.1:2379", "--advertise-client-urls=http://127.0.0.1:2379",
		"--listen-peer-urls=http://127.0.0.1:2380", "--initial-advertise-peer-urls=http://127.0.0.1:2380",
		"--initial-cluster=node=http://127.0.0.1:2380", "--listen-metrics-urls=",
		"--unsafe-no-fsync=true", "--log-level=warn",
	})
	if err != nil {
		return err
	}
	args := []string{
		"--etcd-servers=http://127.0.0.1:2379",
		"--bind-address=0.0.0.0", "--secure-port=" + strconv.Itoa(APIServerPort),
		"--advertise-address=" + c.Network.NodeIP,
		"--cert-dir=" + c.path("apiserver-certs"),
		"--tls-cert-file=" + c.path("pki", "apiserver.crt"), "--tls-private-key-file=" + c.path("pki", "apiserver.key"),
		"--client-ca-file=" + c.path("pki", "ca.crt"),
		"--token-auth-file=" + c.path("pki", "tokens.csv"),
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + c.path("pki", "sa.pub"),
		"--service-account-signing-key-file=" + c.path("pki", "sa.key"),
		"--service-cluster-ip-range=" + c.Network.ServiceCIDR,
		// No kube-proxy: the API server reaches webhook Services through
		// their endpoints.
		"--enable-aggregator-routing=true",
		"--kubelet-client-certificate=" + c.path("pki", "kubelet-client.crt"),
		"--kubelet-client-key=" + c.path("pki", "kubelet-client.key"),
		"--kubelet-certificate-authority=" + c.path("pki", "ca.crt"),
		"--kubelet-preferred-address-types=InternalIP",
		"--profiling=false",
	}
	if c.o.AuditPolicy != "" {
		if err := os.WriteFile(c.path("audit-policy.yaml"), []byte(c.o.AuditPolicy), 0o644); err != nil {
			return fmt.Errorf("writing the audit policy: %w", err)
		}
		args = append(args, "--audit-policy-file="+c.path("audit-policy.yaml"), "--audit-log-path="+c.AuditLogPath(),
			"--audit-log-mode=blocking", "--audit-log-format=json", "--audit-log-maxsize=0")
	}
	c.apiserver, err = c.start("kube-apiserver", filepath.Join(c.o.AssetsDir, "kube-apiserver"), args)
	if err != nil {
		return err
	}
	c.Config = &rest.Config{
		Host:            c.apiURL(),
		BearerToken:     c.adminToken,
		TLSClientConfig: rest.TLSClientConfig{CAData: c.caPEM},
		Dial:            c.NetNS.DialContext,
		QPS:             100, Burst: 200,
	}
	hc, err := rest.HTTPClientFor(c.Config)
	if err != nil {
		return err
	}
	defer hc.CloseIdleConnections()
	if err := c.poll(ctx, 90*time.Second, "kube-apiserver", c.apiserver, func(ctx context.Context) (bool, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.apiURL()+"/readyz", nil)
		resp, err := hc.Do(req)
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	}); err != nil {
		return err
	}
	c.Client, err = client.New(c.Config, client.Options{Scheme: testenv.Scheme()})
	return err
}

func (c *Cluster) startNode(ctx context.Context) error {
	var err error
	c.controllers, err = c.start("kube-controller-manager", filepath.Join(c.o.AssetsDir, "kube-controller-manager"), []string{
		"--kubeconfig=" + c.path("controller-manager.kubeconfig"),
		"--authentication-kubeconfig=" + c.path("controller-manager.kubeconfig"),
		"--authorization-kubeconfig=" + c.path("controller-manager.kubeconfig"),
		"--bind-address=127.0.0.1", "--cert-dir=" + c.path("controller-manager-certs"),
		"--leader-elect=false",
		"--use-service-account-credentials=true",
		"--root-ca-file=" + c.path("pki", "ca.crt"),
		"--service-account-private-key-file=" + c.path("pki", "sa.key"),
		"--cluster-signing-cert-file=" + c.path("pki", "ca.crt"),
		"--cluster-signing-key-file=" + c.path("pki", "ca.key"),
		"--allocate-node-cidrs=false",
		"--service-cluster-ip-range=" + c.Network.ServiceCIDR,
		"--profiling=false",
	})
	if err != nil {
		return err
	}
	c.scheduler, err = c.start("kube-scheduler", filepath.Join(c.o.AssetsDir, "kube-scheduler"), []string{
		"--kubeconfig=" + c.path("scheduler.kubeconfig"),
		"--authentication-kubeconfig=" + c.path("scheduler.kubeconfig"),
		"--authorization-kubeconfig=" + c.path("scheduler.kubeconfig"),
		"--bind-address=127.0.0.1", "--leader-elect=false", "--profiling=false",
	})
	if err != nil {
		return err
	}
	if err := createCgroups(c.cgroupRoot); err != nil {
		return err
	}
	cfg := c.path("kubelet", "config.yaml")
	if err := os.WriteFile(cfg, []byte(kubeletConfig(c.Dir, c.cgroupRoot, c.containerdSock(), c.Network)), 0o644); err != nil {
		return err
	}
	wrapper, err := c.kubeletMountNamespace()
	if err != nil {
		return err
	}
	c.kubelet, err = c.start("kubelet", "unshare", append([]string{"--mount", "--propagation", "unchanged", "--", "/bin/sh", wrapper, filepath.Join(c.o.AssetsDir, "kubelet")}, []string{
		"--config=" + cfg,
		"--kubeconfig=" + c.path("kubelet.kubeconfig"),
		"--root-dir=" + c.path("kubelet", "root"),
		"--cert-dir=" + c.path("kubelet", "certs"),
		"--tls-cert-file=" + c.path("kubelet", "certs", "kubelet.crt"),
		"--tls-private-key-file=" + c.path("kubelet", "certs", "kubelet.key"),
		"--hostname-override=" + NodeName,
		"--node-ip=" + c.Network.NodeIP,
		"--v=1",
	}...))
	if err != nil {
		return err
	}
	return c.poll(ctx, 120*time.Second, "kubelet", c.kubelet, func(ctx context.Context) (bool, error) {
		var node corev1.Node
		if err := c.Client.Get(ctx, client.ObjectKey{Name: NodeName}, &node); err != nil {
			return false, nil
		}
		for _, cond := range node.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				return cond.Status == corev1.ConditionTrue, nil
			}
		}
		return false, nil
	})
}

// poll waits for ok, failing early with the log's tail when p exits.
func (c *Cluster) poll(ctx context.Context, timeout time.Duration, name string, p *localcluster.Process, ok func(context.Context) (bool, error)) error {
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		if exited, err := p.Exited(); exited {
			return false, fmt.Errorf("%s exited (%v):\n%s", name, err, c.Tail(name, 30))
		}
		return ok(ctx)
	})
	if err != nil && !strings.Contains(err.Error(), "exited") {
		return fmt.Errorf("waiting for %s: %w\n%s", name, err, c.Tail(name, 30))
	}
	return err
}

// KubeletRoot is the kubelet's root folder (pods' volumes are below it).
func (c *Cluster) KubeletRoot() string { return c.path("kubelet", "root") }
