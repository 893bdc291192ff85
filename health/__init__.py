"""Device health: signals (kernel log, NVML events, counters), fail-closed checks, the health
policy (a pure decision per signal), graded remediation, and the bad-hardware list by UUID.
"""
