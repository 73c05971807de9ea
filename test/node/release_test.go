//go:build node

package node

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	addonsv1alpha1 "github.com/openshift/addon-operator/apis/addons/v1alpha1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/addon-heartbeat/addon-heartbeat/internal/images"
	ahbrelease "github.com/addon-heartbeat/addon-heartbeat/internal/release"
	"github.com/addon-heartbeat/addon-heartbeat/internal/testenv"
)

// The previous release, which the upgrade starts from. v0.1.0 is commit
// 2f4a617 (CHANGELOG.md): the last commit before releases were built, whose
// chart and images already called themselves v0.1.0; every installation
// made from the repository until then ran that code or an earlier state of
// it. Its images are built here from that commit, as nothing was published.
// The next release moves these two constants to the release before it.
const (
	previousVersion = "v0.1.0"
	previousCommit  = "2f4a617902ccd7200bfe7777b2a9173e1115cf33"
)

const (
	upgradeRelease   = "addon-heartbeat"
	upgradeNamespace = "heartbeat-upgrade-system"
)

// upgradeAddon is an addon onboarded before the upgrade.
type upgradeAddon struct {
	ns, name string
	replicas int32
	hb       *heartbeats
}

// TestReleaseUpgrade builds this checkout's release as make release does,
// runs its binaries for each platform (arm64 under qemu-user), installs the
// previous release built from its commit, onboards addons, upgrades to the
// packaged chart with the images imported by digest from the release's
// archive, rolls the addons, rolls back, and installs the packaged chart
// anew. No AddonInstance may go 3 periods without a heartbeat at any step;
// the longest gap of each is logged.
func TestReleaseUpgrade(t *testing.T) {
	suite := t
	root := testenv.RepoRoot()
	changelog, err := os.ReadFile(filepath.Join(root, "CHANGELOG.md"))
	if err != nil {
		t.Fatal(err)
	}
	newVersion, err := ahbrelease.Latest(changelog)
	if err != nil {
		t.Fatal(err)
	}
	var (
		res       *ahbrelease.Result
		prevChart string
		addons    []*upgradeAddon
		gaps      []string
	)
	byDigest := func() string { return images.AddonHeartbeat + "@" + res.Digest.String() }
	previousImage := images.AddonHeartbeat + ":" + previousVersion
	step := func(name string, f func(t *testing.T)) { runStep(t, name, f) }
	// window checks that no addon went 3 periods without a heartbeat
	// between from and now, and records the longest gap of each.
	window := func(t *testing.T, what string, from time.Time) {
		t.Helper()
		for _, a := range addons {
			a.hb.waitWrites(t, 2, 4*period)
		}
		to := time.Now()
		var parts []string
		for _, a := range addons {
			gap := a.hb.MaxGap(from, to)
			parts = append(parts, fmt.Sprintf("%s/%s %s", a.ns, a.name, gap.Round(time.Millisecond)))
			if gap >= 3*period {
				t.Errorf("%s: %s/%s went %s without a heartbeat (period %s, the operator's limit %s)", what, a.ns, a.name, gap, period, 3*period)
			}
		}
		line := fmt.Sprintf("%s (%s): longest heartbeat gap %s", what, to.Sub(from).Round(time.Second), strings.Join(parts, ", "))
		gaps = append(gaps, line)
		logf("%s", line)
	}
	defer func() {
		if len(gaps) > 0 {
			logf("upgrade and rollback, period %s:\n  %s", period, strings.Join(gaps, "\n  "))
		}
	}()

	step("release built", func(t *testing.T) {
		start := time.Now()
		res, err = ahbrelease.Build(ahbrelease.Options{Root: root, Version: newVersion, Out: filepath.Join(workDir, "release"), Log: os.Stderr})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = res.Cleanup() })
		logf("cost: release %s built in %s: %s@%s", newVersion, time.Since(start).Round(time.Millisecond), res.Ref, res.Digest)
	})

	step("the index holds both platforms, whose binaries print the version", func(t *testing.T) {
		layoutDir := filepath.Join(workDir, "release-layout")
		if err := untar(filepath.Join(workDir, "release", res.ImageArchive), layoutDir); err != nil {
			t.Fatal(err)
		}
		idx, d, err := images.ReadLayoutIndex(layoutDir, res.Ref)
		if err != nil {
			t.Fatal(err)
		}
		if d != res.Digest {
			t.Errorf("the archive names %s, the release %s", d, res.Digest)
		}
		m, err := idx.IndexManifest()
		if err != nil {
			t.Fatal(err)
		}
		var plats []string
		for _, desc := range m.Manifests {
			plats = append(plats, desc.Platform.String())
			img, err := idx.Image(desc.Digest)
			if err != nil {
				t.Fatal(err)
			}
			dir := filepath.Join(workDir, "release-bin", desc.Platform.OS+"-"+desc.Platform.Architecture)
			if err := extractFiles(img, dir, "webhook", "reporter"); err != nil {
				t.Fatal(err)
			}
			for _, bin := range []string{"webhook", "reporter"} {
				out, how, err := runForPlatform(*desc.Platform, filepath.Join(dir, bin), "--version")
				if err != nil {
					t.Errorf("%s %s --version (%s): %v\n%s", desc.Platform, bin, how, err, out)
					continue
				}
				want := fmt.Sprintf("addon-heartbeat %s %s (revision ", bin, newVersion)
				if !strings.HasPrefix(out, want) || !strings.HasSuffix(strings.TrimSpace(out), ", "+desc.Platform.String()+")") {
					t.Errorf("%s %s --version (%s): %q, want %q... %s)", desc.Platform, bin, how, out, want, desc.Platform)
				}
				logf("%s /%s --version (%s): %s", desc.Platform, bin, how, strings.TrimSpace(out))
			}
		}
		if !slices.Equal(plats, []string{"linux/amd64", "linux/arm64"}) {
			t.Errorf("the index holds %v, want linux/amd64 and linux/arm64", plats)
		}
	})

	step("previous release built from its commit", func(t *testing.T) {
		start := time.Now()
		dir := filepath.Join(workDir, "previous")
		if err := checkoutCommit(root, previousCommit, dir); err != nil {
			t.Fatalf("the previous release %s: %v", previousVersion, err)
		}
		bins, err := images.BuildBinaries(dir, filepath.Join(workDir, "previous-bin"), images.BuildOptions{Stderr: os.Stderr}, "./cmd/webhook", "./cmd/reporter")
		if err != nil {
			t.Fatal(err)
		}
		tarball := filepath.Join(workDir, "previous-image.tar")
		if err := images.Write(images.Image{Ref: previousImage, Files: map[string]string{"/webhook": bins["webhook"], "/reporter": bins["reporter"]},
			Entrypoint: []string{"/webhook"}, Labels: map[string]string{"org.opencontainers.image.version": previousVersion}}, tarball); err != nil {
			t.Fatal(err)
		}
		if err := cluster.ImportImages(suiteCtx, tarball); err != nil {
			t.Fatal(err)
		}
		prevChart = filepath.Join(dir, "charts", "addon-heartbeat")
		logf("cost: previous release %s (commit %s) built and imported in %s", previousVersion, previousCommit[:7], time.Since(start).Round(time.Millisecond))
	})

	step("release images imported by digest from the release's archive", func(t *testing.T) {
		archive := filepath.Join(workDir, "release", res.ImageArchive)
		if err := cluster.Ctr(suiteCtx, "images", "import", "--digests", "--base-name", images.AddonHeartbeat, archive); err != nil {
			t.Fatal(err)
		}
		out, err := cluster.CtrOutput(suiteCtx, "images", "ls", "-q")
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{byDigest(), res.Ref} {
			if !slices.Contains(strings.Fields(out), want) {
				t.Errorf("containerd has no image %s:\n%s", want, out)
			}
		}
	})

	step("install "+previousVersion+" and onboard addons", func(t *testing.T) {
		crd, err := testenv.AddonInstanceCRD()
		if err != nil {
			t.Fatal(err)
		}
		// TestRealNode installs it too; either may run alone.
		if _, err := envtest.InstallCRDs(cluster.Config, envtest.CRDInstallOptions{Paths: []string{crd}, ErrorIfPathMissing: true}); err != nil &&
			!apierrors.IsAlreadyExists(err) {
			t.Fatalf("installing the AddonInstance CRD: %v", err)
		}
		// One webhook at a time: TestRealNode's release, should it have
		// stopped before its uninstall step, would inject too and owns the
		// same cluster-wide names.
		if _, err := run(suiteCtx, helmBin, "uninstall", release, "--namespace", releaseNamespace, "--ignore-not-found", "--wait", "--timeout", "3m"); err != nil {
			t.Fatal(err)
		}
		restrictedNamespace(t, upgradeNamespace)
		start := time.Now()
		if _, err := run(suiteCtx, helmBin, "install", upgradeRelease, prevChart, "--namespace", upgradeNamespace, "--wait", "--timeout", "3m"); err != nil {
			t.Fatal(err)
		}
		logf("helm install %s --wait: %s", previousVersion, time.Since(start).Round(time.Millisecond))
		webhookImageIs(t, previousImage)
		addons = []*upgradeAddon{{ns: "upgrade-addon-a", name: "operator", replicas: 2}, {ns: "upgrade-addon-b", name: "agent", replicas: 1}}
		for _, a := range addons {
			onboard(t, suite, a)
		}
		for _, a := range addons {
			waitFor(t, a.ns+"/"+a.name+" rolled out", 2*time.Minute, func(ctx context.Context) (bool, string) {
				return rolledOut(ctx, key(a.ns, a.name), a.replicas)
			})
			a.hb.waitCondition(t, installed, metav1.ConditionTrue, 6*period)
			if got := addonReporterImage(t, a); got != previousImage {
				t.Errorf("%s/%s: reporter %s, want %s", a.ns, a.name, got, previousImage)
			}
		}
	})

	step("helm upgrade to "+newVersion+" from the packaged chart", func(t *testing.T) {
		from := time.Now()
		if _, err := run(suiteCtx, helmBin, "upgrade", upgradeRelease, filepath.Join(workDir, "release", res.Chart),
			"--namespace", upgradeNamespace, "--wait", "--timeout", "3m"); err != nil {
			t.Fatal(err)
		}
		webhookImageIs(t, byDigest())
		window(t, "helm upgrade "+previousVersion+" -> "+newVersion+", webhook rollout", from)
		// The webhook pods run the release's amd64 image: they say so.
		for _, p := range webhookPods(t) {
			v, err := metric(suiteCtx, "http://"+p.Status.PodIP+":8080/metrics", "addon_heartbeat_build_info",
				`component="webhook"`, `version="`+newVersion+`"`, `platform="linux/amd64"`)
			if err != nil || v != 1 {
				t.Errorf("webhook pod %s: build info %v (%v), want version %s on linux/amd64", p.Name, v, err, newVersion)
			}
		}
		// A webhook acts on admission only: the addons keep their reporter.
		for _, a := range addons {
			if got := addonReporterImage(t, a); got != previousImage {
				t.Errorf("%s/%s: the upgrade alone changed the reporter to %s", a.ns, a.name, got)
			}
		}
	})

	step("the addons' next rollout runs the "+newVersion+" reporter by digest", func(t *testing.T) {
		from := time.Now()
		rollAddons(t, addons, byDigest())
		window(t, "addon rollout to the "+newVersion+" reporter", from)
		for _, a := range addons {
			ps, err := pods(suiteCtx, a.ns, map[string]string{"app": a.name})
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range ps {
				v, err := reporterMetric(suiteCtx, p, "addon_heartbeat_build_info")
				if err != nil || v != 1 {
					t.Errorf("pod %s/%s: no build info from the new reporter (%v)", a.ns, p.Name, err)
				}
			}
		}
	})

	step("helm rollback to "+previousVersion, func(t *testing.T) {
		from := time.Now()
		if _, err := run(suiteCtx, helmBin, "rollback", upgradeRelease, "1", "--namespace", upgradeNamespace, "--wait", "--timeout", "3m"); err != nil {
			t.Fatal(err)
		}
		webhookImageIs(t, previousImage)
		window(t, "helm rollback "+newVersion+" -> "+previousVersion+", webhook rollout", from)
		from = time.Now()
		rollAddons(t, addons, previousImage)
		window(t, "addon rollout back to the "+previousVersion+" reporter", from)
	})

	step("the packaged chart installs anew, by digest", func(t *testing.T) {
		if _, err := run(suiteCtx, helmBin, "uninstall", upgradeRelease, "--namespace", upgradeNamespace, "--wait", "--timeout", "3m"); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if _, err := run(suiteCtx, helmBin, "install", upgradeRelease, filepath.Join(workDir, "release", res.Chart),
			"--namespace", upgradeNamespace, "--wait", "--timeout", "3m"); err != nil {
			t.Fatal(err)
		}
		logf("helm install %s --wait: %s", res.Chart, time.Since(start).Round(time.Millisecond))
		webhookImageIs(t, byDigest())
		fresh := &upgradeAddon{ns: "upgrade-addon-c", name: "fresh", replicas: 1}
		onboard(t, suite, fresh)
		waitFor(t, "fresh addon rolled out", 2*time.Minute, func(ctx context.Context) (bool, string) {
			return rolledOut(ctx, key(fresh.ns, fresh.name), 1)
		})
		fresh.hb.waitCondition(t, installed, metav1.ConditionTrue, 6*period)
		if got := addonReporterImage(t, fresh); got != byDigest() {
			t.Errorf("fresh addon: reporter %s, want %s", got, byDigest())
		}
		if _, err := run(suiteCtx, helmBin, "uninstall", upgradeRelease, "--namespace", upgradeNamespace, "--wait", "--timeout", "3m"); err != nil {
			t.Fatal(err)
		}
	})
}

