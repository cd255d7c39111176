// Command tpuflow-kube is the real Kubernetes control plane for tpuflow's GKE rehearsal (issue 46), one binary
// for four programs so that their shared packages are compiled and linked once:
//
//	tpuflow-kube etcd [etcd flags]                        go.etcd.io/etcd/server/v3's own etcd command
//	tpuflow-kube kube-apiserver [flags]                   k8s.io/kubernetes/cmd/kube-apiserver
//	tpuflow-kube kube-controller-manager [flags]          k8s.io/kubernetes/cmd/kube-controller-manager
//	tpuflow-kube kube-scheduler [flags]                   k8s.io/kubernetes/cmd/kube-scheduler
//
// Each branch is the upstream main function verbatim; nothing here changes what the programs do.
package main

import (
	"fmt"
	"os"
	_ "time/tzdata" // CronJob time zones, as upstream's mains

	"github.com/spf13/cobra"
	"go.etcd.io/etcd/server/v3/etcdmain"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: tpuflow-kube etcd|kube-apiserver|kube-controller-manager|kube-scheduler [flags]")
		os.Exit(2)
	}
	program, args := os.Args[1], os.Args[2:]
	var command *cobra.Command
	switch program {
	case "etcd":
		etcdmain.Main(append([]string{"etcd"}, args...))
		return
	case "kube-apiserver":
		command = apiserver.NewAPIServerCommand()
	case "kube-controller-manager":
		command = controllermanager.NewControllerManagerCommand()
	case "kube-scheduler":
		command = scheduler.NewSchedulerCommand()
	default:
		fmt.Fprintf(os.Stderr, "tpuflow-kube: unknown program %q (etcd, kube-apiserver, kube-controller-manager, kube-scheduler)\n", program)
		os.Exit(2)
	}
	command.SetArgs(args)
	os.Exit(cli.Run(command))
}
