"""`ascend-fleet profile new`: a candidate profile from what the index shows of a vllm-ascend release, and the
go / no-go report. The index is a fake holding files built here in the shapes PyPI serves (a source archive with
PKG-INFO, Dockerfile and versioning policy; wheels with METADATA and RECORD); the steps' environments, the check
and the lock are fakes too: nothing here reaches the network."""

from __future__ import annotations

import hashlib
import io
import tarfile
import time
import zipfile

import pytest
import yaml

from ascend_fleet.config.profile import load_profile
from ascend_fleet.core.errors import FleetError
from ascend_fleet.fleet.profile_check import Check, Indexes, IndexFile, Platform, PlatformResult, Problem, StepResult
from ascend_fleet.fleet.profile_lock import Dist, Lock, LockError
from ascend_fleet.fleet.profile_new import (
    Candidate,
    Judges,
    judge,
    newest_prerelease,
    qualify_candidate,
    read_release,
    write_candidate,
)

PYPI = "https://pypi.org/simple"
HUAWEI = "https://mirrors.huaweicloud.com/ascend/repos/pypi"
CPU = "https://download.pytorch.org/whl/cpu/"
AARCH64 = Platform("aarch64", "3.11", "2.35")
# Upstream's Dockerfile at v0.23.0.post1, the lines the command reads (numbers as in the real file: 42, 52-53, 65-71).
DOCKERFILE = "\n".join(["#"] * 41 + [
    "ARG VLLM_TAG=v0.23.0",
    *["#"] * 9,
    'RUN VLLM_TARGET_DEVICE="empty" python3 -m pip install -e /vllm-workspace/vllm/[audio] --extra-index '
    f"{CPU} && \\",
    "    python3 -m pip uninstall -y triton && \\",
    "    python3 -m pip cache purge",
    *["#"] * 10,
    f'RUN export PIP_EXTRA_INDEX_URL="{HUAWEI}" && \\',
    "    export VLLM_BATCH_INVARIANT=1 && \\",
    "    source /usr/local/Ascend/ascend-toolkit/set_env.sh && \\",
    "    source /usr/local/Ascend/nnal/atb/set_env.sh && \\",
    f"    python3 -m pip install -e /vllm-workspace/vllm-ascend/ --extra-index {CPU} && \\",
    "    python3 -m pip uninstall -y triton triton-ascend && \\",
    f"    python3 -m pip install triton-ascend==3.2.2 --extra-index-url {HUAWEI} && \\",
    "    python3 -m pip cache purge",
]) + "\n"
POLICY = ("| vLLM Ascend | vLLM | Python | Stable CANN | PyTorch/torch_npu | Triton Ascend |\n"
          "| v0.23.0.post1 | v0.23.0 | >= 3.10, < 3.13 | 9.1.0 | 2.10.0 / 2.10.0.post4 | 3.2.2 |\n")
PKG_INFO = """Metadata-Version: 2.4
Name: vllm_ascend
Version: 0.23.0.post1
Classifier: Programming Language :: Python :: 3.10
Classifier: Programming Language :: Python :: 3.11
Classifier: Programming Language :: Python :: 3.12
Requires-Python: >=3.10
Requires-Dist: torch==2.10.0
Requires-Dist: torch-npu==2.10.0.post4
Requires-Dist: triton-ascend==3.2.2
Requires-Dist: memfabric_hybrid==1.2.0
Requires-Dist: transformers==5.5.4
Requires-Dist: fastapi<0.124.0
Dynamic: requires-dist

"""


