package localcluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/certs"
)

// ControlPlane is etcd and kube-apiserver run as plain processes on
// loopback, with certificates and credentials written once into Dir, so that
// the API server can be stopped and started again (same address, same CA,
// same tokens) while its clients keep running, as after a real API server
// restart.
type ControlPlane struct {
	Dir       string
	AssetsDir string
	// AuditLog, when set, is where the API server writes an audit log of
	// every request (metadata level), for counting what clients do.
	AuditLog string

	etcd, apiserver *Process
	apiPort         int
	etcdPort        int
	peerPort        int
	caPEM           []byte
	adminToken      string
	config          *rest.Config
}

const adminUser = "admin"

// StartControlPlane writes credentials into dir and starts etcd and the API
// server from the binaries in assetsDir.
func StartControlPlane(ctx context.Context, dir, assetsDir, auditLog string) (*ControlPlane, error) {
	cp := &ControlPlane{Dir: dir, AssetsDir: assetsDir, AuditLog: auditLog, adminToken: "admin-" + strconv.FormatInt(time.Now().UnixNano(), 36)}
	var err error
	for _, p := range []*int{&cp.apiPort, &cp.etcdPort, &cp.peerPort} {
		if *p, err = FreePort(); err != nil {
			return nil, err
		}
	}
	if err := cp.writeCredentials(); err != nil {
		return nil, err
	}
	if err := cp.startEtcd(); err != nil {
		return nil, err
	}
	if err := cp.StartAPIServer(ctx); err != nil {
		return nil, errors.Join(err, cp.etcd.Stop(10*time.Second))
	}
	return cp, nil
}

func (cp *ControlPlane) path(name string) string { return filepath.Join(cp.Dir, name) }

func (cp *ControlPlane) writeCredentials() error {
	now := time.Now()
	ca, err := certs.NewCA("addon-heartbeat-local-apiserver-ca", now, 7*24*time.Hour)
	if err != nil {
		return err
	}
	serving, err := ca.Issue([]string{"127.0.0.1", "localhost"}, now, 7*24*time.Hour)
	if err != nil {
		return err
	}
	// The service-account signing key: any key pair will do.
	sa, err := ca.Issue([]string{"service-accounts"}, now, 7*24*time.Hour)
	if err != nil {
		return err
	}
	cp.caPEM = ca.CertPEM
	files := map[string][]byte{
		"ca.crt":            ca.CertPEM,
		"apiserver.crt":     serving.CertPEM,
		"apiserver.key":     serving.KeyPEM,
		"sa.key":            sa.KeyPEM,
		"sa.crt":            sa.CertPEM,
		"tokens.csv":        []byte(cp.adminToken + "," + adminUser + ",admin-uid,system:masters\n"),
		"audit-policy.yaml": []byte("apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n"),
	}
	for name, data := range files {
		if err := os.WriteFile(cp.path(name), data, 0o600); err != nil {
			return fmt.Errorf("writing %s: %w", name, err)
		}
	}
	return nil
}

func (cp *ControlPlane) startEtcd() error {
	peer := "http://127.0.0.1:" + strconv.Itoa(cp.peerPort)
	client := "http://127.0.0.1:" + strconv.Itoa(cp.etcdPort)
	args := []string{
		"--name=default",
		"--data-dir=" + cp.path("etcd"),
		"--listen-client-urls=" + client, "--advertise-client-urls=" + client,
		"--listen-peer-urls=" + peer, "--initial-advertise-peer-urls=" + peer,
		"--initial-cluster=default=" + peer,
		"--unsafe-no-fsync=true", // test data only: durability is not the point
		"--log-level=warn",
	}
	p, err := StartProcess("etcd", cp.path("etcd.log"), filepath.Join(cp.AssetsDir, "etcd"), args, nil, nil)
	if err != nil {
		return err
	}
	cp.etcd = p
	return nil
}

