package main

// `harness realnode`: one real node. The full kubelet (k8s.io/kubernetes/cmd/kubelet at the pinned
// version, run as `harness kubelet`) and containerd 2.x with runc
// (tests/e2e/realnode, built by its build.sh) run in their own mount namespace, as `harness node`
// does, against the e2e control plane. Inside that namespace:
//
//	/var/lib/kubelet     <- DIR/kubelet     (device-plugins/kubelet.sock, plugins_registry, pods)
//	/var/lib/containerd  <- DIR/containerd  (images, overlayfs snapshots)
//	/run/containerd      a tmpfs           (containerd.sock, shim sockets)
//	/var/run/cdi         <- DIR/cdi         (the CDI spec directory containerd reads)
//
// so that the paths the chart's DaemonSet mounts mean what they mean on a node, while the host's
// own /var/lib and /run stay untouched. Container logs go to DIR/logs/pods (the kubelet's
// podLogsDir). Images are imported from OCI archives with containerd's ctr before the kubelet
// starts (no registry is reachable). Pods run in the host's network namespace (hostNetwork): no
// CNI configuration is installed, so containerd reports the network not ready and the Node is
// NotReady, which nothing here acts on (no node lifecycle controller runs).
//
// Signals: SIGHUP restarts the kubelet only (containerd and the containers keep running, as on a
// node where systemd restarts kubelet.service); SIGTERM/SIGINT stop the kubelet and containerd,
// kill every process left in the namespace (shims, containers) and remove the node's cgroups.

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
)

type realNodeFlags struct {
	nodeFlags
	dir         string
	binDir      string
	images      string
	kubeletPort int
	taints      string
	deviceNodes string
	serviceIP   bool
	labels      string
}

func parseRealNodeFlags(args []string) (realNodeFlags, error) {
	var f realNodeFlags
	fs := flag.NewFlagSet("realnode", flag.ContinueOnError)
	fs.StringVar(&f.name, "name", "", "Node name (required)")
	fs.StringVar(&f.dir, "dir", "", "the node's directory: kubelet/, containerd/, cdi/, logs/ (required)")
	fs.StringVar(&f.controlPlane, "control-plane-dir", "", "the --dir of `harness control-plane` (required)")
	fs.StringVar(&f.binDir, "bin-dir", "", "containerd, containerd-shim-runc-v2, ctr and runc (required)")
	fs.StringVar(&f.images, "images", "", "comma-separated OCI image archives to import before the kubelet starts")
	fs.IntVar(&f.kubeletPort, "kubelet-port", 10250, "the kubelet's HTTPS port on 127.0.0.1")
	fs.StringVar(&f.taints, "register-with-taints", "", "the kubelet's --register-with-taints (key=value:Effect,...)")
	fs.StringVar(&f.labels, "node-labels", "", "the kubelet's --node-labels (key=value,...)")
	fs.BoolVar(&f.serviceIP, "kubernetes-service", false, "route the kubernetes Service's address (10.0.0.1:443) to the API server, for in-cluster clients on the host network")
	fs.StringVar(&f.deviceNodes, "device-nodes", "", "JSON list of {path, major, minor}: character devices to create under the node's /dev")
	if err := fs.Parse(args); err != nil {
		return f, err
	}
	if f.name == "" || f.dir == "" || f.controlPlane == "" || f.binDir == "" {
		return f, errors.New("realnode: --name, --dir, --control-plane-dir and --bin-dir are required")
	}
	for _, p := range []*string{&f.dir, &f.binDir, &f.controlPlane} {
		abs, err := filepath.Abs(*p)
		if err != nil {
			return f, err
		}
		*p = abs
	}
	f.kubeletDir = filepath.Join(f.dir, "kubelet")
	return f, nil
}

func (f realNodeFlags) path(parts ...string) string {
	return filepath.Join(append([]string{f.dir}, parts...)...)
}

const (
	containerdSocket = "/run/containerd/containerd.sock"
	criNamespace     = "k8s.io"
	// The sandbox ("pause") image every pod starts with; built here like the workload image.
	sandboxImage = "gpuweave.test/pause:1"
)

