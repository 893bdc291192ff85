"""``gpuweave simulate``, the main job: a simulated cluster driven by the real extender and node
agents on a simulated clock, and (in ``fgd``) the reproduction of the FGD paper's trace experiments.
"""
