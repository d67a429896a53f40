"""An instance's prefix cache counters as parse_metrics reads them from vLLM's /metrics."""

from __future__ import annotations

from ascend_fleet.core.vllm_metrics import parse_metrics

# vLLM's exposition of its two counters (prometheus_client: HELP and TYPE of the _total sample, then the
# _created gauge) for a data-parallel instance of two engines
TWO_ENGINES = """\
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
vllm:prefix_cache_queries_total{engine="1",model_name="m"} 600.0
# HELP vllm:prefix_cache_queries_created Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_created gauge
vllm:prefix_cache_queries_created{engine="0",model_name="m"} 1.7965e+09
vllm:prefix_cache_queries_created{engine="1",model_name="m"} 1.7965e+09
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 512.0
vllm:prefix_cache_hits_total{engine="1",model_name="m"} 128.0
# HELP vllm:prefix_cache_hits_created Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_created gauge
vllm:prefix_cache_hits_created{engine="0",model_name="m"} 1.7965e+09
vllm:prefix_cache_hits_created{engine="1",model_name="m"} 1.7965e+09
"""


def test_prefix_cache_counters_are_summed_over_engines_without_their_created_times():
    metrics = parse_metrics(TWO_ENGINES)
    assert (metrics.prefix_cache_queries, metrics.prefix_cache_hits) == (1600, 640)
    assert metrics.to_dict()["prefix_cache_hits"] == 640


def test_an_instance_without_the_counters_reads_none():
    metrics = parse_metrics('# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine="0"} 1.0\n')
    assert metrics.running == 1
    assert (metrics.prefix_cache_queries, metrics.prefix_cache_hits) == (None, None)