func runRealNode(args []string) error {
	f, err := parseRealNodeFlags(args)
	if err != nil {
		return err
	}
	if os.Getenv(inNamespaceEnv) != "1" {
		for _, d := range []string{"kubelet", "containerd", "cdi", "logs/pods"} {
			if err := os.MkdirAll(f.path(d), 0o755); err != nil {
				return err
			}
		}
		if err := writeRealNodeConfig(f); err != nil {
			return fmt.Errorf("realnode %s: %w", f.name, err)
		}
		return reexecInMountNamespace("realnode", f.nodeFlags, args)
	}
	if err := mountRealNode(f); err != nil {
		return fmt.Errorf("realnode %s: %w", f.name, err)
	}
	return superviseRealNode(f)
}

// cgroupRoot is the node's own cgroup subtree (the kubelet's cgroupRoot): kubepods and the QoS
// classes sit below it in every hierarchy, so stopping the node removes exactly what it made.
func (f realNodeFlags) cgroupRoot() string { return "/gpuweave-e2e-" + f.name }

func writeRealNodeConfig(f realNodeFlags) error {
	containerd := fmt.Sprintf(`version = 3
root = "/var/lib/containerd"
state = "/run/containerd"

[grpc]
  address = %q

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = %q

[plugins.'io.containerd.cri.v1.runtime']
  cdi_spec_dirs = ["/var/run/cdi"]
  # Lowering a process's oom_score_adj needs CAP_SYS_RESOURCE, which some CI sandboxes withhold
  # even from root; containers then start at containerd's own score or higher.
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = %q
        SystemdCgroup = false
    # The chart's DaemonSet asks for runtimeClassName nvidia; here it is plain runc.
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia.options]
        BinaryName = %q
        SystemdCgroup = false
`, containerdSocket, sandboxImage, filepath.Join(f.binDir, "runc"), filepath.Join(f.binDir, "runc"))
	if err := os.WriteFile(f.path("containerd.toml"), []byte(containerd), 0o644); err != nil {
		return err
	}
	kubelet := map[string]any{
		"apiVersion":                "kubelet.config.k8s.io/v1beta1",
		"kind":                      "KubeletConfiguration",
		"address":                   "127.0.0.1",
		"port":                      f.kubeletPort,
		"readOnlyPort":              0,
		"healthzPort":               0,
		"authentication":            map[string]any{"anonymous": map[string]any{"enabled": false}, "webhook": map[string]any{"enabled": false}, "x509": map[string]any{"clientCAFile": filepath.Join(f.controlPlane, "pki", "ca.crt")}},
		"authorization":             map[string]any{"mode": "AlwaysAllow"},
		"cgroupDriver":              "cgroupfs",
		"cgroupRoot":                f.cgroupRoot(),
		"cgroupsPerQOS":             true,
		"failCgroupV1":              false,
		"failSwapOn":                false,
		"containerRuntimeEndpoint":  "unix://" + containerdSocket,
		"podLogsDir":                f.path("logs", "pods"),
		"nodeStatusUpdateFrequency": "1s",
		"nodeStatusReportFrequency": "1s",
		"syncFrequency":             "5s",
		// A shared CI machine's disk and memory are not this test's to police.
		"evictionHard": map[string]string{"memory.available": "1Mi", "nodefs.available": "1%",
			"imagefs.available": "1%", "nodefs.inodesFree": "1%"},
		"imageGCHighThresholdPercent": 100,
		"imageGCLowThresholdPercent":  99,
		"featureGates":                draFeatureGateMap(), // features_k1xx.go
		"resolvConf":                  "",
		"registerNode":                true,
		"serializeImagePulls":         false,
		"shutdownGracePeriod":         "0s",
	}
	raw, err := json.MarshalIndent(kubelet, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(f.path("kubelet.json"), raw, 0o644) // JSON is YAML to the kubelet's loader
}

// mountRealNode lays out the node's paths (see the package comment) in this mount namespace.
func mountRealNode(f realNodeFlags) error {
	if err := mountKubeletDir(f.kubeletDir); err != nil { // node.go: / private, tmpfs /var/lib
		return err
	}
	binds := [][2]string{{f.path("containerd"), "/var/lib/containerd"}, {f.path("cdi"), "/var/run/cdi"}}
	for _, b := range binds {
		if err := os.MkdirAll(b[1], 0o755); err != nil {
			return err
		}
		if err := syscall.Mount(b[0], b[1], "", syscall.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind-mounting %s on %s: %w", b[0], b[1], err)
		}
	}
	if err := os.MkdirAll("/run/containerd", 0o755); err != nil {
		return err
	}
	if err := syscall.Mount("tmpfs", "/run/containerd", "tmpfs", 0, "mode=0711"); err != nil {
		return fmt.Errorf("mounting a tmpfs on /run/containerd: %w", err)
	}
	if f.deviceNodes != "" {
		if err := makeDeviceNodes(f); err != nil {
			return err
		}
	}
	return makeCgroupRoot(f.cgroupRoot())
}

type deviceNode struct {
	Path  string `json:"path"`
	Major uint32 `json:"major"`
	Minor uint32 `json:"minor"`
}

// makeDeviceNodes gives the node the simulated hardware's device nodes as real character devices
// at their real paths (/dev/nvidia0, /dev/infiniband/uverbs0, ...), where the runtime looks for a
// device plugin's DeviceSpec host paths and the CDI specs' nodes. The node's /dev is an overlay:
// the host's /dev below, a tmpfs above, so the nodes exist in this mount namespace only. The
// overlay hides /dev's own mounts, so devpts, shm and mqueue are mounted again.
func makeDeviceNodes(f realNodeFlags) error {
	raw, err := os.ReadFile(f.deviceNodes)
	if err != nil {
		return err
	}
	var nodes []deviceNode
	if err := json.Unmarshal(raw, &nodes); err != nil {
		return fmt.Errorf("--device-nodes %s: %w", f.deviceNodes, err)
	}
	layer := f.path("devfs")
	if err := os.MkdirAll(layer, 0o755); err != nil {
		return err
	}
	if err := syscall.Mount("tmpfs", layer, "tmpfs", 0, "mode=0755"); err != nil {
		return fmt.Errorf("mounting the /dev overlay's tmpfs: %w", err)
	}
	for _, d := range []string{"upper", "work"} {
		if err := os.MkdirAll(filepath.Join(layer, d), 0o755); err != nil {
			return err
		}
	}
	options := "lowerdir=/dev,upperdir=" + filepath.Join(layer, "upper") + ",workdir=" + filepath.Join(layer, "work")
	if err := syscall.Mount("overlay", "/dev", "overlay", 0, options); err != nil {
		return fmt.Errorf("mounting an overlay on /dev: %w", err)
	}
	again := []struct{ fstype, target, data string }{
		{"devpts", "/dev/pts", "newinstance,ptmxmode=0666,mode=0620"},
		{"tmpfs", "/dev/shm", "mode=1777"},
		{"mqueue", "/dev/mqueue", ""},
	}
	for _, m := range again {
		if err := os.MkdirAll(m.target, 0o755); err != nil {
			return err
		}
		if err := syscall.Mount(m.fstype, m.target, m.fstype, 0, m.data); err != nil {
			return fmt.Errorf("mounting %s on %s: %w", m.fstype, m.target, err)
		}
	}
	for _, n := range nodes {
		if !strings.HasPrefix(n.Path, "/dev/") || strings.Contains(n.Path, "..") {
			return fmt.Errorf("--device-nodes: %q is not a path below /dev", n.Path)
		}
		if err := os.MkdirAll(filepath.Dir(n.Path), 0o755); err != nil {
			return err
		}
		_ = os.Remove(n.Path)
		if err := syscall.Mknod(n.Path, syscall.S_IFCHR|0o666, int(unix.Mkdev(n.Major, n.Minor))); err != nil {
			return fmt.Errorf("mknod %s (%d:%d): %w", n.Path, n.Major, n.Minor, err)
		}
	}
	klog.InfoS("device nodes created", "count", len(nodes), "overlay", layer)
	return nil
}

// cgroupHierarchies are the mounted cgroup hierarchies (v1 controllers and the v2 one).
func cgroupHierarchies() []string {
	raw, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(raw), "\n") {
		fields := strings.Fields(line)
		if len(fields) >= 3 && (fields[2] == "cgroup" || fields[2] == "cgroup2") {
			out = append(out, fields[1])
		}
	}
	return out
}

