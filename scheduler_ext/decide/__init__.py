"""The pure decision core: node layouts and states, per-resource planners, GPU set search,
fractional shares, EFA alignment, scores and shortlists, reservation by node kind. Values in,
verdicts out; no I/O and no locks (the cluster room owns state).
"""
