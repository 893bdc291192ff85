"""The one Kubernetes adapter layer: client builder, list+watch, error mapping.

Every component that talks to the API server (the extender's cache and binder, the node agent's
pod watch and publisher, MIG's Node and demand watches, health's Kubernetes side) builds its
client here and mirrors objects through ``kubeio.listwatch.ListWatch``; nothing else drives a
watch. This package sits below the middle packages and imports ``devicemodel`` at most.
"""