func makeCgroupRoot(root string) error {
	for _, h := range cgroupHierarchies() {
		if err := os.MkdirAll(filepath.Join(h, root), 0o755); err != nil {
			return fmt.Errorf("creating the node's cgroup %s in %s: %w", root, h, err)
		}
	}
	return nil
}

// removeCgroupTree removes the node's cgroups, deepest first (a cgroup directory is removed with
// rmdir once it holds no process).
func removeCgroupTree(root string) {
	for _, h := range cgroupHierarchies() {
		var dirs []string
		_ = filepath.WalkDir(filepath.Join(h, root), func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
		for _, d := range dirs {
			_ = syscall.Rmdir(d)
		}
	}
}

type child struct {
	name string
	cmd  *exec.Cmd
	done chan error
}

func startChild(name, logPath string, env []string, argv ...string) (*child, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	c := &child{name: name, cmd: cmd, done: make(chan error, 1)}
	go func() { c.done <- cmd.Wait(); logFile.Close() }()
	klog.InfoS("started", "component", name, "pid", cmd.Process.Pid, "log", logPath)
	return c, nil
}

func (c *child) stop(grace time.Duration) {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(grace):
		_ = c.cmd.Process.Kill()
		<-c.done
	}
}

func waitForSocket(path string, c *child, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if conn, err := net.Dial("unix", path); err == nil {
			conn.Close()
			return nil
		}
		select {
		case err := <-c.done:
			return fmt.Errorf("%s exited before %s answered: %v", c.name, path, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s did not answer on %s within %s", c.name, path, timeout)
}

func superviseRealNode(f realNodeFlags) error {
	env := append(os.Environ(), "PATH="+f.binDir+":"+os.Getenv("PATH"))
	containerd, err := startChild("containerd", f.path("logs", "containerd.log"), env,
		filepath.Join(f.binDir, "containerd"), "--config", f.path("containerd.toml"))
	if err != nil {
		return err
	}
	defer cleanUpRealNode(f, containerd)
	if f.serviceIP {
		stopProxy, err := routeKubernetesService(f)
		if err != nil {
			return err
		}
		defer stopProxy()
	}
	if err := waitForSocket(containerdSocket, containerd, 60*time.Second); err != nil {
		return err
	}
	for _, image := range strings.Split(f.images, ",") {
		if image == "" {
			continue
		}
		out, err := exec.Command(filepath.Join(f.binDir, "ctr"), "--address", containerdSocket, "--namespace",
			criNamespace, "images", "import", "--platform", "linux/amd64", image).CombinedOutput()
		if err != nil {
			return fmt.Errorf("importing %s: %v: %s", image, err, bytes.TrimSpace(out))
		}
		klog.InfoS("image imported", "archive", image, "ctr", string(bytes.TrimSpace(out)))
	}
	starts := 0
	startKubelet := func() (*child, error) {
		starts++
		return startChild("kubelet", f.path("logs", "kubelet-"+strconv.Itoa(starts)+".log"), os.Environ(),
			"/proc/self/exe", "kubelet", "--config", f.path("kubelet.json"),
			"--kubeconfig", nodeKubeconfigPath(f.nodeFlags), "--hostname-override", f.name,
			"--register-with-taints", f.taints, "--node-labels", f.labels, "--v", "2")
	}
	kubelet, err := startKubelet()
	if err != nil {
		return err
	}
	if err := os.WriteFile(f.path("ready"), []byte("ok\n"), 0o644); err != nil {
		return err
	}
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	for {
		select {
		case s := <-signals:
			if s != syscall.SIGHUP {
				kubelet.stop(10 * time.Second)
				return nil
			}
			klog.InfoS("restarting the kubelet (SIGHUP)")
			kubelet.stop(10 * time.Second)
			if kubelet, err = startKubelet(); err != nil {
				return err
			}
		case err := <-kubelet.done:
			return fmt.Errorf("the kubelet exited: %v (log: %s)", err, f.path("logs", "kubelet-"+strconv.Itoa(starts)+".log"))
		case err := <-containerd.done:
			kubelet.stop(10 * time.Second)
			return fmt.Errorf("containerd exited: %v (log: %s)", err, f.path("logs", "containerd.log"))
		}
	}
}

// cleanUpRealNode stops containerd, then kills what is left (shims, which outlive containerd by
// design, in this mount namespace; containers, in their own namespaces, in the node's cgroups) and
// removes the node's cgroups.
func cleanUpRealNode(f realNodeFlags, containerd *child) {
	containerd.stop(10 * time.Second)
	for round := 0; round < 50; round++ {
		pids := nodeProcesses(f)
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		if len(pids) == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	removeCgroupTree(f.cgroupRoot())
	klog.InfoS("node stopped", "name", f.name)
}

// nodeProcesses are the live processes of this node other than this one: those in this mount
// namespace and those in the node's cgroups.
func nodeProcesses(f realNodeFlags) []int {
	seen := map[int]bool{}
	if own, err := os.Readlink("/proc/self/ns/mnt"); err == nil {
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			if ns, err := os.Readlink(filepath.Join("/proc", e.Name(), "ns", "mnt")); err == nil && ns == own {
				seen[pid] = true
			}
		}
	}
	for _, h := range cgroupHierarchies() {
		_ = filepath.WalkDir(filepath.Join(h, f.cgroupRoot()), func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
				return nil
			}
			raw, _ := os.ReadFile(p)
			for _, field := range strings.Fields(string(raw)) {
				if pid, err := strconv.Atoi(field); err == nil {
					seen[pid] = true
				}
			}
			return nil
		})
	}
	delete(seen, os.Getpid())
	pids := make([]int, 0, len(seen))
	for pid := range seen {
		pids = append(pids, pid)
	}
	return pids
}

