"""The FGD paper's experiments (USENIX ATC '23), reproduced: its trace, its artifact's setup and
baseline schedulers, the packing experiment, and gpuweave's own extender as one more policy.
"""
