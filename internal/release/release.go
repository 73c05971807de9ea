// Package release builds a release of addon-heartbeat from a checkout,
// without a container engine or a registry (make release VERSION=v1.2.3):
// the image (/webhook and /reporter) for every platform as one OCI image
// index in an OCI image layout archive, the chart packaged with that
// index's digest, a CycloneDX SBOM per platform image, release notes from
// CHANGELOG.md and SHA-256 checksums of every file.
package release

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/addon-heartbeat/addon-heartbeat/internal/images"
	"github.com/addon-heartbeat/addon-heartbeat/internal/version"
)

// Platforms are those every release image is built for.
var Platforms = []v1.Platform{images.LinuxAMD64, images.LinuxARM64}

// Options say what to release.
type Options struct {
	// Root is the checkout.
	Root string
	// Version is the release, such as v0.2.0; CHANGELOG.md must have a
	// section for it.
	Version string
	// Out is the folder the release is written into; it must not exist or
	// be empty.
	Out string
	// Repository of the image; images.AddonHeartbeat when empty.
	Repository string
	// Platforms; Platforms when empty.
	Platforms []v1.Platform
	// Log receives the go command's output and a line per step.
	Log io.Writer
}

// Result is what a release holds.
type Result struct {
	Version string
	// Ref is the image index's reference by tag, Digest its digest.
	Ref    string
	Digest v1.Hash
	// Manifests are the digests of the platform images, by platform.
	Manifests map[string]v1.Hash
	// Files of the release, by name, in Out: the image layout archive
	// (ImageArchive), the chart (Chart), the SBOMs, the notes and SHA256SUMS.
	ImageArchive, Chart, Notes, Checksums string
	SBOMs                                 []string
	// ImageLayout is the OCI image layout folder the archive holds (in a
	// temporary place; removed by Cleanup).
	ImageLayout string
	// Binaries are the built binaries by platform and path in the image
	// (in a temporary place; removed by Cleanup).
	Binaries map[string]map[string]string
	tmp      string
}

// Cleanup removes the temporary files (ImageLayout, Binaries).
func (r *Result) Cleanup() error { return os.RemoveAll(r.tmp) }

// ImageArchiveName is the file name of a version's image layout archive.
func ImageArchiveName(v string) string { return "addon-heartbeat-" + v + ".oci.tar" }

// Build builds the release o asks for.
func Build(o Options) (res *Result, err error) {
	if !version.IsSemver(o.Version) {
		return nil, fmt.Errorf("version %q: expected a semantic version such as v0.2.0 or v0.3.0-rc.1", o.Version)
	}
	repo := o.Repository
	if repo == "" {
		repo = images.AddonHeartbeat
	}
	platforms := o.Platforms
	if len(platforms) == 0 {
		platforms = Platforms
	}
	logw := o.Log
	if logw == nil {
		logw = io.Discard
	}
	step := func(format string, args ...any) { fmt.Fprintf(logw, "release: "+format+"\n", args...) }

	changelog, err := os.ReadFile(filepath.Join(o.Root, "CHANGELOG.md"))
	if err != nil {
		return nil, fmt.Errorf("reading the release notes: %w", err)
	}
	notes, err := Notes(changelog, o.Version)
	if err != nil {
		return nil, err
	}
	if entries, err := os.ReadDir(o.Out); err == nil && len(entries) > 0 {
		return nil, fmt.Errorf("%s is not empty: remove it, or release into another folder", o.Out)
	}
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp("", "addon-heartbeat-release-")
	if err != nil {
		return nil, err
	}
	res = &Result{Version: o.Version, Ref: repo + ":" + o.Version, Manifests: map[string]v1.Hash{},
		Binaries: map[string]map[string]string{}, tmp: tmp}
	defer func() {
		if err != nil {
			_ = res.Cleanup()
			res = nil
		}
	}()

	// The commit, stamped: the Go toolchain's own VCS stamping is off
	// where GOFLAGS has -buildvcs=false.
	rev := revision(o.Root)
	var built []images.PlatformImage
	for _, p := range platforms {
		start := time.Now()
		bins, err := images.BuildBinaries(o.Root, filepath.Join(tmp, "bin", p.OS+"-"+p.Architecture),
			images.BuildOptions{Platform: p, Version: o.Version, Revision: rev, Stderr: logw}, "./cmd/webhook", "./cmd/reporter")
		if err != nil {
			return nil, err
		}
		files := map[string]string{"/webhook": bins["webhook"], "/reporter": bins["reporter"]}
		img, err := images.Build(images.Image{Ref: res.Ref, Files: files, Entrypoint: []string{"/webhook"}, Labels: labels(o.Version)}, p)
		if err != nil {
			return nil, err
		}
		d, err := img.Digest()
		if err != nil {
			return nil, err
		}
		res.Manifests[p.String()] = d
		res.Binaries[p.String()] = files
		built = append(built, images.PlatformImage{Platform: p, Image: img})
		step("%s: binaries built, image %s (%s)", p, d, time.Since(start).Round(time.Millisecond))

		sbom, err := SBOM(repo, o.Version, p, d, files)
		if err != nil {
			return nil, err
		}
		name := fmt.Sprintf("addon-heartbeat-%s-%s-%s.cdx.json", o.Version, p.OS, p.Architecture)
		if err := os.WriteFile(filepath.Join(o.Out, name), sbom, 0o644); err != nil {
			return nil, err
		}
		res.SBOMs = append(res.SBOMs, name)
	}
	idx, err := images.Index(built...)
	if err != nil {
		return nil, err
	}
	if res.Digest, err = idx.Digest(); err != nil {
		return nil, err
	}
	res.ImageLayout = filepath.Join(tmp, "oci")
	if err := images.WriteLayout(res.ImageLayout, res.Ref, idx); err != nil {
		return nil, err
	}
	res.ImageArchive = ImageArchiveName(o.Version)
	if err := images.TarDir(res.ImageLayout, filepath.Join(o.Out, res.ImageArchive)); err != nil {
		return nil, fmt.Errorf("archiving the image layout: %w", err)
	}
	step("image index %s@%s: %s", res.Ref, res.Digest, res.ImageArchive)

	chartPath, err := PackageChart(filepath.Join(o.Root, "charts", "addon-heartbeat"), o.Out, o.Version, res.Digest.String(), commitTime(o.Root))
	if err != nil {
		return nil, err
	}
	res.Chart = filepath.Base(chartPath)
	step("chart %s (appVersion %s, image digests %s)", res.Chart, o.Version, res.Digest)

	res.Notes = "RELEASE_NOTES.md"
	if err := os.WriteFile(filepath.Join(o.Out, res.Notes), []byte(releaseNotes(res, notes)), 0o644); err != nil {
		return nil, err
	}
	res.Checksums = "SHA256SUMS"
	files := append([]string{res.ImageArchive, res.Chart, res.Notes}, res.SBOMs...)
	if err := writeChecksums(o.Out, res.Checksums, files); err != nil {
		return nil, err
	}
	step("%s: %s", o.Out, strings.Join(append(files, res.Checksums), ", "))
	return res, nil
}

