"""Shipped stack profiles: each loads, follows (or provably does not follow) the vllm-ascend
matrix, names every vendor file it needs, and a bad profile is refused in one line."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from ascend_fleet import PROFILES
from ascend_fleet.config.profile import (
    InstallStep,
    OverrideStep,
    PipBuild,
    PipRemoval,
    RemoveStep,
    available_profiles,
    load_profile,
)
from ascend_fleet.core.errors import FleetError
from ascend_fleet.sizing.planner import python_version_key

# vllm-ascend's versioning policy, as the field notes copy it (section 3): the one
# place the tests keep the upstream matrix.
UPSTREAM_MATRIX = {
    "0.7.3": {"vllm": "0.7.3", "python": ("3.9", "3.11"), "cann": "8.1.RC1", "torch": "2.5.1", "torch_npu": "2.5.1"},
    "0.9.1": {"vllm": "0.9.1", "python": ("3.9", "3.11"), "cann": "8.2.RC1", "torch": "2.5.1", "torch_npu": "2.5.1.post1"},
    "0.11.0": {"vllm": "0.11.0", "python": ("3.9", "3.11"), "cann": "8.3.RC2", "torch": "2.7.1", "torch_npu": "2.7.1.post1"},
    "0.13.0": {"vllm": "0.13.0", "python": ("3.10", "3.11"), "cann": "8.5.0", "torch": "2.8.0", "torch_npu": "2.8.0.post2"},
    "0.18.0": {"vllm": "0.18.0", "python": ("3.10", "3.11"), "cann": "8.5.1", "torch": "2.9.0", "torch_npu": "2.9.0.post1"},
    "0.23.0": {"vllm": "0.23.0", "python": ("3.10", "3.12"), "cann": "9.1.0", "torch": "2.10.0", "torch_npu": "2.10.0.post4"},
}
SHIPPED_UPSTREAM_ROWS = {"vllm-ascend-0.11.0": "0.11.0", "vllm-ascend-0.13.0": "0.13.0", "vllm-ascend-0.18.0": "0.18.0",
                         "vllm-ascend-0.23.0": "0.23.0"}
# Where a release's wheel pins another torch_npu than its matrix row, the profile follows the wheel
# (Requires-Dist of vllm_ascend-<release>-cp311-*.whl on PyPI; the release's installation guide says
# the same): pip cannot install the row's .post1 beside the wheel, and PyPI has no 2.7.1.post1.
WHEEL_TORCH_NPU = {"0.11.0": "2.7.1", "0.18.0": "2.9.0"}
CPU_INDEX = "https://download.pytorch.org/whl/cpu/"
HUAWEI_INDEX = "https://mirrors.huaweicloud.com/ascend/repos/pypi"
# Each release's installation guide: the extra indexes of every step, then those of each step.
UPSTREAM_PIP_INDEXES = {
    "0.11.0": ([CPU_INDEX, HUAWEI_INDEX], [[], []]),
    "0.13.0": ([CPU_INDEX], [[], []]),
    "0.18.0": ([CPU_INDEX], [[], []]),
    # the guide's vllm-ascend step, then the Dockerfile's triton-ascend step (Dockerfile:71 at v0.23.0)
    "0.23.0": ([CPU_INDEX], [[], [f"{HUAWEI_INDEX}/variant", HUAWEI_INDEX], [HUAWEI_INDEX]]),
}


def follows_row(profile, release: str) -> bool:
    row, stack = UPSTREAM_MATRIX[release], profile.stack
    low, high = row["python"]
    return (stack.vllm_ascend == release and stack.vllm == row["vllm"] and stack.cann == row["cann"]
            and stack.torch == row["torch"] and stack.torch_npu == WHEEL_TORCH_NPU.get(release, row["torch_npu"])
            and python_version_key(low) <= python_version_key(stack.python) <= python_version_key(high))


def test_every_required_profile_ships():
    assert {"handbook", "lab", *SHIPPED_UPSTREAM_ROWS} <= set(available_profiles())


@pytest.mark.parametrize("name", available_profiles())
def test_every_shipped_profile_loads_and_names_every_vendor_file_it_needs(name):
    profile = load_profile(name)
    needed = {file for arch in profile.arch for file in profile.vendor_files(arch).values()}
    assert needed <= set(profile.packages.files)


@pytest.mark.parametrize("name, release", SHIPPED_UPSTREAM_ROWS.items())
def test_upstream_profiles_follow_their_matrix_row_and_install_guide(name, release):
    profile = load_profile(name)
    assert profile.upstream.vllm_ascend_row == release
    assert follows_row(profile, release)
    assert profile.stack.nnal == profile.stack.cann
    assert profile.pip.index_url == "https://pypi.org/simple"
    every_step, each_step = UPSTREAM_PIP_INDEXES[release]
    assert profile.pip.extra_index_urls == every_step
    assert [step.extra_index_urls for step in profile.pip.install if isinstance(step, InstallStep)] == each_step


def test_a_profile_that_follows_its_wheel_over_its_row_says_so():
    release, torch_npu = "0.11.0", WHEEL_TORCH_NPU["0.11.0"]
    profile = load_profile(f"vllm-ascend-{release}")
    assert UPSTREAM_MATRIX[release]["torch_npu"] != torch_npu == profile.stack.torch_npu
    assert f"as its wheel pins it ({torch_npu}, not the row's {UPSTREAM_MATRIX[release]['torch_npu']})" in \
        profile.upstream.note


OBJECT_STORAGE = "https://vllm-ascend.obs.cn-north-4.myhuaweicloud.com/vllm-ascend/"
# v0.18.0's Dockerfile: PTA_WHEEL per (Python tag, arch), TRITON_ASCEND_WHEEL per Python tag and arch.
DOCKERFILE_TORCH_NPU = {("3.10", "aarch64"): "git4c901a4", ("3.11", "x86_64"): "gitdc51c2d",
                        ("3.10", "x86_64"): "gita74051c", ("3.11", "aarch64"): "gitee7ba04"}


def test_the_0_18_0_profile_installs_its_wheels_pins_then_upstreams_builds_over_them_in_the_dockerfiles_order():
    profile = load_profile("vllm-ascend-0.18.0")
    kinds = [("requires", s.requires) if isinstance(s, InstallStep) else ("remove", s.remove, s.arch)
             if isinstance(s, RemoveStep) else ("override", s.override) for s in profile.pip.install]
    assert kinds == [("requires", ["vllm"]), ("remove", ["triton"], ["x86_64", "aarch64"]),
                     # the instrumentator held where upstream's image had it (`profile lock` found why)
                     ("requires", ["vllm-ascend", "torch", "torch-npu", "transformers",
                                   "prometheus-fastapi-instrumentator<8"]),
                     ("remove", ["triton"], ["x86_64"]), ("override", "triton-ascend"), ("override", "torch-npu")]
    for (python, arch), label in DOCKERFILE_TORCH_NPU.items():
        torch_npu = profile.pip.install[5].build_for(arch, python)
        assert torch_npu.file == f"torch_npu-2.9.0.post1+{label}-cp{python.replace('.', '')}-" \
                                 f"cp{python.replace('.', '')}-manylinux_2_28_{arch}.whl"
        triton = profile.pip.install[4].build_for(arch, python)
        assert triton.file.startswith(f"triton_ascend-3.2.0.dev20260322-cp{python.replace('.', '')}-")
        assert torch_npu.sha256 is None and "does not resolve here" in torch_npu.unknown
    assert {profile.pip.install[4].source, profile.pip.install[5].source} == {OBJECT_STORAGE}
    assert "vllm-ascend 0.18.0 has requirement torch-npu==2.9.0" in profile.accepted_complaints()


def test_a_build_without_sha256_stops_the_deploy_naming_the_file_and_step():
    with pytest.raises(FleetError, match=r"vllm-ascend-0.18.0.yaml pip.install step 5: triton_ascend-3.2.0.dev20260322-"
                                         r"cp311-cp311-manylinux_2_27_aarch64.manylinux_2_28_aarch64.whl has no sha256 "
                                         r"\(not read: .*\); fill it in from the file"):
        load_profile("vllm-ascend-0.18.0").node_steps("aarch64")


def test_x86_64_with_cann_8_5_1_is_refused_naming_issue_7993_unless_the_profile_accepts_it():
    refusal = load_profile("vllm-ascend-0.18.0").refusal("x86_64")
    assert refusal.startswith("profile vllm-ascend-0.18.0 refuses x86_64 with CANN 8.5.1: "
                              "vllm-project/vllm-ascend#7993 (")
    assert "use aarch64 nodes or a profile with CANN 9.0.0 or later" in refusal
    assert load_profile("vllm-ascend-0.18.0").refusal("aarch64") is None
    assert load_profile("lab").refusal("x86_64") is None and load_profile("lab").known_issues[0].accepted


def test_the_lab_mirrors_the_0_18_0_steps_with_its_stand_in_builds_from_its_index():
    lab, real = load_profile("lab"), load_profile("vllm-ascend-0.18.0")
    assert lab.accepted_complaints() == real.accepted_complaints()
    for arch in ("x86_64", "aarch64"):
        steps = lab.node_steps(arch)
        real_builds = [step.build_for(arch, "3.11").file for step in real.pip.install if isinstance(step, OverrideStep)]
        assert [s.file for s in steps if isinstance(s, PipBuild)] == real_builds
        assert sum(isinstance(s, PipRemoval) for s in steps) == (2 if arch == "x86_64" else 1)


def test_the_lab_0_23_0_row_is_the_0_23_0_profiles_python_stack_steps_and_accepts():
    """The lab's 0.23.0 row (issue 47) runs vllm-ascend-0.23.0's five steps on each arch, from the lab's index."""
    lab, real = load_profile("lab-0.23.0"), load_profile("vllm-ascend-0.23.0")
    python_row = ("python", "torch", "torch_npu", "vllm", "vllm_ascend", "transformers")
    assert [getattr(lab.stack, key) for key in python_row] == [getattr(real.stack, key) for key in python_row]
    assert lab.accepted_complaints() == real.accepted_complaints()

    def what(steps) -> list:
        return [step.packages if isinstance(step, PipRemoval) else step.requirements for step in steps]
    for arch in ("x86_64", "aarch64"):
        assert what(lab.node_steps(arch)) == what(real.node_steps(arch))
        assert not any(step.extra_index_urls for step in lab.node_steps(arch) if not isinstance(step, PipRemoval))


