"""`ascend-fleet profile check`: pip's real failures read into one line each (pip outputs captured
from the check's own runner, PyPI's real file lists), and against PyPI itself the lines issue 12
asks for. The network tests skip when PyPI does not answer."""

from __future__ import annotations

import atexit
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import pytest
import requests
from packaging.utils import canonicalize_name

from ascend_fleet.config.profile import OverrideStep, load_profile
from ascend_fleet.core.errors import FleetError
from ascend_fleet.fleet.profile_check import (
    Check,
    Indexes,
    IndexFile,
    Platform,
    PlatformResult,
    Problem,
    Standin,
    StepResolver,
    StepResult,
    check_profile,
    conflict_lines,
    manylinux_platforms,
    platforms_to_check,
    resolver_pip,
)

DATA = Path(__file__).parent / "data"
PYPI = "https://pypi.org/simple"
CPU = "https://download.pytorch.org/whl/cpu/"
HUAWEI = "https://mirrors.huaweicloud.com/ascend/repos/pypi"
HUAWEI_VARIANT = "https://mirrors.huaweicloud.com/ascend/repos/pypi/variant"
CLI = Path(sys.executable).with_name("ascend-fleet")
AARCH64 = Platform("aarch64", "3.11", "2.35")
SUMMARY = re.compile(r"^\S+ (x86_64|aarch64) Python [\d.]+ glibc [\d.]+: ")


def pip_output(name: str) -> str:
    """A captured pip output, less the lines saying how it was captured."""
    return "".join(line for line in (DATA / name).read_text().splitlines(keepends=True) if not line.startswith("# "))


