// Package heartbeattest starts a real kube-apiserver and etcd, with the
// upstream AddonInstance CRD installed, for tests of code that reports
// through the heartbeat SDK: an addon's own tests, and the SDK's.
//
// It runs the binaries it is given (kube-apiserver and etcd in
// KUBEBUILDER_ASSETS, as controller-runtime's envtest does) and depends on
// client-go alone, so that a module requiring the SDK is not made to require
// controller-runtime, or a version of it, for the SDK's tests. It reads the
// CRD from github.com/openshift/addon-operator@v1.14.0 through the go
// command (the module need not be in go.mod) unless given a file. On Linux
// the servers end with the test process even when it never calls Stop (it
// timed out, or was killed); Dir is then left in the temporary folder.
//
//	env, err := heartbeattest.Start(heartbeattest.Options{})
//	...
//	defer env.Stop()
//	reporter, err := heartbeat.New(env.Config, heartbeat.Options{...})
package heartbeattest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"
)

// The upstream AddonInstance CRD: the addon-operator's own, in its main
// module.
const (
	AddonOperatorModule  = "github.com/openshift/addon-operator"
	AddonOperatorVersion = "v1.14.0"
	AddonInstanceCRDFile = "config/deploy/addons.managed.openshift.io_addoninstances.yaml"
)

// Options of an environment.
type Options struct {
	// AssetsDir holds the kube-apiserver and etcd binaries;
	// $KUBEBUILDER_ASSETS when empty.
	AssetsDir string
	// CRDFiles are installed; the upstream AddonInstance CRD when empty.
	CRDFiles []string
	// APIServerFlags are added to kube-apiserver's ("name": "value",
	// without the dashes), replacing any of the same name.
	APIServerFlags map[string]string
	// StartTimeout bounds the start of each process; a minute when zero.
	StartTimeout time.Duration
}

// Environment is a running kube-apiserver and etcd.
type Environment struct {
	// Config reaches the API server as a cluster administrator
	// (system:masters).
	Config *rest.Config
	// Dir holds the processes' files and logs (apiserver.log, etcd.log);
	// Stop removes it.
	Dir string

	apiserver, etcd *process
}

// Start starts etcd and kube-apiserver on loopback ports and installs the
// CRDs. On error nothing is left running.
func Start(opts Options) (env *Environment, err error) {
	assets := cmpOr(opts.AssetsDir, os.Getenv("KUBEBUILDER_ASSETS"))
	if assets == "" {
		return nil, errors.New("heartbeattest: no kube-apiserver and etcd: set KUBEBUILDER_ASSETS or Options.AssetsDir")
	}
	timeout := opts.StartTimeout
	if timeout == 0 {
		timeout = time.Minute
	}
	crds := opts.CRDFiles
	if len(crds) == 0 {
		crd, err := AddonInstanceCRD()
		if err != nil {
			return nil, err
		}
		crds = []string{crd}
	}
	dir, err := os.MkdirTemp("", "heartbeattest-")
	if err != nil {
		return nil, fmt.Errorf("heartbeattest: %w", err)
	}
	env = &Environment{Dir: dir}
	defer func() {
		if err != nil {
			err = errors.Join(err, env.Stop())
			env = nil
		}
	}()

	ports, err := freePorts(3)
	if err != nil {
		return env, err
	}
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	peerURL := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	if env.etcd, err = start(filepath.Join(assets, "etcd"), filepath.Join(dir, "etcd.log"),
		"--data-dir="+filepath.Join(dir, "etcd"), "--name=default",
		"--listen-client-urls="+etcdURL, "--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=default="+peerURL, "--unsafe-no-fsync=true"); err != nil {
		return env, err
	}
	if err := waitHTTP(etcdURL+"/health", nil, env.etcd.done, timeout); err != nil {
		return env, fmt.Errorf("heartbeattest: etcd: %w (log: %s)", err, tail(filepath.Join(dir, "etcd.log")))
	}

	token, err := env.credentials()
	if err != nil {
		return env, err
	}
	port := strconv.Itoa(ports[2])
	flags := map[string]string{
		"etcd-servers":                     etcdURL,
		"bind-address":                     "127.0.0.1",
		"advertise-address":                "127.0.0.1",
		"secure-port":                      port,
		"cert-dir":                         filepath.Join(dir, "certs"),
		"token-auth-file":                  filepath.Join(dir, "tokens.csv"),
		"authorization-mode":               "RBAC",
		"service-account-issuer":           "https://kubernetes.default.svc",
		"service-account-key-file":         filepath.Join(dir, "sa.pub"),
		"service-account-signing-key-file": filepath.Join(dir, "sa.key"),
		"service-cluster-ip-range":         "10.0.0.0/24",
		"disable-admission-plugins":        "ServiceAccount",
		// No Endpoints for the kubernetes Service: it would need an
		// address other than loopback.
		"endpoint-reconciler-type": "none",
	}
	for k, v := range opts.APIServerFlags {
		flags[k] = v
	}
	args := make([]string, 0, len(flags))
	for k, v := range flags {
		args = append(args, "--"+k+"="+v)
	}
	if env.apiserver, err = start(filepath.Join(assets, "kube-apiserver"), filepath.Join(dir, "apiserver.log"), args...); err != nil {
		return env, err
	}
	host := "https://127.0.0.1:" + port
	// The serving certificate kube-apiserver makes for itself, in cert-dir,
	// carries the CA that signed it.
	ca := filepath.Join(dir, "certs", "apiserver.crt")
	if err := waitHTTP(host+"/readyz", &tlsFiles{ca: ca, token: token}, env.apiserver.done, timeout); err != nil {
		return env, fmt.Errorf("heartbeattest: kube-apiserver: %w (log: %s)", err, tail(filepath.Join(dir, "apiserver.log")))
	}
	env.Config = &rest.Config{Host: host, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAFile: ca},
		// Tests make many requests at once; the default limits would
		// make them wait on the client.
		QPS: 1000, Burst: 2000}
	for _, f := range crds {
		if err := env.installCRD(f, timeout); err != nil {
			return env, err
		}
	}
	return env, nil
}

