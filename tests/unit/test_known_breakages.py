"""The known breakages of the version matrix (tests/known_breakages.py), each refused by `profile check` in one
line, offline: each case's recorded real metadata served as metadata-only stand-ins from a loopback index.

The end state (what all the steps leave, judged as `pip check` judges it) needs only uv: those cases run
everywhere. A step's own resolution is pip's, the check's pinned pip 26.3 wheel, which the index must
serve: the lab's wheelhouse keeps it, and it comes from PyPI the first time (those tests are `network`).
Both are what `ascend-fleet profile check` prints (its end state, then its steps); the command itself
against PyPI: test_profile_check.py."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from concurrent.futures import ThreadPoolExecutor
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from rich.console import Console

from ascend_fleet.core.package_index import PACKAGES_DIR, write_simple_index
from ascend_fleet.fleet.profile_check import RESOLVER_PIP, Check, Indexes, check_profile
from ascend_fleet.fleet.profile_lock import end_state, end_state_verdicts
from ascend_fleet.lab import publish
from ascend_fleet.lab.sim.wheels import build_metadata_standins
from tests.known_breakages import CASES, PYTHON, Breakage
from tests.loopback import refused_port

BY_NAME = {case.name: case for case in CASES}
# The cases `profile check` refuses by their end state (uv alone) and by a step's resolution (pip).
END_STATE = [case for case in CASES if all(": end state: " in line for line in case.refusals)]
STEPS = [case for case in CASES if case not in END_STATE]
# Huawei's indexes, where the 0.23.0 steps take triton-ascend 3.2.2 from: a loopback port nothing listens on, as
# they answer nowhere here (the check stands in for what they hold, and says so).
UNANSWERED = f"http://127.0.0.1:{refused_port()}/simple"
SERVER = """\
import functools, sys
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

class Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass

server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=sys.argv[1]))
print(server.server_address[1], flush=True)
server.serve_forever()
"""


def where(case: Breakage) -> str:
    return f"{case.name} {case.platform}"


def refusals(case: Breakage) -> list[str]:
    return [line.format(where=where(case)) for line in case.refusals]


class Served:
    """Each case's closed-world index under root/<case>/simple, on one loopback HTTP server."""

    def __init__(self, root: Path) -> None:
        self.root = root
        for case in CASES:
            build_metadata_standins(case.wheels(), root / case.name / PACKAGES_DIR, case.arch, case.kept)
            write_simple_index(root / case.name)
        self.server = subprocess.Popen([sys.executable, "-c", SERVER, str(root)], stdout=subprocess.PIPE, text=True)
        self.url = f"http://127.0.0.1:{int(self.server.stdout.readline())}"

    def index(self, case: Breakage) -> str:
        return f"{self.url}/{case.name}/simple"

    def add(self, wheel: Path) -> None:
        """The wheel on every case's index beside its stand-ins."""
        for case in CASES:
            shutil.copy(wheel, self.root / case.name / PACKAGES_DIR / wheel.name)
            write_simple_index(self.root / case.name)

    def stop(self) -> None:
        self.server.kill()
        self.server.wait()


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Served:
    indexes = Served(tmp_path_factory.mktemp("breakages"))
    yield indexes
    indexes.stop()


def test_a_metadata_standin_is_its_real_wheels_name_tags_and_requirements_on_the_cases_distributions(tmp_path):
    case = BY_NAME["guide-steps-0.23.0"]
    (real,) = [wheel for wheel in case.wheels() if wheel.name == "vllm_ascend"]
    (built,) = build_metadata_standins([real], tmp_path, case.arch, case.kept)
    assert built.name == real.file  # cp311-cp311-manylinux_2_34_aarch64: what pip and uv judge the node by
    with zipfile.ZipFile(built) as archive:
        assert all(".dist-info/" in name for name in archive.namelist())
        metadata = Parser().parsestr(archive.read(f"vllm_ascend-{real.version}.dist-info/METADATA").decode())
    assert metadata["Requires-Python"] == real.requires_python
    kept = metadata.get_all("Requires-Dist")
    assert kept == [line for line in real.requires_dist if canonicalize_name(Requirement(line).name) in case.kept]
    assert "triton-ascend==3.2.2" in kept and "arctic-inference==0.1.1" in real.requires_dist


