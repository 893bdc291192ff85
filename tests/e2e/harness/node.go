package main

// `harness node`: one simulated node whose device handling is the kubelet's own. The kubelet's
// device manager (k8s.io/kubernetes/pkg/kubelet/cm/devicemanager) listens on the fixed path
// /var/lib/kubelet/device-plugins/kubelet.sock, so each node runs in its own mount namespace
// where --kubelet-dir is bind-mounted on /var/lib/kubelet: seen from outside, the registration
// socket is <kubelet-dir>/device-plugins/kubelet.sock, as on a real node.
//
// The node registers its Node object with node credentials (system:node:<name>, so the API
// server's Node authorizer and NodeRestriction apply), mirrors the device manager's capacity and
// allocatable into the Node status, and admits the pods bound to it through the kubelet's
// admission path (topology manager -> device manager Allocate, incl. GetPreferredAllocation;
// then the predicate admit handler). See admit.go.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
)

const inNamespaceEnv = "GPUWEAVE_E2E_NODE_NAMESPACE"

type nodeFlags struct {
	name           string
	kubeletDir     string
	controlPlane   string
	topologyPolicy string
	numaNodes      int
	cpu            string
	memory         string
	statusInterval time.Duration
}

func parseNodeFlags(args []string) (nodeFlags, error) {
	var f nodeFlags
	fs := flag.NewFlagSet("node", flag.ContinueOnError)
	fs.StringVar(&f.name, "name", "", "Node name (required)")
	fs.StringVar(&f.kubeletDir, "kubelet-dir", "", "directory seen by this node as /var/lib/kubelet (required)")
	fs.StringVar(&f.controlPlane, "control-plane-dir", "", "the --dir of `harness control-plane` (required)")
	fs.StringVar(&f.topologyPolicy, "topology-policy", "none", "kubelet topology manager policy")
	fs.IntVar(&f.numaNodes, "numa-nodes", 2, "NUMA nodes the topology manager sees (policies other than none)")
	fs.StringVar(&f.cpu, "cpu", "96", "Node cpu capacity")
	fs.StringVar(&f.memory, "memory", "1Ti", "Node memory capacity")
	fs.DurationVar(&f.statusInterval, "status-interval", time.Second, "how often the Node status is refreshed")
	if err := fs.Parse(args); err != nil {
		return f, err
	}
	if f.name == "" || f.kubeletDir == "" || f.controlPlane == "" {
		return f, errors.New("node: --name, --kubelet-dir and --control-plane-dir are required")
	}
	abs, err := filepath.Abs(f.kubeletDir)
	if err != nil {
		return f, err
	}
	f.kubeletDir = abs
	return f, nil
}

func runNode(args []string) error {
	f, err := parseNodeFlags(args)
	if err != nil {
		return err
	}
	if os.Getenv(inNamespaceEnv) != "1" {
		return reexecInMountNamespace("node", f, args)
	}
	if err := enableDRAFeatureGates(); err != nil { // features.go
		return err
	}
	if err := mountKubeletDir(f.kubeletDir); err != nil {
		return fmt.Errorf("node %s: %w", f.name, err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	return serveNode(ctx, f)
}

// reexecInMountNamespace mints the node's credentials, then runs this same command (`harness
// <command> args...`) again in a new mount namespace and relays SIGTERM/SIGINT (and SIGHUP, which
// `harness realnode` takes as "restart the kubelet") to it.
func reexecInMountNamespace(command string, f nodeFlags, args []string) error {
	if err := os.MkdirAll(f.kubeletDir, 0o755); err != nil {
		return err
	}
	if err := writeNodeKubeconfig(f); err != nil {
		return fmt.Errorf("node %s: writing credentials: %w", f.name, err)
	}
	cmd := exec.Command("/proc/self/exe", append([]string{command}, args...)...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), inNamespaceEnv+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("node %s: starting in a new mount namespace (needs root): %w", f.name, err)
	}
	signals := make(chan os.Signal, 2)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	go func() {
		for s := range signals {
			_ = cmd.Process.Signal(s)
		}
	}()
	return cmd.Wait()
}

func nodeKubeconfigPath(f nodeFlags) string { return filepath.Join(f.kubeletDir, "kubelet.kubeconfig") }

func writeNodeKubeconfig(f nodeFlags) error {
	admin, err := clientcmd.LoadFromFile(filepath.Join(f.controlPlane, "admin.kubeconfig"))
	if err != nil {
		return err
	}
	server := admin.Clusters[admin.Contexts[admin.CurrentContext].Cluster].Server
	keys := pki{dir: filepath.Join(f.controlPlane, "pki")}
	return keys.writeClientKubeconfig(nodeKubeconfigPath(f), server, "system:node:"+f.name,
		[]string{"system:nodes"})
}

// mountKubeletDir makes <kubeletDir> appear at /var/lib/kubelet for this process only; a tmpfs
// over /var/lib keeps the host's /var/lib untouched.
func mountKubeletDir(kubeletDir string) error {
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making / private in the node's mount namespace: %w", err)
	}
	if err := syscall.Mount("tmpfs", "/var/lib", "tmpfs", 0, "mode=0755"); err != nil {
		return fmt.Errorf("mounting a tmpfs on /var/lib: %w", err)
	}
	if err := os.MkdirAll("/var/lib/kubelet", 0o755); err != nil {
		return err
	}
	if err := syscall.Mount(kubeletDir, "/var/lib/kubelet", "", syscall.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind-mounting %s on /var/lib/kubelet: %w", kubeletDir, err)
	}
	klog.InfoS("kubelet directory mounted", "source", kubeletDir, "target", "/var/lib/kubelet")
	return nil
}