// Stop stops kube-apiserver, then etcd, and removes Dir.
func (e *Environment) Stop() error {
	var errs []error
	for _, c := range []*process{e.apiserver, e.etcd} {
		if err := stop(c); err != nil {
			errs = append(errs, err)
		}
	}
	if e.Dir != "" {
		if err := os.RemoveAll(e.Dir); err != nil {
			errs = append(errs, fmt.Errorf("heartbeattest: %w", err))
		}
	}
	return errors.Join(errs...)
}

// AddonInstanceCRD downloads the addon-operator's module through the go
// command (or finds it in the module cache) and returns the path of its
// AddonInstance CRD.
func AddonInstanceCRD() (string, error) {
	cmd := exec.Command("go", "mod", "download", "-json", AddonOperatorModule+"@"+AddonOperatorVersion)
	cmd.Dir = os.TempDir() // outside any module: it need not be in go.mod
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("heartbeattest: go mod download %s@%s: %w: %s", AddonOperatorModule, AddonOperatorVersion, err, stderr.String())
	}
	var info struct{ Dir, Error string }
	if err := json.Unmarshal(out, &info); err != nil || info.Error != "" || info.Dir == "" {
		return "", fmt.Errorf("heartbeattest: go mod download %s@%s: %v %s", AddonOperatorModule, AddonOperatorVersion, err, info.Error)
	}
	return filepath.Join(info.Dir, AddonInstanceCRDFile), nil
}

// credentials writes the administrator's token and the service-account key
// pair, and returns the token.
func (e *Environment) credentials() (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("heartbeattest: %w", err)
	}
	token := hex.EncodeToString(b)
	if err := os.WriteFile(filepath.Join(e.Dir, "tokens.csv"), []byte(token+`,admin,admin,"system:masters"`+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("heartbeattest: %w", err)
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return "", fmt.Errorf("heartbeattest: %w", err)
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return "", fmt.Errorf("heartbeattest: %w", err)
	}
	files := map[string]*pem.Block{
		"sa.key": {Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)},
		"sa.pub": {Type: "PUBLIC KEY", Bytes: pub},
	}
	for name, block := range files {
		if err := os.WriteFile(filepath.Join(e.Dir, name), pem.EncodeToMemory(block), 0o600); err != nil {
			return "", fmt.Errorf("heartbeattest: %w", err)
		}
	}
	return token, nil
}

