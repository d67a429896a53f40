"""`ascend-fleet profile lock`: the committed locks are their profiles', a lock the profile moved away from or
that lost a hash is refused by `profile check`, and against PyPI a fresh lock of vllm-ascend 0.18.0 is accepted."""

from __future__ import annotations

import re

import pytest

from ascend_fleet.config.profile import (
    PipBuild,
    PipLocked,
    PipRemoval,
    PipStep,
    available_profiles,
    from_one_index,
    load_profile,
)
from ascend_fleet.fleet.profile_check import DEFAULT_GLIBC, Platform
from ascend_fleet.fleet.profile_lock import (
    LOCKS_DIR,
    Dist,
    complaint_overrides,
    glibc_problem,
    lock_path,
    lock_profile,
    lock_verdicts,
    node_lock,
    pip_check,
    read_lock,
)

AARCH64 = Platform("aarch64", "3.11", DEFAULT_GLIBC)
ROUTER_LOCKS = "vllm-router-*.txt"  # the gateways' router (profile lock --router), not a profile's stack
LOCKED = "vllm-ascend-0.18.0"


def committed_locks() -> list[tuple[str, Platform]]:
    found = []
    for path in sorted(set(LOCKS_DIR.glob("*.txt")) - set(LOCKS_DIR.glob(ROUTER_LOCKS))):
        match = re.fullmatch(r"(?P<profile>.+)\.(?P<arch>x86_64|aarch64)-py(?P<python>3\.\d+)\.txt", path.name)
        assert match and match["profile"] in available_profiles(), f"{path.name} is no profile's lock"
        found.append((match["profile"], Platform(match["arch"], match["python"], DEFAULT_GLIBC)))
    return found


def test_every_committed_router_lock_is_of_a_release_a_profile_pins():
    pinned = {load_profile(name).router.vllm_router for name in available_profiles() if load_profile(name).router}
    locked = {re.fullmatch(r"vllm-router-(.+)\.(x86_64|aarch64)-py3\.\d+\.txt", path.name)[1]
              for path in LOCKS_DIR.glob(ROUTER_LOCKS)}
    assert locked and locked <= pinned


def test_vllm_ascend_0_18_0_on_aarch64_is_locked_in_the_repository():
    assert (LOCKED, AARCH64) in committed_locks()


@pytest.mark.parametrize("name, platform", committed_locks(), ids=str)
def test_every_committed_lock_is_accepted_by_profile_check(name, platform):
    lines, problems = lock_verdicts(load_profile(name), [platform])
    assert problems == 0 and "accepted" in lines[0], lines


def test_a_lock_the_profile_moved_away_from_is_refused_naming_the_command_that_remakes_it(tmp_path, monkeypatch):
    profile = load_profile(LOCKED)
    moved = profile.model_copy(update={"stack": profile.stack.model_copy(update={"transformers": "4.57.5"})})
    lines, problems = lock_verdicts(moved, [AARCH64])
    assert problems == 1
    assert "made from another version of profile vllm-ascend-0.18.0" in lines[0]
    assert "`ascend-fleet profile lock vllm-ascend-0.18.0 --arch aarch64 --python 3.11`" in lines[0]


def test_a_pin_without_its_hash_or_a_profile_pin_the_lock_does_not_meet_is_refused(tmp_path, monkeypatch):
    text = lock_path(LOCKED, AARCH64).read_text()
    unhashed = re.sub(r"(absl-py==\S+) \\\n(\s+--hash=\S+ \\\n)*\s+--hash=\S+\n", r"\1\n", text)
    moved_torch = unhashed.replace("\ntorch==2.9.0 ", "\ntorch==2.9.1 ")
    monkeypatch.setattr("ascend_fleet.fleet.profile_lock.LOCKS_DIR", tmp_path)
    lock_path(LOCKED, AARCH64).write_text(moved_torch)
    lines, problems = lock_verdicts(load_profile(LOCKED), [AARCH64])
    assert problems == 2, lines
    assert any("absl-py==2.5.1 has no sha256" in line for line in lines), lines
    assert any("torch==2.9.0 is not met (torch 2.9.1)" in line for line in lines), lines


def test_a_platform_without_a_lock_is_said_and_is_no_problem():
    lines, problems = lock_verdicts(load_profile(LOCKED), [Platform("x86_64", "3.11", DEFAULT_GLIBC)])
    assert problems == 0 and "no lock" in lines[0] and "--arch x86_64" in lines[0]


