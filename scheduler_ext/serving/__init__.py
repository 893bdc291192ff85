"""Serving kube-scheduler: the four verbs over cache and core (``service``), the extender/v1 wire
models, the HTTP(S) server and its request parser, the probe listener, Prometheus metrics, pod
Events and single-flight.
"""
