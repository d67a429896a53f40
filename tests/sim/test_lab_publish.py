"""What the lab mirror publishes for a profile: the requirement set, the node's platforms, the caches."""

import json

import pytest
from packaging.requirements import Requirement
from rich.console import Console

from ascend_fleet.config.profile import load_profile
from ascend_fleet.lab import publish
from ascend_fleet.lab.base import node_platforms
from ascend_fleet.lab.sim.wheels import build_lab_standins


@pytest.fixture
def wheelhouse(tmp_path, monkeypatch):
    monkeypatch.setattr(publish, "WHEELHOUSE", tmp_path / "wheelhouse")
    return tmp_path / "wheelhouse"


def test_real_requirements_are_what_each_step_and_the_standins_it_reaches_need_but_not_the_standins(tmp_path):
    profile = load_profile("lab")
    vllm_step, ascend_step = publish.node_requirements(profile, build_lab_standins(tmp_path, "x86_64"), "x86_64")
    # vllm's step reaches opencv-python-headless 5.1.0.95 (>=4.13.0), which takes numpy 2; vllm-ascend's step
    # moves both below (<=4.11.0.86, numpy<2.0.0): one pip download of both would find no numpy.
    numpy_2 = 'numpy>=2; python_version >= "3.9"'
    assert {numpy_2, "transformers<5,>=4.56.0", "fastapi[standard]>=0.115.0", "pip"} <= set(vllm_step)
    assert "numpy<2.0.0" not in vllm_step
    assert {"numpy<2.0.0", "numpy<3", f"transformers=={profile.stack.transformers}"} <= set(ascend_step)
    assert numpy_2 not in ascend_step
    names = {Requirement(r).name.replace("_", "-") for r in vllm_step + ascend_step}
    assert not names & {"vllm", "vllm-ascend", "torch-npu", "torch", "torchvision", "torchaudio", "triton-ascend",
                        "opencv-python-headless"}
    assert "vllm-ascend" not in {Requirement(r).name for step in publish.node_requirements(
        load_profile("lab-previous"), build_lab_standins(tmp_path, "x86_64"), "x86_64") for r in step}


def test_a_pin_no_standin_admits_is_a_real_wheel(tmp_path):
    real = load_profile("lab-real")  # real torch 2.13.0+cpu under the stand-ins of the sim tier
    standins = build_lab_standins(tmp_path, "x86_64")
    assert any("torch==2.13.0" in step for step in publish.node_requirements(real, standins, "x86_64"))


def test_node_platforms_run_from_bookworm_glibc_down_to_manylinux1():
    platforms = node_platforms("x86_64")
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


def test_the_tiny_models_are_built_once_and_published_whole_qwen3_in_two_revisions(tmp_path, monkeypatch):
    monkeypatch.setattr(publish, "MODEL_CACHE", tmp_path / "cache")
    first = publish.publish_tiny_model(tmp_path / "models", Console(quiet=True))
    built = sorted((tmp_path / "cache").iterdir())
    stamps = [(b / "config.json").stat().st_mtime_ns for b in built]
    second = publish.publish_tiny_model(tmp_path / "models", Console(quiet=True))
    tree = tmp_path / "models" / "lab"
    assert first == second == [tree / "Qwen3-Tiny" / "v1", tree / "Qwen3-Tiny" / "v2",
                               tree / "Qwen3.5-Tiny-A1B-W8A8" / "v1", tree / "Qwen3.5-Tiny-397B-Shape-W8A8" / "v1"]
    assert [(b / "config.json").stat().st_mtime_ns for b in built] == stamps
    manifests = [json.loads((revision / "ascend-fleet-manifest.json").read_text()) for revision in first]
    assert [m["revision"] for m in manifests] == ["v1", "v2", "v1", "v1"]
    assert "quant_model_description.json" in manifests[2]["files"] and "quant_model_description.json" in manifests[3]["files"]
    # Same shapes, other weights: a swap to v2 is a real change of the files a node serves.
    shard = "model-00001-of-00002.safetensors"
    assert manifests[0]["files"][shard]["sha256"] != manifests[1]["files"][shard]["sha256"]