// StartAPIServer starts (or starts again) kube-apiserver and waits until it
// is ready.
func (cp *ControlPlane) StartAPIServer(ctx context.Context) error {
	args := []string{
		"--etcd-servers=http://127.0.0.1:" + strconv.Itoa(cp.etcdPort),
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
		// No kubelet or kube-proxy: nothing would use the kubernetes Service's
		// endpoints, and a loopback address may not be published in them.
		"--endpoint-reconciler-type=none",
		"--secure-port=" + strconv.Itoa(cp.apiPort),
		"--cert-dir=" + cp.path("apiserver-certs"),
		"--tls-cert-file=" + cp.path("apiserver.crt"), "--tls-private-key-file=" + cp.path("apiserver.key"),
		"--client-ca-file=" + cp.path("ca.crt"),
		"--token-auth-file=" + cp.path("tokens.csv"),
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://127.0.0.1:" + strconv.Itoa(cp.apiPort),
		"--service-account-key-file=" + cp.path("sa.key"),
		"--service-account-signing-key-file=" + cp.path("sa.key"),
		"--service-cluster-ip-range=10.0.0.0/24",
		"--disable-admission-plugins=ServiceAccount",
		"--allow-privileged=true",
	}
	if cp.AuditLog != "" {
		args = append(args, "--audit-policy-file="+cp.path("audit-policy.yaml"), "--audit-log-path="+cp.AuditLog,
			"--audit-log-mode=blocking", "--audit-log-format=json")
	}
	p, err := StartProcess("kube-apiserver", cp.path("kube-apiserver.log"), filepath.Join(cp.AssetsDir, "kube-apiserver"), args, nil, nil)
	if err != nil {
		return err
	}
	cp.apiserver = p
	if err := cp.waitReady(ctx); err != nil {
		return errors.Join(err, p.Stop(10*time.Second))
	}
	return nil
}

// apiserverGrace is how long kube-apiserver gets after SIGTERM. It waits
// for open watches to end before it exits, and its clients' watches do not
// end by themselves; like a kubelet after a pod's grace period, Stop then
// kills it, which clients must survive just the same.
const apiserverGrace = 5 * time.Second

// StopAPIServer stops kube-apiserver, keeping etcd and every credential.
func (cp *ControlPlane) StopAPIServer() error {
	if cp.apiserver == nil {
		return nil
	}
	err := cp.apiserver.Stop(apiserverGrace)
	cp.apiserver = nil
	if errors.Is(err, ErrKilled) {
		return nil
	}
	return err
}

// Stop stops the API server, then etcd.
func (cp *ControlPlane) Stop() error {
	errs := []error{cp.StopAPIServer()}
	if cp.etcd != nil {
		errs = append(errs, cp.etcd.Stop(10*time.Second))
	}
	return errors.Join(errs...)
}

// Config is an admin client configuration.
func (cp *ControlPlane) Config() *rest.Config {
	return &rest.Config{
		Host:            "https://127.0.0.1:" + strconv.Itoa(cp.apiPort),
		BearerToken:     cp.adminToken,
		TLSClientConfig: rest.TLSClientConfig{CAData: cp.caPEM},
		QPS:             200, Burst: 400,
	}
}

// Kubeconfig returns an admin kubeconfig file's content.
func (cp *ControlPlane) Kubeconfig() ([]byte, error) {
	return cp.kubeconfigFor(adminUser, cp.adminToken)
}

func (cp *ControlPlane) kubeconfigFor(user, token string) ([]byte, error) {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["local"] = &clientcmdapi.Cluster{Server: cp.Config().Host, CertificateAuthorityData: cp.caPEM}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["local"] = &clientcmdapi.Context{Cluster: "local", AuthInfo: user}
	cfg.CurrentContext = "local"
	return clientcmd.Write(*cfg)
}

func (cp *ControlPlane) waitReady(ctx context.Context) error {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(cp.caPEM)
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	defer hc.CloseIdleConnections()
	url := cp.Config().Host + "/readyz"
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	err := wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if exited, err := cp.apiserver.Exited(); exited {
			return false, fmt.Errorf("kube-apiserver exited (%v): %s", err, tail(cp.apiserver.LogPath, 20))
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		req.Header.Set("Authorization", "Bearer "+cp.adminToken)
		resp, err := hc.Do(req)
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for kube-apiserver to be ready: %w", err)
	}
	return nil
}

// tail returns the last n lines of a log file, for error messages about a
// process whose folder is removed on the way out.
func tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
