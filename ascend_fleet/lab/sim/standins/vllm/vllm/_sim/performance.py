"""How fast the simulated engine steps: the performance model (perfmodel.py) when the node's
hardware file has a `performance` section, else the fixed pacing of VLLM_SIM_ITL_SECONDS.

    "performance": {"time_scale": 0.1, "performs_as": {...a real model's config.json...} or null}

performs_as: the lab serves tiny models, whose own weights would make every step take microseconds
and every knob look free; the model is then timed (and its KV cache sized) as the real model it
stands for, on this node's chip with this server's options. time_scale: lab seconds per modelled
second, so a lab benchmark takes seconds. docs/sim-performance.md.
"""

import logging
import os
from dataclasses import dataclass

from vllm._sim import perfmodel, planner
from vllm._sim.engine import FixedPacing

log = logging.getLogger("vllm")


@dataclass(frozen=True)
class Pacing:
    cost: object  # perfmodel.StepCost or FixedPacing: seconds(batch)
    time_scale: float
    kv_cache_tokens: int


def pacing(hardware: dict, shape: planner.ModelShape, plan: planner.InstancePlan) -> Pacing:
    """The step cost for this server: the served plan's, or that of the model it performs as."""
    performance = hardware.get("performance")
    if not performance:
        return Pacing(FixedPacing.from_env(), 1.0, plan.kv_cache_tokens)
    chip = planner.chip_by_name(hardware["chip"])
    if performance.get("performs_as"):
        shape = planner.ModelShape.from_config(performance["performs_as"])
        plan = planner.plan_instance(
            shape, chip, tp=plan.tp, dp=plan.dp, ep=plan.ep, dtype=plan.dtype, quantization=plan.quantization,
            max_model_len=min(plan.max_model_len, shape.max_position_embeddings or plan.max_model_len),
            gpu_memory_utilization=plan.gpu_memory_utilization)
    hccl_buffsize = int(os.environ.get("HCCL_BUFFSIZE", planner.DEFAULT_POLICY.hccl_buffsize_mib))
    cost = perfmodel.StepCost.for_plan(shape, plan, chip, hccl_buffsize_mib=hccl_buffsize)
    scale = float(performance.get("time_scale", 1.0))
    single = cost.seconds(perfmodel.Batch(((perfmodel.Request(1, 1, computed=0), 1),)))
    log.info("(simulated) performance model: %s, %.1fB parameters, on %s, TP%d: %.1f ms a one-token step, "
             "KV cache %s tokens; time scale %g (lab seconds per modelled second)", shape.model_type,
             shape.parameter_count().total / 1e9, chip.name, plan.tp, single * 1000,
             f"{plan.kv_cache_tokens:,}", scale)
    return Pacing(cost, scale, plan.kv_cache_tokens)
