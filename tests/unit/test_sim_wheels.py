"""Stand-in wheels: metadata, contents, determinism, and the device view they share."""

from __future__ import annotations

import importlib.util
import json
import zipfile
from pathlib import Path

import pytest

from ascend_fleet.lab.sim.wheels import OPTIONS_DIR, RUNTIME_FILE, WheelBuildError, build_standin_wheels

PROFILE = {"torch_npu": "2.7.1.post1", "vllm_ascend": "0.11.0", "vllm": "0.11.0"}


def wheel_text(wheel: Path, member: str) -> str:
    return zipfile.ZipFile(wheel).read(member).decode()


@pytest.fixture
def wheels(tmp_path) -> dict[str, Path]:
    return {path.name.split("-")[0]: path for path in build_standin_wheels(PROFILE, tmp_path)}


def test_wheel_names_follow_the_profile(wheels):
    assert sorted(p.name for p in wheels.values()) == [
        "torch_npu-2.7.1.post1-py3-none-any.whl",
        "vllm-0.11.0-py3-none-any.whl",
        "vllm_ascend-0.11.0-py3-none-any.whl",
    ]


def test_builds_are_byte_identical(wheels, tmp_path):
    again = build_standin_wheels(PROFILE, tmp_path / "again")
    assert [p.read_bytes() for p in again] == [wheels[p.name.split("-")[0]].read_bytes() for p in again]


def test_torch_npu_pins_the_torch_it_was_built_for(wheels, tmp_path):
    assert "Requires-Dist: torch==2.7.1" in wheel_text(wheels["torch_npu"], "torch_npu-2.7.1.post1.dist-info/METADATA")
    (pinned,) = build_standin_wheels({"torch_npu": "2.7.1.post1", "torch": "2.7.1+cpu"}, tmp_path / "cpu")
    assert "Requires-Dist: torch==2.7.1+cpu" in wheel_text(pinned, "torch_npu-2.7.1.post1.dist-info/METADATA")


def test_vllm_ascend_registers_the_platform_plugin(wheels):
    assert wheel_text(wheels["vllm_ascend"], "vllm_ascend/_version.py") == '__version__ = "0.11.0"\n'
    entry_points = wheel_text(wheels["vllm_ascend"], "vllm_ascend-0.11.0.dist-info/entry_points.txt")
    assert "[vllm.platform_plugins]\nascend = vllm_ascend:register" in entry_points


def test_vllm_carries_its_release_options_planner_and_console_script(wheels):
    vllm = wheels["vllm"]
    assert json.loads(wheel_text(vllm, "vllm/_sim/options.json")) == json.loads(
        (OPTIONS_DIR / "0.11.0.json").read_text()
    )
    assert "def plan_instance(" in wheel_text(vllm, "vllm/_sim/planner.py")
    assert "vllm = vllm.entrypoints.cli.main:main" in wheel_text(vllm, "vllm-0.11.0.dist-info/entry_points.txt")
    metadata = wheel_text(vllm, "vllm-0.11.0.dist-info/METADATA")
    assert {"Requires-Dist: fastapi", "Requires-Dist: uvicorn", "Requires-Dist: prometheus_client"} <= set(
        metadata.splitlines()
    )


def test_record_lists_every_file(wheels):
    with zipfile.ZipFile(wheels["vllm"]) as wheel:
        recorded = {line.split(",")[0] for line in wheel.read("vllm-0.11.0.dist-info/RECORD").decode().splitlines()}
        assert recorded == set(wheel.namelist())


def test_unknown_vllm_release_is_refused(tmp_path):
    with pytest.raises(WheelBuildError, match="no CLI option data for vLLM 0.1.0"):
        build_standin_wheels({"vllm": "0.1.0"}, tmp_path)


def test_unknown_package_is_refused(tmp_path):
    with pytest.raises(WheelBuildError, match="no stand-in for mindie"):
        build_standin_wheels({"mindie": "1.0"}, tmp_path)


@pytest.fixture
def runtime(tmp_path, monkeypatch):
    """ascend_runtime.py as the wheels ship it, over a fake node root with NPUs 0-3."""
    for npu in range(4):
        (tmp_path / "dev" / f"davinci{npu}").parent.mkdir(exist_ok=True)
        (tmp_path / "dev" / f"davinci{npu}").touch()
    (tmp_path / "dev" / "davinci_manager").touch()
    monkeypatch.setenv("ASCEND_SIM_ROOT", str(tmp_path))
    spec = importlib.util.spec_from_file_location("ascend_runtime", RUNTIME_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_all_present_npus_are_visible_by_default(runtime, monkeypatch):
    monkeypatch.delenv("ASCEND_RT_VISIBLE_DEVICES", raising=False)
    assert runtime.visible_npus() == [0, 1, 2, 3]


def test_visible_devices_narrow_and_order_the_npus(runtime, monkeypatch):
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "3,1,7")
    assert runtime.visible_npus() == [3, 1]


def test_missing_cann_environment_fails_like_torch_npu(runtime, monkeypatch):
    monkeypatch.delenv("ASCEND_TOOLKIT_HOME", raising=False)
    with pytest.raises(ImportError, match="libhccl.so"):
        runtime.check_cann_environment()
