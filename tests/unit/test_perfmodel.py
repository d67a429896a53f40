"""The performance model: the effects of the serving knobs a tuner turns (docs/sim-performance.md). Its
calibration is held against upstream's held-out A2 runs in test_perfmodel_runs.py."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from ascend_fleet.sizing import perf_fit, perfmodel
from ascend_fleet.sizing.perfmodel import Request, SchedulerLimits, StepCost, simulate
from ascend_fleet.sizing.planner import CHIPS, ModelShape, plan_instance

MODELS = Path(__file__).resolve().parents[1] / "fixtures" / "models"
CHIP = CHIPS["910B3"]

def instance(model: str, tp: int, **plan_options):
    shape = ModelShape.from_config(json.loads((MODELS / model / "config.json").read_text()))
    options = {"max_model_len": 32768, "gpu_memory_utilization": 0.9, "dtype": "bfloat16", **plan_options}
    plan = plan_instance(shape, CHIP, tp=tp, **options)
    return shape, plan


@pytest.fixture(scope="module")
def handbook_72b():
    """Qwen2.5-72B at TP4 with the handbook's flags: a large dense instance to turn knobs on."""
    shape, plan = instance("qwen2.5-72b-instruct", tp=4, dtype="float16")
    limits = SchedulerLimits(max_num_seqs=64, max_num_batched_tokens=8192, kv_cache_tokens=plan.kv_cache_tokens)
    return shape, plan, limits


def test_more_sequences_per_step_raise_throughput_and_tpot(handbook_72b):
    shape, plan, limits = handbook_72b
    cost = StepCost.for_plan(shape, plan, CHIP)
    few = simulate(perfmodel.fixed_load(128, 256, 128), replace(limits, max_num_seqs=4), cost)
    many = simulate(perfmodel.fixed_load(128, 256, 128), replace(limits, max_num_seqs=64), cost)
    assert many.output_throughput > 5 * few.output_throughput
    assert many.mean_tpot_ms > few.mean_tpot_ms
    assert many.mean_ttft_ms < few.mean_ttft_ms  # with 4 seats the rest queue


def test_a_kv_cache_too_small_for_the_batch_preempts_and_still_finishes_everything(handbook_72b):
    shape, plan, limits = handbook_72b
    cost = StepCost.for_plan(shape, plan, CHIP)
    roomy = simulate(perfmodel.fixed_load(32, 512, 512), limits, cost)
    cramped = simulate(perfmodel.fixed_load(32, 512, 512), replace(limits, kv_cache_tokens=16 * 1024), cost)
    assert roomy.preemptions == 0
    assert cramped.preemptions > 0 and cramped.completed == 32
    assert cramped.duration_seconds > roomy.duration_seconds  # recomputing the preempted costs time


def test_a_prompt_longer_than_the_token_budget_is_prefilled_in_chunks():
    limits = SchedulerLimits(max_num_seqs=8, max_num_batched_tokens=1000, kv_cache_tokens=100_000)
    scheduler = perfmodel.Scheduler(limits)
    request = Request(prompt_tokens=2500, output_tokens=3)
    scheduler.add(request)
    chunks = []
    while not request.token_times:
        batch = scheduler.schedule()
        chunks.append(batch.tokens)
        scheduler.complete(batch, now=len(chunks))
    assert chunks == [1000, 1000, 500]
    assert request.token_times == [3]  # the first token comes with the last chunk


def test_a_prompt_that_can_never_fit_the_kv_cache_is_an_error_not_a_hang():
    limits = SchedulerLimits(max_num_seqs=8, max_num_batched_tokens=8192, kv_cache_tokens=1024)
    shape, plan = instance("qwen2.5-72b-instruct", tp=4)
    with pytest.raises(ValueError, match="does not fit a KV cache of 1024 tokens"):
        simulate([Request(4096, 16)], limits, StepCost.for_plan(shape, plan, CHIP))


def test_an_hccl_buffer_smaller_than_a_prefill_message_costs_collective_rounds(handbook_72b):
    shape, plan, _ = handbook_72b
    default = StepCost.for_plan(shape, plan, CHIP)
    small = StepCost.for_plan(shape, plan, CHIP, hccl_buffsize_mib=8)
    decode, prefill = 64, 8192  # tokens a step carries: 64 x 8192 x 2 B fits 8 MiB, 8192 x 8192 x 2 B does not
    assert small.collectives_seconds(decode) == default.collectives_seconds(decode)
    assert small.collectives_seconds(prefill) > default.collectives_seconds(prefill)


def test_moe_decode_reads_only_the_experts_its_tokens_touch():
    shape, plan = instance("qwen3.5-397b-a17b", tp=8, ep=True, dp=2, quantization="w8a8")
    # without the fitted fixed costs (per layer and sequence), which would hide the weight reads
    cost = StepCost.for_plan(shape, plan, CHIP, efficiency=perfmodel.ASSUMED)
    assert cost.expert_weight_bytes > cost.dense_weight_bytes  # 512 experts dominate the weights
    one = perfmodel.Batch(((Request(100, 10, computed=100), 1),))
    many = perfmodel.Batch(tuple((Request(100, 10, computed=100), 1) for _ in range(64)))
    every_expert = (cost.dense_weight_bytes + cost.expert_weight_bytes) / (CHIP.hbm_bytes_per_second * cost.efficiency.hbm)
    assert cost.seconds(one) < every_expert / 2  # one token: its 10 experts of 512 a layer
    assert cost.seconds(many) > every_expert / 2  # 64 tokens: most experts


def test_plan_predicts_latency_at_a_concurrency_and_says_it_is_predicted():
    from typer.testing import CliRunner

    from ascend_fleet.cli import build_app

    config = str(MODELS / "qwen2.5-72b-instruct" / "config.json")
    common = ["plan", "--model-config", config, "--tp", "4", "--dtype", "float16", "--max-num-seqs", "64"]
    runner = CliRunner()
    shown = runner.invoke(build_app(), [*common, "--predict-concurrency", "8"])
    assert shown.exit_code == 0, shown.output
    assert "predicted by the performance model (not measured" in shown.output
    # with the model's error on the held-out runs: "TPOT x0.96-1.88 (10 of 12 within 20%)"
    assert perf_fit.band_text(perfmodel.HELD_OUT_RATIOS) in " ".join(shown.output.split())
    assert "TPOT x0.96-1.88 (10 of 12 within 20%)" in perf_fit.band_text(perfmodel.HELD_OUT_RATIOS)
    light, heavy = (json.loads(runner.invoke(build_app(), [*common, "--predict-concurrency", str(clients), "--json"]).output)
                    for clients in (1, 48))
    assert light["verdict"] == "fits" and light["predicted"]["completed"] == 4
    assert heavy["predicted"]["mean_tpot_ms"] > light["predicted"]["mean_tpot_ms"]
    assert heavy["predicted"]["output_throughput"] > 10 * light["predicted"]["output_throughput"]


def test_a_request_aborted_while_its_step_runs_frees_its_blocks_and_gets_no_token():
    limits = SchedulerLimits(max_num_seqs=8, max_num_batched_tokens=8192, kv_cache_tokens=4096, block_size=128)
    scheduler = perfmodel.Scheduler(limits)
    gone, staying = Request(300, 4), Request(100, 4)
    scheduler.add(gone)
    scheduler.add(staying)
    batch = scheduler.schedule()
    scheduler.abort(gone)  # its client disconnected mid-step
    assert scheduler.complete(batch, now=1.0) == [staying]
    assert scheduler.free_blocks == limits.blocks - 1 and gone.token_times == []