@pytest.mark.parametrize("name", available_profiles())
def test_a_profile_without_an_upstream_row_matches_none(name):
    profile = load_profile(name)
    if profile.upstream.vllm_ascend_row is None:
        assert profile.upstream.note
        assert not any(follows_row(profile, release) for release in UPSTREAM_MATRIX)


def test_handbook_is_the_operators_stack_and_says_it_matches_no_row():
    profile = load_profile("handbook")
    stack = profile.stack
    assert (stack.cann, stack.vllm_ascend, stack.torch, stack.torch_npu) == ("8.0.RC2", "0.7.3", "2.4.0", "2.4.0.post2")
    assert profile.upstream.vllm_ascend_row is None
    assert "matches no upstream row" in profile.upstream.note


@pytest.mark.parametrize("name", ["handbook", *SHIPPED_UPSTREAM_ROWS])
def test_real_vendor_files_have_no_checksum_yet_and_the_deploy_is_told_to_fill_it_in(name):
    profile = load_profile(name)
    driver = profile.vendor_files("aarch64")["driver"]
    with pytest.raises(FleetError, match=rf"^profile {name}: no sha256 for {driver}; add it under packages.files"):
        profile.sha256_of(driver)


# --- Refusals: one line naming the file and the key. ---


@pytest.fixture
def profile_dir(tmp_path) -> Path:
    shutil.copy(PROFILES / "vllm-ascend-0.13.0.yaml", tmp_path)
    return tmp_path


