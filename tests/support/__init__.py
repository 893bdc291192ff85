"""Test support shared by suites: the kubelet device-manager emulator and helpers."""
