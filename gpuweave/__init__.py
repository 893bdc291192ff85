"""gpuweave: CLI, configuration, composition roots and the ``simulate`` main job."""

__version__ = "0.1.0"
