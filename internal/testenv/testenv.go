// Package testenv starts a real kube-apiserver and etcd (controller-runtime
// envtest) for the project's tests, with the upstream AddonInstance CRD
// installed. The binaries come from hack/kube-binaries.sh (make
// envtest-assets), built from the Go module proxy into a cache folder outside
// the checkout.
package testenv

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	addonsv1alpha1 "github.com/openshift/addon-operator/apis/addons/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// Versions of the binaries and of the upstream modules that carry CRDs. They
// match hack/kube-binaries.sh and the Makefile. KubeVersion is the default
// release; KUBE_VERSION picks another (make test-matrix).
const (
	KubeVersion          = "v1.37.2"
	EtcdVersion          = "v3.6.16"
	AddonOperatorModule  = "github.com/openshift/addon-operator"
	AddonOperatorVersion = "v1.14.0"
	// AddonInstanceCRDFile is the upstream CRD, relative to the operator module.
	AddonInstanceCRDFile = "config/deploy/addons.managed.openshift.io_addoninstances.yaml"
)

// Scheme has the built-in types and the AddonInstance API.
func Scheme() *k8sruntime.Scheme {
	s := k8sruntime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(addonsv1alpha1.AddToScheme(s))
	return s
}

// modulePath is the main module's path, as its go.mod says.
const modulePath = "github.com/addon-heartbeat/addon-heartbeat"

// RepoRoot is the checkout's root folder: where this source file was
// compiled from or, in a binary built with -trimpath (make demo's driver),
// whose source paths are module paths, the working directory or the nearest
// folder above it whose go.mod is this module's.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	wd, err := os.Getwd()
	if err != nil {
		wd = "."
	}
	return repoRoot(file, wd)
}

// repoRoot is RepoRoot for this file compiled as file, run in folder wd.
func repoRoot(file, wd string) string {
	if filepath.IsAbs(file) {
		return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		if data, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && declaresModule(data, modulePath) {
			return dir
		}
		if filepath.Dir(dir) == dir {
			return wd
		}
	}
}

// declaresModule tells whether a go.mod file's module directive names path.
func declaresModule(gomod []byte, path string) bool {
	for line := range strings.SplitSeq(string(gomod), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "module" {
			return strings.Trim(f[1], `"`) == path
		}
	}
	return false
}

// CacheDir is the folder outside the checkout where hack/*.sh build the
// binaries the tests run: ADDON_HEARTBEAT_CACHE, or addon-heartbeat in the
// user's cache folder.
func CacheDir() (string, error) {
	if cache := os.Getenv("ADDON_HEARTBEAT_CACHE"); cache != "" {
		return cache, nil
	}
	base, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("locating the cache folder: %w", err)
	}
	return filepath.Join(base, "addon-heartbeat"), nil
}

// AssetsDir returns KUBEBUILDER_ASSETS, or the cache folder that
// hack/kube-binaries.sh writes for KUBE_VERSION (KubeVersion when unset),
// when it holds the binaries.
func AssetsDir() (string, error) {
	if dir := os.Getenv("KUBEBUILDER_ASSETS"); dir != "" {
		return dir, nil
	}
	cache, err := CacheDir()
	if err != nil {
		return "", err
	}
	version := cmp.Or(os.Getenv("KUBE_VERSION"), KubeVersion)
	dir := filepath.Join(cache, "bin", "k8s-"+version+"-etcd-"+EtcdVersion)
	for _, bin := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(dir, bin)); err != nil {
			return "", fmt.Errorf("no %s in %s: run `make envtest-assets KUBE_VERSION=%s` or set KUBEBUILDER_ASSETS: %w", bin, dir, version, err)
		}
	}
	return dir, nil
}

// ModuleDir downloads module@version through the Go module proxy (or finds it
// in the module cache) and returns its folder. The module need not be in
// go.mod.
func ModuleDir(module, version string) (string, error) {
	cmd := exec.Command("go", "mod", "download", "-json", module+"@"+version)
	cmd.Dir = RepoRoot()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go mod download %s@%s: %w: %s", module, version, err, stderr.String())
	}
	var info struct{ Dir, Error string }
	if err := json.Unmarshal(out, &info); err != nil {
		return "", fmt.Errorf("reading go mod download output for %s@%s: %w", module, version, err)
	}
	if info.Error != "" || info.Dir == "" {
		return "", fmt.Errorf("go mod download %s@%s: %s", module, version, info.Error)
	}
	return info.Dir, nil
}

