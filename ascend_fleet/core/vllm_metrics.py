"""What an instance's /metrics says, read with prometheus_client's parser, under old and new vLLM names.

vLLM renamed two metrics (field notes, section 3): vllm:gpu_cache_usage_perc became
vllm:kv_cache_usage_perc and vllm:time_per_output_token_seconds became
vllm:inter_token_latency_seconds. A fleet mid-upgrade serves both, so each reading
takes the first name an instance exposes.

The prefix cache's counters (vllm:prefix_cache_queries and vllm:prefix_cache_hits, in tokens, since the
instance started) give its hit rate: hits over queries, or their increases over a window. vLLM exposes
them whether prefix caching is on or off (off, they stay 0); an instance without them reads None.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from prometheus_client.parser import text_string_to_metric_families

RUNNING = ("vllm:num_requests_running",)
WAITING = ("vllm:num_requests_waiting",)
KV_CACHE_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
TTFT = ("vllm:time_to_first_token_seconds",)
INTER_TOKEN_LATENCY = ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")
# counters, exposed as NAME_total: the parser names their family NAME, which holds the _total samples only
PREFIX_CACHE_QUERIES = ("vllm:prefix_cache_queries",)
PREFIX_CACHE_HITS = ("vllm:prefix_cache_hits",)


@dataclass(frozen=True)
class Percentiles:
    """p50 and p99 in seconds since the instance started; None before its first request."""

    p50: float | None
    p99: float | None


@dataclass(frozen=True)
class InstanceMetrics:
    running: float | None
    waiting: float | None
    kv_cache_usage: float | None  # 0..1
    ttft: Percentiles
    inter_token_latency: Percentiles
    prefix_cache_queries: float | None = None  # prompt tokens looked up in the prefix cache, all engines
    prefix_cache_hits: float | None = None  # of those, tokens found cached

    def to_dict(self) -> dict:
        return asdict(self)


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """Prometheus's histogram_quantile over cumulative (upper bound, count) buckets: linear
    interpolation inside the bucket holding the rank; the +Inf bucket gives the highest finite bound."""
    buckets = sorted(buckets)
    if not buckets or buckets[-1][1] == 0:
        return None
    rank = q * buckets[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for upper_bound, count in buckets:
        if count >= rank:
            if math.isinf(upper_bound):
                return lower_bound
            if count == lower_count:
                return upper_bound
            return lower_bound + (upper_bound - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = upper_bound, count
    return lower_bound


def parse_metrics(text: str) -> InstanceMetrics:
    """The instance's figures from its /metrics text: requests and prefix cache counters summed over engines,
    KV cache use the fullest one's."""
    families = {family.name: family for family in text_string_to_metric_families(text)}

    def first(names: tuple[str, ...]):
        return next((families[name] for name in names if name in families), None)

    def gauge(names: tuple[str, ...], combine=sum) -> float | None:
        family = first(names)
        return combine(sample.value for sample in family.samples) if family and family.samples else None

    def percentiles(names: tuple[str, ...]) -> Percentiles:
        family = first(names)
        counts: dict[float, float] = {}
        for sample in family.samples if family else ():
            if sample.name.endswith("_bucket"):
                bound = float(sample.labels["le"])
                counts[bound] = counts.get(bound, 0.0) + sample.value
        buckets = list(counts.items())
        return Percentiles(histogram_quantile(0.5, buckets), histogram_quantile(0.99, buckets))

    return InstanceMetrics(running=gauge(RUNNING), waiting=gauge(WAITING), kv_cache_usage=gauge(KV_CACHE_USAGE, max),
                           ttft=percentiles(TTFT), inter_token_latency=percentiles(INTER_TOKEN_LATENCY),
                           prefix_cache_queries=gauge(PREFIX_CACHE_QUERIES), prefix_cache_hits=gauge(PREFIX_CACHE_HITS))
