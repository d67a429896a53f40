"""The example fleet of inventories/prod_397b.py: Qwen3.5-397B-A17B W8A8 with its MTP head, each instance
on two 8 x 910B3 nodes, served as vllm-ascend's guide for Atlas A2 serves it (v0.18.0's
docs/source/tutorials/models/Qwen3.5-397B-A17B.md, "Multi-node Deployment with MP"): TP8 on each node,
DP2 across the two, expert parallel, 32k context.
"""

profile = "vllm-ascend-0.18.0"

# Pin the revision you validated (see group_data/prod.py on ModelScope revisions).
model = {
    "id": "Eco-Tech/Qwen3.5-397B-A17B-w8a8-mtp",
    "revision": "master",
    "source": "modelscope",
    "served_model_name": "qwen3.5",
}

tensor_parallel_size = 8

# The guide's exports on both nodes (HCCL_IF_IP and the *_SOCKET_IFNAME are set per host from
# serving_address and data_parallel.nic).
npu_env = {
    "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True",
    "OMP_PROC_BIND": "false",
    "OMP_NUM_THREADS": 1,
    "HCCL_BUFFSIZE": 1024,
    "TASK_QUEUE_ENABLE": 1,
}

serving = {
    "max_model_len": 32768,
    "gpu_memory_utilization": 0.9,
    "max_num_seqs": 16,
    "max_num_batched_tokens": 4096,
    "enable_expert_parallel": True,
    "enable_prefix_caching": False,
    "async_scheduling": True,
    "quantization": "ascend",
    "quantization_scheme": "w8a8",
    "speculative_config": {"method": "qwen3_5_mtp", "num_speculative_tokens": 3, "enforce_eager": True},
    "compilation_config": {"cudagraph_mode": "FULL_DECODE_ONLY"},
    "additional_config": {"enable_cpu_binding": True, "multistream_overlap_shared_expert": True},
    "extra_args": ["--trust-remote-code", "--seed", "1024"],
    # As group_data/prod.py, from vLLM's recipe for this model (models/Qwen/Qwen3.5-397B-A17B.yaml): the same names.
    "enable_auto_tool_choice": True,
    "tool_call_parser": "qwen3_coder",
    "reasoning_parser": "qwen3",
}

# The NPUs' parameter plane: all NPUs of the fleet in one /24 here; the switch side answers net health.
npu_netmask = "255.255.255.0"
npu_gateway = "10.20.0.254"

rollout_waves = ["canary", "wave1"]
