package images

import (
	"bytes"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// platformImages are two images, one per platform, each with a file saying
// which platform it is for.
func platformImages(t *testing.T) []PlatformImage {
	t.Helper()
	var out []PlatformImage
	for _, p := range []v1.Platform{LinuxAMD64, LinuxARM64} {
		f := filepath.Join(t.TempDir(), "bin")
		if err := os.WriteFile(f, []byte("binary for "+p.String()), 0o755); err != nil {
			t.Fatal(err)
		}
		img, err := Build(Image{Ref: AddonHeartbeat + ":v0.2.0", Files: map[string]string{"/webhook": f}, Entrypoint: []string{"/webhook"}}, p)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, PlatformImage{Platform: p, Image: img})
	}
	return out
}

// An index written as an image layout archive is read back with both
// platforms, and a registry client pushes it as it is: the registry serves
// it under the same digest, each platform's manifest its own image.
func TestIndexLayoutPush(t *testing.T) {
	imgs := platformImages(t)
	idx, err := Index(imgs...)
	if err != nil {
		t.Fatal(err)
	}
	digest, _ := idx.Digest()
	dir := filepath.Join(t.TempDir(), "oci")
	if err := WriteLayout(dir, AddonHeartbeat+":v0.2.0", idx); err != nil {
		t.Fatal(err)
	}
	if err := WriteLayout(dir, AddonHeartbeat+":v0.2.0", idx); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Errorf("a second layout into the same folder: %v", err)
	}
	tar1, tar2 := filepath.Join(t.TempDir(), "1.tar"), filepath.Join(t.TempDir(), "2.tar")
	for _, p := range []string{tar1, tar2} {
		if err := TarDir(dir, p); err != nil {
			t.Fatal(err)
		}
	}
	a, _ := os.ReadFile(tar1)
	b, _ := os.ReadFile(tar2)
	if !bytes.Equal(a, b) {
		t.Error("archiving the same layout twice gave two archives")
	}

	read, readDigest, err := ReadLayoutIndex(dir, AddonHeartbeat+":v0.2.0")
	if err != nil {
		t.Fatal(err)
	}
	if readDigest != digest {
		t.Errorf("the layout names %s, the index is %s", readDigest, digest)
	}
	checkPlatforms(t, read, imgs)

	srv := httptest.NewServer(registry.New())
	defer srv.Close()
	u, _ := url.Parse(srv.URL)
	ref, err := name.ParseReference(u.Host + "/mirror/addon-heartbeat:v0.2.0")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(ref, read); err != nil {
		t.Fatalf("pushing the index: %v", err)
	}
	pulled, err := remote.Index(ref.Context().Digest(digest.String()))
	if err != nil {
		t.Fatalf("pulling the index by digest: %v", err)
	}
	checkPlatforms(t, pulled, imgs)
}

func checkPlatforms(t *testing.T, idx v1.ImageIndex, want []PlatformImage) {
	t.Helper()
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if m.MediaType != types.OCIImageIndex || len(m.Manifests) != len(want) {
		t.Fatalf("index %s with %d manifests, want an OCI index with %d", m.MediaType, len(m.Manifests), len(want))
	}
	for i, d := range m.Manifests {
		wd, _ := want[i].Image.Digest()
		if d.Platform == nil || d.Platform.String() != want[i].Platform.String() || d.Digest != wd || d.MediaType != types.OCIManifestSchema1 {
			t.Errorf("manifest %d: %s %v %s, want %s %s", i, d.MediaType, d.Platform, d.Digest, want[i].Platform, wd)
		}
		img, err := idx.Image(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Architecture != want[i].Platform.Architecture || cfg.OS != "linux" || cfg.Config.User != NonRoot {
			t.Errorf("image %s: config %s/%s user %s", d.Digest, cfg.OS, cfg.Architecture, cfg.Config.User)
		}
	}
}

func TestIndexRefusesWhatIsNoIndex(t *testing.T) {
	imgs := platformImages(t)
	tests := map[string]struct {
		imgs    []PlatformImage
		wantErr string
	}{
		"none":                {wantErr: "at least one image"},
		"a platform twice":    {imgs: []PlatformImage{imgs[0], imgs[0]}, wantErr: "two images for linux/amd64"},
		"an image of another": {imgs: []PlatformImage{{Platform: LinuxARM64, Image: imgs[0].Image}}, wantErr: "the image for linux/arm64 says it is linux/amd64"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			if _, err := Index(tt.imgs...); err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Index: %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
}
