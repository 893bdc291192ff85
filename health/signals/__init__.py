"""Health signal sources: kernel log, NVML events, periodic device checks."""
