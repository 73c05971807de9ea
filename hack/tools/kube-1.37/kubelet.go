package main

import (
	"context"

	"github.com/spf13/cobra"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

// newKubeletCommand is Kubernetes 1.31+'s constructor, which takes a context.
func newKubeletCommand() *cobra.Command { return kubelet.NewKubeletCommand(context.Background()) }
