"""The pure decision core: node layouts and states, per-resource planners, GPU set search,
fractional shares, EFA alignment, scores and shortlists, reservation by node kind. Values in,
verdicts out, no network I/O; the only state is memo caches of pure functions (under their
own locks) and the learned workload, which may be read once from ``--workload``.
"""
