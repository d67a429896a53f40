"""Known breakages of the vLLM Ascend version matrix, rebuilt offline (issue 47, item 3).

Each case is a profile that breaks as a real install did (its source cited), and the real wheels it
reaches: their metadata, recorded from PyPI by `record()` into fixtures/breakages/<case>.json
(ascend_fleet/lab/sim/real_metadata.py's reader and format), becomes metadata-only stand-ins
(wheels.build_metadata_standins), one closed-world index per case: each stand-in keeps its real
Requires-Dist lines on the distributions the case names, verbatim, and no other. `profile check`'s step
resolution and end state (tests/unit/test_known_breakages.py) run against that index and refuse each case,
one line per problem.

The versions a case records are those its steps take from PyPI (uv, as `profile check`'s end state
resolves them, on the record's date), for the distributions it names, and the versions it lists besides
(the pins that do not resolve, and the release series `profile check` names beside a missing pin).

    .venv/bin/python -m tests.known_breakages     # read the records again from PyPI (a few minutes)
"""

from __future__ import annotations

import datetime
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from packaging.utils import canonicalize_name

from ascend_fleet.config.profile import Profile, PythonPackages, load_profile
from ascend_fleet.fleet.profile_check import DEFAULT_GLIBC, Indexes, Platform
from ascend_fleet.fleet.profile_lock import Dist, LockError, StandinSupplier, UvResolver, steps_environment
from ascend_fleet.lab.sim.real_metadata import PYPI_INDEX, PYTHON, RealWheel, load_record, read_wheel, write_record

FIXTURES = Path(__file__).parent / "fixtures" / "breakages"
HUAWEI = "https://mirrors.huaweicloud.com/ascend/repos/pypi"
HUAWEI_VARIANT = "https://mirrors.huaweicloud.com/ascend/repos/pypi/variant"
READERS = 4  # pip runs at once, each waiting on PyPI
STACK = ("vllm", "vllm-ascend", "torch", "torchvision", "torchaudio", "torch-npu", "transformers")


@dataclass(frozen=True)
class Breakage:
    """One known breakage: the profile that breaks, where the break is stated, and the lines `profile check`
    refuses it with (each a whole line of its output, `{where}` standing for the profile and platform)."""

    name: str
    source: str
    base: str  # the shipped profile whose other sections (vendor rows, which `profile check` does not read) it keeps
    stack: dict[str, str]
    install: list[dict]
    names: tuple[str, ...]  # the distributions of its closed world
    refusals: tuple[str, ...]
    versions: dict[str, tuple[str, ...]] = field(default_factory=dict)  # recorded besides what the steps take
    sources: dict[str, str] = field(default_factory=dict)
    arch: str = "aarch64"  # the node's, which its record is for

    @property
    def platform(self) -> Platform:
        return Platform(self.arch, PYTHON, DEFAULT_GLIBC)

    def profile(self, unanswered: str = HUAWEI) -> Profile:
        """The broken profile; unanswered takes the place of Huawei's indexes (which do not answer here either)."""
        base = load_profile(self.base)
        swap = {HUAWEI: unanswered, HUAWEI_VARIANT: unanswered}
        install = [{**step, **({"extra_index_urls": [swap.get(u, u) for u in step["extra_index_urls"]]}
                               if "extra_index_urls" in step else {})} for step in self.install]
        pip = PythonPackages(index_url=PYPI_INDEX, install=install, source_builds=base.pip.source_builds,
                             sources={name: swap.get(url, url) for name, url in self.sources.items()})
        return base.model_copy(update={"name": self.name, "arch": [self.arch], "known_issues": [],
                                       "stack": base.stack.model_copy(update=self.stack), "pip": pip, "router": None})

    @property
    def record_path(self) -> Path:
        return FIXTURES / f"{self.name}.json"

    @property
    def kept(self) -> frozenset[str]:
        return frozenset(canonicalize_name(name) for name in self.names)

    def wheels(self) -> list[RealWheel]:
        """The recorded wheels of its closed world."""
        return load_record(self.record_path)


def guide_steps(*, accepts: tuple[str, ...] = (), huawei: bool = False) -> list[dict]:
    """The installation guides' two pip runs: `pip install vllm==V`, then `pip install vllm-ascend==V` (the
    profile's pins for torch, torch-npu and transformers named, as every profile names them)."""
    second = {"requires": ["vllm-ascend", "torch", "torch-npu", "transformers"]}
    if huawei:
        second["extra_index_urls"] = [HUAWEI_VARIANT, HUAWEI]
    if accepts:
        second["accepts"] = list(accepts)
    return [{"requires": ["vllm"]}, second]


# PyPI's torch-npu 2.7.1 series (the records' date): what `profile check` lists beside a 2.7.1 pin it lacks.
TORCH_NPU_2_7_1 = ("2.7.1rc1", "2.7.1", "2.7.1.post2", "2.7.1.post4", "2.7.1.post6", "2.7.1.post8", "2.7.1.post10",
                   "2.7.1.post11")