def test_pip_check_is_worked_out_for_the_node_and_its_complaints_become_overrides():
    environment = {
        "vllm": Dist("0.18.0", "", ["torch==2.10.0", 'triton==3.6.0; platform_machine == "x86_64"',
                                    'numpy>=1.26; platform_system == "Linux"']),
        "torch": Dist("2.9.0", "", []),
    }
    complaints = pip_check(environment, AARCH64)
    # triton's marker is the node's (aarch64), not this machine's; a missing one is named as pip check names it,
    # by its name alone (pip's check command: "%s %s requires %s, which is not installed.", the dependency's name)
    assert complaints == ["vllm 0.18.0 has requirement torch==2.10.0, but you have torch 2.9.0.",
                          "vllm 0.18.0 requires numpy, which is not installed."]
    assert complaint_overrides(complaints, environment) == ['numpy; python_version < "0"', "torch==2.9.0"]


def test_the_committed_lock_holds_the_later_steps_versions_and_leaves_the_builds_to_the_profile():
    text = lock_path(LOCKED, AARCH64).read_text()
    _, pinned = read_lock(lock_path(LOCKED, AARCH64))
    assert {"torch==2.9.0", "torchvision==0.24.0", "torchaudio==2.9.0", "opencv-python-headless==4.11.0.86",
            "vllm==0.18.0", "vllm-ascend==0.18.0", "transformers==4.57.6"} <= set(pinned)
    assert not [pin for pin in pinned if pin.startswith(("torch-npu==", "triton-ascend==", "triton=="))]
    assert "# then over its pin, from the profile: torch_npu-2.9.0.post1+gitee7ba04-" in text


# One profile's fresh lock: the committed locks of the others are judged offline above, and their end states
# against PyPI by test_profile_check (the same resolutions, which cost minutes of CI each).
@pytest.mark.network  # PyPI's index
@pytest.mark.parametrize("name, complaint", [
    (LOCKED, "vllm 0.18.0 has requirement opencv-python-headless>=4.13.0, but you have opencv-python-headless "
             "4.11.0.86.")])
def test_a_fresh_lock_on_aarch64_is_accepted_with_the_complaints_upstream_leaves(name, complaint, tmp_path,
                                                                                 monkeypatch):
    monkeypatch.setattr("ascend_fleet.fleet.profile_lock.LOCKS_DIR", tmp_path)
    profile = load_profile(name)
    made = lock_profile(profile, AARCH64, ["https://pypi.org/simple"], progress=lambda line: None)
    made.write(lock_path(name, AARCH64))
    lines, problems = lock_verdicts(profile, [AARCH64])
    assert problems == 0 and "accepted" in lines[0], lines
    assert complaint in made.complaints


def test_from_a_bundle_every_step_takes_the_one_index_the_site_serves_builds_included():
    build = PipBuild("torch-npu", "2.9.0.post1+gitee7ba04", "torch_npu-2.9.0.post1+gitee7ba04-cp311-cp311-"
                     "manylinux_2_28_aarch64.whl", "0" * 64, "https://obs.example/", ["https://extra/"])
    steps = from_one_index([PipStep(["vllm==0.18.0"], ["https://extra/"]), PipRemoval(["triton"]),
                            PipLocked("l.txt", "", {}, ["https://extra/"]), build])
    assert steps[1] == PipRemoval(["triton"])
    assert steps[3].from_index and steps[3].file == build.file and steps[3].sha256 == build.sha256
    assert all(not step.extra_index_urls for step in steps if not isinstance(step, PipRemoval))


def test_a_lock_for_a_newer_glibc_than_the_nodes_is_refused_naming_the_option_that_fixes_it():
    lock = node_lock(load_profile(LOCKED), "aarch64", "3.11")
    assert glibc_problem(lock, "2.35") is None and glibc_problem(lock, "2.38") is None
    assert glibc_problem(lock, "2.34") == (
        "vllm-ascend-0.18.0.aarch64-py3.11.txt was locked for glibc 2.35 and this node has 2.34: its wheels may "
        "not load here; lock it again with --glibc 2.34 (the oldest of the fleet's)")


def test_with_a_lock_the_uninstalls_come_whole_before_it_and_the_lock_installs_again_what_they_take():
    profile = load_profile("vllm-ascend-0.23.0")
    lock = PipLocked("l.txt", "", {"vllm": "0.23.0", "triton-ascend": "3.2.2"}, [])
    steps = profile.node_steps("aarch64", lock=lock)
    assert steps == [PipRemoval(["triton"]), PipRemoval(["triton", "triton-ascend"]), lock]
