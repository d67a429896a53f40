"""What the lab mirror publishes for a profile: the requirement set, the node's platforms, the caches."""

import json

import pytest
from rich.console import Console

from ascend_fleet.lab import publish
from ascend_fleet.lab.sim.wheels import build_standin_wheels
from ascend_fleet.profile import load_profile


@pytest.fixture
def wheelhouse(tmp_path, monkeypatch):
    monkeypatch.setattr(publish, "WHEELHOUSE", tmp_path / "wheelhouse")
    return tmp_path / "wheelhouse"


def test_real_requirements_are_the_pins_and_the_standins_dependencies_but_not_the_standins(tmp_path):
    profile = load_profile("lab")
    s = profile.stack
    standins = build_standin_wheels({"torch": s.torch, "torch_npu": s.torch_npu, "vllm_ascend": s.vllm_ascend,
                                     "vllm": s.vllm}, tmp_path)
    requirements = publish.node_requirements(profile, standins)
    assert f"torch=={s.torch}" in requirements and f"transformers=={s.transformers}" in requirements
    assert {"fastapi", "uvicorn", "tokenizers", "pip", "setuptools", "wheel", "numpy<3"} <= set(requirements)
    assert not [r for r in requirements if r.split("=")[0] in ("vllm", "vllm-ascend", "torch-npu", "torch_npu")]


def test_node_platforms_run_from_bookworm_glibc_down_to_manylinux1():
    platforms = publish.node_platforms("x86_64")
    assert platforms[0] == "manylinux_2_36_x86_64" and "manylinux_2_28_x86_64" in platforms
    assert platforms[-3:] == ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]


def test_a_resolved_set_in_the_wheelhouse_is_not_downloaded_again(wheelhouse, monkeypatch):
    downloads = []

    def download(requirements, python, arch):
        downloads.append(requirements)
        for name in ("a-1-py3-none-any.whl", "b-2-py3-none-any.whl"):
            (wheelhouse / name).write_bytes(b"wheel")
        return ["a-1-py3-none-any.whl", "b-2-py3-none-any.whl"]

    monkeypatch.setattr(publish, "download_wheels", download)
    wheelhouse.mkdir()
    first = publish.cached_wheels(["a", "b"], "3.11", "x86_64", "test", Console(quiet=True))
    second = publish.cached_wheels(["a", "b"], "3.11", "x86_64", "test", Console(quiet=True))
    assert first == second == [wheelhouse / "a-1-py3-none-any.whl", wheelhouse / "b-2-py3-none-any.whl"]
    assert len(downloads) == 1
    (wheelhouse / "b-2-py3-none-any.whl").unlink()  # a cache someone pruned is filled again
    publish.cached_wheels(["a", "b"], "3.11", "x86_64", "test", Console(quiet=True))
    assert len(downloads) == 2


def test_the_tiny_model_is_built_once_and_published_whole_in_two_revisions(tmp_path, monkeypatch):
    monkeypatch.setattr(publish, "MODEL_CACHE", tmp_path / "cache")
    first = publish.publish_tiny_model(tmp_path / "models", Console(quiet=True))
    built = sorted((tmp_path / "cache").iterdir())
    stamps = [(b / "config.json").stat().st_mtime_ns for b in built]
    second = publish.publish_tiny_model(tmp_path / "models", Console(quiet=True))
    tree = tmp_path / "models" / "lab" / "Qwen3-Tiny"
    assert first == second == [tree / "v1", tree / "v2"]
    assert [(b / "config.json").stat().st_mtime_ns for b in built] == stamps
    manifests = [json.loads((revision / "ascend-fleet-manifest.json").read_text()) for revision in first]
    assert [m["revision"] for m in manifests] == ["v1", "v2"]
    # Same shapes, other weights: a swap to v2 is a real change of the files a node serves.
    shard = "model-00001-of-00002.safetensors"
    assert manifests[0]["files"][shard]["sha256"] != manifests[1]["files"][shard]["sha256"]
