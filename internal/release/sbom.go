package release

import (
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"os"
	"runtime/debug"
	"slices"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// A CycloneDX 1.6 bill of materials (https://cyclonedx.org/docs/1.6/json/),
// only the fields written here.
type (
	bom struct {
		BOMFormat    string       `json:"bomFormat"`
		SpecVersion  string       `json:"specVersion"`
		SerialNumber string       `json:"serialNumber"`
		Version      int          `json:"version"`
		Metadata     bomMetadata  `json:"metadata"`
		Components   []component  `json:"components"`
		Dependencies []dependency `json:"dependencies"`
	}
	bomMetadata struct {
		Component component `json:"component"`
	}
	component struct {
		Type       string     `json:"type"`
		BOMRef     string     `json:"bom-ref"`
		Name       string     `json:"name"`
		Version    string     `json:"version,omitempty"`
		PURL       string     `json:"purl,omitempty"`
		Hashes     []hash     `json:"hashes,omitempty"`
		Properties []property `json:"properties,omitempty"`
	}
	hash struct {
		Alg     string `json:"alg"`
		Content string `json:"content"`
	}
	property struct {
		Name  string `json:"name"`
		Value string `json:"value"`
	}
	dependency struct {
		Ref       string   `json:"ref"`
		DependsOn []string `json:"dependsOn"`
	}
)

// SBOM is the CycloneDX bill of materials of one platform's image: the image
// (repository, tag and manifest digest), each Go binary in it (path, SHA-256,
// Go version, build settings) and every module the binaries were built from,
// as the Go toolchain recorded them in the binaries (debug/buildinfo), with
// which binary uses which.
func SBOM(repository, tag string, p v1.Platform, digest v1.Hash, binaries map[string]string) ([]byte, error) {
	imageRef := "pkg:oci/" + repository[strings.LastIndexByte(repository, '/')+1:] + "@" + url.PathEscape(digest.String()) +
		"?arch=" + p.Architecture + "&repository_url=" + url.QueryEscape(repository) + "&tag=" + url.QueryEscape(tag)
	b := bom{
		BOMFormat: "CycloneDX", SpecVersion: "1.6", Version: 1,
		SerialNumber: "urn:uuid:" + uuidOf(digest.String()),
		Metadata: bomMetadata{Component: component{Type: "container", BOMRef: imageRef, Name: repository, Version: tag, PURL: imageRef,
			Hashes: []hash{{Alg: "SHA-256", Content: digest.Hex}}, Properties: []property{{Name: "platform", Value: p.String()}}}},
	}
	modules := map[string]component{}
	var binRefs []string
	paths := make([]string, 0, len(binaries))
	for p := range binaries {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	for _, inImage := range paths {
		file := binaries[inImage]
		bi, err := buildinfo.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("reading the Go build info of %s: %w", file, err)
		}
		sum, err := fileSHA256(file)
		if err != nil {
			return nil, err
		}
		ref := "file:" + inImage
		binRefs = append(binRefs, ref)
		props := []property{{Name: "path", Value: inImage}, {Name: "go:package", Value: bi.Path}, {Name: "go:version", Value: bi.GoVersion}}
		for _, s := range bi.Settings {
			props = append(props, property{Name: "go:build:" + s.Key, Value: s.Value})
		}
		b.Components = append(b.Components, component{Type: "application", BOMRef: ref, Name: inImage[strings.LastIndexByte(inImage, '/')+1:],
			Version: tag, Hashes: []hash{{Alg: "SHA-256", Content: sum}}, Properties: props})
		stdlib := component{Type: "library", Name: "stdlib", Version: bi.GoVersion, PURL: "pkg:golang/stdlib@" + bi.GoVersion}
		stdlib.BOMRef = stdlib.PURL
		deps := []component{stdlib, module(bi.Main, tag)}
		for _, d := range bi.Deps {
			deps = append(deps, module(*d, ""))
		}
		var on []string
		for _, d := range deps {
			modules[d.BOMRef] = d
			on = append(on, d.BOMRef)
		}
		slices.Sort(on)
		b.Dependencies = append(b.Dependencies, dependency{Ref: ref, DependsOn: slices.Compact(on)})
	}
	refs := make([]string, 0, len(modules))
	for r := range modules {
		refs = append(refs, r)
	}
	slices.Sort(refs)
	for _, r := range refs {
		b.Components = append(b.Components, modules[r])
	}
	b.Dependencies = append([]dependency{{Ref: imageRef, DependsOn: binRefs}}, b.Dependencies...)
	out, err := json.MarshalIndent(b, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(out, '\n'), nil
}

// module is a Go module as a component: the replacement when there is one,
// and version (when not empty) for the main module, which the toolchain
// records as (devel) or a pseudo-version.
func module(m debug.Module, version string) component {
	path, v, sum := m.Path, m.Version, m.Sum
	if m.Replace != nil {
		path, v, sum = m.Replace.Path, m.Replace.Version, m.Replace.Sum
	}
	if version != "" {
		v = version
	}
	c := component{Type: "library", Name: path, Version: v, PURL: "pkg:golang/" + path + "@" + v}
	if v == "" {
		c.PURL = "pkg:golang/" + path
	}
	c.BOMRef = c.PURL
	if sum != "" {
		// The go.sum hash (h1:, a SHA-256 over the module's files): not a
		// hash of one file, so a property rather than a CycloneDX hash.
		c.Properties = []property{{Name: "go:sum", Value: sum}}
	}
	return c
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("hashing %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// uuidOf is a version 5 style UUID made from s, so that the same image gets
// the same serial number.
func uuidOf(s string) string {
	h := sha256.Sum256([]byte(s))
	h[6] = h[6]&0x0f | 0x50
	h[8] = h[8]&0x3f | 0x80
	x := hex.EncodeToString(h[:16])
	return x[0:8] + "-" + x[8:12] + "-" + x[12:16] + "-" + x[16:20] + "-" + x[20:32]
}
