"""The multi-node lab (inventories/lab_multinode.py): the lab's tiny model of Qwen3.5-397B-A17B's shape,
W8A8, served as vllm-ascend's two-node guide serves the real one (v0.18.0's
docs/source/tutorials/models/Qwen3.5-397B-A17B.md, "Multi-node Deployment with MP"): TP8 on each
worker, DP2 across two, expert parallel, MTP, prefix caching off, FULL_DECODE_ONLY; only the batch
limits and the context are the lab's own (the tiny model knows 4096 positions).
"""

import runpy
from pathlib import Path

__all__ = ["profile", "model", "tensor_parallel_size", "npu_env", "serving", "monitoring", "gateway_fail_timeout"]

_lab = runpy.run_path(str(Path(__file__).with_name("lab.py")))

profile = _lab["profile"]  # vllm-ascend 0.18.0's row

model = {"id": "lab/Qwen3.5-Tiny-397B-Shape-W8A8", "revision": "v1", "source": "http", "served_model_name": "qwen3.5"}

tensor_parallel_size = 8

# The guide's exports for both nodes (HCCL_IF_IP and the *_SOCKET_IFNAME come from data_parallel).
npu_env = {"PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True", "OMP_PROC_BIND": "false", "OMP_NUM_THREADS": 1,
           "HCCL_BUFFSIZE": 1024, "TASK_QUEUE_ENABLE": 1}

serving = {
    "max_model_len": 2048,
    "gpu_memory_utilization": 0.9,
    "max_num_seqs": 16,
    "max_num_batched_tokens": 2048,
    "enable_expert_parallel": True,
    "enable_prefix_caching": False,
    "async_scheduling": True,
    "quantization": "ascend",
    "speculative_config": {"method": "qwen3_5_mtp", "num_speculative_tokens": 3, "enforce_eager": True},
    "compilation_config": {"cudagraph_mode": "FULL_DECODE_ONLY"},
    "additional_config": {"enable_cpu_binding": True, "multistream_overlap_shared_expert": True},
    "extra_args": ["--trust-remote-code", "--seed", "1024"],
}

monitoring = _lab["monitoring"]
gateway_fail_timeout = _lab["gateway_fail_timeout"]