def rewrite(directory: Path, change) -> None:
    path = directory / "vllm-ascend-0.13.0.yaml"
    raw = yaml.safe_load(path.read_text())
    change(raw)
    path.write_text(yaml.safe_dump(raw))


def refusal(directory: Path) -> str:
    with pytest.raises(FleetError) as caught:
        load_profile("vllm-ascend-0.13.0", directory)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_unknown_profile_is_refused_naming_the_known_ones(profile_dir):
    with pytest.raises(FleetError, match=r"profile 'prod-stack': no .*prod-stack.yaml; known profiles: vllm-ascend-0.13.0$"):
        load_profile("prod-stack", profile_dir)


def test_unknown_key_is_refused_naming_file_and_key(profile_dir):
    rewrite(profile_dir, lambda raw: raw["stack"].update(cuda="12.4"))
    assert refusal(profile_dir) == f"profile vllm-ascend-0.13.0: {profile_dir / 'vllm-ascend-0.13.0.yaml'}: stack.cuda: unknown key"


def test_firmware_outside_the_driver_range_is_refused(profile_dir):
    rewrite(profile_dir, lambda raw: raw["stack"].update(firmware="9.0.0.0.205"))
    message = refusal(profile_dir)
    assert "vllm-ascend-0.13.0.yaml: stack:" in message
    assert "firmware 9.0.0.0.205 is outside the driver's compatible range [7.0.0,8.9.9]" in message


