"""Capacity planner: the operators' numbers, hand-computed fixture figures, verdicts, and each check."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ascend_fleet.cli import build_app
from ascend_fleet.config.profile import load_profile
from ascend_fleet.core.errors import FleetError
from ascend_fleet.fleet.plan import model_support
from ascend_fleet.sizing.planner import (
    CHIPS,
    DOES_NOT_FIT,
    FITS,
    GIB,
    TIGHT,
    ConfigError,
    InstanceRecord,
    ModelShape,
    ModelSupport,
    check_block_size,
    check_blue_green,
    check_concurrency,
    check_gpu_memory_utilization,
    check_model_support,
    check_node_instances,
    check_vllm_use_v1,
    check_weights_fit,
    chip_by_name,
    kv_cache_bytes_per_token,
    kv_cache_copies,
    linear_state_bytes_per_sequence,
    plan_instance,
    python_version_key,
    reserved_ports,
    weight_bytes,
    weight_bytes_per_npu,
)

MODELS = Path(__file__).resolve().parent.parent / "fixtures" / "models"
NPUS_PER_NODE = 8
B3 = CHIPS["910B3"]


def load_config(name: str) -> dict:
    return json.loads((MODELS / name / "config.json").read_text())


def shape(name: str) -> ModelShape:
    return ModelShape.from_config(load_config(name))


def codes(findings) -> list[str]:
    return [finding.code for finding in findings]


# --- The operators' handbook: 80 layers, 8 KV heads, head_dim 128, FP16. ---


def test_handbook_kv_cache_is_327680_bytes_per_token_and_10_gib_for_32k():
    handbook = shape("handbook-dense-80l")
    # 2 (K and V) x 80 layers x 8 KV heads x 128 head_dim x 2 bytes = 327,680
    assert kv_cache_bytes_per_token(handbook, kv_dtype_bytes=2) == 327_680
    # 327,680 x 32,768 = 10,737,418,240 bytes: exactly 10 GiB (the handbook's "~10 GB")
    assert kv_cache_bytes_per_token(handbook) * 32_768 == 10 * GIB


def test_handbook_72b_fp16_weights_are_about_144_gb_and_36_gb_per_npu_at_tp4():
    handbook = shape("handbook-dense-80l")
    # per layer: q 8192x8192 + 8192 bias, k and v 8192x1024 + 1024 bias each, o 8192x8192,
    #   MLP 3 x 8192 x 29,568, two norms 2 x 8192 = 877,684,736
    # 80 layers = 70,214,778,880; embeddings + lm_head 2 x 152,064 x 8192 = 2,491,416,576; final norm 8192
    assert handbook.parameter_count().total == 72_706_203_648
    # x 2 bytes = 145,412,407,296: the handbook's "~144 GB" (72B x 2 bytes, decimal GB)
    total = weight_bytes(handbook, "float16")
    assert total == 145_412_407_296
    assert 144e9 <= total <= 146e9
    # TP4: all but the 80 x 2 + 1 replicated norms (1,318,912 params) split four ways:
    # (72,706,203,648 - 1,318,912) / 4 + 1,318,912 = 18,177,540,096 params x 2 bytes
    per_npu = weight_bytes_per_npu(handbook, "float16", tp=4)
    assert per_npu == 36_355_080_192
    assert 35.5e9 <= per_npu <= 36.5e9


def test_handbook_plan_at_tp4_32k_fits_with_the_arithmetic_written_out():
    result = plan_instance(shape("handbook-dense-80l"), B3, tp=4, max_model_len=32_768, gpu_memory_utilization=0.9, dtype="float16")
    # budget 0.9 x 60 GiB = 57,982,058,496; minus weights 36,355,080,192 and the 2 GiB
    # activation reserve = 19,479,494,656 bytes of KV cache per NPU
    assert result.budget_bytes_per_npu == 57_982_058_496
    assert result.kv_cache_pool_bytes_per_npu == 19_479_494_656
    # 8 KV heads over 4 NPUs: 2 heads each, 327,680 / 4 = 81,920 bytes per token per NPU
    assert result.kv_cache_bytes_per_token_per_npu == 81_920
    # 19,479,494,656 // 81,920 = 237,786 tokens; / 32,768 = 7.26 full-length requests
    assert result.kv_cache_tokens == 237_786
    assert result.max_concurrency == 7.26
    # 4096-token requests: 19,479,494,656 / (81,920 x 4096) = 58.05
    assert result.suggested_max_num_seqs == 58
    # one HCCL group (TP): 2 x 200 MiB; headroom 60 GiB - 54 GiB budget - 400 MiB
    assert result.hccl_reserve_bytes_per_npu == 400 * 2**20
    assert result.headroom_bytes_per_npu == 6 * GIB - 400 * 2**20
    assert result.verdict == FITS and result.findings == []


def test_two_npus_need_int4_for_a_72b():
    handbook = shape("handbook-dense-80l")
    fp16 = plan_instance(handbook, B3, tp=2, max_model_len=32_768, gpu_memory_utilization=0.9, dtype="float16")
    int4 = plan_instance(handbook, B3, tp=2, max_model_len=32_768, gpu_memory_utilization=0.9, dtype="float16", quantization="int4")
    assert fp16.verdict == DOES_NOT_FIT
    assert "weights-do-not-fit" in codes(fp16.findings)
    # int4: 70,212,648,960 linear params x 0.5 byte + 2,493,554,688 embedding/bias/norm params x 2 bytes
    #     = 40,093,433,856 bytes (the handbook's "~36 GB" leaves out the unquantized embeddings)
    assert weight_bytes(handbook, "float16", "int4") == 40_093_433_856
    assert int4.verdict == FITS


def test_w8a8_stores_linear_weights_at_one_byte():
    # 70,212,648,960 x 1 + 2,493,554,688 x 2 = 75,199,758,336
    assert weight_bytes(shape("handbook-dense-80l"), "float16", "w8a8") == 75_199_758_336


# --- Published configs: parsing and hand-computed figures. ---


def test_qwen25_72b_derives_head_dim_and_qkv_bias():
    qwen = shape("qwen2.5-72b-instruct")
    # no head_dim key: 8192 / 64 heads = 128; qwen2 always has q/k/v biases
    assert qwen.head_dim == 128
    assert qwen.qkv_bias
    assert qwen.parameter_count().total == shape("handbook-dense-80l").parameter_count().total
    assert kv_cache_bytes_per_token(qwen) == 327_680


# vllm-ascend issue #5020 (v0.12.0rc1's Qwen3-Next tutorial): TP4, --max-model-len 4096 at
# --gpu-memory-utilization 0.85 logged "Maximum concurrency for 4,096 tokens per request: 210.07x", then
# ran out of memory allocating the KV cache; the tutorial's own figure is 0.8 (0.13.0's
# docs/source/tutorials/Qwen3-Next.md line 64).
def plan_issue_5020(gpu_memory_utilization: float, profile: str):
    qwen3_next = shape("qwen3-next-80b-a3b")
    copies = kv_cache_copies(qwen3_next, load_profile(profile).hybrid_kv_cache_allocation)
    return plan_instance(qwen3_next, B3, tp=4, max_model_len=4096, gpu_memory_utilization=gpu_memory_utilization,
                         dtype="bfloat16", kv_copies=copies)


def test_issue_5020s_kv_arithmetic_matches_its_log():
    assert plan_issue_5020(0.85, "vllm-ascend-0.18.0").max_concurrency == pytest.approx(210.07, rel=0.01)


def test_issue_5020s_case_does_not_fit_at_085_on_a_release_that_allocates_its_kv_cache_twice():
    at_085, at_080 = plan_issue_5020(0.85, "vllm-ascend-0.13.0"), plan_issue_5020(0.80, "vllm-ascend-0.13.0")
    assert at_085.verdict == DOES_NOT_FIT and "kv-cache-copies" in codes(at_085.errors)
    message = next(f.message for f in at_085.errors if f.code == "kv-cache-copies")
    assert "KV cache 2 times: 11.9 GiB per NPU beyond the budget, 8.6 GiB free outside it" in message
    assert "lower --gpu-memory-utilization to 0.82" in message
    assert "kv-cache-copies" not in codes(at_080.findings) and at_080.headroom_bytes_per_npu > 0
    # 0.18.0 shares the tensor as vLLM budgets it: the same plan fits at 0.85
    assert "kv-cache-copies" not in codes(plan_issue_5020(0.85, "vllm-ascend-0.18.0").findings)


def test_a_release_that_allocates_each_linear_layer_its_own_kv_tensor_holds_qwen3_nexts_pool_four_times():
    # 12 attention and 36 linear-attention layers: a tensor shared by one attention and three linear layers
    assert kv_cache_copies(shape("qwen3-next-80b-a3b"), "per_layer") == 4
    assert kv_cache_copies(shape("qwen3-next-80b-a3b"), "shared") == 1
    assert kv_cache_copies(shape("qwen2.5-72b-instruct"), "per_kind") == 1  # no linear layers, nothing shared


def test_qwen35_27b_hybrid_layers_and_parameters():
    qwen = shape("qwen3.5-27b")
    assert (qwen.full_attention_layers, qwen.linear_attention_layers) == (16, 48)
    # full-attention layer: q 5120 x (24 x 256 x 2, output gate) = 62,914,560; k, v 2 x 5120 x 1024 = 10,485,760;
    #   o 6144 x 5120 = 31,457,280; q/k norms 512 -> 104,858,112; x 16 = 1,677,729,792
    # linear layer: qkv 5120 x 10,240 = 52,428,800; z 5120 x 6144 = 31,457,280; b, a 2 x 5120 x 48 = 491,520;
    #   conv 10,240 x 4 = 40,960; dt_bias, A_log 96; norm 128; out 6144 x 5120 = 31,457,280
    #   -> 115,876,064; x 48 = 5,562,051,072
    # MLP 3 x 5120 x 17,408 x 64 = 17,112,760,320; embeddings 2 x 248,320 x 5120 = 2,542,796,800;
    # norms 64 x 2 x 5120 + 5120 = 660,480
    assert qwen.parameter_count().total == 26_895_998_464
    # KV: 2 x 16 full layers x 4 heads x 256 x 2 bytes = 65,536 per token
    assert kv_cache_bytes_per_token(qwen) == 65_536
    # TP2 state per sequence: 48 x ((4 - 1) x 10,240 / 2 x 2 bytes + 48 / 2 x 128 x 128 x 2 bytes)
    #                        = 48 x (30,720 + 786,432) = 39,223,296
    assert linear_state_bytes_per_sequence(qwen, tp=2, state_dtype_bytes=2) == 39_223_296


def test_qwen35_122b_moe_parameters_and_kv():
    qwen = shape("qwen3.5-122b-a10b")
    assert qwen.moe.moe_layers == 48
    # full layer: q 3072 x 16,384 = 50,331,648; k, v 3,145,728; o 8192 x 3072 = 25,165,824; norms 512
    #   -> 78,643,712 x 12 = 943,724,544
    # linear layer: qkv 3072 x 12,288 = 37,748,736; z 3072 x 8192 = 25,165,824; b, a 393,216; conv 49,152;
    #   dt_bias, A_log, norm 256; out 25,165,824 -> 88,523,008 x 36 = 3,186,828,288
    # MoE layer: router 3072 x 256 = 786,432; experts 256 x 3 x 3072 x 1024 = 2,415,919,104;
    #   shared 3 x 3072 x 1024 = 9,437,184; shared gate 3072 -> 2,426,145,792 x 48 = 116,454,998,016
    # embeddings 2 x 248,320 x 3072 = 1,525,678,080; norms 48 x 2 x 3072 + 3072 = 297,984
    assert qwen.parameter_count().total == 122_111_526_912
    # 2 x 12 full layers x 2 heads x 256 x 2 bytes
    assert kv_cache_bytes_per_token(qwen) == 24_576


def test_qwen35_397b_parameters_match_the_published_text_count():
    qwen = shape("qwen3.5-397b-a17b")
    assert (qwen.full_attention_layers, qwen.linear_attention_layers, qwen.moe.num_experts) == (15, 45, 512)
    # full layers 15 x 104,858,112 = 1,572,871,680; linear 45 x 118,014,208 = 5,310,639,360;
    # MoE 60 x (2,097,152 router + 512 x 3 x 4096 x 1024 + 12,582,912 shared + 4096 gate) = 387,428,106,240;
    # embeddings 2 x 248,320 x 4096 = 2,034,237,440; norms 60 x 8192 + 4096 = 495,616
    # = 396,346,350,336, the base-text parameter count published for this checkpoint
    assert qwen.parameter_count().total == 396_346_350_336
    # 2 x 15 full layers x 2 heads x 256 x 2 bytes
    assert kv_cache_bytes_per_token(qwen) == 30_720
    # TP8: 2 KV heads are replicated, each NPU holds one: 15 x 2 x 1 x 256 x 2 = 15,360 per token
    result = plan_instance(qwen, B3, tp=8, dp=2, ep=True, max_model_len=32_768, gpu_memory_utilization=0.9, dtype="bfloat16")
    assert result.kv_cache_bytes_per_token_per_npu == 15_360
    # state: 45 x (3 x 12,288 / 8 x 2 + 64 / 8 x 128 x 128 x 2) = 45 x (9,216 + 262,144)
    assert result.linear_state_bytes_per_sequence_per_npu == 12_211_200


def test_tie_word_embeddings_is_read_from_the_outer_config_of_a_multimodal_model():
    config = load_config("qwen3.5-397b-a17b")
    tied = {**config, "tie_word_embeddings": True}
    untied, tied_shape = ModelShape.from_config(config), ModelShape.from_config(tied)
    assert untied.parameter_count().total - tied_shape.parameter_count().total == 248_320 * 4096


def test_full_attention_interval_stands_in_for_layer_types():
    config = load_config("qwen3.5-27b")
    text = {key: value for key, value in config["text_config"].items() if key != "layer_types"}
    derived = ModelShape.from_config({**config, "text_config": text})
    assert derived == shape("qwen3.5-27b")


def test_mamba_ssm_dtype_float32_doubles_the_recurrent_state():
    config = load_config("qwen3.5-27b")
    fp32 = ModelShape.from_config({**config, "text_config": {**config["text_config"], "mamba_ssm_dtype": "float32"}})
    # recurrent part 48 x 786,432 doubles; the conv window (48 x 30,720) stays in the model dtype
    assert linear_state_bytes_per_sequence(fp32, tp=2) == 39_223_296 + 48 * 786_432


def test_missing_fields_are_config_errors():
    with pytest.raises(ConfigError, match="num_hidden_layers"):
        ModelShape.from_config({"hidden_size": 8, "num_attention_heads": 2, "vocab_size": 10})
    config = load_config("qwen3.5-27b")
    text = {key: value for key, value in config["text_config"].items() if key != "linear_num_value_heads"}
    with pytest.raises(ConfigError, match="linear_num_value_heads"):
        ModelShape.from_config({**config, "text_config": text})


# --- Verdicts on 1, 2 and 4 nodes of 8 x 910B3, at the layouts upstream recommends. ---

# name -> (tp, expert parallel, dtype, quantization, data parallel across nodes)
LAYOUTS = {
    "handbook-dense-80l": (4, False, "float16", None, False),
    "qwen2.5-72b-instruct": (4, False, "bfloat16", None, False),
    "qwen3.5-27b": (2, False, "bfloat16", None, False),
    "qwen3.5-122b-a10b": (8, True, "bfloat16", None, False),
    "qwen3.5-397b-a17b": (8, True, "bfloat16", None, True),
    "qwen3.5-397b-a17b w8a8": (8, True, "bfloat16", "w8a8", True),
}

# 32K context, gpu-memory-utilization 0.9. Instances that fit inside a node are
# independent, so their verdict does not change with the node count; only the
# 397B spans nodes (DP across nodes, TP8 + EP inside each).
EXPECTED_VERDICTS = {
    "handbook-dense-80l": {1: FITS, 2: FITS, 4: FITS},
    "qwen2.5-72b-instruct": {1: FITS, 2: FITS, 4: FITS},
    "qwen3.5-27b": {1: FITS, 2: FITS, 4: FITS},
    "qwen3.5-122b-a10b": {1: FITS, 2: FITS, 4: FITS},
    # 1 node: 512 experts / 8 = 92.5 GiB per NPU. 2 nodes: 47.5 GiB of weights leave a
    # 4.5 GiB KV pool (8% of the budget): tight. Upstream asks for 4 A2 nodes.
    "qwen3.5-397b-a17b": {1: DOES_NOT_FIT, 2: TIGHT, 4: FITS},
    # 1 node: 46.6 GiB of weights leave 5.4 GiB: tight. Upstream asks for 2 A2 nodes.
    "qwen3.5-397b-a17b w8a8": {1: TIGHT, 2: FITS, 4: FITS},
}


def plan_on_nodes(layout_name: str, nodes: int):
    """Plan one instance of the layout and count how many run on `nodes` nodes."""
    tp, ep, dtype, quantization, dp_across_nodes = LAYOUTS[layout_name]
    dp = nodes if dp_across_nodes else 1
    result = plan_instance(
        shape(layout_name.split()[0]), B3, tp=tp, dp=dp, ep=ep, max_model_len=32_768,
        gpu_memory_utilization=0.9, dtype=dtype, quantization=quantization,
    )
    return result, nodes * NPUS_PER_NODE // result.npus


@pytest.mark.parametrize("nodes", [1, 2, 4])
@pytest.mark.parametrize("layout_name", sorted(LAYOUTS))
def test_verdict_on_nodes_of_eight_910b3(layout_name, nodes):
    result, instances = plan_on_nodes(layout_name, nodes)
    assert result.verdict == EXPECTED_VERDICTS[layout_name][nodes], [f.message for f in result.findings]
    assert instances >= 1


def test_expert_parallel_spreads_experts_over_every_rank():
    qwen = shape("qwen3.5-397b-a17b")
    tp_only = weight_bytes_per_npu(qwen, "bfloat16", tp=8, dp=2)
    with_ep = weight_bytes_per_npu(qwen, "bfloat16", tp=8, dp=2, ep=True)
    # routed experts 386,547,056,640 params x 2 bytes: /8 without EP, /16 with it
    assert tp_only - with_ep == pytest.approx(386_547_056_640 * 2 / 16, abs=1)


def test_usable_hbm_override_and_chip_table():
    handbook = shape("handbook-dense-80l")
    on_910b4 = plan_instance(handbook, chip_by_name("910B4"), tp=4, max_model_len=32_768, gpu_memory_utilization=0.9, dtype="float16")
    assert on_910b4.verdict == DOES_NOT_FIT
    roomy = plan_instance(handbook, chip_by_name("910B4"), tp=4, max_model_len=32_768, gpu_memory_utilization=0.9, dtype="float16", hbm_bytes_override=60 * GIB)
    assert roomy.verdict == FITS
    with pytest.raises(ConfigError, match="910C"):
        chip_by_name("910C")


# --- Each check's refusal. ---


def test_concurrency_below_one_refuses():
    handbook = shape("handbook-dense-80l")
    # 40 GiB usable: budget 36 GiB holds weights (33.9 GiB) + 2 GiB activations, leaving 0.14 GiB
    starved = plan_instance(handbook, B3, tp=4, max_model_len=32_768, gpu_memory_utilization=0.9, dtype="float16", hbm_bytes_override=40 * GIB)
    assert starved.verdict == DOES_NOT_FIT
    assert codes(starved.findings) == ["concurrency-below-one", "kv-pool-thin"]
    assert codes(check_concurrency(0.99, 32_768)) == ["concurrency-below-one"]
    assert codes(check_concurrency(1.5, 32_768)) == ["concurrency-low"]
    assert check_concurrency(2.0, 32_768) == []


def test_weights_that_do_not_fit_refuse():
    assert codes(check_weights_fit(55 * GIB, 54 * GIB)) == ["weights-do-not-fit"]
    assert check_weights_fit(54 * GIB, 54 * GIB) == []


def test_gpu_memory_utilization_warns_above_092_and_refuses_above_098():
    assert check_gpu_memory_utilization(0.92) == []
    assert [f.severity for f in check_gpu_memory_utilization(0.95)] == ["warning"]
    assert [f.severity for f in check_gpu_memory_utilization(0.99)] == ["error"]
    result = plan_instance(shape("handbook-dense-80l"), B3, tp=4, max_model_len=32_768, gpu_memory_utilization=0.95, dtype="float16")
    assert result.verdict == TIGHT


def test_tensor_parallel_must_divide_the_heads():
    result = plan_instance(shape("handbook-dense-80l"), B3, tp=3, max_model_len=32_768, gpu_memory_utilization=0.9, dtype="float16")
    assert "tp-heads" in codes(result.findings)
    assert result.verdict == DOES_NOT_FIT


def test_max_model_len_beyond_position_embeddings_refuses():
    result = plan_instance(shape("qwen2.5-72b-instruct"), B3, tp=4, max_model_len=65_536, gpu_memory_utilization=0.9, dtype="bfloat16")
    assert "max-model-len" in codes(result.findings)


# HCCL takes 32 ports on CANN 8.3 and later (profiles' stack.hccl_port_span).
BLUE = InstanceRecord("blue", npus=(0, 1, 2, 3), port=8000, hccl_base_port=60000, vllm_port=61000, hccl_port_span=32)
GREEN = InstanceRecord("green", npus=(4, 5, 6, 7), port=8001, hccl_base_port=60032, vllm_port=61016, hccl_port_span=32)


def test_reserved_ports_are_every_instance_range_in_the_kernels_own_form():
    """net.ipv4.ip_local_reserved_ports reads back ascending, touching ranges merged, a lone port
    alone; the deploy compares that with what it sets, so the form decides whether a rerun is a no-op."""
    assert reserved_ports([BLUE, GREEN]) == "8000-8001,60000-60063,61000-61031"
    assert reserved_ports([replace(BLUE, port=9000), replace(GREEN, vllm_port=61100)]) == \
        "8001,9000,60000-60063,61000-61015,61100-61115"
    # CANN 8.0's HCCL takes 16.
    assert reserved_ports([replace(BLUE, hccl_port_span=16)]) == "8000,60000-60015,61000-61015"


def test_instances_with_distinct_npus_and_ports_pass():
    assert check_node_instances([BLUE, GREEN]) == []
    # 16 apart is enough where HCCL takes 16 (CANN 8.0), not where it takes 32
    assert check_node_instances([replace(BLUE, hccl_port_span=16),
                                 replace(GREEN, hccl_base_port=60016, hccl_port_span=16)]) == []


@pytest.mark.parametrize(
    ("green", "expected"),
    [
        (replace(GREEN, npus=(3, 4, 5, 6)), "shared-npu"),
        (replace(GREEN, port=8000), "shared-port"),
        (replace(GREEN, hccl_base_port=60016), "shared-port"),  # 60016-60047 overlaps 60000-60031
        (replace(GREEN, vllm_port=61000), "shared-port"),
        (replace(GREEN, vllm_port=61001), "shared-port"),  # vLLM takes 61000-61015 for blue, 61001-61016 for green
        (replace(GREEN, port=60031), "shared-port"),  # API port inside blue's HCCL range, its last
        (replace(GREEN, port=61010), "shared-port"),  # API port inside blue's VLLM_PORT range
    ],
)
def test_instances_sharing_an_npu_or_a_port_refuse(green, expected):
    findings = check_node_instances([BLUE, green])
    assert codes(findings) == [expected]
    assert findings[0].severity == "error"


@pytest.mark.parametrize(
    ("blue", "message"),
    [
        (replace(BLUE, port=60005), "blue port 60005 lies in its own HCCL range 60000-60031"),
        (replace(BLUE, vllm_port=59990), "blue VLLM_PORT 59990-60005 overlaps its own HCCL range 60000-60031"),
        (replace(BLUE, port=61015), "blue port 61015 lies in its own VLLM_PORT 61000-61015"),
    ],
)
def test_an_instance_whose_own_ports_meet_is_refused(blue, message):
    assert [(f.code, f.message) for f in check_node_instances([blue])] == [("shared-port", message)]


def test_a_profile_too_old_for_the_model_type_is_refused_naming_model_profile_and_minimum():
    support = {"qwen3_5_moe": ModelSupport(transformers="5.2.0", vllm_ascend="0.17.0rc1", vllm_config="0.17.0")}

    def found(vllm_ascend: str, vllm: str, transformers: str) -> list[tuple[str, str]]:
        versions = {"vllm_ascend": vllm_ascend, "vllm": vllm, "transformers": transformers}
        return [(f.code, f.message) for f in check_model_support("Qwen/Qwen3.5-35B-A3B", "qwen3_5_moe", "p", versions, support)]

    assert found("0.13.0", "0.13.0", "4.57.6") == [
        ("vllm-ascend-too-old", "Qwen/Qwen3.5-35B-A3B (model_type 'qwen3_5_moe') is served from vllm-ascend 0.17.0rc1 "
                                "on, profile p pins 0.13.0; choose a newer profile"),
        ("transformers-too-old", "transformers 4.57.6 (profile p) does not know model_type 'qwen3_5_moe' of "
                                 "Qwen/Qwen3.5-35B-A3B (needs >= 5.2.0; fails with KeyError: 'qwen3_5_moe')")]
    # vLLM 0.17.0 on brings its own Qwen3.5 config (and requires transformers < 5): 4.57.6 is enough.
    assert found("0.18.0", "0.18.0", "4.57.6") == []
    assert found("0.17.0rc1", "0.17.0", "4.57.4") == []
    assert [code for code, _ in found("0.17.0rc1", "0.16.0", "5.2.0.dev0")] == ["transformers-too-old"]
    assert found("0.23.0", "0.23.0", "5.5.4") == []
    assert [f.code for f in check_model_support("m", "qwen9", "p", {}, support)] == ["model-type-unknown"]


def test_the_recorded_first_releases_hold_for_the_shipped_profiles():
    """Qwen3.5 on the first profile that serves it passes; on 0.13.0 it is refused (issue 13)."""
    support = model_support()
    stacks = {name: load_profile(name).stack.model_dump() for name in ("vllm-ascend-0.13.0", "vllm-ascend-0.18.0")}
    assert [f.code for f in check_model_support("m", "qwen3_5", "old", stacks["vllm-ascend-0.13.0"], support)] == [
        "vllm-ascend-too-old", "transformers-too-old"]
    assert check_model_support("m", "qwen3_5_moe", "new", stacks["vllm-ascend-0.18.0"], support) == []
    assert check_model_support("m", "qwen3", "old", stacks["vllm-ascend-0.13.0"], support) == []


# Versions the profiles pin or the planner compares against: pre-, post- and dev releases, and the
# local labels of CPU builds (torch 2.9.0+cpu, vllm 0.32.0+cpu).
PYTHON_VERSIONS = ["4.57.0.dev0", "4.57", "4.57.0", "4.57.1", "4.100.0", "0.9.2", "0.10.0rc1", "0.10", "0.18.0a1",
                   "0.18.0b2", "0.18.0rc1", "0.18.0", "0.18.0.post1", "0.18.0.post1.dev2", "0.18.0.dev0",
                   "0.32.0+cpu", "0.32.0", "2.9.0+cpu", "2.9.0+cpu.1", "2.9.0+cpu.10", "2.9.0+2", "1!0.1"]


def test_python_versions_are_ordered_as_pip_orders_them():
    from packaging.version import Version  # the planner itself is standard library only

    def sign(a, b) -> int:
        return (a > b) - (a < b)

    disagree = [(a, b) for a in PYTHON_VERSIONS for b in PYTHON_VERSIONS
                if sign(python_version_key(a), python_version_key(b)) != sign(Version(a), Version(b))]
    assert disagree == []


def test_blue_green_refuses_when_both_models_cannot_be_resident():
    handbook = shape("handbook-dense-80l")
    full = plan_instance(handbook, B3, tp=8, max_model_len=32_768, gpu_memory_utilization=0.9, dtype="float16")
    assert codes(check_blue_green(full, full)) == ["blue-green-hbm"]
    # two 27 GiB budgets + two 400 MiB HCCL reserves = 54.8 GiB of 60
    half = plan_instance(handbook, B3, tp=8, max_model_len=32_768, gpu_memory_utilization=0.45, dtype="float16")
    assert half.verdict != DOES_NOT_FIT
    assert check_blue_green(half, half) == []


def test_block_size_warns_only_where_vllm_ascend_forces_128():
    assert codes(check_block_size(32, prefix_caching=True, chunked_prefill=False, hybrid_model=False)) == ["block-size-overridden"]
    assert codes(check_block_size(32, prefix_caching=False, chunked_prefill=True, hybrid_model=False)) == ["block-size-overridden"]
    assert check_block_size(32, prefix_caching=True, chunked_prefill=True, hybrid_model=True) == []
    assert check_block_size(32, prefix_caching=False, chunked_prefill=False, hybrid_model=False) == []
    assert check_block_size(128, prefix_caching=True, chunked_prefill=True, hybrid_model=False) == []
    assert check_block_size(None, prefix_caching=True, chunked_prefill=True, hybrid_model=False) == []


def test_vllm_use_v1_warns_once_v0_is_gone():
    assert codes(check_vllm_use_v1({"VLLM_USE_V1": "1"}, "0.11.0")) == ["vllm-use-v1-obsolete"]
    assert check_vllm_use_v1({"VLLM_USE_V1": "1"}, "0.9.1") == []
    assert check_vllm_use_v1({}, "0.11.0") == []


# --- The command. ---

runner = CliRunner()


def test_plan_json_reports_the_handbook_figures():
    result = runner.invoke(build_app(), [
        "plan", "--model-config", str(MODELS / "handbook-dense-80l"), "--chip", "910B3", "--tp", "4",
        "--max-model-len", "32768", "--gpu-memory-utilization", "0.9", "--dtype", "float16", "--json",
    ])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["kv_cache_bytes_per_token"] == 327_680
    assert report["weight_bytes_total"] == 145_412_407_296
    assert report["weight_bytes_per_npu"] == 36_355_080_192
    assert report["verdict"] == FITS


def test_plan_table_names_the_verdict():
    result = runner.invoke(build_app(), ["plan", "--model-config", str(MODELS / "qwen3.5-27b" / "config.json"), "--tp", "2"])
    assert result.exit_code == 0, result.output
    assert "fits" in result.stdout
    assert "65,536" in result.stdout  # KV bytes per token


def test_plan_exits_non_zero_with_one_line_when_it_does_not_fit():
    result = runner.invoke(build_app(), ["plan", "--model-config", str(MODELS / "qwen3.5-397b-a17b"), "--tp", "8", "--enable-expert-parallel", "--json"])
    assert result.exit_code == 1
    assert isinstance(result.exception, FleetError)
    assert str(result.exception).startswith("does not fit: weights and activations need")
    assert "\n" not in str(result.exception)


def test_plan_turns_bad_input_into_fleet_errors(tmp_path):
    missing = runner.invoke(build_app(), ["plan", "--model-config", str(tmp_path)])
    assert isinstance(missing.exception, FleetError) and "no such file" in str(missing.exception)
    unknown_chip = runner.invoke(build_app(), ["plan", "--model-config", str(MODELS / "qwen3.5-27b"), "--chip", "910C"])
    assert isinstance(unknown_chip.exception, FleetError) and "unknown chip" in str(unknown_chip.exception)


def test_the_mtp_draft_of_qwen3_5_122b_a10b_is_counted_as_worked_out_by_hand():
    """Qwen3.5-122B-A10B's config.json (tests/fixtures): hidden 3072, 32 heads x 256 with an output
    gate, 2 KV heads, 256 experts of 1024 and a shared expert of 1024, vocab 248320, untied, one MTP
    layer. The draft (vLLM's Qwen3_5MultiTokenPredictor) is that layer, fc (2h x h), three norms and
    its own lm_head; the embeddings are the target's."""
    h, q, kv = 3072, 32 * 256, 2 * 256
    attention = h * q * 2 + q * h                          # q (with its gate) and o
    kv_projections = 2 * h * kv
    routed = 256 * 3 * h * 1024
    shared = 3 * h * 1024
    fc = 2 * h * h
    lm_head = 248320 * h
    replicated = h * 256 + h + 3 * h + 2 * h + 2 * 256     # router, shared gate, norms, layer norms, q/k norms
    draft = shape("qwen3.5-122b-a10b").mtp_parameter_count()
    assert (draft.attention, draft.kv_projections, draft.routed_experts, draft.shared_experts, draft.dense_mlp,
            draft.embeddings, draft.replicated) == (attention, kv_projections, routed, shared, fc, lm_head, replicated)
    assert draft.total == 3_286_518_272  # 3.29B parameters
    # BF16 at TP4 without EP: quantizable weights and experts / 4, k/v over the 2 KV heads, lm_head / 4.
    per_npu = ((attention + fc + shared) / 4 + kv_projections / 2 + routed / 4) * 2 + lm_head / 4 * 2 + replicated * 2
    plain = plan_instance(shape("qwen3.5-122b-a10b"), B3, tp=4, max_model_len=32768, gpu_memory_utilization=0.9,
                          dtype="bfloat16")
    with_mtp = plan_instance(shape("qwen3.5-122b-a10b"), B3, tp=4, max_model_len=32768, gpu_memory_utilization=0.9,
                             dtype="bfloat16", mtp=True)
    assert with_mtp.mtp_weight_bytes_per_npu == per_npu == 1_646_040_064  # 1.53 GiB per NPU
    assert with_mtp.weight_bytes_per_npu == plain.weight_bytes_per_npu + per_npu
    assert with_mtp.kv_cache_pool_bytes_per_npu == plain.kv_cache_pool_bytes_per_npu - per_npu


def test_mtp_for_a_model_without_mtp_layers_is_refused():
    result = plan_instance(shape("qwen2.5-72b-instruct"), B3, tp=8, max_model_len=8192, gpu_memory_utilization=0.9,
                           dtype="bfloat16", mtp=True)
    assert "mtp-without-layers" in codes(result.findings)


def test_qwen3_5_122b_a10b_on_8_910b3_per_npu_figures_as_worked_out_by_hand():
    """Issue 13: plan's weights, KV and linear-state figures per NPU for the real config at TP8 BF16
    (one instance per node), each from the config's dimensions (see test_qwen35_122b_moe_parameters_and_kv)."""
    # Weights, by how each part shards (bf16: 2 bytes):
    attention = 12 * (3072 * 16_384 + 8192 * 3072)           # q (with its gate) and o of the 12 full layers
    kv = 12 * 2 * 3072 * 512                                 # k and v: 2 KV heads, so 2 shards at TP8
    linear = 36 * (3072 * 12_288 + 3072 * 8192 + 2 * 3072 * 64 + 8192 * 3072)  # qkv, z, b and a, out
    shared = 48 * 3 * 3072 * 1024
    routed = 48 * 256 * 3 * 3072 * 1024
    embeddings = 2 * 248_320 * 3072
    small = 36 * (12_288 * 4 + 2 * 64)                       # conv1d, dt_bias and A_log
    replicated = 3072 + 48 * 2 * 3072 + 12 * 2 * 256 + 36 * 128 + 48 * (3072 * 256 + 3072)  # norms, routers, gates
    weights = ((attention + linear + shared) / 8 + kv / 2 + routed / 8) * 2 + (embeddings + small) / 8 * 2 + replicated * 2
    # KV per token per NPU: 12 full layers x K and V x the 1 KV head an NPU holds x 256 x 2 bytes.
    kv_per_token = 12 * 2 * 1 * 256 * 2
    # Linear state per sequence per NPU: 36 layers x (conv: 3 x 12,288 / 8 x 2 + state: 64 / 8 heads x 128 x 128 x 2).
    state = 36 * (3 * 12_288 // 8 * 2 + 64 // 8 * 128 * 128 * 2)
    plan = plan_instance(shape("qwen3.5-122b-a10b"), B3, tp=8, max_model_len=32_768, gpu_memory_utilization=0.9,
                         dtype="bfloat16")
    assert plan.weight_bytes_per_npu == math.ceil(weights) == 30_623_051_904  # 28.5 GiB
    assert plan.kv_cache_bytes_per_token_per_npu == kv_per_token == 12_288
    assert plan.linear_state_bytes_per_sequence_per_npu == state == 9_768_960
    assert plan.verdict == FITS
