// Command harness runs the real Kubernetes control-plane components on loopback for gpuweave's
// end-to-end tests: `control-plane` (embedded etcd + kube-apiserver), `kube-scheduler` (the
// upstream command itself, flags passed through) and `node` (a simulated node whose device
// handling is the kubelet's device manager, DRA manager and admission path) and `controllers`
// (the ResourceClaim and device taint eviction controllers). See docs/e2e.md.
package main

import (
	"context"
	"fmt"
	"os"

	"k8s.io/component-base/cli"
	schedulerapp "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubeletapp "k8s.io/kubernetes/cmd/kubelet/app"
)

const usage = `usage: harness <command> [flags]

commands:
  control-plane --dir DIR      embedded etcd + kube-apiserver; writes DIR/admin.kubeconfig,
                               DIR/scheduler.kubeconfig, then DIR/ready
  kube-scheduler [flags]       the upstream kube-scheduler command (e.g. --config FILE),
                               with the DRA feature gates of features.go
  node --name N --kubelet-dir D --control-plane-dir DIR
                               a node: Node object, kubelet device manager on
                               D/device-plugins/kubelet.sock, DRA manager and plugin
                               watcher on D/plugins_registry, pod admission
  realnode --name N --dir D --control-plane-dir DIR --bin-dir B [--images A,B] [--device-nodes F]
                               one real node: the full kubelet and containerd + runc in
                               their own mount namespace (realnode.go); SIGHUP restarts
                               the kubelet
  kubelet [flags]              the upstream kubelet command (run by realnode)
  controllers --control-plane-dir DIR
                               the DRA controllers of kube-controller-manager: ResourceClaim
                               controller and device taint eviction
                               (--daemonsets: DaemonSet controller and root CA publisher;
                               --jobs: Job controller)
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "control-plane":
		err = runControlPlane(os.Args[2:])
	case "kube-scheduler":
		cmd := schedulerapp.NewSchedulerCommand()
		cmd.SetArgs(append([]string{draFeatureGateFlag()}, os.Args[2:]...)) // features.go
		err = cmd.Execute()
	case "node":
		err = runNode(os.Args[2:])
	case "realnode":
		err = runRealNode(os.Args[2:])
	case "kubelet":
		cmd := kubeletapp.NewKubeletCommand(context.Background())
		cmd.SetArgs(os.Args[2:])
		os.Exit(cli.Run(cmd))
	case "controllers":
		err = runControllers(os.Args[2:])
	case "kustomize":
		err = runKustomize(os.Args[2:])
	case "podresources":
		err = runPodResourcesList(os.Args[2:])
	case "-h", "--help", "help":
		fmt.Print(usage)
		return
	default:
		fmt.Fprintf(os.Stderr, "harness: unknown command %q\n%s", os.Args[1], usage)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "harness %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}
