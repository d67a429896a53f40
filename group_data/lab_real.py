"""The rehearsal lab's real serving tier (inventories/lab_real.py): the tiny Qwen3 model on
real vLLM for CPU (profiles/lab-real.yaml), over the same simulated Ascend platform.

Sizing: one vLLM for CPU takes ~3.2 GB and one core, so a worker runs one instance
whatever its simulated NPU count.
"""

profile = "lab-real"

model = {
    "id": "lab/Qwen3-Tiny",
    "revision": "v1",
    "source": "http",
}

# vLLM on CPU runs one process per TP rank; one rank on one core is what the machine takes.
tensor_parallel_size = 1
instances = [{"name": "vllm-0", "npus": [0], "port": 8000, "hccl_base_port": 60000, "vllm_port": 51000}]

# vLLM's CPU backend computes in bfloat16 (float16 is converted); the tiny model knows 4096 positions.
serving = {
    "max_model_len": 2048,
    "gpu_memory_utilization": 0.9,
    "dtype": "bfloat16",
    "enable_prefix_caching": True,
    "enable_chunked_prefill": True,
    "max_num_batched_tokens": 2048,
    "max_num_seqs": 8,
    # Tools chosen "auto" served, with the Qwen3.5 recipes' tool parser (group_data/prod.py): vLLM for CPU
    # 0.32.0 has it and answers the tiny model's requests with it (tests/lab/test_real_tier.py). No reasoning
    # parser: the tiny model's chat template has no thinking.
    "enable_auto_tool_choice": True,
    "tool_call_parser": "qwen3_coder",
    # No torch.compile: its CPU backend needs a C++ compiler, which a lab node (a fresh OS) does not have.
    "extra_args": ["--enforce-eager"],
}

# In place of all.py's Ascend settings, which mean nothing to vLLM for CPU: its platform chosen
# outright (the vllm-ascend plugin is installed too), a 1 GiB KV cache, its OpenMP threads on
# core 0, and nothing fetched from a hub.
npu_env = {
    "VLLM_TARGET_DEVICE": "cpu",
    "VLLM_CPU_KVCACHE_SPACE": 1,
    "VLLM_CPU_OMP_THREADS_BIND": "0",
    "TRANSFORMERS_OFFLINE": 1,
    "VLLM_NO_USAGE_STATS": 1,
    "DO_NOT_TRACK": 1,
}
