package main

// `harness kustomize DIR`: renders a kustomization with kustomize's own library (the version
// kubectl v1.37 embeds), so the e2e tests apply exactly what `kubectl apply -k DIR` would.

import (
	"fmt"
	"os"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

func runKustomize(args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("kustomize: want exactly one directory, got %d arguments", len(args))
	}
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	resources, err := k.Run(filesys.MakeFsOnDisk(), args[0])
	if err != nil {
		return err
	}
	out, err := resources.AsYaml()
	if err != nil {
		return err
	}
	_, err = os.Stdout.Write(out)
	return err
}