// onboard creates a's namespace (restricted), ServiceAccount, AddonInstance
// and opted-in Deployment, and starts watching its heartbeats until suite
// ends.
func onboard(t, suite *testing.T, a *upgradeAddon) {
	t.Helper()
	restrictedNamespace(t, a.ns)
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: a.ns, Name: addonServiceAccount}}
	ai := &addonsv1alpha1.AddonInstance{
		ObjectMeta: metav1.ObjectMeta{Namespace: a.ns, Name: instance},
		Spec:       addonsv1alpha1.AddonInstanceSpec{HeartbeatUpdatePeriod: metav1.Duration{Duration: period}},
	}
	for _, o := range []client.Object{sa, ai} {
		if err := cluster.Client.Create(suiteCtx, o); err != nil {
			t.Fatal(err)
		}
	}
	a.hb = watchHeartbeats(suite, a.ns, instance)
	// Right after an install the API server may not trust the webhook yet:
	// the elected replica writes the caBundle once it runs, and the API
	// server picks the change up a moment later (helm --wait waits for
	// ready pods only). The create is retried until the call succeeds.
	start := time.Now()
	waitFor(t, "the webhook admits "+a.ns+"/"+a.name, time.Minute, func(ctx context.Context) (bool, string) {
		err := cluster.Client.Create(ctx, exampleAddon(a.ns, a.name, instance, a.replicas))
		if err != nil && strings.Contains(err.Error(), "failed calling webhook") {
			return false, err.Error()
		}
		if err != nil {
			t.Fatalf("creating %s/%s: %v", a.ns, a.name, err)
		}
		return true, ""
	})
	if d := time.Since(start); d > time.Second {
		logf("%s/%s admitted %s after its first try", a.ns, a.name, d.Round(time.Millisecond))
	}
}

