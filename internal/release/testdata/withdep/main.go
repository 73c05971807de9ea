// Command withdep is a binary with one module dependency, for the SBOM test.
package main

import (
	"fmt"

	"github.com/google/go-containerregistry/pkg/name"
)

func main() { fmt.Println(name.DefaultRegistry) }
