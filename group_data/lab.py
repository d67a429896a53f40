"""The rehearsal lab (inventories/lab.py): the tiny Qwen3 model on simulated 910B3 nodes.

The lab inventory gives each host `model_mirror_url`, `pip_index_url` and
`vendor_mirror_url`, all on the lab mirror; an http model with no `url` is fetched from
<model_mirror_url>/models/<id>/<revision>/.
"""

profile = "lab"

model = {
    "id": "lab/Qwen3-Tiny",
    "revision": "v1",
    "source": "http",
}

# 8 simulated NPUs at TP4: two instances per worker, as in production.
tensor_parallel_size = 4

# Small numbers for the sim tier: the tiny model knows 4096 positions.
serving = {
    "max_model_len": 2048,
    "gpu_memory_utilization": 0.9,
    "dtype": "float16",
    "enable_prefix_caching": True,
    "enable_chunked_prefill": True,
    "max_num_batched_tokens": 2048,
    "max_num_seqs": 8,
}

# Prometheus on the lab gateway calls an instance down after 10 s (production: 1 min). It looks as
# often as production's defaults and reads npu-smi once a minute: every lab that is up scrapes all
# the while, and at 5 s (npu-smi every 15 s) the monitoring of one idle lab took 5 % of a core of this
# 2-core machine. tests/lab/test_monitoring.py deploys faster settings for the alerts it waits for.
monitoring = {
    "instance_down_for": "10s",
    "npu_metrics_interval": "1m",
}

# Nginx forgets an instance's failed attempts after 3 s instead of 10, so the lab's plain deploys
# (which wait that long after each routed restart) take less of a test run; the mechanics are the same.
gateway_fail_timeout = 3