// rollAddons restarts every addon (kubectl rollout restart) and waits until
// each runs the reporter image want, ready.
func rollAddons(t *testing.T, addons []*upgradeAddon, want string) {
	t.Helper()
	for _, a := range addons {
		if _, err := run(suiteCtx, "kubectl", "rollout", "restart", "deployment/"+a.name, "-n", a.ns); err != nil {
			t.Fatal(err)
		}
	}
	for _, a := range addons {
		waitFor(t, a.ns+"/"+a.name+" rolled out", 3*time.Minute, func(ctx context.Context) (bool, string) {
			return rolledOut(ctx, key(a.ns, a.name), a.replicas)
		})
		if got := addonReporterImage(t, a); got != want {
			t.Errorf("%s/%s: reporter %s after its rollout, want %s", a.ns, a.name, got, want)
		}
		ps, err := pods(suiteCtx, a.ns, map[string]string{"app": a.name})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range ps {
			if rs := reporterStatus(p); rs == nil || !rs.Ready || p.Spec.InitContainers[len(p.Spec.InitContainers)-1].Image != want {
				t.Errorf("pod %s/%s: reporter %+v, want ready with %s", a.ns, p.Name, rs, want)
			}
		}
	}
}

func addonReporterImage(t *testing.T, a *upgradeAddon) string {
	t.Helper()
	var d appsv1.Deployment
	if err := cluster.Client.Get(suiteCtx, key(a.ns, a.name), &d); err != nil {
		t.Fatal(err)
	}
	return reporterImage(d)
}

