"""The lab's tiny Qwen3 model: deterministic, self-consistent, shaped as vLLM expects."""

import json
import struct
import subprocess
import sys
from pathlib import Path

import jinja2
import pytest
from safetensors import safe_open
from tokenizers import Tokenizer

from ascend_fleet.core.model_tree import publish_model, read_manifest
from ascend_fleet.core.node_layout import MANIFEST_NAME
from ascend_fleet.core.package_index import file_sha256 as sha256_file
from ascend_fleet.lab.sim.tinymodel import (
    INDEX_NAME,
    QWEN_PRETOKENIZE_REGEX,
    TinyDims,
    build_tiny_model,
    build_tiny_qwen35_moe,
)

# What HF Qwen3ForCausalLM (and vLLM's loader for it) expects for each decoder layer.
QWEN3_LAYER_TENSORS = {
    "input_layernorm.weight", "post_attention_layernorm.weight",
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
    "self_attn.o_proj.weight", "self_attn.q_norm.weight", "self_attn.k_norm.weight",
    "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
}
QWEN3_TOP_TENSORS = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny"))


def read_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def safetensors_header(path: Path) -> dict:
    """Parse the header the way the weights stage does: u64 little-endian length, then JSON."""
    with path.open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(length))


def test_same_arguments_give_byte_identical_files(model_dir, tmp_path):
    # A separate process: hash seeds differ per process, so this catches unordered output too.
    again = tmp_path / "again"
    build = f"from ascend_fleet.lab.sim.tinymodel import build_tiny_model; build_tiny_model({str(again)!r})"
    subprocess.run([sys.executable, "-c", build], check=True)
    names = sorted(p.name for p in model_dir.iterdir())
    assert names == sorted(p.name for p in again.iterdir())
    for name in names:
        assert (model_dir / name).read_bytes() == (again / name).read_bytes(), name


def test_another_seed_changes_weights_but_not_tokenizer(model_dir, tmp_path):
    other = build_tiny_model(tmp_path / "seed1", seed=1)
    assert (other / "tokenizer.json").read_bytes() == (model_dir / "tokenizer.json").read_bytes()
    shard = "model-00001-of-00002.safetensors"
    assert (other / shard).read_bytes() != (model_dir / shard).read_bytes()


def test_config_is_a_small_gqa_qwen3_with_a_cpu_head_size(model_dir):
    config = read_json(model_dir / "config.json")
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    assert config["model_type"] == "qwen3"
    assert config["architectures"] == ["Qwen3ForCausalLM"]
    assert config["head_dim"] == 64
    assert config["num_key_value_heads"] < config["num_attention_heads"]
    assert config["vocab_size"] == tokenizer.get_vocab_size(with_added_tokens=True)


def test_index_names_every_shard_and_every_tensor(model_dir):
    index = read_json(model_dir / INDEX_NAME)
    config = read_json(model_dir / "config.json")
    weight_map = index["weight_map"]
    shards = sorted(p.name for p in model_dir.glob("*.safetensors"))
    assert shards == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    assert sorted(set(weight_map.values())) == shards

    expected = QWEN3_TOP_TENSORS | {
        f"model.layers.{i}.{suffix}"
        for i in range(config["num_hidden_layers"])
        for suffix in QWEN3_LAYER_TENSORS
    }
    assert set(weight_map) == expected
    for shard in shards:
        with safe_open(model_dir / shard, framework="numpy") as f:
            assert set(f.keys()) == {name for name, s in weight_map.items() if s == shard}


def test_headers_parse_and_match_config_shapes(model_dir):
    config = read_json(model_dir / "config.json")
    index = read_json(model_dir / INDEX_NAME)
    tensors = {}
    for shard in sorted(model_dir.glob("*.safetensors")):
        header = safetensors_header(shard)
        assert header.pop("__metadata__") == {"format": "pt"}
        tensors.update(header)
    assert {t["dtype"] for t in tensors.values()} == {"F16"}
    assert tensors["model.embed_tokens.weight"]["shape"] == [config["vocab_size"], config["hidden_size"]]
    q_dim = config["num_attention_heads"] * config["head_dim"]
    kv_dim = config["num_key_value_heads"] * config["head_dim"]
    assert tensors["model.layers.0.self_attn.q_proj.weight"]["shape"] == [q_dim, config["hidden_size"]]
    assert tensors["model.layers.0.self_attn.k_proj.weight"]["shape"] == [kv_dim, config["hidden_size"]]
    assert tensors["model.layers.0.self_attn.k_norm.weight"]["shape"] == [config["head_dim"]]
    data_bytes = sum(end - start for start, end in (t["data_offsets"] for t in tensors.values()))
    assert index["metadata"]["total_size"] == data_bytes


def test_manifest_lists_every_file_with_its_size_and_sha256(model_dir):
    manifest = read_manifest(model_dir)
    assert (manifest["model_id"], manifest["revision"]) == ("lab/Qwen3-Tiny", "v1")
    on_disk = {p.name for p in model_dir.iterdir()} - {MANIFEST_NAME}
    assert set(manifest["files"]) == on_disk
    for name, entry in manifest["files"].items():
        assert entry["size"] == (model_dir / name).stat().st_size
        assert entry["sha256"] == sha256_file(model_dir / name)


def test_tokenizer_round_trips_text_and_keeps_special_tokens_whole(model_dir):
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    for text in ["Serve Qwen on 910B.", "  leading spaces\nand lines", "你好，世界 ✓ émoji 🚀", "x=1;\ty=2"]:
        assert tokenizer.decode(tokenizer.encode(text).ids) == text
    config = read_json(model_dir / "tokenizer_config.json")
    for special in ("<|im_start|>", "<|im_end|>", config["pad_token"]):
        assert tokenizer.encode(special).ids == [tokenizer.token_to_id(special)]


