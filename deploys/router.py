"""The vllm-router stage: the vLLM project's router on each gateway whose routing policy is cache_aware."""

from ascend_fleet.stages.vllm_router import router_stage

router_stage()
