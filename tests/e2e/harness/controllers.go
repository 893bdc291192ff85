package main

// `harness controllers`: the kube-controller-manager controllers DRA needs, from their own
// packages (not the whole controller-manager app, whose ~80 other controllers would add to every
// build): the ResourceClaim controller (k8s.io/kubernetes/pkg/controller/resourceclaim: creates a
// pod's claims from its resourceClaimTemplates, records them in the pod's status, releases
// reservations of pods that are gone, deletes generated claims with their pod) and the device
// taint eviction controller (pkg/controller/devicetainteviction: deletes pods whose allocated
// devices carry a NoExecute taint, once their toleration expires). Both run on one shared
// informer factory, as in kube-controller-manager, with the admin credentials.
//
// With --daemonsets (the realnode tier) it also runs the DaemonSet controller
// (pkg/controller/daemon: creates the chart's node-agent pod on each matching Node) and the
// root CA publisher (pkg/controller/certificates/rootcacertpublisher: the kube-root-ca.crt
// ConfigMap every namespace needs for a pod's projected service-account token).
//
// With --jobs (the Kueue and JobSet tests) it also runs the Job controller (pkg/controller/job:
// creates the pods of the batch/v1 Jobs a JobSet creates, once Kueue has admitted it and JobSet
// resumed them).

import (
	"context"
	"errors"
	"flag"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/controller/certificates/rootcacertpublisher"
	"k8s.io/kubernetes/pkg/controller/daemon"
)

// Worker counts are kube-controller-manager's defaults (--concurrent-resource-claim-syncs 50,
// --concurrent-device-taint-eviction-syncs 10).
const (
	resourceClaimWorkers      = 50
	jobWorkers                = 5 // --concurrent-job-syncs
	deviceTaintEvictWorkers   = 10
	deviceTaintControllerName = "device-taint-eviction-controller"
)

func runControllers(args []string) error {
	fs := flag.NewFlagSet("controllers", flag.ContinueOnError)
	dir := fs.String("control-plane-dir", "", "the --dir of `harness control-plane` (required)")
	daemonsets := fs.Bool("daemonsets", false, "also run the DaemonSet controller and the root CA publisher")
	jobs := fs.Bool("jobs", false, "also run the Job controller")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dir == "" {
		return errors.New("controllers: --control-plane-dir is required")
	}
	if err := enableDRAFeatureGates(); err != nil {
		return err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(*dir, "admin.kubeconfig"))
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = 50, 100
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	logger := klog.FromContext(ctx)
	factory := informers.NewSharedInformerFactory(client, 0)
	runDRA, names, err := draControllers(ctx, client, factory) // compat_k1xx.go
	if err != nil {
		return err
	}
	var extra []func()
	if *daemonsets {
		run, err := daemonSetControllers(ctx, client, factory, filepath.Join(*dir, "pki", "ca.crt"))
		if err != nil {
			return err
		}
		extra = append(extra, run)
	}
	if *jobs {
		run, err := jobController(ctx, client, factory)
		if err != nil {
			return err
		}
		extra = append(extra, run)
	}
	factory.Start(ctx.Done())
	for _, run := range extra {
		go run()
	}
	go runDRA()
	logger.Info("DRA controllers running", "controllers", names)
	<-ctx.Done()
	factory.Shutdown()
	return nil
}

// daemonSetControllers builds the DaemonSet controller and the root CA publisher on the shared
// factory (kube-controller-manager's worker counts: --concurrent-daemonset-syncs 2, one publisher
// worker); the returned function runs both.
func daemonSetControllers(ctx context.Context, client kubernetes.Interface, factory informers.SharedInformerFactory,
	caFile string) (func(), error) {
	ca, err := os.ReadFile(caFile)
	if err != nil {
		return nil, err
	}
	backoff := flowcontrol.NewBackOff(time.Second, 15*time.Second)
	dsc, err := daemon.NewDaemonSetsController(ctx, factory.Apps().V1().DaemonSets(),
		factory.Apps().V1().ControllerRevisions(), factory.Core().V1().Pods(), factory.Core().V1().Nodes(),
		client, backoff)
	if err != nil {
		return nil, err
	}
	publisher, err := rootcacertpublisher.NewPublisher(factory.Core().V1().ConfigMaps(),
		factory.Core().V1().Namespaces(), client, ca)
	if err != nil {
		return nil, err
	}
	return func() {
		go publisher.Run(ctx, 1)
		dsc.Run(ctx, 2)
	}, nil
}
