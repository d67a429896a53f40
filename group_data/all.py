"""Defaults for every host of every fleet (ascend_fleet/config/hostdata.py validates them).

A fleet's own file (group_data/<inventory name>.py) and the rollout or gateway group
files add to these; no key is defined in two groups a host can be in at once.
"""

# The account each vLLM instance runs as (in HwHiAiUser's group).
service_user = "vllm"

# vllm-ascend's recommended environment (field notes, section 3). HCCL_BUFFSIZE 200 MB is
# the handbook's measured setting (TPOT 38 -> 34 ms); the Qwen3.5 guides use 512-1024.
npu_env = {
    "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True",
    "TASK_QUEUE_ENABLE": 1,
    "CPU_AFFINITY_CONF": 1,
    "HCCL_OP_EXPANSION_MODE": "AIV",
    "HCCL_BUFFSIZE": 200,
    "OMP_NUM_THREADS": 1,
    "OMP_PROC_BIND": "false",
}

# Rollout order: each wave is an inventory group; the next starts when the last is healthy.
rollout_waves = ["canary", "wave1", "wave2"]
