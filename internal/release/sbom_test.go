package release

import (
	"encoding/json"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/addon-heartbeat/addon-heartbeat/internal/images"
	"github.com/addon-heartbeat/addon-heartbeat/internal/testenv"
)

// The SBOM of an image lists its binary (by SHA-256) and every module the
// Go toolchain recorded in it, as the binary's dependencies. A small binary
// that links go-containerregistry stands for a release binary.
func TestSBOM(t *testing.T) {
	bins, err := images.BuildBinaries(testenv.RepoRoot(), t.TempDir(), images.BuildOptions{Platform: images.LinuxARM64, Stderr: os.Stderr},
		"./internal/release/testdata/withdep")
	if err != nil {
		t.Fatal(err)
	}
	self := bins["withdep"]
	d := v1.Hash{Algorithm: "sha256", Hex: strings.Repeat("ab", 32)}
	data, err := SBOM(images.AddonHeartbeat, "v0.2.0", images.LinuxARM64, d, map[string]string{"/release.test": self})
	if err != nil {
		t.Fatal(err)
	}
	var doc bom
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.BOMFormat != "CycloneDX" || doc.SpecVersion != "1.6" || !strings.HasPrefix(doc.SerialNumber, "urn:uuid:") {
		t.Errorf("header %s %s %s", doc.BOMFormat, doc.SpecVersion, doc.SerialNumber)
	}
	img := doc.Metadata.Component
	wantPURL := "pkg:oci/addon-heartbeat@sha256:" + d.Hex + "?arch=arm64&repository_url=ghcr.io%2Faddon-heartbeat%2Faddon-heartbeat&tag=v0.2.0"
	if img.Type != "container" || img.PURL != wantPURL {
		t.Errorf("image component %+v, want purl %s", img, wantPURL)
	}
	refs := map[string]component{}
	for _, c := range doc.Components {
		if _, dup := refs[c.BOMRef]; dup {
			t.Errorf("component %s twice", c.BOMRef)
		}
		refs[c.BOMRef] = c
	}
	bin, ok := refs["file:/release.test"]
	sum, _ := fileSHA256(self)
	if !ok || len(bin.Hashes) != 1 || bin.Hashes[0].Content != sum {
		t.Errorf("binary component %+v, want SHA-256 %s", bin, sum)
	}
	var binDeps []string
	for _, dep := range doc.Dependencies {
		for _, on := range dep.DependsOn {
			if _, ok := refs[on]; !ok && on != "file:/release.test" {
				t.Errorf("%s depends on %s, which is no component", dep.Ref, on)
			}
		}
		if dep.Ref == "file:/release.test" {
			binDeps = dep.DependsOn
		}
	}
	for _, want := range []string{"pkg:golang/stdlib@" + runtime.Version(), "pkg:golang/github.com/google/go-containerregistry@v0.22.1"} {
		if !slices.Contains(binDeps, want) {
			t.Errorf("the binary's dependencies lack %s: %v", want, binDeps)
		}
	}
	if again, _ := SBOM(images.AddonHeartbeat, "v0.2.0", images.LinuxARM64, d, map[string]string{"/release.test": self}); string(again) != string(data) {
		t.Error("the same image gave two different SBOMs")
	}
}
