//go:build tools

// This file pins kube-apiserver v1.37.2, which hack/kube-binaries.sh builds
// with `go build k8s.io/kubernetes/cmd/kube-apiserver` in this module. The
// build tag keeps it out of every build; the import keeps the packages
// kube-apiserver needs in go.mod and go.sum. (Package main, like the main.go
// that a module building the full kube binary holds beside it.)
package main

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
