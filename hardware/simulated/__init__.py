"""Simulated hardware: a faithful pynvml call surface and a fake sysfs tree."""