func webhookPods(t *testing.T) []corev1.Pod {
	t.Helper()
	ps, err := pods(suiteCtx, upgradeNamespace, map[string]string{"app.kubernetes.io/instance": upgradeRelease, "app.kubernetes.io/component": "webhook"})
	if err != nil {
		t.Fatal(err)
	}
	return ps
}

// webhookImageIs waits until the webhook Deployment has rolled out with
// image, both pods ready and running it.
func webhookImageIs(t *testing.T, image string) {
	t.Helper()
	k := key(upgradeNamespace, upgradeRelease+"-webhook")
	waitFor(t, "webhook rolled out with "+image, 3*time.Minute, func(ctx context.Context) (bool, string) {
		var d appsv1.Deployment
		if err := cluster.Client.Get(ctx, k, &d); err != nil {
			return false, err.Error()
		}
		if got := d.Spec.Template.Spec.Containers[0].Image; got != image {
			return false, "image " + got
		}
		if ok, msg := rolledOut(ctx, k, 2); !ok {
			return false, msg
		}
		ps, err := pods(ctx, upgradeNamespace, map[string]string{"app.kubernetes.io/instance": upgradeRelease, "app.kubernetes.io/component": "webhook"})
		if err != nil {
			return false, err.Error()
		}
		for _, p := range ps {
			if p.Spec.Containers[0].Image != image {
				return false, "pod " + p.Name + " runs " + p.Spec.Containers[0].Image
			}
		}
		return len(ps) == 2, fmt.Sprintf("%d pods", len(ps))
	})
}

