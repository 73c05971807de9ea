// Package images builds OCI images from static Go binaries without a
// container engine or registry: an empty image, one layer holding the
// binaries, and a config with the entrypoint and a non-root user. Written
// as image tarballs (docker load, podman load, ctr -n k8s.io images import),
// or as a multi-platform image index in an OCI image layout (index.go).
package images

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/addon-heartbeat/addon-heartbeat/internal/version"
)

// NonRoot is the user the images run as, as in distroless "nonroot". The
// images also run as any other UID with GID 0, as OpenShift's restricted-v2
// SCC assigns one from the namespace's range: every file is root-owned and
// readable and executable by everyone (see layer), and the binaries write
// nothing to the image's filesystem (the root filesystem is read-only), so
// no file needs to belong to the user that runs them.
const NonRoot = "65532:65532"

// Image describes one image.
type Image struct {
	// Ref is the image reference with a tag, such as
	// ghcr.io/addon-heartbeat/addon-heartbeat:v0.2.0. Tags must not be
	// "latest": kubelet would always try to pull it.
	Ref string
	// Files maps a path in the image (such as /webhook) to a binary on disk.
	Files map[string]string
	// Entrypoint is the image's entrypoint.
	Entrypoint []string
	// User is the image's user; NonRoot when empty.
	User string
	// Labels are the image config's labels.
	Labels map[string]string
}

// epoch is the timestamp of every file and of the image, so that the same
// binaries give the same image digest.
var epoch = time.Unix(0, 0).UTC()

// Platforms of a release: every image is built for each.
var (
	LinuxAMD64 = v1.Platform{OS: "linux", Architecture: "amd64"}
	LinuxARM64 = v1.Platform{OS: "linux", Architecture: "arm64"}
)

// Build builds img for platform p (its binaries must be built for it) as an
// OCI image: OCI media types, one layer, and the same digest for the same
// binaries.
func Build(img Image, p v1.Platform) (v1.Image, error) {
	layerTar, err := layer(img.Files)
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", img.Ref, err)
	}
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(layerTar)), nil },
		tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("image %s: layer: %w", img.Ref, err)
	}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	i, err := mutate.AppendLayers(base, l)
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", img.Ref, err)
	}
	user := img.User
	if user == "" {
		user = NonRoot
	}
	cfg, err := i.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", img.Ref, err)
	}
	cfg = cfg.DeepCopy()
	cfg.Architecture, cfg.OS, cfg.Variant = p.Architecture, p.OS, p.Variant
	cfg.Created = v1.Time{Time: epoch}
	cfg.Config.Entrypoint = img.Entrypoint
	cfg.Config.User = user
	cfg.Config.Env = []string{"PATH=/"}
	cfg.Config.Labels = img.Labels
	if i, err = mutate.ConfigFile(i, cfg); err != nil {
		return nil, fmt.Errorf("image %s: %w", img.Ref, err)
	}
	return i, nil
}

// Write builds img for linux/amd64 and writes it as an image tarball (the
// format of docker save) to path.
func Write(img Image, path string) error {
	ref, err := tagOf(img.Ref)
	if err != nil {
		return err
	}
	i, err := Build(img, LinuxAMD64)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	if err := tarball.WriteToFile(path, ref, i); err != nil {
		return fmt.Errorf("writing image %s to %s: %w", img.Ref, path, err)
	}
	return nil
}

// tagOf parses an image reference with a tag other than latest.
func tagOf(s string) (name.Tag, error) {
	ref, err := name.NewTag(s, name.WeakValidation)
	if err != nil {
		return name.Tag{}, fmt.Errorf("image reference %q: %w", s, err)
	}
	if ref.TagStr() == "latest" {
		return name.Tag{}, fmt.Errorf("image reference %q: use a tag other than latest", s)
	}
	return ref, nil
}

// layer is a tar of the files, each readable and executable by everyone,
// owned by root, with the folders they need.
func layer(files map[string]string) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	paths := make([]string, 0, len(files))
	for p := range files {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	for _, p := range paths {
		inImage := strings.TrimPrefix(filepath.Clean("/"+p), "/")
		for d := filepath.Dir(inImage); d != "." && !dirs[d]; d = filepath.Dir(d) {
			dirs[d] = true
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: epoch}); err != nil {
				return nil, err
			}
		}
		data, err := os.ReadFile(files[p])
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", files[p], err)
		}
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: inImage, Mode: 0o755, Size: int64(len(data)), ModTime: epoch}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	// /tmp for programs that expect one (read-only root filesystems mount an
	// emptyDir there when they need to write).
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "tmp/", Mode: 0o1777, ModTime: epoch}); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// BuildOptions are how BuildBinaries builds.
type BuildOptions struct {
	// Platform is the GOOS and GOARCH of the binaries; linux/amd64 when
	// empty.
	Platform v1.Platform
	// Version and Revision, when set, are stamped into the binaries
	// (internal/version).
	Version, Revision string
	// Stderr receives the go command's output.
	Stderr io.Writer
}

// BuildBinaries builds static binaries of the main packages pkgs (import
// paths or ./ paths relative to dir) into out, with the flags of the
// Dockerfile, and returns each binary's path by the last element of its
// package path.
func BuildBinaries(dir, out string, o BuildOptions, pkgs ...string) (map[string]string, error) {
	p := o.Platform
	if p.OS == "" {
		p = LinuxAMD64
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return nil, err
	}
	ldflags := strings.TrimSpace("-s -w " + version.LDFlags(o.Version, o.Revision))
	args := append([]string{"build", "-trimpath", "-ldflags=" + ldflags, "-o", out + string(filepath.Separator)}, pkgs...)
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+p.OS, "GOARCH="+p.Architecture)
	if p.Variant != "" && p.Architecture == "arm" {
		cmd.Env = append(cmd.Env, "GOARM="+strings.TrimPrefix(p.Variant, "v"))
	}
	cmd.Stdout, cmd.Stderr = o.Stderr, o.Stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("go build %s for %s: %w", strings.Join(pkgs, " "), p, err)
	}
	bins := map[string]string{}
	for _, p := range pkgs {
		base := filepath.Base(p)
		bins[base] = filepath.Join(out, base)
	}
	return bins, nil
}
