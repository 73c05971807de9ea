package images

import (
	"fmt"
	"io"
	"path/filepath"
)

// Repositories of the images the project builds.
const (
	// AddonHeartbeat holds /webhook (the entrypoint) and /reporter, as the
	// Dockerfile's image does.
	AddonHeartbeat = "ghcr.io/addon-heartbeat/addon-heartbeat"
	// Pause is the pod sandbox image for nodes without a registry.
	Pause = "localhost/addon-heartbeat/pause"
	// ExampleAddon is an addon with no heartbeat code whose readiness can be
	// switched off (hack/images/example-addon).
	ExampleAddon = "localhost/addon-heartbeat/example-addon"
)

// Built is an image written as a tarball.
type Built struct {
	Ref  string
	Path string
}

// Project builds the project's images with tag from the checkout at root and
// writes them as tarballs into out: addon-heartbeat (webhook and reporter),
// pause and example-addon. extraTags adds further tags of the
// addon-heartbeat image, each in its own tarball.
func Project(root, out, tag string, stderr io.Writer, extraTags ...string) ([]Built, error) {
	bins, err := BuildBinaries(root, filepath.Join(out, "bin"), BuildOptions{Stderr: stderr},
		"./cmd/webhook", "./cmd/reporter", "./hack/images/pause", "./hack/images/example-addon")
	if err != nil {
		return nil, err
	}
	var imgs []Image
	for _, t := range append([]string{tag}, extraTags...) {
		imgs = append(imgs, Image{
			Ref:        AddonHeartbeat + ":" + t,
			Files:      map[string]string{"/webhook": bins["webhook"], "/reporter": bins["reporter"]},
			Entrypoint: []string{"/webhook"},
			// The version label makes each tag its own image (and image ID),
			// as separately released versions would be.
			Labels: map[string]string{"org.opencontainers.image.version": t},
		})
	}
	imgs = append(imgs,
		Image{Ref: Pause + ":" + tag, Files: map[string]string{"/pause": bins["pause"]}, Entrypoint: []string{"/pause"}},
		Image{Ref: ExampleAddon + ":" + tag, Files: map[string]string{"/example-addon": bins["example-addon"]}, Entrypoint: []string{"/example-addon"}},
	)
	var built []Built
	for _, img := range imgs {
		path := filepath.Join(out, fileName(img.Ref)+".tar")
		if err := Write(img, path); err != nil {
			return nil, err
		}
		built = append(built, Built{Ref: img.Ref, Path: path})
	}
	return built, nil
}

// fileName turns an image reference into a file name.
func fileName(ref string) string {
	b := []byte(filepath.Base(ref))
	for i, c := range b {
		if c == ':' {
			b[i] = '_'
		}
	}
	return string(b)
}

// String is "ref (path)".
func (b Built) String() string { return fmt.Sprintf("%s (%s)", b.Ref, b.Path) }
