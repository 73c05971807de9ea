// Command release builds a release of addon-heartbeat into a folder (make
// release VERSION=v1.2.3): the multi-platform image as an OCI image layout
// archive, the packaged chart with the image's digest, SBOMs, release notes
// from CHANGELOG.md and SHA256SUMS. See internal/release.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/addon-heartbeat/addon-heartbeat/internal/release"
)

func main() {
	v := flag.String("version", "", "the version to release, such as v0.2.0 (CHANGELOG.md must have a section for it)")
	out := flag.String("out", "", "folder to write the release into (default dist/<version>); it must not exist or be empty")
	flag.Parse()
	if *v == "" {
		fmt.Fprintln(os.Stderr, "release: -version is required, such as -version v0.2.0 (make release VERSION=v0.2.0)")
		os.Exit(2)
	}
	if *out == "" {
		*out = filepath.Join("dist", *v)
	}
	root, err := os.Getwd()
	if err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
	res, err := release.Build(release.Options{Root: root, Version: *v, Out: *out, Log: os.Stderr})
	if err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
	defer res.Cleanup()
	fmt.Printf("%s@%s\n", res.Ref, res.Digest)
	for _, f := range append([]string{res.ImageArchive, res.Chart, res.Notes, res.Checksums}, res.SBOMs...) {
		fmt.Println(filepath.Join(*out, f))
	}
}