# vllm-ascend-0.23.0's steps as the profile had them before issue 47: the installation guide's two pip runs alone.
GUIDE_ONLY_0_23_0 = guide_steps(huawei=True)

WHERE = "{where}"
CASES = [
    Breakage(
        "opencv-pins-0.18.0",
        "vllm 0.18.0's Requires-Dist `opencv-python-headless>=4.13.0`, vllm-ascend 0.18.0's `<=4.11.0.86` (PyPI, "
        "the record's date); ascend_fleet/profiles/vllm-ascend-0.18.0.yaml accepts it as upstream's image leaves it; "
        "a user's pip says the same line (vllm-project/vllm-ascend#8286)",
        "vllm-ascend-0.18.0", {},
        guide_steps(accepts=("vllm 0.18.0 has requirement torch==2.10.0", "vllm 0.18.0 has requirement torchaudio==2.10.0",
                             "vllm 0.18.0 has requirement torchvision==0.25.0")),
        (*STACK, "opencv-python-headless"),
        (f"{WHERE}: end state: `pip check` would say: vllm 0.18.0 has requirement opencv-python-headless>=4.13.0, but "
         "you have opencv-python-headless 4.11.0.86. (not among the profile's accepts)",)),
    Breakage(
        "guide-steps-0.23.0",
        "vllm-ascend-0.23.0's steps before issue 47 (docs/source/installation.md at v0.23.0, lines 175-181: the "
        "guide's two pip runs alone); PyPI's vllm 0.23.0 pins torch==2.11.0, torch 2.11.0 requires triton==3.6.0 on "
        "Linux, prometheus-fastapi-instrumentator 8.1.0 requires starlette>=1.0.0 and vllm-ascend 0.23.0's "
        "fastapi<0.124.0 keeps it below 0.51 (the wheels' Requires-Dist, PyPI, the record's date)",
        "vllm-ascend-0.23.0", {}, GUIDE_ONLY_0_23_0,
        # triton-ascend: vllm-ascend's pin, from Huawei's index, which does not answer here: a stand-in of the check's
        (*STACK, "triton", "triton-ascend", "fastapi", "starlette", "prometheus-fastapi-instrumentator"),
        (f"{WHERE}: end state: `pip check` would say: prometheus-fastapi-instrumentator 8.1.0 has requirement "
         "starlette<2.0.0,>=1.0.0, but you have starlette 0.50.0. (not among the profile's accepts)",
         f"{WHERE}: end state: `pip check` would say: vllm 0.23.0 has requirement torch==2.11.0, but you have torch "
         "2.10.0. (not among the profile's accepts)",
         f"{WHERE}: end state: `pip check` would say: vllm 0.23.0 has requirement torchaudio==2.11.0, but you have "
         "torchaudio 2.10.0. (not among the profile's accepts)",
         f"{WHERE}: end state: `pip check` would say: vllm 0.23.0 has requirement torchvision==0.26.0, but you have "
         "torchvision 0.25.0. (not among the profile's accepts)"),
        # PyPI's newest triton-ascend (vllm-ascend's 3.2.2 is Huawei's alone): the check's resolver is told there
        # is no version 3.2.2, and stands in for the file of the index that did not answer
        versions={"triton-ascend": ("3.2.0",)}, sources={"triton-ascend": HUAWEI}),
    Breakage(
        "torch-npu-2.7.1.post1",
        "vllm-ascend's versioning policy (docs/source/community/versioning_policy.md at v0.13.0, line 28): the "
        "v0.11.0 row's torch_npu is 2.7.1.post1, which PyPI never had (its 2.7.1 series: the record)",
        "vllm-ascend-0.11.0", {"torch_npu": "2.7.1.post1"}, guide_steps(), STACK,
        (f"{WHERE} step 2: torch-npu==2.7.1.post1: no index checked has it; versions there: "
         f"{', '.join(TORCH_NPU_2_7_1)}",),
        versions={"torch-npu": TORCH_NPU_2_7_1, "torch": ("2.7.1",), "vllm-ascend": ("0.11.0",),
                  "transformers": ("4.57.1",)}),
    Breakage(
        "issue-1796-0.9.2rc1",
        "vllm-project/vllm-ascend#1796: `pip install vllm==0.9.2`, then `pip install vllm-ascend==0.9.2rc1`: 'could "
        "not find a version that satisfies the requirement torch-npu==2.5.1.post1.dev20250619' (vllm-ascend 0.9.2rc1's "
        "Requires-Dist, pyproject.toml at v0.9.2rc1 line 15; only Huawei's index had it, closed as the reporter's "
        "network); on x86_64, where PyPI has vllm 0.9.2's wheel (aarch64 nodes built it from source)",
        "vllm-ascend-0.11.0",
        {"vllm": "0.9.2", "vllm_ascend": "0.9.2rc1", "torch": "2.5.1", "torch_npu": "2.5.1.post1.dev20250619",
         "transformers": "4.52.4"},  # vllm-ascend 0.9.2rc1's pins
        guide_steps(), STACK,
        (f"{WHERE} step 2: torch-npu==2.5.1.post1.dev20250619: no index checked has it; versions there: 2.5.1rc1, "
         "2.5.1, 2.5.1.post1",),
        versions={"torch-npu": ("2.5.1rc1", "2.5.1", "2.5.1.post1"), "torch": ("2.5.1",),
                  "vllm-ascend": ("0.9.2rc1",), "transformers": ("4.52.4",)}, arch="x86_64"),
    Breakage(
        "issue-3793-0.11.0rc0",
        "vllm-project/vllm-ascend#3793 ('v0.11.0 required a not exist version of torch-npu'): with vllm 0.11.0 "
        "installed, `pip install vllm-ascend==0.11.0rc0` from a PyPI mirror; its Requires-Dist pins "
        "torch-npu==2.7.1.dev20250724 (pyproject.toml at v0.11.0rc0 line 15), on Huawei's index alone",
        "vllm-ascend-0.11.0", {"vllm_ascend": "0.11.0rc0", "torch_npu": "2.7.1.dev20250724"}, guide_steps(), STACK,
        (f"{WHERE} step 2: torch-npu==2.7.1.dev20250724: no index checked has it; versions there: "
         f"{', '.join(TORCH_NPU_2_7_1)}",),
        versions={"torch-npu": TORCH_NPU_2_7_1, "torch": ("2.7.1",), "vllm-ascend": ("0.11.0rc0",),
                  "transformers": ("4.57.1",)}),
    Breakage(
        "issue-5710-0.11.0",
        "vllm-project/vllm-ascend#5710 ('vllm-ascend 0.11.0 does not compatible with vllm 0.11.0 for mismatch of "
        "pytorch version'; its error is a screenshot, not readable here): vllm 0.11.0 and vllm-ascend 0.11.0 in one "
        "pip run, which the maintainer's answer (install vLLM first, then vLLM Ascend) implies; their wheels pin "
        "torch==2.8.0 and torch==2.7.1",
        "vllm-ascend-0.11.0", {}, [{"requires": ["vllm", "vllm-ascend", "torch", "torch-npu", "transformers"]}], STACK,
        (f"{WHERE} step 1: conflict: step 1 asks for torch==2.7.1; vllm 0.11.0 depends on torch==2.8.0",),
        versions={"vllm": ("0.11.0",), "vllm-ascend": ("0.11.0",), "torch": ("2.7.1", "2.8.0"), "torch-npu": ("2.7.1",),
                  "torchvision": ("0.22.1", "0.23.0"), "torchaudio": ("2.8.0",), "transformers": ("4.57.1",)}),
]


