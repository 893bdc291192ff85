"""deviceplugin package of gpuweave."""
