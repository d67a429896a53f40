"""Open a --model directory the way vLLM's loader would: config, weight shards, tokenizer."""

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from safetensors import SafetensorError, safe_open

from vllm._sim.errors import StartupError

INDEX_NAME = "model.safetensors.index.json"
SINGLE_SHARD_NAME = "model.safetensors"


@dataclass(frozen=True)
class ModelDir:
    """A model directory that passed the loader's checks."""

    path: Path
    config: dict
    shards: list[Path]
    weight_bytes: int
    tokenizer_config: dict
    weights_digest: bytes  # of every tensor as read at start: what the simulated model generates from


def _read_json(path: Path, what: str) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise StartupError(f"{what} not found: {path}") from None
    except json.JSONDecodeError as err:
        raise StartupError(f"{what} is not valid JSON: {path}: {err}") from None


def _shard_names(path: Path) -> dict[str, list[str]]:
    """Shard file name -> tensor names, from the index or the single-file layout."""
    index = path / INDEX_NAME
    if index.exists():
        shards: dict[str, list[str]] = {}
        for tensor, shard in _read_json(index, "weight index").get("weight_map", {}).items():
            shards.setdefault(shard, []).append(tensor)
        return shards
    if (path / SINGLE_SHARD_NAME).exists():
        return {SINGLE_SHARD_NAME: []}
    raise StartupError(f"Cannot find any model weights with `{path}`: no {INDEX_NAME} or {SINGLE_SHARD_NAME}")


def _check_shard(shard: Path, tensors: list[str]) -> None:
    """Parse the shard's safetensors header and check it holds the tensors the index names."""
    if not shard.exists():
        raise StartupError(f"weight shard {shard.name} named in {INDEX_NAME} is missing: {shard}")
    try:
        with safe_open(shard, framework="numpy") as handle:
            present = set(handle.keys())
    except SafetensorError as err:
        raise StartupError(f"corrupt safetensors file {shard}: {err}") from None
    missing = [t for t in tensors if t not in present]
    if missing:
        raise StartupError(f"{shard.name} lacks {len(missing)} tensor(s) the index puts there, e.g. {missing[0]}")


def read_weights(shards: list[Path]) -> bytes:
    """Read every tensor of every shard (its headers passed _check_shard), as vLLM's
    safetensors_weights_iterator does at start (vllm/model_executor/model_loader/weight_utils.py:
    safe_open, then get_tensor for each name), and
    return a digest of what was read. The model generates from this, so bytes that change on disk
    after the start are not seen until a restart, as in vLLM."""
    digest = hashlib.sha256()
    for shard in shards:  # each tensor's bytes as the header places them (any dtype, bf16 too)
        with shard.open("rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
            data = f.read()
        for name, info in sorted(header.items()):
            if name != "__metadata__":
                begin, end = info["data_offsets"]
                digest.update(name.encode() + data[begin:end])
    return digest.digest()


def open_model_dir(path: Path) -> ModelDir:
    """Check the directory like vLLM's loader does and return what the server needs from it."""
    if not path.is_dir():
        raise StartupError(f"--model {path} is not a local directory (the lab serves staged weights only)")
    config = _read_json(path / "config.json", "config.json")
    shard_tensors = _shard_names(path)
    shards = [path / name for name in sorted(shard_tensors)]
    for shard in shards:
        _check_shard(shard, shard_tensors[shard.name])
    tokenizer_config_path = path / "tokenizer_config.json"
    tokenizer_config = (
        _read_json(tokenizer_config_path, "tokenizer_config.json") if tokenizer_config_path.exists() else {}
    )
    return ModelDir(
        path=path,
        config=config,
        shards=shards,
        weight_bytes=sum(s.stat().st_size for s in shards),
        tokenizer_config=tokenizer_config,
        weights_digest=read_weights(shards),
    )