def versions_the_steps_take(case: Breakage, index_url: str = PYPI_INDEX,
                            progress: Callable[[str], None] = print) -> dict[str, set[str]]:
    """{name: versions} of the case's distributions that its install steps' resolutions take, as
    `profile check`'s end state resolves them (uv, step by step), up to the first step that does not resolve."""
    taken: dict[str, set[str]] = {}

    class Recording(UvResolver):
        def compile(self, *args, **kwargs) -> tuple[dict[str, Dist], str]:
            resolved, text = super().compile(*args, **kwargs)
            for name, dist in resolved.items():
                if name in case.kept:
                    taken.setdefault(name, set()).add(dist.version)
            return resolved, text

    profile, indexes = case.profile(), Indexes()
    indexes.probe([index_url])
    with tempfile.TemporaryDirectory(prefix="ascend-fleet-breakage-") as workdir:
        resolver = Recording(case.platform, [index_url], profile.pip.source_builds, Path(workdir))
        standins = StandinSupplier(profile, case.platform, index_url, indexes)
        try:
            steps_environment(profile, case.platform, resolver, progress, standins)
        except LockError as exc:  # a pin no index has: the case lists what it records of that step
            progress(f"{case.name}: {exc}")
    for name, dist in standins.given.items():  # the check's own stand-ins for an index that did not answer
        taken[name].discard(dist.version)
    return taken


def record(case: Breakage, progress: Callable[[str], None] = print) -> list[RealWheel]:
    """Read the case's wheels from PyPI with pip (real_metadata.read_wheel) and write its record."""
    today = datetime.date.today().isoformat()
    taken = versions_the_steps_take(case, progress=progress)
    for name, versions in case.versions.items():
        taken.setdefault(canonicalize_name(name), set()).update(versions)
    progress(f"{case.name}: " + "; ".join(f"{name} {' '.join(sorted(v))}" for name, v in sorted(taken.items())))
    wanted = sorted((name, version) for name, versions in taken.items() for version in versions)
    with ThreadPoolExecutor(READERS) as pool:
        wheels = list(pool.map(lambda pin: read_wheel(*pin, case.arch, PYPI_INDEX, today), wanted))
    write_record(wheels, case.record_path)
    return wheels


if __name__ == "__main__":  # every case, or those named
    FIXTURES.mkdir(parents=True, exist_ok=True)
    for breakage in CASES:
        if breakage.name in sys.argv[1:] or len(sys.argv) == 1:
            record(breakage)
