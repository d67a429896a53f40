"""vLLM's Prometheus metrics under their current names (v1 engine), labelled by model_name and engine."""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LABELS = ("model_name", "engine")

# vLLM's own buckets for these histograms.
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
E2E_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)


class ServerMetrics:
    """One registry per server, with the label values of the model it serves already bound."""

    def __init__(self, model_name: str):
        self.registry = CollectorRegistry()
        labels = {"model_name": model_name, "engine": "0"}

        def bind(metric):
            return metric.labels(**labels)

        reg = {"labelnames": LABELS, "registry": self.registry}
        self.running = bind(Gauge("vllm:num_requests_running", "Number of requests in model execution batches.", **reg))
        self.waiting = bind(Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", **reg))
        self.kv_cache_usage = bind(
            Gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", **reg)
        )
        self.ttft = bind(
            Histogram(
                "vllm:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
                buckets=TTFT_BUCKETS,
                **reg,
            )
        )
        self.itl = bind(
            Histogram(
                "vllm:inter_token_latency_seconds",
                "Histogram of inter-token latency in seconds.",
                buckets=ITL_BUCKETS,
                **reg,
            )
        )
        self.e2e = bind(
            Histogram(
                "vllm:e2e_request_latency_seconds",
                "Histogram of e2e request latency in seconds.",
                buckets=E2E_BUCKETS,
                **reg,
            )
        )
        self.prompt_tokens = bind(Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", **reg))
        self.generation_tokens = bind(
            Counter("vllm:generation_tokens", "Number of generation tokens processed.", **reg)
        )
        # registered whether prefix caching is on or off, as vLLM's PrometheusStatLogger does: off, they stay 0
        self.prefix_cache_queries = bind(
            Counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.", **reg)
        )
        self.prefix_cache_hits = bind(
            Counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", **reg)
        )
