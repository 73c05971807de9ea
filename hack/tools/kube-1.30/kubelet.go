package main

import (
	"github.com/spf13/cobra"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

// newKubeletCommand is Kubernetes 1.30's constructor, which takes no context.
func newKubeletCommand() *cobra.Command { return kubelet.NewKubeletCommand() }
