"""Capacity planner: HBM, KV-cache and concurrency arithmetic for one vLLM Ascend instance.

Standard library only: this module is also copied into the lab's simulated vLLM
server wheel, so it must not import pydantic, numpy or anything from ascend_fleet.

Memory model, per NPU (every figure the plan reports is per NPU unless its name
says otherwise):

    usable        chip HBM a process can allocate (table below, or an override)
    budget        usable x gpu_memory_utilization: what vLLM lets itself fill
    weights       this NPU's shard of the weights
    activations   PlanPolicy.activation_reserve_bytes: vLLM's profiling run
                  measures the peak activation inside the budget; this is an
                  estimate of that peak, not a measurement
    kv pool       budget - weights - activations: vLLM hands all of it to the
                  KV cache (and, for hybrid models, to the linear-attention state)
    hccl reserve  2 x HCCL_BUFFSIZE MiB per communication group (TP, EP, DP) the
                  NPU joins: HCCL allocates these outside vLLM's view, so they
                  must fit in the HBM the budget leaves free
    headroom      usable - budget - hccl reserve

KV cache per token counts only the layers that attend over the whole sequence
(2 x kv_heads x head_dim per full-attention layer). Linear-attention (gated
delta net) layers hold a fixed state per sequence instead: a convolution window
of (kernel - 1) inputs and a value_dim x key_dim recurrent matrix per value
head, as vLLM's MambaStateShapeCalculator.gated_delta_net_state_shape sizes
them. vLLM pads the attention block size so attention and state pages align;
that rounding is ignored here.

The MTP draft (mtp_num_hidden_layers) is counted when speculative decoding loads
it (ModelShape.mtp_parameter_count). Not counted in the weights: the vision
encoder of multimodal checkpoints, quantization scales, and ACL graph capture
memory. PlanPolicy.tight_kv_fraction exists because of them. No pinned release budgets ACL graph
capture memory and upstream publishes no figure for it (docs/sim-performance.md, "Memory the budget
does not hold"), so it is not counted either.

Some releases allocate a hybrid model's KV cache more than once (kv_cache_copies): vLLM's KV cache
config shares each tensor between one layer of each group, and those releases' model runner gives the
linear-attention and the attention layers their own tensors; the copies beyond the first land outside
the budget, in the HBM gpu-memory-utilization leaves free.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace

GIB = 1024**3
MIB = 1024**2

DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}

# Bytes per parameter of the linear-layer weights a quantization scheme stores.
# Embeddings, lm_head, norms, routers and the delta-net scalars stay in the
# compute dtype (vllm-ascend's W8A8/W4A8 checkpoints leave them unquantized).
QUANTIZED_BYTES_PER_PARAM = {"w8a8": 1.0, "w4a8": 0.5, "int4": 0.5}

# msModelSlim weights carry this file; its `model_quant_type` names the checkpoint's method, the
# weight and activation widths first (vllm-ascend: quantization/modelslim_config.py reads it,
# tests/ut/quantization has "W8A8_DYNAMIC"; methods W8A8, W8A8_MIX, W4A8_DYNAMIC, ...).
MODELSLIM_DESCRIPTION = "quant_model_description.json"

# Model types whose q/k/v projections carry a bias although config.json has no
# attention_bias key (Qwen2 modeling code hard-codes it).
QKV_BIAS_MODEL_TYPES = frozenset({"qwen2", "qwen2_moe"})

# Model types with per-head RMSNorm on queries and keys (q_norm, k_norm).
QK_NORM_MODEL_TYPES = frozenset(
    {"qwen3", "qwen3_moe", "qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"}
)

FULL_ATTENTION = "full_attention"
LINEAR_ATTENTION = "linear_attention"


class ConfigError(ValueError):
    """config.json lacks a field the planner needs, or holds one it cannot use."""


@dataclass(frozen=True)
class Chip:
    """One NPU model: physical HBM, what a process can actually allocate, and the peak speeds the
    performance model (perfmodel.py) divides by. Sources and confidence: docs/sim-performance.md."""

    name: str
    hbm_bytes: int
    usable_hbm_bytes: int
    hbm_bytes_per_second: float
    fp16_flops: float  # dense FP16/BF16 matrix peak; INT8 runs at twice this
    link_bytes_per_second: float  # one HCCS link to another NPU of the node


# 910B3: 64 GiB, ~60 usable (field notes). 910B4: 32 GiB; its usable figure is
# not published, so it assumes the same 4 GiB firmware/driver reservation as the
# 910B3 (measure with `npu-smi info -t usages` and pass hbm_bytes_override).
# Speeds: 910B3 1.6 TB/s (half the 910C's 3.2 TB/s: two 910B dies), ~320 TFLOPS FP16 (field
# notes), HCCS 56 GB/s per link; 910B4's bandwidth is a third-party figure (1.2 TB/s), its
# FLOPS assumed equal to the 910B3's.
CHIPS = {
    "910B3": Chip("910B3", hbm_bytes=64 * GIB, usable_hbm_bytes=60 * GIB, hbm_bytes_per_second=1.6e12,
                  fp16_flops=320e12, link_bytes_per_second=56e9),
    "910B4": Chip("910B4", hbm_bytes=32 * GIB, usable_hbm_bytes=28 * GIB, hbm_bytes_per_second=1.2e12,
                  fp16_flops=320e12, link_bytes_per_second=56e9),
}


def chip_by_name(name: str, chips: Mapping[str, Chip] = CHIPS) -> Chip:
    """Look a chip up in `chips` (the built-in table unless the caller passes its own)."""
    try:
        return chips[name]
    except KeyError:
        raise ConfigError(f"unknown chip {name!r}; known: {', '.join(sorted(chips))}") from None


@dataclass(frozen=True)
class LinearAttentionShape:
    """Gated delta net dimensions of a linear-attention layer."""

    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel_dim: int

    @property
    def key_dim(self) -> int:
        return self.num_key_heads * self.key_head_dim

    @property
    def value_dim(self) -> int:
        return self.num_value_heads * self.value_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the short convolution: queries, keys and values."""
        return 2 * self.key_dim + self.value_dim


@dataclass(frozen=True)
class MoeShape:
    """Mixture-of-experts dimensions; every expert is resident in HBM."""

    num_experts: int
    experts_per_token: int
    moe_intermediate_size: int
    shared_expert_intermediate_size: int
    moe_layers: int