def test_a_profile_that_does_not_say_how_many_ports_its_hccl_takes_is_refused(profile_dir):
    """HCCL's span is a fact of the CANN release, in no code: a profile without it cannot place instances."""
    rewrite(profile_dir, lambda raw: raw["stack"].pop("hccl_port_span"))
    assert refusal(profile_dir) == (f"profile vllm-ascend-0.13.0: {profile_dir / 'vllm-ascend-0.13.0.yaml'}: "
                                    "stack.hccl_port_span: missing")


def test_a_source_that_is_not_one_of_the_profiles_indexes_is_refused(profile_dir):
    rewrite(profile_dir, lambda raw: raw["pip"].update(sources={"triton-ascend": "https://example.org/simple"}))
    message = refusal(profile_dir)
    assert "vllm-ascend-0.13.0.yaml: pip:" in message
    assert "sources names https://example.org/simple, which is not one of the profile's pip indexes" in message


def test_malformed_sha256_is_refused_naming_the_file_entry(profile_dir):
    rewrite(profile_dir, lambda raw: raw["packages"]["files"]["Ascend-cann-toolkit_8.5.0_linux-x86_64.run"].update(sha256="abc"))
    message = refusal(profile_dir)
    assert "packages.files.Ascend-cann-toolkit_8.5.0_linux-x86_64.run.sha256" in message
    assert "must be 64 lower-case hex digits" in message


def test_an_operators_profile_where_it_runs_comes_before_the_packages(tmp_path, monkeypatch):
    """A fleet repository keeps its own copy (the sha256 of the packages it downloaded) in profiles/."""
    name = "vllm-ascend-0.18.0"
    driver = load_profile(name).vendor_files("aarch64")["driver"]
    with pytest.raises(FleetError, match=rf"add it under packages.files in {PROFILES / name}.yaml "):
        load_profile(name).sha256_of(driver)
    raw = yaml.safe_load((PROFILES / f"{name}.yaml").read_text())
    raw["packages"]["files"][driver]["sha256"] = "a" * 64
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / f"{name}.yaml").write_text(yaml.safe_dump(raw))
    monkeypatch.chdir(tmp_path)
    assert load_profile(name).sha256_of(driver) == "a" * 64
    assert {name, "lab", "handbook"} <= set(available_profiles())


@pytest.mark.parametrize("venv", ["/opt/my venv", "/opt/%h/venv", "opt/venv", "/opt/v;rm -rf /"])
def test_a_venv_path_that_is_not_one_plain_absolute_word_is_refused(profile_dir, venv):
    rewrite(profile_dir, lambda raw: raw["pip"].update(venv=venv))
    assert "vllm-ascend-0.13.0.yaml: pip.venv: String should match pattern" in refusal(profile_dir)
