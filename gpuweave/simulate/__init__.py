"""``gpuweave simulate``, the main job: a simulated cluster driven by the real extender and node
agents on a simulated clock, and (in ``fgd``) the reproduction of the FGD paper's trace experiments.
"""

# Node agents: on every node up to this many nodes (measured: 128 agents ran in 185 s; 256 did
# not all start in 10 minutes on 2 cores), else on a sample of this many, spread over the fleet.
FULL_AGENTS_UP_TO = 128
SAMPLED_AGENTS = 64

# The node lifecycle (``lifecycle``): a launched machine until its node is ready (a p5.48xlarge
# through Karpenter: about five minutes), and the most machines a scale-up has added at once.
DEFAULT_BOOT_S = 300.0
DEFAULT_MAX_NEW_NODES = 4