@dataclass(frozen=True)
class ParameterCount:
    """Parameters by how vLLM shards and quantizes them."""

    embeddings: int  # embed_tokens + lm_head: vocab-parallel, never quantized
    attention: int  # q and o projections: TP-sharded, quantizable
    kv_projections: int  # k and v projections: replicated when kv_heads < tp
    linear_attention: int  # delta-net projections: TP-sharded, quantizable
    dense_mlp: int  # TP-sharded, quantizable
    shared_experts: int  # TP-sharded, quantizable
    routed_experts: int  # TP- or EP-sharded, quantizable
    small_sharded: int  # biases, conv1d, dt_bias, A_log: TP-sharded, not quantized
    replicated: int  # norms, routers, shared-expert gates: on every NPU

    @property
    def total(self) -> int:
        return sum(asdict(self).values())


@dataclass(frozen=True)
class ModelShape:
    """The architecture facts capacity planning needs, read from a HF config.json."""

    model_type: str
    text_model_type: str
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    intermediate_size: int
    tie_word_embeddings: bool
    qkv_bias: bool
    qk_norm: bool
    attn_output_gate: bool
    full_attention_layers: int
    linear_attention: LinearAttentionShape | None
    moe: MoeShape | None
    max_position_embeddings: int | None
    ssm_state_dtype: str | None
    mtp_layers: int = 0  # multi-token-prediction layers, loaded only with speculative decoding
    # The scheme the checkpoint's msModelSlim description names (modelslim_scheme), None without one.
    checkpoint_quantization: str | None = None

    @property
    def linear_attention_layers(self) -> int:
        return self.num_layers - self.full_attention_layers

    @property
    def is_hybrid(self) -> bool:
        """True when some layers hold a per-sequence state instead of a KV cache."""
        return self.linear_attention_layers > 0

    @classmethod
    def from_config(cls, config: Mapping) -> ModelShape:
        """Parse a HF config.json; multimodal configs nest the decoder in text_config. A value the planner
        cannot size with (null where a size is needed, a count of 0, a size written as a string) is a
        ConfigError naming its key and value, as config.json has them."""
        if not isinstance(config, Mapping):
            raise ConfigError(f"config.json is a JSON {type(config).__name__}, not an object")
        nested = config.get("text_config")
        if nested is not None and not isinstance(nested, Mapping):
            raise ConfigError(f"config.json text_config: {_quoted(nested)}, expected an object (the decoder's keys)")
        text, where = (nested, "text_config.") if nested else (config, "")

        def required(key: str) -> int:
            if key not in text:
                raise ConfigError(f"config.json has no {where}{key}")
            return _whole(text, key, where)

        hidden_size = required("hidden_size")
        num_layers = required("num_hidden_layers")
        num_heads = required("num_attention_heads")
        text_model_type = _name(text, "model_type", where)
        model_type = _name(config, "model_type", "") if "model_type" in config else text_model_type
        layer_types = _layer_types(text, num_layers, where)
        linear_layers = layer_types.count(LINEAR_ATTENTION)
        moe = _moe_shape(text, num_layers, where)
        dense_layers = num_layers - (moe.moe_layers if moe else 0)
        if dense_layers and "intermediate_size" not in text:
            raise ConfigError("config.json has dense MLP layers but no intermediate_size")
        max_position_embeddings = text.get("max_position_embeddings")
        ssm_state_dtype = text.get("mamba_ssm_dtype")
        if ssm_state_dtype is not None and not isinstance(ssm_state_dtype, str):
            raise ConfigError(f"config.json {where}mamba_ssm_dtype: {_quoted(ssm_state_dtype)}, expected a dtype's "
                              "name, e.g. \"float32\"")
        return cls(
            model_type=model_type,
            text_model_type=text_model_type,
            hidden_size=hidden_size,
            num_layers=num_layers,
            num_attention_heads=num_heads,
            num_kv_heads=_whole(text, "num_key_value_heads", where, default=num_heads),
            head_dim=_whole(text, "head_dim", where, default=hidden_size // num_heads),
            vocab_size=required("vocab_size"),
            intermediate_size=_whole(text, "intermediate_size", where, default=0, least=1 if dense_layers else 0),
            tie_word_embeddings=bool(text.get("tie_word_embeddings", config.get("tie_word_embeddings", False))),
            qkv_bias=bool(text.get("attention_bias", model_type in QKV_BIAS_MODEL_TYPES)),
            qk_norm=bool({model_type, text_model_type} & QK_NORM_MODEL_TYPES),
            attn_output_gate=bool(text.get("attn_output_gate", False)),
            full_attention_layers=num_layers - linear_layers,
            linear_attention=_linear_attention_shape(text, where) if linear_layers else None,
            moe=moe,
            max_position_embeddings=(None if max_position_embeddings is None
                                     else _whole(text, "max_position_embeddings", where)),
            ssm_state_dtype=ssm_state_dtype,
            mtp_layers=_whole(text, "mtp_num_hidden_layers", where, default=0, least=0),
        )

    def parameter_count(self) -> ParameterCount:
        """Count the decoder's parameters from its dimensions (see the module docstring)."""
        h, hd = self.hidden_size, self.head_dim
        q_width = self.num_attention_heads * hd
        kv_width = self.num_kv_heads * hd
        full, linear = self.full_attention_layers, self.linear_attention_layers
        moe = self.moe
        moe_layers = moe.moe_layers if moe else 0

        attention = full * (h * q_width * (2 if self.attn_output_gate else 1) + q_width * h)
        kv_projections = full * 2 * h * kv_width
        small_sharded = full * (q_width + 2 * kv_width) if self.qkv_bias else 0
        replicated = h + self.num_layers * 2 * h  # final norm, input and post-attention norms
        if self.qk_norm:
            replicated += full * 2 * hd
        linear_attention = 0
        if self.linear_attention:
            la = self.linear_attention
            # in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, out_proj
            linear_attention = linear * (h * la.conv_dim + h * la.value_dim + 2 * h * la.num_value_heads + la.value_dim * h)
            small_sharded += linear * (la.conv_dim * la.conv_kernel_dim + 2 * la.num_value_heads)  # conv1d, dt_bias, A_log
            replicated += linear * la.value_head_dim  # gated RMSNorm
        shared_experts = routed_experts = 0
        if moe:
            routed_experts = moe_layers * moe.num_experts * 3 * h * moe.moe_intermediate_size
            shared_experts = moe_layers * 3 * h * moe.shared_expert_intermediate_size
            replicated += moe_layers * h * moe.num_experts  # router
            if moe.shared_expert_intermediate_size:
                replicated += moe_layers * h  # shared_expert_gate
        return ParameterCount(
            embeddings=self.vocab_size * h * (1 if self.tie_word_embeddings else 2),
            attention=attention,
            kv_projections=kv_projections,
            linear_attention=linear_attention,
            dense_mlp=(self.num_layers - moe_layers) * 3 * h * self.intermediate_size,
            shared_experts=shared_experts,
            routed_experts=routed_experts,
            small_sharded=small_sharded,
            replicated=replicated,
        )


    def mtp_parameter_count(self) -> ParameterCount:
        """The MTP draft's own parameters (vLLM's Qwen3_5MultiTokenPredictor, 0.17.0): its layers,
        each a full-attention decoder layer with the model's MLP or MoE; `fc` (2h to h, counted with
        the quantizable TP-sharded weights), its final and two pre-fc norms; and an lm_head unless
        tied, which vllm-ascend 0.18.0's proposer does not share with the target for `mtp` (it shares
        the embeddings: spec_decode/eagle_proposer.py)."""
        if not self.mtp_layers:
            return ParameterCount(0, 0, 0, 0, 0, 0, 0, 0, 0)
        moe = replace(self.moe, moe_layers=self.mtp_layers) if self.moe else None
        layers = replace(self, num_layers=self.mtp_layers, full_attention_layers=self.mtp_layers,
                         linear_attention=None, moe=moe, tie_word_embeddings=True, mtp_layers=0).parameter_count()
        h = self.hidden_size
        return replace(layers, embeddings=0 if self.tie_word_embeddings else self.vocab_size * h,
                       dense_mlp=layers.dense_mlp + 2 * h * h, replicated=layers.replicated + 2 * h)


def _quoted(value: object) -> str:
    """A config.json value as the file has it (a string in its quotes), cut short."""
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _whole(section: Mapping, key: str, where: str, default: int | None = None, least: int = 1) -> int:
    """section[key] as a whole number of at least `least`; `default` where the key is absent or null (as HF
    reads null for an optional size), else a ConfigError naming the key and the value."""
    value = section.get(key)
    if value is None and default is not None:
        return default
    whole = isinstance(value, int) or isinstance(value, float) and value.is_integer()
    if isinstance(value, bool) or not whole or value < least:
        raise ConfigError(f"config.json {where}{key}: {_quoted(value)}, expected a whole number"
                          + (f" of at least {least}" if least else " (0 or more)"))
    return int(value)


def _name(section: Mapping, key: str, where: str) -> str:
    """section[key] as a string ("" where absent), else a ConfigError naming the key and the value."""
    value = section.get(key, "")
    if not isinstance(value, str):
        raise ConfigError(f"config.json {where}{key}: {_quoted(value)}, expected a name in quotes")
    return value


def _layer_types(text: Mapping, num_layers: int, where: str) -> list[str]:
    """Per-layer attention kind; sliding-window layers count as full (an upper bound)."""
    if "layer_types" in text:
        kinds = text["layer_types"]
        if not isinstance(kinds, list):
            raise ConfigError(f"config.json {where}layer_types: {_quoted(kinds)}, expected a list of layer kinds")
        if len(kinds) != num_layers:
            raise ConfigError(f"layer_types lists {len(kinds)} layers, num_hidden_layers says {num_layers}")
        return [LINEAR_ATTENTION if kind == LINEAR_ATTENTION else FULL_ATTENTION for kind in kinds]
    if text.get("full_attention_interval"):
        interval = _whole(text, "full_attention_interval", where)
        return [FULL_ATTENTION if (i + 1) % interval == 0 else LINEAR_ATTENTION for i in range(num_layers)]
    return [FULL_ATTENTION] * num_layers


def _linear_attention_shape(text: Mapping, where: str) -> LinearAttentionShape:
    keys = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim")
    missing = [key for key in keys if key not in text]
    if missing:
        raise ConfigError(f"config.json has linear-attention layers but no {', '.join(missing)}")
    return LinearAttentionShape(*(_whole(text, key, where) for key in keys))


def _moe_shape(text: Mapping, num_layers: int, where: str) -> MoeShape | None:
    num_experts = _whole(text, "num_experts", where, default=0, least=0)
    if not num_experts:
        return None
    if "moe_intermediate_size" not in text:
        raise ConfigError(f"config.json has {num_experts} experts but no {where}moe_intermediate_size")
    mlp_only = text.get("mlp_only_layers") or []
    if not isinstance(mlp_only, list):
        raise ConfigError(f"config.json {where}mlp_only_layers: {_quoted(mlp_only)}, expected a list of layer numbers")
    # Qwen2-MoE rule: a layer is sparse unless listed in mlp_only_layers or off the sparse step.
    step = _whole(text, "decoder_sparse_step", where, default=1)
    moe_layers = sum(1 for i in range(num_layers) if i not in mlp_only and (i + 1) % step == 0)
    return MoeShape(
        num_experts=num_experts,
        experts_per_token=_whole(text, "num_experts_per_tok", where, default=0, least=0),
        moe_intermediate_size=_whole(text, "moe_intermediate_size", where),
        shared_expert_intermediate_size=_whole(text, "shared_expert_intermediate_size", where, default=0, least=0),
        moe_layers=moe_layers,
    )


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a vLLM --dtype name."""
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise ConfigError(f"unknown dtype {dtype!r}; known: {', '.join(sorted(DTYPE_BYTES))}") from None


def _quantized_bytes(dtype: str, quantization: str | None) -> float:
    if quantization is None:
        return dtype_bytes(dtype)
    try:
        return QUANTIZED_BYTES_PER_PARAM[quantization]
    except KeyError:
        raise ConfigError(
            f"unknown quantization {quantization!r}; known: {', '.join(sorted(QUANTIZED_BYTES_PER_PARAM))}"
        ) from None


def kv_cache_bytes_per_token(shape: ModelShape, kv_dtype_bytes: int = 2) -> int:
    """K and V of one token across all full-attention layers (the whole instance, all NPUs)."""
    return 2 * shape.full_attention_layers * shape.num_kv_heads * shape.head_dim * kv_dtype_bytes


def kv_heads_per_npu(shape: ModelShape, tp: int) -> int:
    """KV heads one NPU stores: vLLM replicates heads when there are fewer than TP ranks."""
    return max(1, shape.num_kv_heads // tp)


def kv_cache_bytes_per_token_per_npu(shape: ModelShape, tp: int, kv_dtype_bytes: int = 2) -> int:
    """K and V of one token on one NPU of a TP group."""
    return 2 * shape.full_attention_layers * kv_heads_per_npu(shape, tp) * shape.head_dim * kv_dtype_bytes


def linear_state_bytes_per_sequence(shape: ModelShape, tp: int = 1, state_dtype_bytes: int = 2) -> int:
    """Fixed linear-attention state one sequence holds on one NPU, whatever its length.

    The recurrent matrix uses the config's mamba_ssm_dtype when it names one
    (vLLM's mamba_ssm_cache_dtype), otherwise the state dtype.
    """
    la = shape.linear_attention
    if la is None:
        return 0
    ssm_bytes = DTYPE_BYTES[shape.ssm_state_dtype] if shape.ssm_state_dtype in DTYPE_BYTES else state_dtype_bytes
    conv_state = (la.conv_kernel_dim - 1) * (la.conv_dim // tp) * state_dtype_bytes
    recurrent_state = (la.num_value_heads // tp) * la.value_head_dim * la.key_head_dim * ssm_bytes
    return shape.linear_attention_layers * (conv_state + recurrent_state)


def weight_bytes(shape: ModelShape, dtype: str = "float16", quantization: str | None = None) -> int:
    """All decoder weights of the model (not per NPU)."""
    return weight_bytes_per_npu(shape, dtype, quantization, tp=1)


def weight_bytes_per_npu(
    shape: ModelShape,
    dtype: str = "float16",
    quantization: str | None = None,
    tp: int = 1,
    ep: bool = False,
    dp: int = 1,
    params: ParameterCount | None = None,
) -> int:
    """One NPU's weight shard: TP splits layers; with EP the experts spread over tp x dp ranks.
    `params`: other parameters of the same model to shard so (its MTP draft's); default its own."""
    params = params or shape.parameter_count()
    compute_bytes = dtype_bytes(dtype)
    linear_bytes = _quantized_bytes(dtype, quantization)
    expert_shards = tp * dp if ep and shape.moe else tp
    kv_shards = min(tp, shape.num_kv_heads)
    quantizable = params.attention + params.linear_attention + params.dense_mlp + params.shared_experts
    total = (
        (quantizable / tp + params.kv_projections / kv_shards + params.routed_experts / expert_shards) * linear_bytes
        + (params.embeddings + params.small_sharded) / tp * compute_bytes
        + params.replicated * compute_bytes
    )
    return math.ceil(total)


@dataclass(frozen=True)
class PlanPolicy:
    """Estimates and thresholds behind a verdict; every one is a judgement, so all are overridable."""

    # Peak activation vLLM's profiling run measures inside the budget. 2 GiB is an
    # estimate for the default 8192 batched tokens; read the real figure from the
    # start-up log and raise it for larger --max-num-batched-tokens or MoE dispatch.
    activation_reserve_bytes: int = 2 * GIB
    # HCCL_BUFFSIZE in MiB (HCCL's default is 200; the Qwen3.5 guides use 512-1024).
    hccl_buffsize_mib: int = 200
    # Field notes: above 0.92 HCCL runs out of room under load; above 0.98 nothing is left.
    gpu_memory_utilization_warn_above: float = 0.92
    gpu_memory_utilization_refuse_above: float = 0.98
    # Fewer full-length requests than this and one long prompt starves the rest.
    tight_concurrency: float = 2.0
    # A KV pool under this share of the budget is erased by the few GiB this
    # planner does not model (vision encoder, MTP layer, graph capture).
    tight_kv_fraction: float = 0.25
    # Request length (prompt + output) used to suggest --max-num-seqs.
    typical_sequence_tokens: int = 4096
    # vLLM's default --max-num-seqs; the suggestion never exceeds it.
    max_num_seqs_cap: int = 256


DEFAULT_POLICY = PlanPolicy()

ERROR = "error"
WARNING = "warning"


@dataclass(frozen=True)
class Finding:
    """One check result: `code` is stable for machines, `message` is one line for operators."""

    severity: str
    code: str
    message: str


@dataclass(frozen=True)
class InstancePlan:
    """Capacity plan of one vLLM instance (one engine per DP rank); byte figures are per NPU."""

    model_type: str
    chip: str
    tp: int
    dp: int
    ep: bool
    dtype: str
    quantization: str | None
    max_model_len: int
    gpu_memory_utilization: float
    parameter_count: int
    weight_bytes_total: int
    weight_bytes_per_npu: int  # the MTP draft's included
    mtp_weight_bytes_per_npu: int
    kv_cache_bytes_per_token: int
    kv_cache_bytes_per_token_per_npu: int
    linear_state_bytes_per_sequence_per_npu: int
    usable_hbm_bytes_per_npu: int
    budget_bytes_per_npu: int
    activation_reserve_bytes_per_npu: int
    hccl_reserve_bytes_per_npu: int
    kv_cache_pool_bytes_per_npu: int
    kv_cache_tokens: int
    max_concurrency_per_rank: float
    max_concurrency: float
    suggested_max_num_seqs: int
    headroom_bytes_per_npu: int
    verdict: str
    findings: list[Finding] = field(default_factory=list)

    @property
    def npus(self) -> int:
        return self.tp * self.dp

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == ERROR]

    def to_dict(self) -> dict:
        """Plain data for --json and for the simulated server."""
        return {**asdict(self), "npus": self.npus}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


FITS = "fits"
TIGHT = "tight"
DOES_NOT_FIT = "does not fit"


def modelslim_scheme(description: Mapping) -> str:
    """The scheme whose sizes the planner uses for a msModelSlim description (W8A8*, W4A8*)."""
    if not isinstance(description, Mapping):
        raise ConfigError(f"{MODELSLIM_DESCRIPTION}: a JSON {type(description).__name__}, not the object msModelSlim "
                          "writes")
    quant_type = str(description.get("model_quant_type", ""))
    for scheme in ("w8a8", "w4a8"):
        if quant_type.lower().startswith(scheme):
            return scheme
    raise ConfigError(f"{MODELSLIM_DESCRIPTION}: model_quant_type {quant_type!r} is none the planner sizes "
                      "(W8A8..., W4A8...); set quantization_scheme in the data")


def planned_quantization(shape: ModelShape, stated: str | None, ascend: bool) -> tuple[str | None, list[Finding]]:
    """The scheme to size the weights with: the checkpoint's description's where it has one (vLLM
    loads what the files hold), else the one the data states; and what is wrong with that choice."""
    if shape.checkpoint_quantization is None:
        if ascend and stated is None:
            return None, [Finding(ERROR, "quantization-scheme-unknown",
                                  f"quantization ascend, but no {MODELSLIM_DESCRIPTION} is beside the model's config: "
                                  "weights without one are not msModelSlim's and vllm-ascend refuses to start; drop "
                                  "quantization, or, if the weights have it and the plan reads only their config, "
                                  "set quantization_scheme to their scheme (w8a8, w4a8; the serve stage checks the "
                                  "file on the node)")]
        return stated, []
    if stated is not None and stated != shape.checkpoint_quantization:
        return shape.checkpoint_quantization, [Finding(
            WARNING, "quantization-scheme-differs",
            f"quantization_scheme {stated} differs from the weights' {MODELSLIM_DESCRIPTION} "
            f"({shape.checkpoint_quantization}): planned with the weights'")]
    return shape.checkpoint_quantization, []


# How a release's model runner allocates a hybrid model's KV cache tensors (the profile's
# hybrid_kv_cache_allocation): "shared", one tensor for every layer sharing it, as vLLM budgets;
# "per_kind", one for the linear-attention layers and one for the attention layer; "per_layer", one
# for each linear-attention layer and one for the attention layer.
HYBRID_KV_CACHE_ALLOCATIONS = ("shared", "per_kind", "per_layer")


def kv_cache_copies(shape: ModelShape, allocation: str | None) -> int:
    """How many times a release that allocates as `allocation` holds the KV pool of `shape`."""
    if allocation in (None, "shared") or not shape.linear_attention_layers or not shape.full_attention_layers:
        return 1
    if allocation == "per_kind":
        return 2
    # one layer of each group shares a tensor: vLLM groups the layers by the attention layers' count
    return math.ceil(shape.linear_attention_layers / shape.full_attention_layers) + 1


def plan_instance(
    shape: ModelShape,
    chip: Chip,
    tp: int,
    max_model_len: int,
    gpu_memory_utilization: float,
    dtype: str,
    quantization: str | None = None,
    ep: bool = False,
    hbm_bytes_override: int | None = None,
    dp: int = 1,
    kv_dtype: str | None = None,
    policy: PlanPolicy = DEFAULT_POLICY,
    mtp: bool = False,
    kv_copies: int = 1,
) -> InstancePlan:
    """Plan one instance of `tp` x `dp` NPUs and judge it: fits, tight, or does not fit.

    `dp` > 1 means data parallelism across engines (e.g. one per node), each
    with its own KV pool; `ep` spreads the experts over all tp x dp NPUs.
    `kv_copies`: how many times the release allocates the KV pool (kv_cache_copies).
    """
    if tp < 1 or dp < 1 or max_model_len < 1:
        raise ConfigError("tp, dp and max-model-len must be positive")
    kv_bytes = dtype_bytes(kv_dtype or dtype)
    usable = hbm_bytes_override if hbm_bytes_override is not None else chip.usable_hbm_bytes
    budget = int(usable * gpu_memory_utilization)
    # The MTP draft (speculative decoding's method *_mtp) is resident beside the model.
    mtp_weights = weight_bytes_per_npu(shape, dtype, quantization, tp=tp, ep=ep, dp=dp,
                                       params=shape.mtp_parameter_count()) if mtp else 0
    weights = weight_bytes_per_npu(shape, dtype, quantization, tp=tp, ep=ep, dp=dp) + mtp_weights
    activation = policy.activation_reserve_bytes
    kv_pool = budget - weights - activation
    hccl = 2 * policy.hccl_buffsize_mib * MIB * _communication_groups(shape, tp, dp, ep)
    kv_per_token = kv_cache_bytes_per_token_per_npu(shape, tp, kv_bytes)
    state = linear_state_bytes_per_sequence(shape, tp, dtype_bytes(dtype))
    usable_pool = max(kv_pool, 0)

    def sequences_that_fit(tokens: int) -> float:
        return usable_pool / (kv_per_token * tokens + state)

    concurrency = sequences_that_fit(max_model_len)
    typical = sequences_that_fit(min(max_model_len, policy.typical_sequence_tokens))
    findings = [
        *check_mtp_layers(shape, mtp),
        *check_tensor_parallel(shape, tp),
        *check_max_model_len(shape, max_model_len),
        *check_gpu_memory_utilization(gpu_memory_utilization, policy),
        *check_weights_fit(weights + activation, budget),
        *check_concurrency(concurrency, max_model_len, policy),
        *check_kv_share(usable_pool, budget, policy),
        *check_hccl_headroom(usable - budget, hccl),
        *check_kv_cache_copies(kv_copies, usable_pool, usable - budget - hccl, usable, gpu_memory_utilization),
    ]
    return InstancePlan(
        model_type=shape.model_type,
        chip=chip.name,
        tp=tp,
        dp=dp,
        ep=ep,
        dtype=dtype,
        quantization=quantization,
        max_model_len=max_model_len,
        gpu_memory_utilization=gpu_memory_utilization,
        parameter_count=shape.parameter_count().total,
        weight_bytes_total=weight_bytes(shape, dtype, quantization),
        weight_bytes_per_npu=weights,
        mtp_weight_bytes_per_npu=mtp_weights,
        kv_cache_bytes_per_token=kv_cache_bytes_per_token(shape, kv_bytes),
        kv_cache_bytes_per_token_per_npu=kv_per_token,
        linear_state_bytes_per_sequence_per_npu=state,
        usable_hbm_bytes_per_npu=usable,
        budget_bytes_per_npu=budget,
        activation_reserve_bytes_per_npu=activation,
        hccl_reserve_bytes_per_npu=hccl,
        kv_cache_pool_bytes_per_npu=kv_pool,
        kv_cache_tokens=usable_pool // kv_per_token,
        max_concurrency_per_rank=round(concurrency, 2),
        max_concurrency=round(concurrency * dp, 2),
        suggested_max_num_seqs=min(policy.max_num_seqs_cap, math.floor(typical)) if concurrency >= 1 else 0,
        headroom_bytes_per_npu=usable - budget - hccl - (kv_copies - 1) * usable_pool,
        verdict=judge(findings),
        findings=findings,
    )


def _communication_groups(shape: ModelShape, tp: int, dp: int, ep: bool) -> int:
    """HCCL communicators an NPU joins: TP all-reduce, EP all-to-all, DP sync."""
    return (tp > 1) + (dp > 1) + bool(ep and shape.moe)


def judge(findings: Sequence[Finding]) -> str:
    """Any error: does not fit; any warning: tight; otherwise: fits."""
    if any(f.severity == ERROR for f in findings):
        return DOES_NOT_FIT
    if findings:
        return TIGHT
    return FITS


# --- Stack checks: pure functions over simple inputs, each returning findings. ---


def check_tensor_parallel(shape: ModelShape, tp: int) -> list[Finding]:
    """vLLM refuses a TP size that does not divide the attention (or delta-net) heads."""
    findings = []
    if shape.num_attention_heads % tp:
        findings.append(Finding(ERROR, "tp-heads", f"--tensor-parallel-size {tp} does not divide {shape.num_attention_heads} attention heads"))
    if shape.num_kv_heads % tp and tp % shape.num_kv_heads:
        findings.append(Finding(ERROR, "tp-kv-heads", f"--tensor-parallel-size {tp} and {shape.num_kv_heads} KV heads divide neither way"))
    la = shape.linear_attention
    if la and (la.num_key_heads % tp or la.num_value_heads % tp):
        findings.append(Finding(ERROR, "tp-linear-heads", f"--tensor-parallel-size {tp} does not divide the {la.num_key_heads}/{la.num_value_heads} linear-attention heads"))
    return findings


def check_max_model_len(shape: ModelShape, max_model_len: int) -> list[Finding]:
    """vLLM refuses a --max-model-len beyond the model's position embeddings."""
    limit = shape.max_position_embeddings
    if limit and max_model_len > limit:
        return [Finding(ERROR, "max-model-len", f"--max-model-len {max_model_len} exceeds the model's max_position_embeddings {limit}")]
    return []


def check_gpu_memory_utilization(value: float, policy: PlanPolicy = DEFAULT_POLICY) -> list[Finding]:
    """Above the warn level HCCL buffers run short under load; above the refuse level nothing is left."""
    if value > policy.gpu_memory_utilization_refuse_above:
        return [Finding(ERROR, "gpu-memory-utilization", f"--gpu-memory-utilization {value} is above {policy.gpu_memory_utilization_refuse_above}: no HBM left for HCCL and the runtime")]
    if value > policy.gpu_memory_utilization_warn_above:
        return [Finding(WARNING, "gpu-memory-utilization", f"--gpu-memory-utilization {value} is above {policy.gpu_memory_utilization_warn_above}: HCCL buffers tend to OOM under load on Ascend")]
    return []


def check_weights_fit(resident_bytes: int, budget_bytes: int) -> list[Finding]:
    """Refuse when weights plus the activation reserve exceed one NPU's budget."""
    if resident_bytes > budget_bytes:
        return [Finding(ERROR, "weights-do-not-fit", f"weights and activations need {format_gib(resident_bytes)} per NPU; the budget is {format_gib(budget_bytes)}: add NPUs, quantize, or raise the budget")]
    return []


def check_concurrency(concurrency: float, max_model_len: int, policy: PlanPolicy = DEFAULT_POLICY) -> list[Finding]:
    """Refuse below one full-length request; warn below the policy's tight level."""
    if concurrency < 1:
        return [Finding(ERROR, "concurrency-below-one", f"not even one {max_model_len}-token request fits in the KV cache ({concurrency:.2f}x): lower --max-model-len or add NPUs")]
    if concurrency < policy.tight_concurrency:
        return [Finding(WARNING, "concurrency-low", f"only {concurrency:.2f} requests of {max_model_len} tokens fit at once")]
    return []


def check_kv_share(kv_pool_bytes: int, budget_bytes: int, policy: PlanPolicy = DEFAULT_POLICY) -> list[Finding]:
    """Warn when the KV pool is a thin slice of the budget that unmodelled allocations can erase."""
    if 0 < kv_pool_bytes < policy.tight_kv_fraction * budget_bytes:
        return [Finding(WARNING, "kv-pool-thin", f"KV cache gets {format_gib(kv_pool_bytes)} of a {format_gib(budget_bytes)} budget per NPU: weights crowd it out")]
    return []


def check_hccl_headroom(free_outside_budget: int, hccl_reserve: int) -> list[Finding]:
    """Warn when HCCL buffers do not fit in the HBM that gpu-memory-utilization leaves free."""
    if hccl_reserve > free_outside_budget:
        return [Finding(WARNING, "hccl-headroom", f"HCCL buffers need {format_gib(hccl_reserve)} per NPU but only {format_gib(free_outside_budget)} is left outside the budget")]
    return []


def check_kv_cache_copies(copies: int, pool: int, free_outside_budget: int, usable: int,
                          gpu_memory_utilization: float) -> list[Finding]:
    """An error when the KV pool's further copies (kv_cache_copies) do not fit outside the budget."""
    extra = (copies - 1) * pool
    if extra <= free_outside_budget:
        return []
    # each copy shrinks with the budget: the pool drops by usable x the utilization given up
    lower = gpu_memory_utilization - (extra - free_outside_budget) / (copies * usable)
    return [Finding(ERROR, "kv-cache-copies", f"this release allocates a hybrid model's KV cache {copies} times: "
                    f"{format_gib(extra)} per NPU beyond the budget, {format_gib(max(free_outside_budget, 0))} free "
                    f"outside it; lower --gpu-memory-utilization to {math.floor(lower * 100) / 100:.2f} or below")]


# vLLM's ParallelConfig default: the port a multi-node instance's head coordinates its engines on
# (--data-parallel-rpc-port).
DP_RPC_PORT = 29550
# vLLM takes VLLM_PORT and counts up from it for its further internal sockets (get_open_port
# moves past busy ones) and, with DP > 1, for its DP master ports (0.18.0: get_open_ports_list(5)
# scans up from VLLM_PORT; the dataclass's 29500 is replaced), so each instance keeps this many.
VLLM_PORT_SPAN = 16


def ranges_overlap(first: range, second: range) -> bool:
    """Whether two port ranges share a port."""
    return first.start < second.stop and second.start < first.stop


def ports_text(ports: range) -> str:
    """A port range as messages say it: 8000, or 60000-60031."""
    first, last = ports[0], ports[-1]
    return f"{first}" if first == last else f"{first}-{last}"


@dataclass(frozen=True)
class PortRange:
    """The ports an instance takes for one purpose, and the instance field that places them."""

    name: str  # as messages say it
    field: str
    ports: range

    def overlaps(self, other: PortRange) -> bool:
        return ranges_overlap(self.ports, other.ports)

    def __str__(self) -> str:
        return f"{self.name} {ports_text(self.ports)}"


@dataclass(frozen=True)
class InstanceRecord:
    """What one instance on a node claims: NPUs and ports."""

    name: str
    npus: tuple[int, ...]
    port: int
    hccl_base_port: int
    vllm_port: int
    hccl_port_span: int  # the ports HCCL takes from hccl_base_port: its CANN's (a profile's stack.hccl_port_span)

    @property
    def hccl_range(self) -> PortRange:
        return PortRange("HCCL range", "hccl_base_port", range(self.hccl_base_port, self.hccl_base_port + self.hccl_port_span))

    def port_ranges(self) -> tuple[PortRange, ...]:
        """Every port the instance takes: its API port, vLLM's internal ports and HCCL's."""
        return (
            PortRange("port", "port", range(self.port, self.port + 1)),
            PortRange("VLLM_PORT", "vllm_port", range(self.vllm_port, self.vllm_port + VLLM_PORT_SPAN)),
            self.hccl_range,
        )


def reserved_ports(records: Sequence[InstanceRecord], more: Sequence[PortRange] = ()) -> str:
    """Every port of these instances (and of `more`, e.g. a multi-node head's) in the form the kernel
    reads net.ipv4.ip_local_reserved_ports back in (so a rerun compares equal): ascending, touching
    ports merged into one a-b range, a lone port alone, e.g. "8000-8001,51000-51031,60000-60031"."""
    taken = [*(claimed for record in records for claimed in record.port_ranges()), *more]
    ports = sorted({port for claimed in taken for port in claimed.ports})
    spans: list[list[int]] = []
    for port in ports:
        if spans and port == spans[-1][1] + 1:
            spans[-1][1] = port
        else:
            spans.append([port, port])
    return ",".join(str(first) if first == last else f"{first}-{last}" for first, last in spans)


@dataclass(frozen=True)
class PortClash:
    """Two port ranges on one node that share a port: of two instances, or of the same one."""

    first: str
    first_range: PortRange
    second: str
    second_range: PortRange

    @property
    def own(self) -> bool:
        return self.first == self.second

    def __str__(self) -> str:
        a, b = self.first_range, self.second_range
        if self.own:
            return f"{self.first} {a} {'lies in' if len(a.ports) == 1 else 'overlaps'} its own {b}"
        if len(a.ports) == len(b.ports) == 1:
            return f"{self.first} and {self.second} both take {a}"
        if len(a.ports) == 1:
            return f"{self.first} {a} lies in {self.second}'s {b}"
        if len(b.ports) == 1:
            return f"{self.second} {b} lies in {self.first}'s {a}"
        return f"{self.first} {a} and {self.second} {b} overlap"


def port_clashes(instances: Sequence[InstanceRecord]) -> list[PortClash]:
    """Every two port ranges of one node's instances that share a port, one instance's own included."""
    claims = [(instance.name, claimed) for instance in instances for claimed in instance.port_ranges()]
    return [PortClash(first, a, second, b) for index, (first, a) in enumerate(claims) for second, b in claims[index + 1:]
            if a.overlaps(b)]


def check_node_instances(instances: Sequence[InstanceRecord]) -> list[Finding]:
    """Refuse instances on one node that share an NPU, or any port (port_clashes)."""
    findings = []
    for index, first in enumerate(instances):
        for second in instances[index + 1:]:
            shared_npus = sorted(set(first.npus) & set(second.npus))
            if shared_npus:
                findings.append(Finding(ERROR, "shared-npu", f"{first.name} and {second.name} both use NPU {', '.join(map(str, shared_npus))}"))
    return findings + [Finding(ERROR, "shared-port", str(clash)) for clash in port_clashes(instances)]


# PEP 440's version scheme, as packaging.version parses it (the planner is standard library only).
_PYTHON_VERSION = re.compile(
    r"^v?(?:(?P<epoch>\d+)!)?(?P<release>\d+(?:\.\d+)*)"
    r"(?:[-_.]?(?P<pre>a|b|c|rc|alpha|beta|pre|preview)[-_.]?(?P<pre_n>\d*))?"
    r"(?:-(?P<post_implicit>\d+)|[-_.]?(?:post|rev|r)[-_.]?(?P<post_n>\d*))?"
    r"(?:[-_.]?(?P<dev>dev)[-_.]?(?P<dev_n>\d*))?"
    r"(?:\+(?P<local>[a-z0-9]+(?:[-_.][a-z0-9]+)*))?$", re.IGNORECASE)
_PRE_RELEASE_ORDER = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "c": 2, "rc": 2, "pre": 2, "preview": 2}


def python_version_key(version: str) -> tuple:
    """Order Python package versions as pip does (PEP 440): 4.57.0.dev0 < 4.57rc1 < 4.57 == 4.57.0 <
    4.57.0+cpu < 4.57.0.post1 < 4.57.1. Huawei's versions are ordered by ascend_fleet.core.versions."""
    match = _PYTHON_VERSION.match(version.strip())
    if match is None:
        raise ValueError(f"{version!r} is not a PEP 440 version")
    release = tuple(int(part) for part in match["release"].split("."))
    while len(release) > 1 and release[-1] == 0:
        release = release[:-1]
    has_post = match["post_implicit"] is not None or match["post_n"] is not None
    # packaging's order: a dev release of X (no pre or post) before X's pre-releases, X after them.
    if match["pre"]:
        pre = (0, _PRE_RELEASE_ORDER[match["pre"].lower()], int(match["pre_n"] or 0))
    else:
        pre = (-1,) if match["dev"] and not has_post else (1,)
    post = (int(match["post_implicit"] or match["post_n"] or 0),) if has_post else (-1,)
    dev = (0, int(match["dev_n"] or 0)) if match["dev"] else (1,)
    local = tuple((1, int(part), "") if part.isdigit() else (0, 0, part.lower())
                  for part in re.split(r"[-_.]", match["local"])) if match["local"] else ()
    return int(match["epoch"] or 0), release, pre, post, dev, local


def _version_at_least(version: str, minimum: str) -> bool:
    return python_version_key(version) >= python_version_key(minimum)


def speculates_with_mtp(speculative_config: Mapping | None) -> bool:
    """Speculative decoding with the model's own MTP layers (method qwen3_5_mtp, mtp, ...), whose
    draft weights are then resident beside the model."""
    return bool(speculative_config) and str(speculative_config.get("method", "")).endswith("mtp")


def check_mtp_layers(shape: ModelShape, mtp: bool) -> list[Finding]:
    """Refuse MTP speculative decoding for a model that has no MTP layers to draft with."""
    if mtp and not shape.mtp_layers:
        return [Finding(ERROR, "mtp-without-layers", f"speculative decoding with MTP, but model_type "
                                f"{shape.model_type!r} has no MTP layers (config.json mtp_num_hidden_layers); "
                                "drop speculative_config or serve a model that has them")]
    return []


@dataclass(frozen=True)
class ModelSupport:
    """The first releases that serve one model_type (ascend_fleet/fleet/model_types.yaml says each source)."""

    transformers: str  # the first whose AutoConfig knows it
    vllm_ascend: str | None = None  # the first that serves it; None: unknown
    vllm_config: str | None = None  # a vLLM that brings its own config class for it

    def config_from_vllm(self, vllm: str) -> bool:
        """Whether vLLM `vllm` reads this model's config with a class of its own, so its transformers
        need not know the model_type (vLLM's config registry is looked up before AutoConfig)."""
        return self.vllm_config is not None and _version_at_least(vllm, self.vllm_config)


def check_model_support(model: str, model_type: str, profile: str, versions: Mapping[str, str],
                        support: Mapping[str, ModelSupport]) -> list[Finding]:
    """Refuse a profile too old for the model: a vllm-ascend before the first that serves its
    model_type, or a transformers that does not know it when the pinned vLLM brings no config of
    its own. `versions`: the profile's vllm_ascend, vllm and transformers."""
    known = support.get(model_type)
    if known is None:
        return [Finding(WARNING, "model-type-unknown", f"no first releases are recorded for model_type "
                                 f"{model_type!r} of {model} (ascend_fleet/fleet/model_types.yaml); whether profile "
                                 f"{profile} serves it is not checked")]
    findings = []
    vllm_ascend = versions["vllm_ascend"]
    if known.vllm_ascend and not _version_at_least(vllm_ascend, known.vllm_ascend):
        findings.append(Finding(ERROR, "vllm-ascend-too-old", f"{model} (model_type {model_type!r}) is served from "
                                f"vllm-ascend {known.vllm_ascend} on, profile {profile} pins {vllm_ascend}; "
                                "choose a newer profile"))
    if not known.config_from_vllm(versions["vllm"]) and not _version_at_least(versions["transformers"], known.transformers):
        findings.append(Finding(ERROR, "transformers-too-old", f"transformers {versions['transformers']} (profile "
                                f"{profile}) does not know model_type {model_type!r} of {model} (needs >= "
                                f"{known.transformers}; fails with KeyError: '{model_type}')"))
    return findings


def check_blue_green(current: InstancePlan, replacement: InstancePlan) -> list[Finding]:
    """Refuse a blue/green switch on the same NPUs when HBM cannot hold both instances.

    Each vLLM instance takes its whole budget at start-up (the KV pool is
    preallocated), so both budgets and both HCCL reserves must fit at once.
    """
    usable = min(current.usable_hbm_bytes_per_npu, replacement.usable_hbm_bytes_per_npu)
    needed = (
        current.budget_bytes_per_npu
        + replacement.budget_bytes_per_npu
        + current.hccl_reserve_bytes_per_npu
        + replacement.hccl_reserve_bytes_per_npu
    )
    if needed > usable:
        return [Finding(ERROR, "blue-green-hbm", f"blue/green keeps both models resident: {format_gib(needed)} per NPU against {format_gib(usable)} usable; lower both --gpu-memory-utilization or stage the new model on other NPUs")]
    return []


BLOCK_SIZE_FORCED_BY_VLLM_ASCEND = 128


def check_block_size(block_size: int | None, prefix_caching: bool | None, chunked_prefill: bool | None, hybrid_model: bool) -> list[Finding]:
    """Warn when vllm-ascend will override --block-size (non-hybrid model with prefix caching or chunked
    prefill on; None is vLLM's default, which is on)."""
    forced = BLOCK_SIZE_FORCED_BY_VLLM_ASCEND
    if block_size is not None and block_size != forced and not hybrid_model and (prefix_caching is not False or chunked_prefill is not False):
        return [Finding(WARNING, "block-size-overridden", f"--block-size {block_size} has no effect: vllm-ascend forces {forced} when prefix caching or chunked prefill is on")]
    return []


VLLM_V0_REMOVED_IN = "0.10"


def check_vllm_use_v1(environment: Mapping[str, str], vllm_version: str) -> list[Finding]:
    """Warn about VLLM_USE_V1 on vLLM versions that no longer have the V0 engine."""
    if "VLLM_USE_V1" in environment and _version_at_least(vllm_version, VLLM_V0_REMOVED_IN):
        return [Finding(WARNING, "vllm-use-v1-obsolete", f"VLLM_USE_V1 does nothing on vLLM {vllm_version}: V0 is gone since {VLLM_V0_REMOVED_IN}; drop it")]
    return []


def format_gib(value: int, digits: int = 1) -> str:
    """Bytes as GiB for operator messages."""
    return f"{value / GIB:.{digits}f} GiB"