// The kubernetes Service's ClusterIP and port (the control plane's --service-cluster-ip-range is
// 10.0.0.0/24), which the kubelet gives every pod as KUBERNETES_SERVICE_HOST/PORT.
const kubernetesServiceAddr = "10.0.0.1:443"

// routeKubernetesService stands in for kube-proxy for that one Service: the address goes on the
// loopback interface (pods here share the host's network) and a TCP relay forwards it to the API
// server. The serving certificate already names 10.0.0.1. The returned function undoes both.
func routeKubernetesService(f realNodeFlags) (func(), error) {
	admin, err := clientcmd.LoadFromFile(filepath.Join(f.controlPlane, "admin.kubeconfig"))
	if err != nil {
		return nil, err
	}
	server, err := url.Parse(admin.Clusters[admin.Contexts[admin.CurrentContext].Cluster].Server)
	if err != nil {
		return nil, err
	}
	host, _, _ := net.SplitHostPort(kubernetesServiceAddr)
	added := false
	if out, err := exec.Command("ip", "addr", "add", host+"/32", "dev", "lo").CombinedOutput(); err == nil {
		added = true
	} else if !strings.Contains(string(out), "File exists") && !strings.Contains(string(out), "already assigned") {
		// iproute2 reports an address that is already there as "File exists" (older) or
		// "Address already assigned" (6.x); either way it is on lo and only the relay is missing.
		return nil, fmt.Errorf("adding %s to lo: %v: %s", host, err, bytes.TrimSpace(out))
	}
	ln, err := net.Listen("tcp", kubernetesServiceAddr)
	if err != nil {
		return nil, err
	}
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go relay(conn, server.Host)
		}
	}()
	klog.InfoS("kubernetes Service routed", "address", kubernetesServiceAddr, "apiserver", server.Host)
	return func() {
		ln.Close()
		if added {
			_ = exec.Command("ip", "addr", "del", host+"/32", "dev", "lo").Run()
		}
	}, nil
}

func relay(in net.Conn, target string) {
	defer in.Close()
	out, err := net.DialTimeout("tcp", target, 5*time.Second)
	if err != nil {
		return
	}
	defer out.Close()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(out, in); done <- struct{}{} }()
	go func() { _, _ = io.Copy(in, out); done <- struct{}{} }()
	<-done
}