# --- the end state, from the product's own verdicts ---


@pytest.mark.parametrize("case", END_STATE, ids=lambda case: case.name)
def test_the_end_state_of_each_known_breakage_is_refused_one_line_per_complaint(case, served):
    lines, problems = end_state_verdicts(case.profile(UNANSWERED), [case.platform], [served.index(case)], Indexes())
    assert [line for line in lines if ": end state: `pip check` would say: " in line] == refusals(case), lines
    assert problems == len(case.refusals)


def test_the_0_23_0_guide_steps_leave_cuda_triton_beside_triton_ascend(served):
    """Both own site-packages/triton/ (vllm-ascend-0.23.0.yaml's Dockerfile:51-53 and :69-71 remove steps): pip
    check has nothing to say of it, so neither has the end state; the torch pins above are what refuse these steps."""
    case = BY_NAME["guide-steps-0.23.0"]
    state = end_state(case.profile(UNANSWERED), case.platform, [served.index(case)], lambda line: None, Indexes())
    assert state.environment["triton"].version == "3.6.0"  # torch 2.11.0's, on aarch64 too; torch 2.10.0's has none
    assert state.environment["triton-ascend"].version == "3.2.2"  # vllm-ascend 0.23.0's pin, from a stand-in
    assert state.environment["torch"].version == "2.10.0"


def test_a_package_the_profiles_index_lacks_altogether_is_still_stood_in_for_from_the_index_that_did_not_answer(
        served):
    """An index with no triton-ascend project at all (an operator's mirror, where PyPI has at least 3.2.0): uv says
    it "was not found in the package registry", not "there is no version of triton-ascend==3.2.2"; the end state is
    judged all the same, from the stand-in."""
    case = BY_NAME["guide-steps-0.23.0"]
    root = served.root / "no-triton-ascend"
    build_metadata_standins([w for w in case.wheels() if w.name != "triton-ascend"], root / PACKAGES_DIR, case.arch,
                            case.kept)
    write_simple_index(root)
    lines, problems = end_state_verdicts(case.profile(UNANSWERED), [case.platform], [f"{served.url}/{root.name}/simple"],
                                         Indexes())
    assert [line for line in lines if ": end state: `pip check` would say: " in line] == refusals(case), lines
    assert any(line.startswith(f"{where(case)}: end state: note: triton-ascend 3.2.2 judged from a stand-in: ")
               for line in lines), lines


# --- a step's resolution, by the check's pip ---


def resolver_pip() -> Path:
    """The check's pinned pip wheel, from the lab's wheelhouse (from PyPI into it the first time)."""
    version, _ = RESOLVER_PIP
    wheel = publish.WHEELHOUSE / f"pip-{version}-py3-none-any.whl"
    if wheel.exists():
        return wheel
    (found,) = publish.cached_wheels([f"pip=={version}"], PYTHON, "x86_64", "the check's own pip", Console(stderr=True))
    return found


@pytest.fixture(scope="module")
def checked(served) -> dict[str, Check]:
    """`profile check`'s step resolutions of each case whose steps do not resolve, all at once (each runs pip,
    which spends seconds importing itself from its wheel; `ascend-fleet profile check` prints these lines)."""
    served.add(resolver_pip())

    def check(case: Breakage) -> Check:
        return check_profile(case.profile(UNANSWERED), [case.platform], [served.index(case)], indexes=Indexes())

    with ThreadPoolExecutor(len(STEPS)) as pool:
        return dict(zip((case.name for case in STEPS), pool.map(check, STEPS)))


@pytest.mark.network  # the check's pip 26.3 wheel, from PyPI the first time
@pytest.mark.parametrize("case", STEPS, ids=lambda case: case.name)
def test_profile_check_refuses_each_known_breakage_of_a_step_in_one_line(case, checked):
    check = checked[case.name]
    problems = [line for line in check.lines() if line.startswith(f"{where(case)} step ") and ": note: " not in line]
    assert problems == refusals(case)
    assert check.problem_count == len(case.refusals)
