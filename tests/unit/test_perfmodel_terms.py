"""The performance model's terms from issue 48 item 2 that the published runs alone do not pin:
attention FLOPs in prefill, graph mode, and an MTP draft with its acceptance rate."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from ascend_fleet.sizing.perfmodel import Batch, Efficiency, Request, StepCost
from ascend_fleet.sizing.planner import CHIPS, ModelShape, plan_instance

MODELS = Path(__file__).resolve().parents[1] / "fixtures" / "models"
CHIP = CHIPS["910B3"]
# per-layer and per-sequence costs of the order perf_fit fits (their values are test_perfmodel_runs')
EFFICIENCY = Efficiency(layer_seconds_full_decode=0.4e-3, layer_seconds_piecewise=0.6e-3, layer_seconds_eager=1.2e-3,
                        sequence_layer_seconds=6e-6)


def qwen3_32b_tp4(**options) -> StepCost:
    shape = ModelShape.from_config(json.loads((MODELS / "qwen3-32b" / "config.json").read_text()))
    plan = plan_instance(shape, CHIP, tp=4, max_model_len=65536 + 16, gpu_memory_utilization=0.9, dtype="bfloat16")
    return StepCost.for_plan(shape, plan, CHIP, efficiency=EFFICIENCY, **options)


def decode(sequences: int, context: int) -> Batch:
    return Batch(tuple((Request(context, 100, computed=context, generated=1), 1) for _ in range(sequences)))


def test_a_64k_prefill_of_qwen3_32b_spends_as_many_flops_on_attention_as_on_its_weights():
    cost = qwen3_32b_tp4()
    prefill = Batch(((Request(65536, 1), 65536),))
    with_attention = cost.seconds(prefill)
    without = replace(cost, attention_flops_per_context_token=0.0).seconds(prefill)
    assert 1.7 < with_attention / without < 2.1


def test_a_short_decode_barely_notices_attention_flops():
    cost = qwen3_32b_tp4()
    assert cost.seconds(decode(8, 2048)) == pytest.approx(
        replace(cost, attention_flops_per_context_token=0.0).seconds(decode(8, 2048)), rel=0.01)


def test_graph_modes_order_a_decode_step_full_decode_fastest_eager_slowest():
    steps = [qwen3_32b_tp4(graph_mode=mode).seconds(decode(8, 2048)) for mode in ("full_decode_only", "piecewise",
                                                                                  "eager")]
    assert steps == sorted(steps) and steps[2] - steps[0] == pytest.approx(64 * 0.8e-3)


def test_each_running_sequence_adds_its_per_layer_cost():
    cost = qwen3_32b_tp4()
    added = cost.seconds(decode(9, 16)) - cost.seconds(decode(8, 16))
    assert added == pytest.approx(64 * 6e-6, rel=0.3)  # and the little KV it reads


def test_an_mtp_draft_speeds_decoding_only_as_far_as_its_tokens_are_accepted():
    plain = qwen3_32b_tp4().seconds(decode(8, 2048))
    accepted = qwen3_32b_tp4(speculative_tokens=1, acceptance_rate=0.9).seconds(decode(8, 2048))
    rejected = qwen3_32b_tp4(speculative_tokens=1, acceptance_rate=0.0).seconds(decode(8, 2048))
    assert accepted < 0.7 * plain  # 1.9 tokens a step for one verified token and a one-layer draft more
    assert rejected > plain  # the draft and the verification, for nothing

