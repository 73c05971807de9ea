// Command kube is one binary holding the Kubernetes control-plane and node
// commands, built from the Go module proxy. It dispatches on the name it is
// invoked as (a symlink named kube-apiserver, kubelet, ...) or on its first
// argument. One binary instead of four shares most packages, so it builds in
// about the time of kube-apiserver alone and takes a third of the disk.
//
// The module of each Kubernetes minor that builds it (hack/tools/kube-1.*)
// links this file and has a kubelet.go of its own, since that constructor's
// signature changed between minors.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	_ "time/tzdata" // CronJob time zones in kube-controller-manager

	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

var commands = map[string]func() *cobra.Command{
	"kube-apiserver":          apiserver.NewAPIServerCommand,
	"kube-controller-manager": controllermanager.NewControllerManagerCommand,
	"kube-scheduler":          func() *cobra.Command { return scheduler.NewSchedulerCommand() },
	"kubelet":                 newKubeletCommand,
}

func main() {
	name := filepath.Base(os.Args[0])
	newCommand, ok := commands[name]
	if !ok && len(os.Args) > 1 {
		if newCommand, ok = commands[os.Args[1]]; ok {
			os.Args = os.Args[1:]
		}
	}
	if !ok {
		fmt.Fprintf(os.Stderr, "usage: %s {kube-apiserver|kube-controller-manager|kube-scheduler|kubelet} [flags]\n", name)
		os.Exit(2)
	}
	os.Exit(cli.Run(newCommand()))
}
