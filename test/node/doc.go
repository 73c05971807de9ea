// Package node is the real-node end-to-end test: `make e2e-node` builds the
// project's images, starts a single-node Kubernetes cluster on this machine
// (containerd, runc, the CNI bridge plugin, kubelet and the control plane,
// inside a network namespace of its own), installs the chart with the Helm
// CLI, and watches real pods heartbeat. Its files carry the build tag
// "node", so that `go test ./...` leaves it out; it needs root.
package node
