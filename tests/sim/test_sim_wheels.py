"""Stand-in wheels: held to the real wheels' recorded metadata, pip meeting the real pins, determinism,
the profile-built stand-ins, the record's refresh, and the device view they share."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import zipfile
from email.message import Message
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

from ascend_fleet.core.errors import FleetError
from ascend_fleet.fleet.profile_check import Platform, pip_environment
from ascend_fleet.fleet.profile_lock import Dist, pip_check
from ascend_fleet.lab.base import node_platforms
from ascend_fleet.lab.sim import real_metadata
from ascend_fleet.lab.sim.real_metadata import PYPI_INDEX, PYTORCH_CPU_INDEX, find, load_record, standin_basis
from ascend_fleet.lab.sim.wheels import (
    LEFT_OUT_CUDA,
    OPTIONS_DIR,
    RUNTIME_FILE,
    SIM_SERVER_IMPORTS,
    Standin,
    WheelBuildError,
    build_lab_standins,
    build_standin_wheels,
    left_out,
    write_wheel,
)
from ascend_fleet.stages.python_stack import TORCH_NPU_PROBE

PROFILE = {"torch_npu": "2.7.1.post1", "vllm_ascend": "0.11.0", "vllm": "0.11.0"}
# The packages whose real requirements every stand-in must carry verbatim (issue 12); opencv-python-headless
# for the pins vllm and vllm-ascend 0.18.0 put on it, which no one version meets.
STACK = {canonicalize_name(n) for n in ("torch", "torchvision", "torchaudio", "torch-npu", "triton-ascend",
                                        "transformers", "numpy", "vllm", "vllm-ascend", "opencv-python-headless")}
RECORD = load_record()


def wheel_text(wheel: Path, member: str) -> str:
    return zipfile.ZipFile(wheel).read(member).decode()


def dist_info_file(wheel: Path, name: str) -> Message:
    """A .dist-info file of the wheel (METADATA, WHEEL), parsed as the email headers it is."""
    with zipfile.ZipFile(wheel) as archive:
        member = next(n for n in archive.namelist() if n.endswith(f".dist-info/{name}"))
        return Parser().parsestr(archive.read(member).decode())


def requirement_name(line: str) -> str:
    return canonicalize_name(Requirement(line).name)


@pytest.fixture(scope="module", params=["x86_64", "aarch64"])
def lab_standins(request, tmp_path_factory) -> tuple[str, list[Path]]:
    arch = request.param
    return arch, build_lab_standins(tmp_path_factory.mktemp(f"standins-{arch}"), arch)


# --- The lab's stand-ins against the real wheels' record ---


def test_every_lab_standin_carries_its_real_wheels_name_tags_and_stack_requirements(lab_standins):
    arch, wheels = lab_standins
    recorded = [standin_basis(RECORD, wheel) for wheel in RECORD if wheel.arch == arch]
    assert sorted(w.name for w in wheels) == sorted(basis.file for basis in recorded)
    by_file = {w.name: w for w in wheels}
    for basis in recorded:
        wheel = by_file[basis.file]
        metadata = dist_info_file(wheel, "METADATA")
        assert (metadata["Name"], metadata["Version"]) == (basis.name, basis.version)
        assert metadata["Requires-Python"] == basis.requires_python, basis.file
        declared = metadata.get_all("Requires-Dist") or []
        stack = [line for line in basis.requires_dist if requirement_name(line) in STACK]
        assert [line for line in declared if requirement_name(line) in STACK] == stack, basis.file
        own = [line for line in declared if line not in basis.requires_dist]
        assert {requirement_name(line) for line in own} <= {canonicalize_name(n) for n in SIM_SERVER_IMPORTS}
        tags = dist_info_file(wheel, "WHEEL")
        assert set(tags.get_all("Tag")) == {str(t) for t in parse_wheel_filename(basis.file)[3]}
        assert tags["Root-Is-Purelib"] == "false"


def test_the_vllm_standins_pin_the_cuda_era_torch_and_vllm_ascend_its_own():
    """The pins behind upstream's two-step install, as the record has them from PyPI."""
    def requires(name: str, version: str) -> list[str]:
        return list(find(RECORD, name, version, "x86_64").requires_dist)

    assert {"torch==2.10.0", "torchvision==0.25.0", "torchaudio==2.10.0"} <= set(requires("vllm", "0.18.0"))
    assert {"torch==2.9.0", "torchvision==0.24.0", "torchaudio==2.9.0", "torch-npu==2.9.0",
            "triton-ascend==3.2.0"} <= set(requires("vllm-ascend", "0.18.0"))
    assert {"torch==2.8.0", "torchvision==0.23.0", "torchaudio==2.8.0"} <= set(requires("vllm", "0.11.0"))
    assert {"torch==2.7.1", "torch-npu==2.7.1"} <= set(requires("vllm-ascend", "0.11.0"))
    assert requires("torch-npu", "2.9.0") == ["torch==2.9.0+cpu"]  # aarch64's is plain torch==2.9.0
    assert find(RECORD, "torch-npu", "2.9.0", "aarch64").requires_dist == ("torch==2.9.0",)


