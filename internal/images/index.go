package images

import (
	"archive/tar"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// PlatformImage is an image built for one platform.
type PlatformImage struct {
	Platform v1.Platform
	Image    v1.Image
}

// Index is the OCI image index of imgs: one manifest per platform, in the
// order given, so that a runtime pulls the one for its node.
func Index(imgs ...PlatformImage) (v1.ImageIndex, error) {
	if len(imgs) == 0 {
		return nil, fmt.Errorf("an image index needs at least one image")
	}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	seen := map[string]bool{}
	for _, i := range imgs {
		if seen[i.Platform.String()] {
			return nil, fmt.Errorf("two images for %s in one index", i.Platform)
		}
		seen[i.Platform.String()] = true
		cfg, err := i.Image.ConfigFile()
		if err != nil {
			return nil, err
		}
		if cfg.OS != i.Platform.OS || cfg.Architecture != i.Platform.Architecture {
			return nil, fmt.Errorf("the image for %s says it is %s/%s", i.Platform, cfg.OS, cfg.Architecture)
		}
		p := i.Platform
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: i.Image, Descriptor: v1.Descriptor{Platform: &p}})
	}
	return idx, nil
}

// Annotations of an image layout's index.json entry that name the image:
// the tag alone for OCI tools (skopeo's oci-archive:FILE:TAG, oras, crane),
// the whole reference for containerd (ctr images import) and docker load.
const (
	AnnotationRefName       = "org.opencontainers.image.ref.name"
	AnnotationContainerName = "io.containerd.image.name"
)

// WriteLayout writes idx as an OCI image layout into dir (which must not
// exist yet), named ref.
func WriteLayout(dir string, ref string, idx v1.ImageIndex) error {
	tag, err := tagOf(ref)
	if err != nil {
		return err
	}
	if _, err := os.Stat(dir); err == nil {
		return fmt.Errorf("image layout %s: already exists", dir)
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("image layout %s: %w", dir, err)
	}
	if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{
		AnnotationRefName: tag.TagStr(), AnnotationContainerName: tag.Name(),
	})); err != nil {
		return fmt.Errorf("image layout %s: %w", dir, err)
	}
	return nil
}

// TarDir writes the files under dir into a tar archive at path, in name
// order, owned by root and dated at the epoch, so that the same files give
// the same archive.
func TarDir(dir, path string) (err error) {
	var paths []string
	if err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != dir {
			paths = append(paths, p)
		}
		return nil
	}); err != nil {
		return err
	}
	slices.Sort(paths)
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}()
	tw := tar.NewWriter(f)
	for _, p := range paths {
		rel, _ := filepath.Rel(dir, p)
		st, err := os.Stat(p)
		if err != nil {
			return err
		}
		hdr := &tar.Header{Name: filepath.ToSlash(rel), ModTime: epoch, Mode: 0o644, Format: tar.FormatPAX}
		if st.IsDir() {
			hdr.Typeflag, hdr.Name, hdr.Mode = tar.TypeDir, hdr.Name+"/", 0o755
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			continue
		}
		hdr.Typeflag, hdr.Size = tar.TypeReg, st.Size()
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		src, err := os.Open(p)
		if err != nil {
			return err
		}
		_, err = io.Copy(tw, src)
		src.Close()
		if err != nil {
			return fmt.Errorf("archiving %s: %w", p, err)
		}
	}
	return tw.Close()
}

// ReadLayoutIndex reads the image index that an OCI image layout (dir)
// names ref (by either annotation).
func ReadLayoutIndex(dir, ref string) (v1.ImageIndex, v1.Hash, error) {
	p, err := layout.FromPath(dir)
	if err != nil {
		return nil, v1.Hash{}, err
	}
	top, err := p.ImageIndex()
	if err != nil {
		return nil, v1.Hash{}, err
	}
	m, err := top.IndexManifest()
	if err != nil {
		return nil, v1.Hash{}, err
	}
	tag, err := name.NewTag(ref, name.WeakValidation)
	if err != nil {
		return nil, v1.Hash{}, err
	}
	for _, d := range m.Manifests {
		if d.Annotations[AnnotationContainerName] == tag.Name() || d.Annotations[AnnotationRefName] == tag.TagStr() {
			idx, err := top.ImageIndex(d.Digest)
			return idx, d.Digest, err
		}
	}
	return nil, v1.Hash{}, fmt.Errorf("image layout %s names no %s", dir, ref)
}
