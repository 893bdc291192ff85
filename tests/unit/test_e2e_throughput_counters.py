"""The throughput benchmark's reading of kube-apiserver's /metrics (requests, allocation, GC)."""

from __future__ import annotations

from benchmarks.e2e_throughput import parse_api_counters

METRICS = """\
# HELP go_gc_duration_seconds A summary of the wall-time pause duration in garbage collection cycles.
# TYPE go_gc_duration_seconds summary
go_gc_duration_seconds{quantile="0"} 2.1e-05
go_gc_duration_seconds_sum 0.0123
go_gc_duration_seconds_count 17
# TYPE go_memstats_alloc_bytes_total counter
go_memstats_alloc_bytes_total 3.221225472e+09
go_memstats_alloc_bytes 2.5e+08
apiserver_request_total{code="201",resource="pods",subresource="binding",verb="POST",version="v1"} 1000
apiserver_request_total{code="409",resource="pods",subresource="binding",verb="POST",version="v1"} 2
apiserver_request_total{code="200",resource="nodes",scope="cluster",subresource="",verb="LIST"} 3
"""


def test_requests_allocation_and_gc_cycles_are_read_and_subtract_per_phase() -> None:
    end = parse_api_counters(METRICS)
    assert end.requests == {"POST pods/binding": 1002, "LIST nodes": 3}
    assert end.allocated_bytes == 3.221225472e09  # not go_memstats_alloc_bytes (the live heap)
    assert end.gc_cycles == 17  # the _count line, not the _sum or a quantile
    start = parse_api_counters(METRICS.replace(" 1000\n", " 400\n").replace("_count 17", "_count 12"))
    phase = end - start
    assert phase.requests == {"POST pods/binding": 600}
    assert (phase.allocated_bytes, phase.gc_cycles) == (0.0, 5)


def test_metrics_without_go_counters_read_as_zero() -> None:
    counters = parse_api_counters('apiserver_request_total{verb="GET",resource="pods"} 4\n')
    assert counters.requests == {"GET pods": 4}
    assert (counters.allocated_bytes, counters.gc_cycles) == (0.0, 0.0)
