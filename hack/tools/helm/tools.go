//go:build tools

// Package tools pins the Helm CLI that the real-node end-to-end test runs
// (`go build -o <cache>/helm helm.sh/helm/v4/cmd/helm` in this module).
package tools

import _ "helm.sh/helm/v4/cmd/helm"