def test_a_cpu_torch_whose_metadata_is_unknown_copies_pypis_same_version_without_cuda(tmp_path):
    cpu = find(RECORD, "torch", "2.9.0+cpu", "x86_64")
    assert cpu.requires_dist is None and cpu.sha256 is None and cpu.index == PYTORCH_CPU_INDEX
    assert cpu.unknown and "CUDA" in cpu.standin_basis
    pypi = find(RECORD, "torch", "2.9.0", "x86_64")
    (wheel,) = [w for w in build_lab_standins(tmp_path, "x86_64") if w.name.startswith("torch-2.9.0+cpu-")]
    assert wheel.name == pypi.file.replace("-2.9.0-", "-2.9.0+cpu-")
    declared = dist_info_file(wheel, "METADATA").get_all("Requires-Dist")
    assert declared and set(declared) <= set(pypi.requires_dist)
    assert not [line for line in declared if line.startswith(("nvidia-", "triton"))]


def test_what_a_standin_leaves_out_is_never_the_stack_and_cuda_builds_are_named_so():
    vllm = find(RECORD, "vllm", "0.18.0", "x86_64")
    omitted = left_out(vllm)
    assert not [line for line in omitted if requirement_name(line) in STACK]
    assert omitted["flashinfer-python==0.6.6"] == LEFT_OUT_CUDA
    assert "blake3" in omitted and omitted["blake3"] != LEFT_OUT_CUDA
    torch = find(RECORD, "torch", "2.9.0", "x86_64")
    assert {line for line, why in left_out(torch).items() if why == LEFT_OUT_CUDA} == {
        line for line in torch.requires_dist if line.startswith("nvidia-")}
    # CUDA triton stays: it shares site-packages/triton/ with triton-ascend, which the uninstalls must meet.
    assert 'triton==3.5.0; platform_system == "Linux" and platform_machine == "x86_64"' not in left_out(torch)


def test_a_pin_off_pypi_copies_pypis_newest_release_of_its_minor_series_and_vllm_keeps_the_instrumentator():
    """triton-ascend 3.2.2 (vllm-ascend 0.23.0's pin) is on Huawei's index alone, which does not answer here;
    vllm's instrumentator requirement stays, whose 8.x needs the starlette>=1.0 vllm-ascend 0.23.0 moves."""
    for arch in ("x86_64", "aarch64"):
        pin, pypi = find(RECORD, "triton-ascend", "3.2.2", arch), find(RECORD, "triton-ascend", "3.2.0", arch)
        basis = standin_basis(RECORD, pin)
        assert pin.unknown and (basis.version, basis.requires_dist) == ("3.2.2", pypi.requires_dist)
        assert basis.file == pypi.file.replace("-3.2.0-", "-3.2.2-")
    vllm = find(RECORD, "vllm", "0.23.0", "x86_64")
    assert "prometheus-fastapi-instrumentator>=7.0.0" in vllm.requires_dist
    assert "prometheus-fastapi-instrumentator>=7.0.0" not in left_out(vllm)
    assert "fastapi<0.124.0" in find(RECORD, "vllm-ascend", "0.23.0", "x86_64").requires_dist


