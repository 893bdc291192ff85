"""Gang preflights: member nodes prove their GPUs before a multi-node gang starts (``book``: what
is asked and answered; ``kube``: the ``GpuPreflight`` objects that carry it to the node agents)."""