// AddonInstanceCRD is the path of the upstream AddonInstance CRD.
func AddonInstanceCRD() (string, error) {
	dir, err := ModuleDir(AddonOperatorModule, AddonOperatorVersion)
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, AddonInstanceCRDFile), nil
}

// Options select what a test environment has beyond the API server.
type Options struct {
	// CRDPaths are extra CRD files or folders to install.
	CRDPaths []string
	// WebhookPaths are MutatingWebhookConfiguration manifests that envtest
	// installs, pointing their clientConfig at a local serving port with a
	// generated CA (see envtest.WebhookInstallOptions).
	WebhookPaths []string
	// APIServerArgs are set on the kube-apiserver in addition to envtest's.
	APIServerArgs map[string]string
}

// Environment is a started kube-apiserver and etcd (envtest's), which end
// with this process should it end without Stop (see reaper).
type Environment struct {
	*envtest.Environment
	reaper *reaper
}

// Stop stops kube-apiserver and etcd.
func (e *Environment) Stop() error {
	err := e.Environment.Stop()
	e.reaper.Stop()
	return err
}

// Start starts etcd and kube-apiserver with the AddonInstance CRD installed.
// Stop the returned environment with Stop.
func Start(opts Options) (*Environment, error) {
	assets, err := AssetsDir()
	if err != nil {
		return nil, err
	}
	crd, err := AddonInstanceCRD()
	if err != nil {
		return nil, err
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		Scheme:                Scheme(),
		CRDDirectoryPaths:     append([]string{crd}, opts.CRDPaths...),
		ErrorIfCRDPathMissing: true,
		WebhookInstallOptions: envtest.WebhookInstallOptions{Paths: opts.WebhookPaths},
	}
	args := env.ControlPlane.GetAPIServer().Configure()
	for k, v := range opts.APIServerArgs {
		args.Set(k, v)
	}
	before, err := childrenNamed(serverNames...)
	if err != nil {
		return nil, err
	}
	_, err = env.Start()
	// Watched even when Start failed part way: whatever it started and
	// Stop does not end goes with this process.
	started, lerr := childrenNamed(serverNames...)
	var r *reaper
	if fresh := slices.DeleteFunc(started, func(pid int) bool { return slices.Contains(before, pid) }); lerr == nil && len(fresh) > 0 {
		var dirs []string
		for _, pid := range fresh {
			dirs = append(dirs, serverDirs(pid)...)
		}
		r, lerr = reapOnExit(fresh, dirs)
	}
	e := &Environment{Environment: env, reaper: r}
	if err != nil {
		return nil, errors.Join(fmt.Errorf("starting kube-apiserver and etcd from %s: %w", assets, err), e.Stop())
	}
	if lerr != nil {
		return nil, errors.Join(lerr, e.Stop())
	}
	return e, nil
}

// serverNames are the command names of the servers envtest starts.
var serverNames = []string{"kube-apiserver", "etcd"}

// CreateAddon creates what the addon-operator gives an addon: a namespace
// (a generated name, "addon-...") holding an AddonInstance named instance
// that asks for a heartbeat every period. It returns the namespace.
func CreateAddon(ctx context.Context, c client.Client, instance string, period time.Duration) (string, error) {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "addon-"}}
	if err := c.Create(ctx, ns); err != nil {
		return "", fmt.Errorf("creating the addon's namespace: %w", err)
	}
	ai := &addonsv1alpha1.AddonInstance{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: instance},
		Spec:       addonsv1alpha1.AddonInstanceSpec{HeartbeatUpdatePeriod: metav1.Duration{Duration: period}},
	}
	if err := c.Create(ctx, ai); err != nil {
		return "", fmt.Errorf("creating AddonInstance %s/%s: %w", ns.Name, instance, err)
	}
	return ns.Name, nil
}