def test_lab_standins_are_byte_identical_across_builds(lab_standins, tmp_path):
    arch, wheels = lab_standins
    assert [w.read_bytes() for w in build_lab_standins(tmp_path, arch)] == [w.read_bytes() for w in wheels]


def test_an_unknown_arch_is_refused(tmp_path):
    with pytest.raises(WheelBuildError, match="no stand-ins for arch ppc64le"):
        build_lab_standins(tmp_path, "ppc64le")


# --- pip and the stand-ins: the real conflict and the real tag checks ---


def placeholder_wheels(standins: list[Path], out_dir: Path) -> None:
    """An empty wheel for every package the stand-ins require but do not provide, at every version their
    specifiers name (and 0): pip then resolves the stack's pins alone, offline, and picks among these."""
    provided = {parse_wheel_filename(w.name)[0] for w in standins}
    versions: dict[str, set[str]] = {}
    for wheel in standins:
        for line in dist_info_file(wheel, "METADATA").get_all("Requires-Dist") or []:
            requirement = Requirement(line)
            if canonicalize_name(requirement.name) not in provided:  # no wheel is named by a prefix (!=5.1.*)
                versions.setdefault(canonicalize_name(requirement.name), {"0"}).update(
                    s.version for s in requirement.specifier if not s.version.endswith(".*"))
    for name, named in versions.items():
        for version in named:
            write_wheel(Standin(name.replace("-", "_"), version, "placeholder"), out_dir)


@pytest.fixture(scope="module")
def find_links(tmp_path_factory) -> Path:
    """The x86_64 stand-ins with placeholders for the rest, as a find-links directory."""
    directory = tmp_path_factory.mktemp("find-links")
    placeholder_wheels(build_lab_standins(directory, "x86_64"), directory)
    return directory


