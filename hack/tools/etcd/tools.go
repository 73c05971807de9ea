//go:build tools

// Package tools pins the etcd server that envtest and the local clusters run.
// The build tag keeps this file out of every build; the import keeps the
// module in go.mod so that `go build go.etcd.io/etcd/server/v3` resolves.
package tools

import _ "go.etcd.io/etcd/server/v3"