// installCRD creates the CRD of a YAML file and waits until it is
// established.
func (e *Environment) installCRD(file string, timeout time.Duration) error {
	raw, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("heartbeattest: reading CRD: %w", err)
	}
	body, err := yaml.YAMLToJSON(raw)
	if err != nil {
		return fmt.Errorf("heartbeattest: CRD %s: %w", file, err)
	}
	var meta struct {
		Metadata struct{ Name string } `json:"metadata"`
		Spec     struct {
			Group string
			Names struct{ Plural string }
			// Versions: the first served is listed until it answers.
			Versions []struct {
				Name   string
				Served bool
			}
		}
	}
	if err := json.Unmarshal(body, &meta); err != nil || meta.Metadata.Name == "" {
		return fmt.Errorf("heartbeattest: CRD %s has no name: %v", file, err)
	}
	list := ""
	for _, v := range meta.Spec.Versions {
		if v.Served {
			list = "/apis/" + meta.Spec.Group + "/" + v.Name + "/" + meta.Spec.Names.Plural
			break
		}
	}
	cfg := rest.CopyConfig(e.Config)
	cfg.GroupVersion = &schema.GroupVersion{Group: "apiextensions.k8s.io", Version: "v1"}
	cfg.APIPath = "/apis"
	cfg.NegotiatedSerializer = serializer.WithoutConversionCodecFactory{CodecFactory: serializer.NewCodecFactory(nil)}
	c, err := rest.RESTClientFor(cfg)
	if err != nil {
		return fmt.Errorf("heartbeattest: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := c.Post().Resource("customresourcedefinitions").SetHeader("Content-Type", "application/json").
		Body(body).Do(ctx).Error(); err != nil {
		return fmt.Errorf("heartbeattest: creating CRD %s: %w", meta.Metadata.Name, err)
	}
	// Established, and served: its storage answers a list (it answers 429
	// for a moment after it is established).
	for {
		out, err := c.Get().Resource("customresourcedefinitions").Name(meta.Metadata.Name).Do(ctx).Raw()
		if err == nil && established(out) {
			if list == "" {
				return nil
			}
			if err = c.Get().AbsPath(list).Param("limit", "1").Do(ctx).Error(); err == nil {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("heartbeattest: CRD %s not established: %w", meta.Metadata.Name, errors.Join(err, ctx.Err()))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func established(crd []byte) bool {
	var c struct {
		Status struct {
			Conditions []struct{ Type, Status string } `json:"conditions"`
		} `json:"status"`
	}
	if json.Unmarshal(crd, &c) != nil {
		return false
	}
	for _, cond := range c.Status.Conditions {
		if cond.Type == "Established" && cond.Status == "True" {
			return true
		}
	}
	return false
}

// process is a binary started by start.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when it has exited
}

// start runs a binary with its output to log.
func start(bin, log string, args ...string) (*process, error) {
	f, err := os.Create(log)
	if err != nil {
		return nil, fmt.Errorf("heartbeattest: %w", err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = serverAttr()
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("heartbeattest: starting %s: %w", bin, err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

// stop ends a process started by start: SIGTERM, then SIGKILL after 20s.
func stop(p *process) error {
	if p == nil {
		return nil
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(20 * time.Second):
	}
	_ = p.cmd.Process.Kill()
	<-p.done
	return fmt.Errorf("heartbeattest: %s did not stop within 20s: killed", filepath.Base(p.cmd.Path))
}

// tlsFiles authenticates a readiness probe.
type tlsFiles struct{ ca, token string }

// waitHTTP polls url until it answers 200, or the process serving it exits
// (exited), or timeout passes.
func waitHTTP(url string, auth *tlsFiles, exited <-chan struct{}, timeout time.Duration) error {
	client := http.DefaultClient
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return errors.New("it exited")
		default:
		}
		if auth != nil && client == http.DefaultClient {
			if _, err := os.Stat(auth.ca); err == nil {
				transport, err := rest.TransportFor(&rest.Config{TLSClientConfig: rest.TLSClientConfig{CAFile: auth.ca}, BearerToken: auth.token})
				if err != nil {
					return err
				}
				client = &http.Client{Transport: transport, Timeout: 5 * time.Second}
			} else {
				last = err
				time.Sleep(50 * time.Millisecond)
				continue
			}
		}
		resp, err := client.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("%s: %s", url, resp.Status)
		}
		last = err
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("not ready within %s: %w", timeout, last)
}

// freePorts reserves n loopback ports, releasing them just before use.
func freePorts(n int) ([]int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("heartbeattest: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// tail is the end of a log, for an error message.
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-15):], "\n")
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