// checkoutCommit writes the tree of commit into dir, with a clear error
// when the clone does not have it (a shallow clone).
func checkoutCommit(root, commit, dir string) error {
	if out, err := exec.Command("git", "-C", root, "cat-file", "-e", commit+"^{commit}").CombinedOutput(); err != nil {
		return fmt.Errorf("this clone of the repository lacks commit %s (%v: %s): the upgrade test builds the previous release from it; "+
			"fetch the whole history (git fetch --unshallow) or clone without --depth", commit, err, strings.TrimSpace(string(out)))
	}
	archive := dir + ".tar"
	if out, err := exec.Command("git", "-C", root, "archive", "--format=tar", "-o", archive, commit).CombinedOutput(); err != nil {
		return fmt.Errorf("git archive %s: %v: %s", commit, err, out)
	}
	defer os.Remove(archive)
	return untar(archive, dir)
}

// untar extracts a tar archive of regular files and folders into dir.
func untar(archive, dir string) error {
	f, err := os.Open(archive)
	if err != nil {
		return err
	}
	defer f.Close()
	return extract(tar.NewReader(f), dir, nil)
}

// extractFiles writes the files named (by base name) of img's file system
// into dir.
func extractFiles(img v1.Image, dir string, names ...string) error {
	rc := mutate.Extract(img)
	defer rc.Close()
	return extract(tar.NewReader(rc), dir, func(name string) (string, bool) {
		base := filepath.Base(name)
		return base, slices.Contains(names, base)
	})
}

// extract writes the entries of tr into dir; keep, when set, names the
// files to write (and where, relative to dir).
func extract(tr *tar.Reader, dir string, keep func(string) (string, bool)) error {
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		name := filepath.Clean(hdr.Name)
		if strings.HasPrefix(name, "..") || filepath.IsAbs(name) {
			return fmt.Errorf("archive entry %q outside the folder", hdr.Name)
		}
		if keep != nil {
			var ok bool
			if name, ok = keep(name); !ok || hdr.Typeflag != tar.TypeReg {
				continue
			}
		}
		target := filepath.Join(dir, name)
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return err
			}
			out, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(hdr.Mode)&0o755|0o600)
			if err != nil {
				return err
			}
			_, err = io.Copy(out, tr)
			if cerr := out.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		}
	}
}

// runForPlatform runs a binary built for p: natively on this machine's
// platform, under qemu-user (qemu-aarch64, from Debian's qemu-user, which
// hack/node-binaries.sh installs) for arm64.
func runForPlatform(p v1.Platform, bin string, args ...string) (out, how string, err error) {
	var cmd *exec.Cmd
	switch p.Architecture {
	case "amd64":
		cmd, how = exec.Command(bin, args...), "native"
	case "arm64":
		qemu, err := exec.LookPath("qemu-aarch64")
		if err != nil {
			if qemu, err = exec.LookPath("qemu-aarch64-static"); err != nil {
				return "", "", fmt.Errorf("no qemu-aarch64: run make e2e-node (hack/node-binaries.sh installs Debian's qemu-user)")
			}
		}
		cmd, how = exec.Command(qemu, append([]string{bin}, args...)...), filepath.Base(qemu)
	default:
		return "", "", fmt.Errorf("no way to run %s binaries here", p)
	}
	b, err := cmd.CombinedOutput()
	return string(b), how, err
}