def test_chat_template_renders_qwen_format(model_dir):
    config = read_json(model_dir / "tokenizer_config.json")
    template = jinja2.Environment().from_string(config["chat_template"])
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    rendered = template.render(messages=messages, add_generation_prompt=True)
    assert rendered == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert config["eos_token"] == "<|im_end|>"
    generation = read_json(model_dir / "generation_config.json")
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    assert tokenizer.token_to_id("<|im_end|>") in generation["eos_token_id"]


def test_probe_ids_in_manifest_match_the_tokenizer(model_dir):
    probe = read_manifest(model_dir)["tokenizer_probe"]
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    assert tokenizer.encode(probe["text"]).ids == probe["ids"]
    assert len(probe["ids"]) > 5


def test_size_mb_pads_with_layers_and_shards(tmp_path):
    padded = build_tiny_model(tmp_path / "padded", size_mb=12, max_shard_mb=4)
    config = read_json(padded / "config.json")
    index = read_json(padded / INDEX_NAME)
    shards = sorted(padded.glob("*.safetensors"))
    assert index["metadata"]["total_size"] >= 12 * 1024 * 1024
    assert config["num_hidden_layers"] > TinyDims().num_hidden_layers
    assert len(shards) >= 3
    assert shards[-1].name == f"model-{len(shards):05d}-of-{len(shards):05d}.safetensors"


def test_head_dim_outside_cpu_backend_sizes_is_refused(tmp_path):
    with pytest.raises(ValueError, match="head_dim 48"):
        build_tiny_model(tmp_path, dims=TinyDims(head_dim=48))


def test_publish_lays_out_org_name_revision_and_replaces_whole(model_dir, tmp_path):
    mirror_models = tmp_path / "models"
    target = publish_model(model_dir, mirror_models)
    assert target == mirror_models / "lab" / "Qwen3-Tiny" / "v1"
    assert sorted(p.name for p in target.iterdir()) == sorted(p.name for p in model_dir.iterdir())
    (target / "stale-file").write_text("left from an older copy")
    assert publish_model(model_dir, mirror_models) == target
    assert not (target / "stale-file").exists()
    assert [p.name for p in target.parent.iterdir()] == ["v1"]


def test_tokenizer_uses_qwens_pretokenizer_so_any_qwen2_tokenizer_agrees(model_dir):
    # transformers' Qwen2Tokenizer rebuilds Qwen's pipeline itself; ours must be the same one.
    pre = read_json(model_dir / "tokenizer.json")["pre_tokenizer"]
    assert [p["type"] for p in pre["pretokenizers"]] == ["Split", "ByteLevel"]
    assert pre["pretokenizers"][0]["pattern"]["Regex"] == QWEN_PRETOKENIZE_REGEX
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    assert len(tokenizer.encode("2026").ids) == 4  # Qwen splits digits one by one


def test_rebuild_into_a_used_directory_leaves_stale_shards_out_of_manifest_and_mirror(tmp_path):
    build_tiny_model(tmp_path / "model", num_shards=3)
    rebuilt = build_tiny_model(tmp_path / "model", num_shards=2)
    assert "model-00001-of-00003.safetensors" not in read_manifest(rebuilt)["files"]
    published = publish_model(rebuilt, tmp_path / "models")
    assert sorted(p.name for p in published.glob("*.safetensors")) == [
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
    ]


def test_the_tiny_qwen35_is_hybrid_moe_with_an_mtp_layer_in_msmodelslim_w8a8_form(tmp_path):
    """What the planner and vllm-ascend read of it: three delta-net layers to one full-attention layer,
    routed and shared experts, one MTP layer; int8 matrices each with scale and offset, as the
    description says, and the rest float."""
    from ascend_fleet.sizing.planner import MODELSLIM_DESCRIPTION, ModelShape, modelslim_scheme

    model = build_tiny_qwen35_moe(tmp_path)
    config = read_json(model / "config.json")
    shape = ModelShape.from_config(config)
    assert (config["model_type"], shape.full_attention_layers, shape.linear_attention_layers) == ("qwen3_5_moe", 1, 3)
    assert (shape.moe.num_experts, shape.mtp_layers) == (8, 1)
    description = read_json(model / MODELSLIM_DESCRIPTION)
    assert modelslim_scheme(description) == "w8a8"
    tensors = {}
    for shard in sorted(model.glob("*.safetensors")):
        with safe_open(shard, framework="numpy") as handle:
            tensors |= {name: handle.get_tensor(name) for name in handle.keys()}
    assert set(read_json(model / INDEX_NAME)["weight_map"]) == set(tensors)
    quantized = [name for name, method in description.items() if method == "W8A8_DYNAMIC" and name != "model_quant_type"]
    assert "mtp.layers.0.mlp.experts.7.down_proj.weight" in quantized
    assert "model.language_model.layers.0.linear_attn.in_proj_qkv.weight" in quantized
    for name in quantized:
        base = name.removesuffix(".weight")
        assert tensors[name].dtype.name == "int8" and tensors[base + ".weight_scale"].shape == (tensors[name].shape[0], 1)
        assert base + ".weight_offset" in tensors
    floats = [name for name, method in description.items() if method == "FLOAT"]
    assert "lm_head.weight" in floats and all(tensors[name].dtype.name == "float16" for name in floats)
