// Command images writes the project's images as OCI tarballs, for machines
// without a container engine (make images-tar): addon-heartbeat (/webhook and
// /reporter), a pause image and the example addon. Load them with
// `docker load -i`, `podman load -i` or `ctr -n k8s.io images import`.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/addon-heartbeat/addon-heartbeat/internal/images"
)

func main() {
	out := flag.String("out", "bin/images", "folder to write the tarballs into")
	tag := flag.String("tag", "v0.2.0", "tag of every image (not latest)")
	flag.Parse()
	root, err := os.Getwd()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	abs, err := filepath.Abs(*out)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	built, err := images.Project(root, abs, *tag, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for _, b := range built {
		fmt.Println(b)
	}
}