def pip_dry_run(find_links: Path, tmp_path: Path, *requirements: str, python: str = "3.11",
                platforms: list[str] | None = None, no_deps: bool = False) -> tuple[subprocess.CompletedProcess, dict]:
    """pip resolving requirements from find_links alone for a node (Debian bookworm x86_64 by default);
    its output and what it would install (name -> version)."""
    report = tmp_path / "report.json"
    report.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "pip", "--isolated", "--disable-pip-version-check", "install", "--dry-run",
            "--ignore-installed", "--no-index", "--find-links", str(find_links), "--target", str(tmp_path / "t"),
            "--report", str(report), "--only-binary=:all:",
            *(f"--platform={tag}" for tag in platforms or node_platforms("x86_64")),
            "--python-version", python, "--implementation", "cp", "--abi", f"cp{python.replace('.', '')}",
            *(["--no-deps"] if no_deps else []), *requirements]
    result = subprocess.run(argv, capture_output=True, text=True, env=pip_environment(dict(os.environ)))
    installs = json.loads(report.read_text())["install"] if report.exists() else []
    return result, {canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"] for i in installs}


ROWS = {  # vllm-ascend release: (torch, torch-npu, what step 1 installs, what step 2 moves torchvision to)
    "0.18.0": ("2.9.0", "2.9.0", {"torch": "2.10.0", "torchvision": "0.25.0", "torchaudio": "2.10.0"}, "0.24.0"),
    "0.11.0": ("2.7.1", "2.7.1", {"torch": "2.8.0", "torchvision": "0.23.0", "torchaudio": "2.8.0"}, "0.22.1"),
    "0.23.0": ("2.10.0", "2.10.0.post4", {"torch": "2.11.0", "torchvision": "0.26.0", "torchaudio": "2.11.0"}, "0.25.0"),
}


@pytest.mark.parametrize("release", ROWS)
def test_vllm_and_vllm_ascend_in_one_go_conflict_on_torch_as_on_a_real_node(find_links, tmp_path, release):
    torch, torch_npu, step1, _ = ROWS[release]
    result, _ = pip_dry_run(find_links, tmp_path, f"vllm=={release}", f"vllm-ascend=={release}",
                            f"torch=={torch}", f"torch-npu=={torch_npu}")
    assert result.returncode == 1 and "ResolutionImpossible" in result.stderr
    assert f"vllm {release} depends on torch=={step1['torch']}" in result.stdout
    result, _ = pip_dry_run(find_links, tmp_path, f"vllm=={release}", f"vllm-ascend=={release}")
    assert result.returncode == 1
    assert f"vllm {release} depends on torch=={step1['torch']}" in result.stdout
    assert f"vllm-ascend {release} depends on torch=={torch}" in result.stdout


@pytest.mark.parametrize("release", ROWS)
def test_upstreams_two_steps_each_resolve_and_the_second_moves_torch(find_links, tmp_path, release):
    torch, torch_npu, step1, torchvision = ROWS[release]
    result, first = pip_dry_run(find_links, tmp_path, f"vllm=={release}")
    assert result.returncode == 0, result.stderr
    # x86_64's mirror, like PyPI plus the PyTorch CPU index, has torch's +cpu build of the same release.
    assert {name: first[name].split("+")[0] for name in step1} == step1
    result, second = pip_dry_run(find_links, tmp_path, f"vllm-ascend=={release}", f"torch=={torch}",
                                 f"torch-npu=={torch_npu}")
    assert result.returncode == 0, result.stderr
    assert (second["torch"], second["torch-npu"]) == (f"{torch}+cpu", torch_npu)  # torch_npu x86_64 pins +cpu
    assert second["torchvision"] == torchvision  # the torchvision whose torch pin accepts vllm-ascend's torch
    # vllm-ascend 0.11.0 requires no torchaudio, so step 2 leaves vllm's; 0.18.0 pins its own.
    assert second.get("torchaudio") == {"0.11.0": None, "0.18.0": "2.9.0", "0.23.0": "2.10.0"}[release]


def test_pip_refuses_a_standin_for_another_python_or_an_older_glibc_as_the_real_wheel(find_links, tmp_path):
    result, _ = pip_dry_run(find_links, tmp_path, "vllm-ascend==0.18.0", python="3.12", no_deps=True)
    assert result.returncode == 1 and "No matching distribution found for vllm-ascend==0.18.0" in result.stderr
    # torch_npu's real wheel is manylinux_2_28: a node with glibc 2.27 gets nothing.
    older = [tag for tag in node_platforms("x86_64")
             if not tag.startswith("manylinux_2_") or int(tag.split("_")[2]) <= 27]
    result, _ = pip_dry_run(find_links, tmp_path, "torch-npu==2.9.0", platforms=older, no_deps=True)
    assert result.returncode == 1 and "No matching distribution found for torch-npu==2.9.0" in result.stderr
    result, installs = pip_dry_run(find_links, tmp_path, "torch-npu==2.9.0", no_deps=True)
    assert result.returncode == 0 and installs == {"torch-npu": "2.9.0"}


def test_torch_npu_registers_torch_npu_over_the_torch_standin(lab_standins, tmp_path):
    """The Python stack stage's probe, run against the stand-ins a lab node installs."""
    arch, wheels = lab_standins
    torch = "2.9.0+cpu" if arch == "x86_64" else "2.9.0"  # what torch_npu 2.9.0 pins there
    site = tmp_path / "site"
    for wheel in wheels:
        if wheel.name.startswith((f"torch-{torch}-", "torch_npu-2.9.0-")):
            zipfile.ZipFile(wheel).extractall(site)
    for npu in range(2):
        (tmp_path / "dev").mkdir(exist_ok=True)
        (tmp_path / "dev" / f"davinci{npu}").touch()
    env = {**os.environ, "PYTHONPATH": str(site), "ASCEND_SIM_ROOT": str(tmp_path), "ASCEND_TOOLKIT_HOME": str(site)}
    env.pop("ASCEND_RT_VISIBLE_DEVICES", None)
    probe = subprocess.run([sys.executable, "-c", f"{TORCH_NPU_PROBE}; print(torch.__version__)"],
                           capture_output=True, text=True, env=env, cwd=tmp_path)
    assert probe.stdout.split() == ["True", "2", torch], probe.stderr


# --- The record's refresh ---


def fake_pip(calls: list[tuple[list[str], dict]]):
    """subprocess.run standing in for pip: PyPI has every wheel (requiring torch==<v>+cpu for torch-npu, and
    CUDA triton 3.6.0 on x86_64 for torch), the PyTorch CPU index, vllm-ascend's object storage and Huawei's
    index do not answer."""
    def run(argv, capture_output, text, env):
        calls.append((argv, env))
        index, requirement = argv[argv.index("--index-url") + 1], argv[-1]
        if index != PYPI_INDEX or "://" in requirement:
            stderr = ("WARNING: Retrying (Retry(total=0)) after connection broken by 'NewConnectionError('<x>: "
                      "Failed to establish a new connection: [Errno -2] Name or service not known')': /whl/cpu/torch/\n"
                      f"ERROR: No matching distribution found for {requirement}\n")
            return subprocess.CompletedProcess(argv, 1, "", stderr)
        name, version = requirement.split("==")
        arch = "x86_64" if "--platform=manylinux2014_x86_64" in argv else "aarch64"
        requires = [f"torch=={version}+cpu"] if name == "torch-npu" else ["filelock", "nvidia-nccl-cu12==2.27.5"]
        requires += ['triton==3.6.0; platform_machine == "x86_64"'] if name == "torch" else []
        report = {"install": [{"metadata": {"name": name, "version": version, "requires_dist": requires},
                               "download_info": {"url": f"https://files/{name}-{version}-cp311-cp311-{arch}.whl",
                                                 "archive_info": {"hashes": {"sha256": "ab" * 32}}}}]}
        Path(argv[argv.index("--report") + 1]).write_text(json.dumps(report))
        return subprocess.CompletedProcess(argv, 0, "", "")
    return run


def test_refresh_reads_every_wheel_with_pip_alone_and_records_an_unanswered_cpu_index(tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setattr(real_metadata.subprocess, "run", fake_pip(calls))
    monkeypatch.setenv("PIP_FIND_LINKS", "/opt/wheels")
    path = tmp_path / "record.json"
    real_metadata.refresh_record(path=path, progress=lambda line: None)
    record = load_record(path)
    wanted = {(canonicalize_name(n), v) for n, versions in real_metadata.REAL_WHEELS.items() for v in versions}
    assert {(canonicalize_name(w.name), w.version) for w in record if not w.unknown} == wanted | {("triton", "3.6.0")}
    assert {w.arch for w in record if w.name == "triton"} == {"x86_64"}  # torch requires it there only
    off_pypi = [w for w in record if real_metadata.OFF_PYPI.get(w.name, (None,))[0] == w.version]
    builds = [w for w in record if w.unknown and "+cpu" not in w.version and w not in off_pypi]
    assert sorted(w.file for w in builds) == sorted(file for _, file, _ in real_metadata.upstream_builds(
        real_metadata.UPSTREAM_PROFILE)) and all("the pin it is installed over" in w.standin_basis for w in builds)
    # triton-ascend 3.2.2, from the index vllm-ascend-0.23.0's `sources` names, which does not answer.
    assert {(w.name, w.version, w.arch, w.index) for w in off_pypi} == {
        ("triton-ascend", "3.2.2", arch, "https://mirrors.huaweicloud.com/ascend/repos/pypi")
        for arch in ("x86_64", "aarch64")}
    assert all(w.unknown and w.requires_dist is None and "minor series below it" in w.standin_basis
               for w in off_pypi)
    cpu = [w for w in record if w.unknown and "+cpu" in w.version]
    assert {(w.version, w.arch) for w in cpu} == {(f"{v}+cpu", a) for v in real_metadata.REAL_WHEELS["torch-npu"]
                                                 for a in ("x86_64", "aarch64")}
    assert "the index did not answer (NewConnectionError: [Errno -2] Name or service not known)" in cpu[0].unknown
    assert all(env["PIP_CONFIG_FILE"] == os.devnull and "PIP_FIND_LINKS" not in env for _, env in calls)
    assert all("--use-feature=fast-deps" in argv and "--isolated" in argv for argv, _ in calls)


def test_refresh_stops_on_a_wheel_the_index_lacks_and_keeps_the_record(tmp_path, monkeypatch):
    def missing(argv, capture_output, text, env):
        return subprocess.CompletedProcess(argv, 1, "", f"ERROR: No matching distribution found for {argv[-1]}\n")

    monkeypatch.setattr(real_metadata.subprocess, "run", missing)
    path = tmp_path / "record.json"
    path.write_text("kept")
    with pytest.raises(FleetError, match=r"pip could not read \S+==\S+ for \w+ from https://pypi.org/simple"):
        real_metadata.refresh_record(PYPI_INDEX, path=path, progress=lambda line: None)
    assert path.read_text() == "kept"


def test_a_damaged_record_is_one_line_saying_how_to_refresh_it(tmp_path):
    (tmp_path / "record.json").write_text("{}")
    with pytest.raises(FleetError, match="run `ascend-fleet lab refresh-metadata`"):
        load_record(tmp_path / "record.json")


# --- Stand-ins built from a profile's versions (profiles/lab-real.yaml's, which have no real wheel) ---


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


def test_a_cann_home_that_is_gone_is_named_in_the_labs_hint(runtime, monkeypatch, tmp_path):
    gone = str(tmp_path / "cann")
    monkeypatch.setenv("ASCEND_TOOLKIT_HOME", gone)
    hint = rf"\(.*ASCEND_TOOLKIT_HOME={re.escape(gone)} is not a directory"
    with pytest.raises(ImportError, match=rf"^libhccl\.so: .* No such file or directory {hint}"):
        runtime.check_cann_environment()


# --- The lab profile's steps with real pip: CUDA triton and triton-ascend share site-packages/triton/ ---


def simple_index(wheels: Path, requirements: list[str]) -> str:
    """A PEP 503 index of the wheels in a directory, with an empty wheel for every requirement no wheel provides."""
    have = [parse_wheel_filename(w.name)[:2] for w in wheels.glob("*.whl")]
    for line in requirements:
        requirement = Requirement(line)
        if not any(name == canonicalize_name(requirement.name) and requirement.specifier.contains(version, True)
                   for name, version in have):
            pins = [s.version for s in requirement.specifier if s.operator == "=="] or ["0"]
            write_wheel(Standin(requirement.name.replace("-", "_"), pins[0], "placeholder"), wheels)
    projects: dict[str, list[str]] = {}
    for wheel in wheels.glob("*.whl"):
        projects.setdefault(parse_wheel_filename(wheel.name)[0], []).append(wheel.name)
    for project, names in projects.items():
        page = wheels / "simple" / project
        page.mkdir(parents=True)
        (page / "index.html").write_text("".join(f'<a href="../../{n}">{n}</a>\n' for n in names))
    return (wheels / "simple").as_uri()


def deploy_steps(steps, venv: Path, index: str) -> None:
    """The pinned operation's commands for the steps, run against the venv, its fact being what the venv holds."""
    from ascend_fleet.facts.ascend import PipPackages
    from ascend_fleet.operations import python_stack
    from tests.fakehost import FakeHost, commands
    held = FakeHost({PipPackages: venv_state(venv)[0]})
    for command in commands(python_stack.pinned, held, venv=str(venv), steps=steps,
                            index_url=index):
        raw = command.get_raw_value() if hasattr(command, "get_raw_value") else command
        run = subprocess.run(["sh", "-c", str(raw)],
                             capture_output=True, text=True, env=pip_environment(dict(os.environ)), timeout=600)
        assert run.returncode == 0, run.stderr[-2000:]


@pytest.fixture(scope="module")
def x86_index(tmp_path_factory) -> str:
    from ascend_fleet.config.profile import load_profile
    directory = tmp_path_factory.mktemp("lab-index")
    placeholder_wheels(build_lab_standins(directory, "x86_64"), directory)
    return simple_index(directory, [r for step in load_profile("lab").install_steps() for r in step.requirements])


def venv_state(venv: Path) -> tuple[dict[str, str], str, list[str]]:
    python = str(venv / "bin" / "python")
    listing = json.loads(subprocess.run([python, "-m", "pip", "list", "--format", "json"], capture_output=True,
                                        text=True).stdout)
    triton = subprocess.run([python, "-c", "import triton; print(triton.__version__)"], capture_output=True, text=True)
    check = subprocess.run([python, "-m", "pip", "check"], capture_output=True, text=True).stdout.splitlines()
    return ({canonicalize_name(r["name"]): r["version"] for r in listing},
            triton.stdout.strip() or triton.stderr.strip().splitlines()[-1], check)


def test_the_lab_x86_64_steps_leave_triton_ascends_build_alone_in_site_packages_triton(x86_index, tmp_path):
    """x86_64 torch (vllm's 2.10.0) brings CUDA triton 3.6.0 (real Requires-Dist); upstream's order removes it
    before triton-ascend goes in, puts the builds over the pins, and pip check names only what it accepts."""
    from ascend_fleet.config.profile import load_profile
    profile = load_profile("lab")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    steps = profile.node_steps("x86_64")
    deploy_steps(steps[:1], venv, x86_index)
    assert venv_state(venv)[0]["triton"] == "3.6.0"  # what step 1 brings on x86_64, as on a real node
    deploy_steps(steps[1:], venv, x86_index)
    installed, triton, check = venv_state(venv)
    assert "triton" not in installed and triton == "3.2.0.dev20260322"
    assert (installed["torch-npu"], installed["triton-ascend"]) == ("2.9.0.post1+gitdc51c2d", "3.2.0.dev20260322")
    assert check and profile.unaccepted_complaints(check) == []
    # `profile lock` judges a locked environment from its metadata as this pip check does, to the word.
    assert sorted(pip_check(installed_metadata(venv), Platform("x86_64", "3.11", "2.36"))) == sorted(check)


def installed_metadata(venv: Path) -> dict[str, Dist]:
    """The venv's distributions, their versions and Requires-Dist, as the lock reads them from an index."""
    read = ("import json, importlib.metadata as m; print(json.dumps("
            "{d.metadata['Name']: [d.version, d.requires or []] for d in m.distributions()}))")
    run = subprocess.run([str(venv / "bin" / "python"), "-c", read], capture_output=True, text=True, cwd=venv,
                         check=True)
    listed = json.loads(run.stdout)
    return {canonicalize_name(name): Dist(version, "", requires) for name, (version, requires) in listed.items()}


def test_removing_cuda_triton_after_triton_ascend_deletes_triton_ascends_files(x86_index, tmp_path):
    """Why upstream's order: an uninstall of triton at the end (as a plain `pip.remove` would run it) leaves
    triton-ascend listed but `import triton` failing."""
    from ascend_fleet.config.profile import PipRemoval, PipStep, load_profile
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    installs = [s for s in load_profile("lab").node_steps("x86_64") if isinstance(s, PipStep)]
    deploy_steps([*installs, PipRemoval(["triton"])], venv, x86_index)
    installed, triton, _ = venv_state(venv)
    assert installed["triton-ascend"] == "3.2.0" and "triton" not in installed
    assert triton == "ModuleNotFoundError: No module named 'triton'"


def test_the_lab_profiles_builds_are_its_standins_by_sha256(lab_standins):
    """profiles/lab.yaml pins each stand-in build by sha256, as a real profile pins upstream's files: a changed
    stand-in fails here with the lines to paste."""
    import hashlib

    from ascend_fleet.config.profile import OverrideStep, load_profile
    arch, wheels = lab_standins
    built = {w.name: hashlib.sha256(w.read_bytes()).hexdigest() for w in wheels}
    pinned = {build.file: build.sha256 for step in load_profile("lab").pip.install if isinstance(step, OverrideStep)
              for build in step.builds if build.file in built}
    assert len(pinned) == 2, f"{arch}: the lab profile has no stand-in build for {arch}"
    paste = "\n".join(f"        - {{file: {name}, sha256: {built[name]}}}" for name in pinned)
    assert pinned == {name: built[name] for name in pinned}, f"profiles/lab.yaml builds for {arch}:\n{paste}"


def test_the_lab_previous_x86_64_steps_leave_only_what_its_row_accepts_and_no_cuda_triton(tmp_path_factory,
                                                                                        tmp_path):
    """The stack gate's pip check runs for every profile: lab-previous (the 0.11.0 row) leaves vllm 0.11.0's
    CUDA-era pins broken, as vllm-ascend-0.11.0 accepts, and its uninstall takes out the CUDA triton that
    vllm's x86_64 torch 2.8.0 brought (Dockerfile:51-53 at v0.11.0)."""
    from ascend_fleet.config.profile import load_profile
    profile = load_profile("lab-previous")
    directory = tmp_path_factory.mktemp("lab-previous-index")
    placeholder_wheels(build_lab_standins(directory, "x86_64"), directory)
    index = simple_index(directory, [r for step in profile.install_steps() for r in step.requirements])
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    steps = profile.node_steps("x86_64")
    deploy_steps(steps[:1], venv, index)
    assert "triton" in venv_state(venv)[0]  # what step 1 brings on x86_64, as on a real node
    deploy_steps(steps[1:], venv, index)
    installed, _, check = venv_state(venv)
    assert "triton" not in installed, (installed.get("torch"), installed.get("triton"), check)
    assert check and profile.unaccepted_complaints(check) == [], check


def test_the_0_23_0_rows_steps_over_the_guides_virtualenv_leave_triton_ascend_alone_in_site_packages_triton(
        tmp_path_factory, tmp_path):
    """The guide's two steps (tests/known_breakages.py's GUIDE_ONLY_0_23_0) leave CUDA triton 3.6.0 (torch
    2.11.0's) beside triton-ascend 3.2.2; lab-0.23.0's steps run over that, step by step as on a node without the
    profile's lock, uninstall both and put triton-ascend back alone (Dockerfile@v0.23.0:70-71)."""
    from ascend_fleet.config.profile import InstallStep, load_profile
    from tests.known_breakages import GUIDE_ONLY_0_23_0
    profile = load_profile("lab-0.23.0")
    guide = profile.model_copy(update={"pip": profile.pip.model_copy(update={
        "install": [InstallStep(requires=step["requires"]) for step in GUIDE_ONLY_0_23_0]})})
    directory = tmp_path_factory.mktemp("lab-0.23.0-index")
    placeholder_wheels(build_lab_standins(directory, "x86_64"), directory)
    index = simple_index(directory, [r for step in profile.install_steps() for r in step.requirements])
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    deploy_steps(guide.node_steps("x86_64"), venv, index)
    installed, triton, _ = venv_state(venv)
    assert (installed["triton"], installed["triton-ascend"], triton) == ("3.6.0", "3.2.2", "3.2.2")
    deploy_steps(profile.node_steps("x86_64"), venv, index)
    installed, triton, check = venv_state(venv)
    assert "triton" not in installed and (installed["triton-ascend"], triton) == ("3.2.2", "3.2.2")
    assert check and profile.unaccepted_complaints(check) == [], check