// labels are the image's OCI annotations as config labels.
func labels(v string) map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":   "addon-heartbeat",
		"org.opencontainers.image.version": v,
		"org.opencontainers.image.source":  "https://github.com/addon-heartbeat/addon-heartbeat",
	}
}

// revision is the checkout's HEAD commit, with -dirty when the tree has
// changes git tracks; empty when it is no git checkout.
func revision(root string) string {
	out, err := exec.Command("git", "-C", root, "rev-parse", "HEAD").Output()
	if err != nil {
		return ""
	}
	rev := strings.TrimSpace(string(out))
	if st, err := exec.Command("git", "-C", root, "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(bytes.TrimSpace(st)) > 0 {
		rev += "-dirty"
	}
	return rev
}

// commitTime is the time of the checkout's HEAD commit, the date of the
// chart's files; the epoch when it has none (an exported tree).
func commitTime(root string) time.Time {
	out, err := exec.Command("git", "-C", root, "log", "-1", "--format=%ct").Output()
	if err != nil {
		return time.Unix(0, 0).UTC()
	}
	s, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
	if err != nil {
		return time.Unix(0, 0).UTC()
	}
	return time.Unix(s, 0).UTC()
}

// releaseNotes are the CHANGELOG section and what the release holds.
func releaseNotes(r *Result, notes string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# addon-heartbeat %s\n\n%s\n## Artifacts\n\n", r.Version, notes)
	fmt.Fprintf(&b, "- Image index `%s@%s` (push `%s` with any OCI tool; see the README's Releases and upgrades):\n", r.Ref, r.Digest, r.ImageArchive)
	plats := make([]string, 0, len(r.Manifests))
	for p := range r.Manifests {
		plats = append(plats, p)
	}
	slices.Sort(plats)
	for _, p := range plats {
		fmt.Fprintf(&b, "  - %s: `%s`\n", p, r.Manifests[p])
	}
	fmt.Fprintf(&b, "- Chart `%s` (appVersion %s; `image.digest` and `reporter.image.digest` are the index's digest)\n", r.Chart, r.Version)
	fmt.Fprintf(&b, "- SBOMs (CycloneDX 1.6), one per platform image: %s\n", strings.Join(r.SBOMs, ", "))
	fmt.Fprintf(&b, "- `SHA256SUMS` (`sha256sum -c SHA256SUMS`)\n")
	return b.String()
}

// writeChecksums writes the SHA-256 of each file in dir, in the format of
// sha256sum.
func writeChecksums(dir, name string, files []string) error {
	slices.Sort(files)
	var b strings.Builder
	for _, f := range files {
		data, err := os.Open(filepath.Join(dir, f))
		if err != nil {
			return err
		}
		h := sha256.New()
		_, err = io.Copy(h, data)
		data.Close()
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s  %s\n", hex.EncodeToString(h.Sum(nil)), f)
	}
	return os.WriteFile(filepath.Join(dir, name), []byte(b.String()), 0o644)
}
