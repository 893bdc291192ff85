"""The node lifecycle, handed to the engine that owns it (docs/node-lifecycle.md).

gpuweave decides; the cluster's node engine acts. ``replace`` decides which nodes whose node agent
says only a reboot or a new machine helps are handed to their engine now (pure); ``kube_replace``
reads the cluster and hands them over (a Karpenter NodeClaim or Cluster API Machine deleted, the
node condition Karpenter's repair reads, an Event, the bad-hardware list). ``capacity`` turns
pending demand the autoscaler cannot read into CapacityBuffers it can (pure), ``kube_capacity``
writes them. ``kubeio.lease`` keeps one active replica; ``service`` runs the controllers.
"""
