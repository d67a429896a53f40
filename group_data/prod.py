"""The example production fleet (inventories/prod.py): Qwen3.5-27B W8A8 with its MTP head on
8 x 910B3 nodes, served as vllm-ascend's guide for Atlas A2 serves it (v0.18.0's
docs/source/tutorials/models/Qwen3.5-27B.md), four TP2 instances per node.

`ascend-fleet plan inventories/prod.py --model-config DIR` (DIR holding the weights' config.json)
shows each instance's figures; docs/guides/qwen35.md has them for this and the other sizes.
"""

# vllm-ascend 0.17.0rc1 is the first release that serves Qwen3.5; plan and preflight refuse older.
profile = "vllm-ascend-0.18.0"

# Pin the revision you validated. ModelScope's commit ids for this repository are not known
# here (no machine of ours reaches ModelScope): replace "master" with the commit id (model page,
# "Files", history) before a real rollout. A branch is staged once, as it was then, so nodes
# staged on different days could hold different weights.
model = {
    "id": "Eco-Tech/Qwen3.5-27B-w8a8-mtp",
    "revision": "master",
    "source": "modelscope",
    "served_model_name": "qwen3.5",
}

# The guide's layout: TP2, so four instances per 8-NPU node.
tensor_parallel_size = 2

# In place of all.py's settings: the guide's environment for this recipe, as its script exports it.
npu_env = {
    "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True",
    "HCCL_BUFFSIZE": 512,
    "OMP_PROC_BIND": "false",
    "OMP_NUM_THREADS": 1,
    "TASK_QUEUE_ENABLE": 1,
}

# The guide's `vllm serve` options for 128k context: prefix caching off, MTP drafting 3 tokens.
serving = {
    "max_model_len": 133000,
    "gpu_memory_utilization": 0.9,
    "max_num_seqs": 32,
    "max_num_batched_tokens": 8096,
    "enable_prefix_caching": False,
    "async_scheduling": True,
    "quantization": "ascend",
    "quantization_scheme": "w8a8",
    "speculative_config": {"method": "qwen3_5_mtp", "num_speculative_tokens": 3, "enforce_eager": True},
    "compilation_config": {"cudagraph_mode": "FULL_DECODE_ONLY"},
    "additional_config": {"enable_cpu_binding": True},
    "extra_args": ["--trust-remote-code", "--seed", "1024"],
    # Tool calling and reasoning as vLLM's own Qwen3.5 recipe sets them (vllm-project/recipes at 8959cf6,
    # models/Qwen/Qwen3.5-27B.yaml, features tool_calling and reasoning; Qwen/Qwen3.5.md, its tip on tools).
    # vllm-ascend's v0.18.0 guide sets neither; its weekly CI on main serves Qwen3.5-27B W8A8 with the same
    # tool parser (tests/e2e/weekly/single_node/configs/Qwen3.5-27B-w8a8-A3.yaml, since 858b96a). Both names
    # are in vLLM 0.18.0's registries (vllm_options/0.18.0.json).
    "enable_auto_tool_choice": True,
    "tool_call_parser": "qwen3_coder",
    "reasoning_parser": "qwen3",
}

# One address over both gateways, which keepalived keeps on a healthy one (docs/guides/gateways.md): the
# address clients use. Give an address of the gateways' network that no host has, and their interface
# on it. Each gateway's own address (ssh_hostname, or its name resolved here) is where VRRP goes.
gateway_vip = {"address": "10.20.0.100/24", "interface": "eth0"}
