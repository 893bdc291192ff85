package main

// `harness controllers`: the kube-controller-manager controllers DRA needs, from their own
// packages (not the whole controller-manager app, whose ~80 other controllers would add to every
// build): the ResourceClaim controller (k8s.io/kubernetes/pkg/controller/resourceclaim: creates a
// pod's claims from its resourceClaimTemplates, records them in the pod's status, releases
// reservations of pods that are gone, deletes generated claims with their pod) and the device
// taint eviction controller (pkg/controller/devicetainteviction: deletes pods whose allocated
// devices carry a NoExecute taint, once their toleration expires). Both run on one shared
// informer factory, as in kube-controller-manager, with the admin credentials.

import (
	"context"
	"errors"
	"flag"
	"os/signal"
	"path/filepath"
	"syscall"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/controller/devicetainteviction"
	"k8s.io/kubernetes/pkg/controller/resourceclaim"
)

// Worker counts are kube-controller-manager's defaults (--concurrent-resource-claim-syncs 50,
// --concurrent-device-taint-eviction-syncs 10).
const (
	resourceClaimWorkers      = 50
	deviceTaintEvictWorkers   = 10
	deviceTaintControllerName = "device-taint-eviction-controller"
)

func runControllers(args []string) error {
	fs := flag.NewFlagSet("controllers", flag.ContinueOnError)
	dir := fs.String("control-plane-dir", "", "the --dir of `harness control-plane` (required)")
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
	claims, err := resourceclaim.NewController(klog.LoggerWithName(logger, "resource-claim-controller"),
		client, factory.Core().V1().Pods(), factory.Scheduling().V1beta1().PodGroups(),
		factory.Resource().V1().ResourceClaims(), factory.Resource().V1().ResourceClaimTemplates())
	if err != nil {
		return err
	}
	taints := devicetainteviction.New(client, factory.Core().V1().Pods(),
		factory.Resource().V1().ResourceClaims(), factory.Resource().V1().ResourceSlices(),
		factory.Resource().V1().DeviceTaintRules(), factory.Resource().V1().DeviceClasses(),
		deviceTaintControllerName)
	factory.Start(ctx.Done())
	go claims.Run(ctx, resourceClaimWorkers)
	go func() {
		if err := taints.Run(ctx, deviceTaintEvictWorkers); err != nil {
			logger.Error(err, "device taint eviction stopped")
		}
	}()
	logger.Info("DRA controllers running", "controllers", []string{"resource-claim-controller",
		deviceTaintControllerName})
	<-ctx.Done()
	factory.Shutdown()
	return nil
}
