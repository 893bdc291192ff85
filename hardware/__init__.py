"""Hardware discovery: the ``GpuBackend`` protocol and its NVML, sysfs and simulated parts.

- ``hardware.backend``: ``GpuBackend`` (``discover() -> NodeInventory``, ``close()``) and the error
  tree (``HardwareError`` -> ``GpuLostError``, ``NotSupportedError``, ``NoPermissionError``,
  ``HardwareTimeoutError``, ``DriverNotLoadedError``, ``NotFoundError``).
- ``hardware.nvml``: ``NvmlBackend(lib=None, sysfs_root="/")``; the only importer of pynvml.
  ``backend.caller`` runs any further NVML call with the same deadline and error mapping.
- ``hardware.sysfs``: ``SysfsReader(root)`` for the PCIe tree, NUMA nodes, EFA/RDMA adapters.
- ``hardware.profiles``: ``load_profile(name_or_path) -> NodeProfile`` and the built-in profiles.
- ``hardware.simulated``: ``SimulatedBackend(profile, sysfs_root)``, ``SimulatedNode`` (faults),
  ``SimulatedNvmlLib`` (the fake pynvml) and ``write_fake_sysfs``.
"""
