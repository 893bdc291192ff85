package main

// `harness control-plane`: embedded etcd plus the real kube-apiserver (its own cobra command from
// k8s.io/kubernetes/cmd/kube-apiserver/app), both on loopback, in one process. It writes
// kubeconfigs for an admin (system:masters) and for the scheduler (system:kube-scheduler, bound by
// the API server's bootstrap RBAC), then a `ready` file once /readyz answers ok.

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	apiserverapp "k8s.io/kubernetes/cmd/kube-apiserver/app"
)

type controlPlaneFlags struct {
	dir        string
	extraArgs  stringList
	readyAfter time.Duration
}

func runControlPlane(args []string) error {
	var f controlPlaneFlags
	fs := flag.NewFlagSet("control-plane", flag.ContinueOnError)
	fs.StringVar(&f.dir, "dir", "", "work directory: etcd data, pki, kubeconfigs, logs (required)")
	fs.Var(&f.extraArgs, "apiserver-arg", "extra kube-apiserver flag, e.g. --max-requests-inflight=800 (repeatable)")
	fs.DurationVar(&f.readyAfter, "ready-timeout", 3*time.Minute, "give up when /readyz is not ok by then")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if f.dir == "" {
		return fmt.Errorf("control-plane: --dir is required")
	}
	keys := pki{dir: filepath.Join(f.dir, "pki")}
	if err := keys.create(); err != nil {
		return fmt.Errorf("control-plane: writing certificates: %w", err)
	}
	etcd, etcdURL, err := startEtcd(filepath.Join(f.dir, "etcd"))
	if err != nil {
		return fmt.Errorf("control-plane: starting embedded etcd: %w", err)
	}
	defer etcd.Close()
	port, err := freePort()
	if err != nil {
		return err
	}
	server := "https://127.0.0.1:" + strconv.Itoa(port)
	if err := writeKubeconfigs(keys, f.dir, server); err != nil {
		return err
	}
	cmd := apiserverapp.NewAPIServerCommand()
	cmd.SetArgs(append(apiserverArgs(keys, etcdURL, port), f.extraArgs...))
	done := make(chan error, 1)
	go func() { done <- cmd.Execute() }()
	go announceReady(f.dir, f.readyAfter, done)
	err = <-done
	if err != nil {
		return fmt.Errorf("kube-apiserver: %w", err)
	}
	return nil
}

func apiserverArgs(keys pki, etcdURL string, port int) []string {
	return []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--tls-cert-file=" + keys.serveCrt(),
		"--tls-private-key-file=" + keys.serveKey(),
		"--client-ca-file=" + keys.caCert(),
		"--service-account-key-file=" + keys.saPub(),
		"--service-account-signing-key-file=" + keys.saKey(),
		"--service-account-issuer=https://kubernetes.default.svc",
		"--api-audiences=https://kubernetes.default.svc",
		"--service-cluster-ip-range=10.0.0.0/24",
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		// No node lifecycle controller runs here to lift the not-ready taints it would add.
		"--disable-admission-plugins=TaintNodesByCondition",
		"--allow-privileged=true",
		"--endpoint-reconciler-type=none",
		"--profiling=false",
		"--shutdown-delay-duration=0s",
		draFeatureGateFlag(), // features.go
	}
}

func writeKubeconfigs(keys pki, dir, server string) error {
	users := []struct {
		file, user string
		groups     []string
	}{
		{"admin.kubeconfig", "e2e-admin", []string{"system:masters"}},
		{"scheduler.kubeconfig", "system:kube-scheduler", nil},
	}
	for _, u := range users {
		if err := keys.writeClientKubeconfig(filepath.Join(dir, u.file), server, u.user, u.groups); err != nil {
			return fmt.Errorf("control-plane: writing %s: %w", u.file, err)
		}
	}
	return nil
}

// startEtcd runs a single-member etcd on two free loopback ports; fsync is off because the data
// lives only as long as the test run.
func startEtcd(dataDir string) (*embed.Etcd, string, error) {
	clientPort, err := freePort()
	if err != nil {
		return nil, "", err
	}
	peerPort, err := freePort()
	if err != nil {
		return nil, "", err
	}
	clientURL := url.URL{Scheme: "http", Host: "127.0.0.1:" + strconv.Itoa(clientPort)}
	peerURL := url.URL{Scheme: "http", Host: "127.0.0.1:" + strconv.Itoa(peerPort)}
	cfg := embed.NewConfig()
	cfg.Dir = dataDir
	cfg.ListenClientUrls = []url.URL{clientURL}
	cfg.AdvertiseClientUrls = []url.URL{clientURL}
	cfg.ListenPeerUrls = []url.URL{peerURL}
	cfg.AdvertisePeerUrls = []url.URL{peerURL}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.LogLevel = "warn"
	cfg.UnsafeNoFsync = true
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, "", err
	}
	select {
	case <-e.Server.ReadyNotify():
		return e, clientURL.String(), nil
	case <-time.After(time.Minute):
		e.Close()
		return nil, "", fmt.Errorf("etcd not ready after 1m in %s", dataDir)
	}
}

// announceReady writes <dir>/ready when the API server's /readyz is ok, so that callers wait
// on a file rather than parse logs.
func announceReady(dir string, timeout time.Duration, done chan<- error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(dir, "admin.kubeconfig"))
	if err != nil {
		done <- err
		return
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		done <- err
		return
	}
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		body, err := client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		cancel()
		if err == nil && string(body) == "ok" {
			if werr := os.WriteFile(filepath.Join(dir, "ready"), []byte(cfg.Host+"\n"), 0o644); werr != nil {
				done <- werr
			}
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	done <- fmt.Errorf("kube-apiserver /readyz not ok after %s", timeout)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// stringList is a repeatable string flag.
type stringList []string

func (s *stringList) String() string     { return fmt.Sprint(*s) }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }
