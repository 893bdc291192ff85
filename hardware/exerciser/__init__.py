"""The active GPU exerciser: one protocol, three backends (docs/health.md, Active checks).

- ``protocol``: ``Exerciser`` (``run(plan, deadline_s) -> ExerciseReport``), plans and results;
- ``levels``: levels 1-4 and the batches of a run; ``model``: what each GPU model should deliver;
- ``ptx``: the hand-written kernels; ``cuda``/``cuda_checks``/``child``/``process``: the CUDA driver
  through ctypes in a child process killed at the deadline; ``wire``: the child's line protocol;
- ``dcgm``: DCGM's diagnostic where its host engine answers;
- the simulated backend is ``hardware.simulated.exerciser``.
"""