def sdist(top: str, files: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, text in files.items():
            member = tarfile.TarInfo(f"{top}/{name}")
            member.size = len(text.encode())
            archive.addfile(member, io.BytesIO(text.encode()))
    return buffer.getvalue()


def wheel(name: str, version: str, modules: dict[str, str]) -> bytes:
    """A wheel whose RECORD lists each module path with its content's hash, as a real RECORD does."""
    buffer, info = io.BytesIO(), f"{name}-{version}.dist-info"
    rows = [f"{path},sha256={hashlib.sha256(text.encode()).hexdigest()},{len(text)}" for path, text in modules.items()]
    with zipfile.ZipFile(buffer, "w") as archive:
        for path, text in modules.items():
            archive.writestr(path, text)
        archive.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        archive.writestr(f"{info}/RECORD", "\n".join([*rows, f"{info}/RECORD,,"]) + "\n")
    return buffer.getvalue()


# What each distribution installs: triton and triton-ascend both own triton/ with other content; two NVIDIA-style
# namespace packages share an identical empty __init__.py, which is no clash.
MODULES = {
    "vllm": {"vllm/__init__.py": "vllm"}, "torch": {"torch/__init__.py": "torch"},
    "triton": {"triton/__init__.py": "cuda triton", "triton/language.py": "cuda"},
    "triton-ascend": {"triton/__init__.py": "ascend triton", "triton/language.py": "ascend"},
    "torch-npu": {"torch_npu/__init__.py": "npu"}, "transformers": {"transformers/__init__.py": "t"},
    "memfabric-hybrid": {"memfabric_hybrid/__init__.py": "m"},
    "nsa-one": {"nsa/__init__.py": "", "nsa/one.py": "1"}, "nsa-two": {"nsa/__init__.py": "", "nsa/two.py": "2"},
    # flashinfer-python 0.6.12 and torch-c-dlpack-ext 0.1.5 both ship a stray build_backend.py (their real RECORDs)
    "flashinfer-python": {"flashinfer/__init__.py": "f", "build_backend.py": "one"},
    "torch-c-dlpack-ext": {"torch_c_dlpack_ext/__init__.py": "d", "build_backend.py": "two"},
}


class FakePyPI(Indexes):
    """PyPI as the command reads it: project pages and files, built here; every other index does not answer."""

    def __init__(self, versions=("0.23.0", "0.23.0.post1", "0.29.0rc1", "0.30.0rc2", "0.9.2rc1")) -> None:
        super().__init__()
        self.unanswered = {HUAWEI: "mirrors.huaweicloud.com does not resolve",
                           CPU: "download.pytorch.org does not resolve"}
        self.contents: dict[str, bytes] = {}
        self.pages: dict[str, list[IndexFile]] = {}
        for version in versions:
            self.add("vllm-ascend", f"vllm_ascend-{version}.tar.gz", sdist(f"vllm_ascend-{version}", {
                "PKG-INFO": PKG_INFO.replace("0.23.0.post1", version), "Dockerfile": DOCKERFILE,
                "docs/source/community/versioning_policy.md": POLICY}))
        for name, version in [("vllm", "0.23.0"), ("torch", "2.11.0"), ("torch", "2.10.0"), ("triton", "3.6.0"),
                              ("triton-ascend", "3.2.0"), ("transformers", "5.5.4"), ("memfabric-hybrid", "1.2.0"),
                              ("nsa-one", "1.0"), ("nsa-two", "1.0"), ("flashinfer-python", "0.6.12"),
                              ("torch-c-dlpack-ext", "0.1.5")]:
            self.add(name, f"{name.replace('-', '_')}-{version}-py3-none-any.whl",
                     wheel(name.replace("-", "_"), version, MODULES[name]))
        for arch in ("aarch64", "x86_64"):
            self.add("torch-npu", f"torch_npu-2.10.0.post4-cp311-cp311-manylinux_2_28_{arch}.whl",
                     wheel("torch_npu", "2.10.0.post4", MODULES["torch-npu"]))

    def add(self, project: str, filename: str, content: bytes) -> None:
        url = f"https://files.example/{filename}"
        self.pages.setdefault(project, []).append(IndexFile(filename, url, ">=3.10"))
        self.contents[url] = content

    def probe(self, urls: list[str]) -> None:
        pass

    def files(self, index: str, name: str) -> list[IndexFile]:
        return self.pages.get(name, []) if index == PYPI else []

    def fetch(self, file: IndexFile) -> bytes:
        return self.contents[file.url]


def dist(version: str, index: str = PYPI, unread: str | None = None) -> Dist:
    return Dist(version, index, unread=unread)


# What each install step leaves, as pip does (a later step keeps what an earlier one left): vLLM's torch 2.11.0
# requires CUDA triton; vllm-ascend's torch 2.10.0 requires it again, and vllm-ascend brings triton-ascend 3.2.2,
# which only Huawei's index (not answering) has: a stand-in, as profile_lock's StandinSupplier gives.
STEP_LEAVES = {
    "vllm": {"vllm": dist("0.23.0"), "torch": dist("2.11.0"), "triton": dist("3.6.0"),
             "nsa-one": dist("1.0"), "nsa-two": dist("1.0"), "flashinfer-python": dist("0.6.12")},
    "vllm-ascend": {"torch": dist("2.10.0"), "triton": dist("3.6.0"), "torch-npu": dist("2.10.0.post4"),
                    "transformers": dist("5.5.4"), "memfabric-hybrid": dist("1.2.0"), "torch-c-dlpack-ext": dist("0.1.5"),
                    "triton-ascend": dist("3.2.2", HUAWEI, unread=f"{HUAWEI} did not answer")},
    "triton-ascend": {"triton-ascend": dist("3.2.2", HUAWEI, unread=f"{HUAWEI} did not answer")},
}


def steps_leave(profile, platform) -> dict[str, Dist]:
    environment: dict[str, Dist] = {}
    for step in profile.pip.install:
        if hasattr(step, "remove"):
            for name in step.remove:
                environment.pop(name, None)
        else:
            environment.update(STEP_LEAVES[step.requires[0].split("==")[0]])
    return environment


def check_finding(*problems: str):
    def check(profile, platforms) -> Check:
        results = [PlatformResult(p, [StepResult(3, ["vllm-ascend==0.23.0.post1"], [PYPI], problems=[
            Problem("elsewhere", message) for message in problems])]) for p in platforms]
        return Check(profile.name, PYPI, {}, {PYPI: [1, 3]}, results)
    return check


def locks_as(refused: dict[str, str]):
    def lock(profile, platform) -> Lock:
        if platform.arch in refused:
            raise LockError(refused[platform.arch])
        return Lock(profile, platform, {"vllm": dist("0.23.0")}, [], "# lock\nvllm==0.23.0\n")
    return lock


def candidate(indexes=None, version="0.23.0.post1") -> Candidate:
    indexes = indexes or FakePyPI()
    release = read_release(indexes, PYPI, version)
    judges = Judges(steps_leave, check_finding(), locks_as({}))
    return qualify_candidate(release, "3.11", "2.35", indexes, judges, lambda line: None)


def test_the_newest_release_candidate_is_found_by_version_order_not_by_listing_order():
    assert newest_prerelease(FakePyPI(), PYPI) == "0.30.0rc2"  # not 0.9.2rc1, listed last; not the post release
    with pytest.raises(FleetError, match="lists no pre-release of vllm-ascend"):
        newest_prerelease(FakePyPI(versions=("0.23.0",)), PYPI)


def test_a_version_the_index_lacks_is_refused_naming_the_newest_there():
    with pytest.raises(FleetError, match=r"has no vllm-ascend 0.24.0; newest there: 0.30.0rc2, 0.29.0rc1"):
        read_release(FakePyPI(), PYPI, "0.24.0")


def test_a_source_only_release_is_read_from_its_pkg_info_and_said_to_be_built_on_the_node():
    release = read_release(FakePyPI(), PYPI, "0.23.0.post1")
    assert release.pin("memfabric-hybrid") == "1.2.0" and release.pin("fastapi") is None
    assert release.requires_from.startswith("vllm_ascend-0.23.0.post1.tar.gz PKG-INFO (no wheel on the index")
    assert "the build may change them" in release.requires_from
    assert release.pythons == ["3.10", "3.11", "3.12"]
    assert release.policy_row == ("| v0.23.0.post1 | v0.23.0 | >= 3.10, < 3.13 | 9.1.0 | 2.10.0 / 2.10.0.post4 | "
                                  "3.2.2 |", 2)


def test_the_candidate_takes_its_pins_from_the_metadata_and_vllm_from_upstreams_dockerfile():
    made = candidate()
    stack = made.data["stack"]
    assert (stack["vllm"], stack["vllm_ascend"], stack["torch"], stack["torch_npu"], stack["transformers"]) == (
        "0.23.0", "0.23.0.post1", "2.10.0", "2.10.0.post4", "5.5.4")
    assert {key for key, value in stack.items() if value is None} == {
        "driver", "driver_firmware_range", "firmware", "cann", "nnal", "hccl_port_span"}
    assert "vllm 0.23.0 (upstream's image builds on it: ARG VLLM_TAG, vllm_ascend-0.23.0.post1.tar.gz:Dockerfile:42)" \
        in made.facts
    assert made.data["arch"] == ["x86_64", "aarch64"]  # torch-npu's wheels: the release has none
    # triton-ascend 3.2.2 is not on PyPI: upstream installs it by name from Huawei's index; the release itself
    # has no wheel, so pip builds it on the node
    assert made.data["pip"]["sources"] == {"triton-ascend": HUAWEI}
    assert made.data["pip"]["source_builds"] == ["vllm-ascend"]


def test_clashing_distributions_get_the_uninstalls_upstreams_image_runs_and_namespace_packages_none():
    made = candidate()
    steps = made.data["pip"]["install"]
    assert [step.get("requires") or ["remove", *step["remove"]] for step in steps] == [
        ["vllm"], ["remove", "triton"], ["vllm-ascend", "torch", "torch-npu", "transformers"],
        ["remove", "triton", "triton-ascend"], ["triton-ascend==3.2.2"]]
    assert [step["extra_index_urls"] for step in steps if "requires" in step] == [[CPU], [HUAWEI, CPU], [HUAWEI]]
    assert made.whys[1] == ("triton 3.6.0 and triton-ascend 3.2.2 both install triton/ (2 files with different "
                            "content); upstream's image uninstalls the same (vllm_ascend-0.23.0.post1.tar.gz:"
                            "Dockerfile:53)")
    assert made.whys[3].endswith("(vllm_ascend-0.23.0.post1.tar.gz:Dockerfile:70)")
    # triton-ascend's own files are on Huawei's index: PyPI's nearest release stood in, and the report says so
    assert any(note.startswith("triton-ascend 3.2.2's files are not readable here") and
               "triton_ascend-3.2.0-py3-none-any.whl" in note for note in made.notes)
    assert not any("nsa" in why or "build_backend" in why for why in made.whys)
    assert "flashinfer-python and torch-c-dlpack-ext both install build_backend.py at site-packages' top, no " \
           "package of either: left as it is" in made.notes


def test_the_written_candidate_is_its_data_and_a_deploy_refuses_it_naming_the_unknown_keys(tmp_path):
    made = candidate()
    report = judge(made, [AARCH64], Judges(steps_leave, check_finding(), locks_as({})), FakePyPI(), tmp_path, time.monotonic())
    text = report.path.read_text()
    assert "# unknown: CANN's environment variable reference for this CANN, under HCCL_IF_BASE_PORT" in text
    assert "  cann: null" in text
    with pytest.raises(FleetError) as refused:
        load_profile("vllm-ascend-0.23.0.post1", tmp_path)
    assert str(refused.value).startswith(f"profile vllm-ascend-0.23.0.post1: {report.path}: stack.")
    assert "\n" not in str(refused.value)
    assert (tmp_path / "locks" / "vllm-ascend-0.23.0.post1.aarch64-py3.11.txt").read_text() == "# lock\nvllm==0.23.0\n"


def test_the_report_is_no_go_with_a_line_for_each_unknown_unreachable_index_check_problem_and_lock():
    made = candidate()
    judges = Judges(steps_leave, check_finding("torch==2.10.0+cpu (required by torch-npu) is not on PyPI"),
                    locks_as({"x86_64": "step 3 (vllm-ascend) does not resolve: no torch==2.10.0+cpu"}))
    platforms = [AARCH64, Platform("x86_64", "3.11", "2.35")]
    report = judge(made, platforms, judges, FakePyPI(), None, time.monotonic())
    assert not report.go
    assert report.reasons == [
        *(f"stack.{key} unknown: a deploy refuses the candidate until it is filled in"
          for key in ("driver_firmware_range", "driver", "firmware", "cann", "nnal", "hccl_port_span")),
        "packages.files unknown: a deploy refuses the candidate until it is filled in",
        f"index {HUAWEI} not reachable (mirrors.huaweicloud.com does not resolve)",
        f"index {CPU} not reachable (download.pytorch.org does not resolve)",
        "profile check aarch64 Python 3.11 glibc 2.35 step 3: torch==2.10.0+cpu (required by torch-npu) is not on PyPI",
        "profile check x86_64 Python 3.11 glibc 2.35 step 3: torch==2.10.0+cpu (required by torch-npu) is not on PyPI",
        "profile lock x86_64 Python 3.11 glibc 2.35: step 3 (vllm-ascend) does not resolve: no torch==2.10.0+cpu"]
    lines = report.lines()
    assert lines[0] == "profile new vllm-ascend-0.23.0.post1: NO-GO (0 s)" and lines[-1].startswith("  - profile lock")


def test_go_only_when_nothing_is_unknown_unreachable_or_found():
    made = candidate()
    known = Candidate(made.name, made.data, made.whys, made.facts, [], [], [])
    indexes = FakePyPI()
    indexes.unanswered = {}
    report = judge(known, [AARCH64], Judges(steps_leave, check_finding(), locks_as({})), indexes, None, time.monotonic())
    assert report.go and report.lines()[0].startswith("profile new vllm-ascend-0.23.0.post1: GO")
    indexes.unanswered = {CPU: "no answer within 5 s"}
    assert not judge(known, [AARCH64], Judges(steps_leave, check_finding(), locks_as({})), indexes, None, time.monotonic()).go


@pytest.mark.parametrize("hostile", ["0.23.0\nname: evil", "0.23.0\r\nname: evil", "a\u2028name: evil", "a % b",
                                     'say "it"', "two words", "a; rm -rf /", "x: {y: 1}", "# not a comment"])
def test_what_the_release_says_is_written_as_yaml_reads_it_back_and_a_comment_stays_one_line(tmp_path, hostile):
    """What the index and the source archive say reaches the candidate's values and its comments (facts, each
    step's why): each value loads back as it was, and a fact with a line break stays inside its comment."""
    made = candidate()
    data = {**made.data, "summary": hostile, "upstream": {**made.data["upstream"], "note": hostile}}
    whys = [hostile, *made.whys[1:]]
    path = write_candidate(Candidate(made.name, data, whys, [*made.facts, hostile], [], [], []), tmp_path)
    text = path.read_text()
    assert yaml.safe_load(text) == data
    assert [line for line in text.splitlines() if line.startswith("name:")] == [f'name: "{made.name}"']