def sdist_with_pkg_info(pkg_info: str, top: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        data = pkg_info.encode()
        member = tarfile.TarInfo(f"{top}/PKG-INFO")
        member.size = len(data)
        archive.addfile(member, io.BytesIO(data))
    return buffer.getvalue()


class RecordedPyPI(Indexes):
    """PyPI's project pages as recorded in data/pypi_files.json; every other index lists nothing."""

    def __init__(self, unanswered: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.unanswered = dict.fromkeys(unanswered, "does not resolve")
        self.pages = json.loads((DATA / "pypi_files.json").read_text())
        pkg_info = "".join((DATA / "arctic_inference-0.1.1.PKG-INFO").read_text().splitlines(keepends=True)[1:])
        self.sdists = {"arctic_inference-0.1.1.tar.gz": sdist_with_pkg_info(pkg_info, "arctic_inference-0.1.1")}

    def files(self, index: str, name: str) -> list[IndexFile]:
        listed = self.pages.get(canonicalize_name(name), []) if index == PYPI else []
        return [IndexFile(f["filename"], f"{PYPI}/{f['filename']}", f["requires-python"]) for f in listed]

    def fetch(self, file: IndexFile) -> bytes:
        return self.sdists[file.filename]


def resolver(profile: str, unanswered: tuple[str, ...] = (), **pip_changes) -> StepResolver:
    loaded = load_profile(profile)
    if pip_changes:
        loaded = loaded.model_copy(update={"pip": loaded.pip.model_copy(update=pip_changes)})
    return StepResolver(loaded, RecordedPyPI(unanswered), Path("unused"))


# --- pip's outputs, read (data/pip_*.txt: real outputs of pip 26.3, each with the command that produced it) ---


def test_a_pin_that_only_the_profiles_unreachable_index_has_is_named_with_that_index_and_stood_in_for():
    finding = resolver("vllm-ascend-0.23.0", unanswered=(CPU, HUAWEI, HUAWEI_VARIANT)).explain(
        pip_output("pip_not_found_elsewhere.txt"), AARCH64, 2, [PYPI])
    assert finding.problem == Problem(
        "elsewhere", f"triton-ascend==3.2.2 (required by vllm-ascend) is not on {PYPI}; the profile takes it from "
                     f"{HUAWEI} (pip.sources), which did not answer")
    assert (finding.standin.name, finding.standin.version, finding.standin.requires) == ("triton-ascend", "3.2.2", [])


def test_the_same_pin_checked_against_pypi_alone_says_its_index_was_not_asked():
    finding = resolver("vllm-ascend-0.23.0").explain(pip_output("pip_not_found_elsewhere.txt"), AARCH64, 2, [PYPI])
    assert finding.problem.message.endswith(f"the profile takes it from {HUAWEI} (pip.sources), which is not among "
                                            "the indexes checked")


def test_a_source_build_the_profile_lists_is_a_note_and_its_stand_in_carries_the_sdists_own_requirements():
    finding = resolver("vllm-ascend-0.23.0").explain(pip_output("pip_not_found_sdist_only.txt"), AARCH64, 2, [PYPI])
    assert finding.problem is None
    assert finding.note == ("arctic-inference==0.1.1 (required by vllm-ascend) has no wheel for aarch64 Python 3.11 "
                            "glibc 2.35: pip builds arctic_inference-0.1.1.tar.gz on the node (pip.source_builds)")
    assert finding.standin.role == "built on the node"
    # PKG-INFO 2.4, Requires-Dist not dynamic: only extras, which pip leaves out
    assert finding.standin.requires[0] == 'vllm==0.10.1; extra == "vllm"' and len(finding.standin.requires) == 17


def test_a_source_only_package_the_profile_does_not_list_is_a_problem_saying_how_to_accept_it():
    finding = resolver("vllm-ascend-0.23.0", source_builds=[]).explain(
        pip_output("pip_not_found_sdist_only.txt"), AARCH64, 2, [PYPI])
    assert finding.problem == Problem(
        "no-wheel", "arctic-inference==0.1.1 (required by vllm-ascend) has no wheel for aarch64 Python 3.11 glibc "
                    "2.35: pip would build its source arctic_inference-0.1.1.tar.gz on the node (list it under "
                    "pip.source_builds if that is meant)")
    assert finding.standin is None


def test_wheels_for_a_newer_glibc_are_named_with_the_tags_they_have():
    finding = resolver("vllm-ascend-0.23.0").explain(
        pip_output("pip_not_found_glibc.txt"), Platform("aarch64", "3.11", "2.28"), 2, [PYPI])
    assert finding.problem.kind == "no-wheel"
    assert finding.problem.message.startswith(
        "vllm-ascend==0.23.0 has no wheel for aarch64 Python 3.11 glibc 2.28: its wheels are for "
        "manylinux_2_34_aarch64 (cp310, cp311, cp312)")


def test_a_pin_no_index_has_lists_the_versions_of_its_release_series_there():
    finding = resolver("vllm-ascend-0.11.0").explain(pip_output("pip_not_found_pin.txt"), AARCH64, 2, [PYPI])
    assert finding.problem == Problem(
        "missing", "torch-npu==2.7.1.post1: no index checked has it; versions there: 2.7.1rc1, 2.7.1, 2.7.1.post2, "
                   "2.7.1.post4, 2.7.1.post6, 2.7.1.post8, 2.7.1.post10, 2.7.1.post11")


def test_a_conflict_says_who_requires_what():
    output = pip_output("pip_conflict_transformers.txt")
    assert [(who, str(r)) for who, r in conflict_lines(output)] == [
        (None, "transformers==4.57.1"), ("vllm-ascend 0.13.0", "transformers<5,>=4.57.4")]
    finding = resolver("vllm-ascend-0.13.0").explain(output, AARCH64, 2, [PYPI])
    assert finding.problem == Problem(
        "conflict", "conflict: step 2 asks for transformers==4.57.1; vllm-ascend 0.13.0 depends on "
                    "transformers<5,>=4.57.4")


def test_a_conflict_over_a_build_only_the_profiles_index_has_is_that_index_s():
    # x86_64: torch-npu pins torch==2.8.0+cpu, which only the PyTorch CPU index has
    finding = resolver("vllm-ascend-0.13.0", unanswered=(CPU,)).explain(
        pip_output("pip_conflict_cpu_torch.txt"), Platform("x86_64", "3.11", "2.35"), 2, [PYPI])
    assert finding.problem == Problem(
        "elsewhere", f"torch==2.8.0+cpu (required by torch-npu 2.8.0.post2) is not on {PYPI}; the profile takes it "
                     f"from {CPU} (pip.sources), which did not answer")
    assert (finding.standin.name, finding.standin.version) == ("torch", "2.8.0+cpu")


# --- platforms, markers, lines ---


def test_a_node_platform_accepts_manylinux_up_to_its_glibc():
    assert manylinux_platforms("aarch64", 28)[0] == "manylinux_2_28_aarch64"
    assert manylinux_platforms("aarch64", 28)[-3:] == ["manylinux2014_aarch64", "manylinux2010_aarch64",
                                                       "manylinux1_aarch64"]
    wheel = IndexFile("vllm_ascend-0.23.0-cp311-cp311-manylinux_2_34_aarch64.whl", "", None)
    assert wheel.wheel[1] & Platform("aarch64", "3.11", "2.35").tags
    assert not wheel.wheel[1] & Platform("aarch64", "3.11", "2.28").tags
    assert not wheel.wheel[1] & Platform("aarch64", "3.12", "2.35").tags


def test_the_lines_name_profile_platform_and_step_and_say_what_resolved():
    resolved = StepResult(1, ["vllm==0.23.0"], [PYPI], resolved=True, installs={"vllm": "0.23.0", "torch": "2.11.0"})
    stood_in = StepResult(2, ["vllm-ascend==0.23.0", "torch==2.10.0", "torch-npu==2.10.0.post4", "transformers==5.5.4",
                              "attrs"], [PYPI], resolved=True, installs={"vllm-ascend": "0.23.0"},
                          standins={"triton-ascend": Standin("triton-ascend", "3.2.2")},
                          problems=[Problem("elsewhere", "triton-ascend==3.2.2 ...")], notes=["arctic ..."])
    check = Check("vllm-ascend-0.23.0", PYPI, {HUAWEI: "mirrors.huaweicloud.com does not resolve"}, {HUAWEI: [2]},
                  [PlatformResult(AARCH64, [resolved, stood_in])])
    assert check.lines() == [
        f"vllm-ascend-0.23.0 step 2: index {HUAWEI} did not answer (mirrors.huaweicloud.com does not resolve); "
        "checked without it",
        "vllm-ascend-0.23.0 aarch64 Python 3.11 glibc 2.35 step 2: triton-ascend==3.2.2 ...",
        "vllm-ascend-0.23.0 aarch64 Python 3.11 glibc 2.35 step 2: note: arctic ...",
        "vllm-ascend-0.23.0 aarch64 Python 3.11 glibc 2.35: 1 problem: step 1 (vllm==0.23.0): 2 packages; step 2 "
        "(vllm-ascend==0.23.0 torch==2.10.0 torch-npu==2.10.0.post4 transformers==5.5.4 and 1 more): 1 packages, "
        "triton-ascend 3.2.2 not checked"]
    assert check.problem_count == 2


@pytest.mark.parametrize("arch, python, glibc, message", [
    ("riscv64", None, "2.35", "--arch riscv64: profile vllm-ascend-0.13.0 lists x86_64, aarch64; give one of those"),
    (None, "3", "2.35", "--python 3: give the nodes' Python as 3.Y, e.g. 3.11"),
    (None, None, "2.12", "--glibc 2.12: give the nodes' glibc as 2.Y, at least 2.17"),
])
def test_a_bad_platform_is_refused_in_one_line(arch, python, glibc, message):
    with pytest.raises(FleetError, match=f"^profile check: {message}"):
        platforms_to_check(load_profile("vllm-ascend-0.13.0"), arch, python, glibc)


def test_a_profile_whose_index_host_data_decides_needs_an_index_url():
    lab = load_profile("lab")
    with pytest.raises(FleetError, match=r"^profile check: profile lab has pip.index_url null .*: pass --index-url$"):
        check_profile(lab, platforms_to_check(lab, None, None, "2.35"))


# --- against PyPI (issue 12): one arch per profile here, both in the manual check ---

CHECKS = {
    "0.23.0 aarch64": ["vllm-ascend-0.23.0", "--arch", "aarch64", "--python", "3.11"],
    "0.23.0 glibc 2.28": ["vllm-ascend-0.23.0", "--arch", "aarch64", "--python", "3.11", "--glibc", "2.28"],
    "handbook": ["handbook", "--arch", "aarch64", "--index-url", PYPI],
    "vllm-ascend-0.11.0": ["vllm-ascend-0.11.0", "--arch", "x86_64", "--index-url", PYPI],
    "vllm-ascend-0.13.0": ["vllm-ascend-0.13.0", "--arch", "aarch64", "--index-url", PYPI],
    # aarch64: the profile refuses x86_64 with its CANN (known_issues, vllm-ascend#7993)
    "vllm-ascend-0.18.0": ["vllm-ascend-0.18.0", "--arch", "aarch64", "--index-url", PYPI],
    "vllm-ascend-0.23.0": ["vllm-ascend-0.23.0", "--arch", "x86_64", "--index-url", PYPI],
}


@pytest.fixture(scope="module")
def pypi() -> None:
    try:
        requests.head(PYPI, timeout=5)
    except requests.RequestException:
        pytest.skip("PyPI did not answer")


class Checks:
    """Every check of CHECKS, by the command itself, all at once (each waits mostly on PyPI), their
    output in files of their own until they are read; those still running when the test run ends
    (its tests stopped first) end with it."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.directory = Path(tempfile.mkdtemp(prefix="profile-checks-"))
        self.runs = {}
        for number, (name, args) in enumerate(CHECKS.items()):
            with open(self.directory / f"{number}.out", "w") as out, open(self.directory / f"{number}.err", "w") as err:
                self.runs[name] = (number, subprocess.Popen([str(CLI), "profile", "check", *args], stdout=out,
                                                            stderr=err, text=True, start_new_session=True))
        atexit.register(self.stop)

    def stop(self) -> None:
        for _, process in self.runs.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        shutil.rmtree(self.directory, ignore_errors=True)

    def results(self) -> dict[str, subprocess.CompletedProcess]:
        atexit.unregister(self.stop)
        done = {}
        for name, (number, process) in self.runs.items():
            returncode = process.wait()
            done[name] = subprocess.CompletedProcess(process.args, returncode,
                                                     (self.directory / f"{number}.out").read_text(),
                                                     (self.directory / f"{number}.err").read_text())
        shutil.rmtree(self.directory)
        print(f"profile checks against PyPI: {time.monotonic() - self.started:.0f} s from their start")
        return done


EARLY: list[Checks] = []


def start_early(items: list[pytest.Item]) -> None:
    """tests/conftest.py calls this once the run's tests are chosen: when one of them reads the checks,
    they start then, beside the labs, rather than hold up the tests when their turn comes."""
    if any("checked" in item.fixturenames for item in items):
        EARLY.append(Checks())


@pytest.fixture(scope="module")
def checked(pypi) -> dict[str, subprocess.CompletedProcess]:
    return (EARLY.pop() if EARLY else Checks()).results()


@pytest.mark.network  # PyPI's index
def test_pip_evaluates_markers_for_the_node_not_for_this_machine(pypi, tmp_path):
    # torch's aarch64 wheel requires triton only `platform_machine == "x86_64"`: pip left alone would ask
    # for it on an aarch64 node when it runs on an x86_64 machine. The check's pip, on stand-ins alone.
    Standin("app", "1.0", ['tool==1.0; platform_machine == "aarch64"']).write(tmp_path)
    Standin("tool", "1.0").write(tmp_path)
    (tmp_path / "empty").mkdir()
    step = StepResolver(load_profile("vllm-ascend-0.13.0"), Indexes(), resolver_pip(Indexes(), PYPI, tmp_path))
    for arch, expected in (("aarch64", ["app", "tool"]), ("x86_64", ["app"])):
        run = step.run_pip(Platform(arch, "3.11", "2.35"), [(tmp_path / "empty").as_uri()], tmp_path, ["app"],
                           tmp_path / "report.json")
        assert run.returncode == 0, run.stderr
        installs = json.loads((tmp_path / "report.json").read_text())["install"]
        assert sorted(i["metadata"]["name"] for i in installs) == expected


def problem_lines(run: subprocess.CompletedProcess) -> list[str]:
    """The lines that report a problem: neither a note nor a platform's summary."""
    return [line for line in run.stdout.splitlines() if ": note: " not in line and not SUMMARY.match(line)]


@pytest.mark.network  # PyPI's index
def test_0_23_0_on_aarch64_names_triton_ascend_from_huaweis_index_and_no_other_package(checked):
    run = checked["0.23.0 aarch64"]
    assert run.returncode == 1
    where = "vllm-ascend-0.23.0 aarch64 Python 3.11 glibc 2.35"
    packages = [line for line in problem_lines(run) if " did not answer (" not in line]
    # Step 3 installs vllm-ascend, step 5 triton-ascend again after the uninstall (Dockerfile:69-71 at v0.23.0).
    assert packages == [f"{where} step 3: triton-ascend==3.2.2 (required by vllm-ascend) is not on {PYPI}; the "
                        f"profile takes it from {HUAWEI} (pip.sources), which did not answer",
                        f"{where} step 5: triton-ascend==3.2.2 is not on {PYPI}; the "
                        f"profile takes it from {HUAWEI} (pip.sources), which did not answer"]
    summary = run.stdout.splitlines()[-1]
    assert summary.startswith(f"{where}: 2 problems: step 1 (vllm==0.23.0): ")
    assert "triton-ascend 3.2.2 not checked, arctic-inference 0.1.1 built on the node; step 4 (uninstall triton " \
           "triton-ascend); step 5 (triton-ascend==3.2.2 " in summary
    assert summary.endswith("triton-ascend 3.2.2 not checked")


@pytest.mark.network  # PyPI's index
def test_0_23_0_on_glibc_2_28_has_no_vllm_ascend_wheel_its_wheels_being_manylinux_2_34(checked):
    run = checked["0.23.0 glibc 2.28"]
    assert run.returncode == 1
    assert ("vllm-ascend-0.23.0 aarch64 Python 3.11 glibc 2.28 step 3: vllm-ascend==0.23.0 has no wheel for aarch64 "
            "Python 3.11 glibc 2.28: its wheels are for manylinux_2_34_aarch64 (cp310, cp311, cp312)") in run.stdout


@pytest.mark.network  # PyPI's index
@pytest.mark.parametrize("name", ["vllm-ascend-0.11.0", "vllm-ascend-0.13.0", "vllm-ascend-0.18.0",
                                  "vllm-ascend-0.23.0"])
def test_each_real_profile_resolves_on_pypi_but_for_what_it_takes_from_its_other_indexes(checked, name):
    profile = load_profile(name)
    run, sources = checked[name], profile.pip.sources
    allowed = [f"is not on {PYPI}; the profile takes it from {url} (pip.sources), which is not among the indexes "
               f"checked" for url in sources.values()]
    # a build over a pin from its own source (0.18.0: vllm-ascend's object storage, which no machine here reaches)
    builds = [f" from {step.source}; " for step in profile.pip.install if isinstance(step, OverrideStep)]
    assert all(any(line.endswith(a) for a in allowed) or any(b in line and " over its pin: " in line for b in builds)
               for line in problem_lines(run)), run.stdout
    assert run.returncode == (1 if problem_lines(run) else 0)
    summary = run.stdout.splitlines()[-1]
    assert "not resolved" not in summary and "; step 2 (" in summary, summary


@pytest.mark.network  # PyPI's index
@pytest.mark.parametrize("name", ["vllm-ascend-0.11.0", "vllm-ascend-0.13.0", "vllm-ascend-0.18.0",
                                  "vllm-ascend-0.23.0", "0.23.0 aarch64"])
def test_each_real_profiles_end_state_leaves_only_what_it_accepts(checked, name):
    """What all the steps leave together, judged as the stack gate's pip check (0.11.0 and 0.23.0 on x86_64,
    whose +cpu torch is judged from a stand-in; 0.13.0, 0.18.0 and 0.23.0 on aarch64; the aarch64 locks of
    test_profile_lock judge 0.11.0's too)."""
    ends = [line for line in checked[name].stdout.splitlines() if ": end state: " in line]
    assert not [line for line in ends if "`pip check` would say" in line or "not judged" in line], ends
    (summary,) = [line for line in ends if "`pip check` complaints" in line]
    complaints, accepted = re.search(r"(\d+) `pip check` complaints, (\d+) accepted", summary).groups()
    assert int(complaints) > 0 and complaints == accepted, summary


@pytest.mark.network  # PyPI's index
def test_the_committed_lock_of_0_18_0_on_aarch64_is_accepted_and_the_platforms_summary_stays_last(checked):
    lines = checked["vllm-ascend-0.18.0"].stdout.splitlines()
    assert ("vllm-ascend-0.18.0 aarch64 Python 3.11 glibc 2.35: note: lock vllm-ascend-0.18.0.aarch64-py3.11.txt "
            "accepted: 193 packages, each hashed, made from this profile, meeting every step's pins") in lines
    assert SUMMARY.match(lines[-1]) and ": note: " not in lines[-1]


@pytest.mark.network  # PyPI's index
def test_the_handbook_says_why_it_cannot_install(checked):
    run = checked["handbook"]
    assert run.returncode == 1
    where = "handbook aarch64 Python 3.10 glibc 2.35"
    assert problem_lines(run) == [
        f"{where} step 1: vllm==0.7.3 has no wheel for aarch64 Python 3.10 glibc 2.35: its wheels are for "
        "manylinux1_x86_64 (cp38-abi3); pip would build its source vllm-0.7.3.tar.gz on the node (list it under "
        "pip.source_builds if that is meant)",
        f"{where} step 2: conflict: step 2 asks for torch-npu==2.4.0.post2; vllm-ascend 0.7.3 depends on "
        "torch-npu==2.5.1"]
