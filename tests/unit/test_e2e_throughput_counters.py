"""The throughput benchmark's reading of kube-apiserver's /metrics (requests, allocation, GC) and of
kube-scheduler's scheduling-algorithm histogram."""

from __future__ import annotations

from benchmarks.e2e_throughput import (
    ALGORITHM_HISTOGRAM,
    PhaseResult,
    bucket_quantile,
    extender_verb_ms,
    histogram_buckets,
    parse_api_counters,
    phase_medians,
)

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


SCHEDULER_METRICS = """\
# TYPE scheduler_scheduling_algorithm_duration_seconds histogram
scheduler_scheduling_algorithm_duration_seconds_bucket{profile="a",le="0.001"} 10
scheduler_scheduling_algorithm_duration_seconds_bucket{profile="a",le="0.002"} 40
scheduler_scheduling_algorithm_duration_seconds_bucket{profile="a",le="0.004"} 90
scheduler_scheduling_algorithm_duration_seconds_bucket{profile="a",le="+Inf"} 100
scheduler_scheduling_algorithm_duration_seconds_bucket{profile="b",le="0.001"} 0
scheduler_scheduling_algorithm_duration_seconds_bucket{profile="b",le="0.002"} 0
scheduler_scheduling_algorithm_duration_seconds_bucket{profile="b",le="0.004"} 0
scheduler_scheduling_algorithm_duration_seconds_bucket{profile="b",le="+Inf"} 0
scheduler_scheduling_algorithm_duration_seconds_sum 0.25
scheduler_scheduling_algorithm_duration_seconds_count 100
scheduler_e2e_scheduling_duration_seconds_bucket{le="0.001"} 99
"""


def test_scheduler_algorithm_quantiles_interpolate_within_the_bucket_as_prometheus_does() -> None:
    buckets = histogram_buckets(SCHEDULER_METRICS, ALGORITHM_HISTOGRAM)
    assert buckets == [(0.001, 10), (0.002, 40), (0.004, 90), (float("inf"), 100)]  # profiles summed
    assert bucket_quantile(buckets, 0.5) == 0.002 + 0.002 * (50 - 40) / (90 - 40)
    assert bucket_quantile(buckets, 0.05) == 0.001 * 5 / 10
    assert bucket_quantile(buckets, 0.99) == 0.004  # in +Inf: the last finite bound
    assert bucket_quantile([(0.001, 0), (float("inf"), 0)], 0.5) is None


EXTENDER_METRICS = """\
gpuweave_extender_request_seconds_bucket{le="0.001",verb="filter"} 10.0
gpuweave_extender_request_seconds_bucket{le="0.002",verb="filter"} 90.0
gpuweave_extender_request_seconds_bucket{le="0.005",verb="filter"} 100.0
gpuweave_extender_request_seconds_bucket{le="+Inf",verb="filter"} 100.0
gpuweave_extender_request_seconds_bucket{le="0.001",verb="prioritize"} 100.0
gpuweave_extender_request_seconds_bucket{le="+Inf",verb="prioritize"} 100.0
"""


def test_the_extenders_own_time_per_verb_is_read_per_verb() -> None:
    assert histogram_buckets(
        EXTENDER_METRICS, "gpuweave_extender_request_seconds", label='verb="filter"'
    ) == [
        (0.001, 10.0),
        (0.002, 90.0),
        (0.005, 100.0),
        (float("inf"), 100.0),
    ]
    latency = extender_verb_ms(EXTENDER_METRICS)
    assert latency["filter"] == {"p50": 1.5, "p99": 4.7}
    assert latency["prioritize"] == {"p50": 0.5, "p99": 0.99}
    assert latency["bind"] == {}


def test_the_results_file_gets_each_phases_medians_and_the_extenders_first_sync() -> None:
    def phase(name: str, round_: int, cpu: float, sync: float | None) -> PhaseResult:
        return PhaseResult(
            phase=name,
            pods=10,
            bound=10,
            seconds=1.0,
            pods_per_s=10.0,
            cpu_ms_per_pod={"kube-scheduler": cpu, "extender": cpu / 2},
            api_requests_per_pod={"POST pods/binding": 1.0 + round_},
            extender_rss_mib=100.0 + round_,
            round=round_,
            extender_first_sync_s=sync,
        )

    results = [phase("baseline", r, 4.0 + r, None) for r in range(3)]
    results += [phase("extender", r, 6.0 + r, 1.5 + r) for r in range(3)]
    medians = phase_medians(results)
    assert medians["cpu_ms_per_pod_median"]["extender"] == {
        "kube-scheduler": 7.0,
        "extender": 3.5,
        "all": 10.5,
    }
    assert medians["api_requests_per_pod_median"]["baseline"] == {"POST_pods/binding": 2.0}
    assert medians["extender_rss_mib_median"] == 101.0
    assert medians["extender_peak_rss_mib_median"] is None
    assert medians["extender_first_sync_s_median"] == 2.5
