"""The record of the real wheels the lab's stand-ins copy: real_metadata.json.

One entry per real wheel (distribution, version, arch, for a node's Python 3.11) that
the installs of the lab's three rows reach on a real node: vllm-ascend 0.18.0
(profiles/lab.yaml), 0.11.0 (profiles/lab-previous.yaml) and 0.23.0 (profiles/lab-0.23.0.yaml),
each installed as upstream does, `pip install vllm==V` and then `pip install vllm-ascend==V torch
torch-npu`. Each entry holds the index it came from, the wheel's file name and sha256 (pip's report,
`download_info`), its `Requires-Python` and its whole `Requires-Dist`, verbatim, and the
date it was read. `ascend-fleet lab refresh-metadata` reads it again with pip itself.

torch's `+cpu` builds, which torch-npu's x86_64 wheels pin (`torch==2.8.0+cpu`), are only on
the PyTorch CPU index. Where that index did not answer, the entry says so (`unknown`) and
has no metadata; its stand-in then copies PyPI's wheel of the same version less the CUDA
packages (`standin_basis`), which is what the entry's `standin_basis` says.

The CUDA `triton` that PyPI's torch requires (`triton==3.6.0; platform_machine == "x86_64"` for
torch 2.10.0; `triton==3.6.0; platform_system == "Linux"` for 2.11.0, aarch64 too) is recorded for the
arch whose torch requires it: it shares site-packages/triton/ with triton-ascend, which the profiles'
uninstalls must meet. The builds the upstream profile (UPSTREAM_PROFILE) installs over a pin (torch_npu
2.9.0.post1+git<hash>, triton_ascend 3.2.0.dev20260322) are read from their source, and the pins PyPI does
not have (OFF_PYPI: triton-ascend 3.2.2) from the index their profile's `sources` names; where it does not
answer, their entry is unknown and the stand-in copies the recorded wheel basis_of names.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from urllib.parse import quote

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from ascend_fleet.config.profile import ARCHES, OverrideStep, is_cpu_build, load_profile
from ascend_fleet.core.errors import FleetError
from ascend_fleet.fleet.profile_check import pip_environment
from ascend_fleet.fleet.profile_lock import CUDA_PACKAGES, CUDA_PREFIXES, is_cuda_requirement
from ascend_fleet.lab.base import node_platforms

RECORD_FILE = Path(__file__).with_name("real_metadata.json")
# The profile whose builds over a pin (its override steps) the lab's profile installs as stand-ins.
UPSTREAM_PROFILE = "vllm-ascend-0.18.0"
PYPI_INDEX = "https://pypi.org/simple"
PYTORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PYTHON = "3.11"  # the rows' Python; the stand-ins carry these wheels' cp311 tags
READERS = 4  # pip runs at once: each waits on the network, not the CPU

# What the three rows' installs reach on a real node, by distribution.
REAL_WHEELS: dict[str, tuple[str, ...]] = {
    "vllm": ("0.11.0", "0.18.0", "0.23.0"),
    "vllm-ascend": ("0.11.0", "0.18.0", "0.23.0"),
    # Each vllm-ascend's pin; 2.13.0 is the real counterpart of profiles/lab-real.yaml's stand-in.
    "torch-npu": ("2.7.1", "2.9.0", "2.10.0.post4", "2.13.0"),
    # vllm-ascend 0.11.0 / 0.18.0 / 0.23.0 pin 2.7.1 / 2.9.0 / 2.10.0; vllm 0.11.0 / 0.18.0 / 0.23.0 pin
    # 2.8.0 / 2.10.0 / 2.11.0.
    "torch": ("2.7.1", "2.8.0", "2.9.0", "2.10.0", "2.11.0"),
    # vllm pins 0.23.0 / 0.25.0 / 0.26.0; vllm-ascend 0.11.0's unpinned torchvision then moves to the one whose
    # torch pin accepts its torch, 0.22.1 (torch==2.7.1); vllm-ascend 0.18.0 / 0.23.0 pin 0.24.0 / 0.25.0.
    "torchvision": ("0.22.1", "0.23.0", "0.24.0", "0.25.0", "0.26.0"),
    # vllm's pins (2.8.0 / 2.10.0 / 2.11.0); vllm-ascend 0.11.0 requires no torchaudio, 0.18.0 / 0.23.0 pin
    # 2.9.0 / 2.10.0.
    "torchaudio": ("2.8.0", "2.9.0", "2.10.0", "2.11.0"),
    # vllm-ascend 0.18.0's pin; 0.23.0's (3.2.2) is not on PyPI: OFF_PYPI.
    "triton-ascend": ("3.2.0",),
    # vllm 0.11.0 / 0.18.0 require >=4.11.0 / >=4.13.0, both vllm-ascends <=4.11.0.86: the first step takes
    # PyPI's newest (5.1.0.95, 2026-12-05, which requires numpy>=2), the vllm-ascend step moves it to 4.11.0.86.
    "opencv-python-headless": ("4.11.0.86", "5.1.0.95"),
    # vllm 0.11.0 pins 0.1.25; vllm 0.18.0 / 0.23.0 (>=0.1.32,<1 / >=0.2.0,<1) and vllm-ascend (>=0.1.30) take
    # PyPI's newest, 0.2.9 (2026-12-07). On x86_64 it requires CUDA triton, which the profiles' uninstalls
    # leave it without (their accepts: "xgrammar V requires triton").
    "xgrammar": ("0.1.25", "0.2.9"),
}

# Pins of the rows that PyPI does not have, by distribution: (version, the profile whose `sources` names the
# index that has it). vllm-ascend 0.23.0's wheel pins triton-ascend==3.2.2; PyPI's newest is 3.2.0 (its
# simple index, 2026-12-07), Dockerfile@v0.23.0:71 installs it from Huawei's index.
OFF_PYPI: dict[str, tuple[str, str]] = {
    "triton-ascend": ("3.2.2", "vllm-ascend-0.23.0"),
}

BROKEN = "connection broken by '"  # pip's warning when it retries an index that does not answer
# The OS's reason in those warnings ("[Errno -2] Name or service not known").
NO_ANSWER_ERRNO = re.compile(r"\[Errno [^\]]+\][^'\")]*")


@dataclass(frozen=True)
class RealWheel:
    """One real wheel as pip read it from an index (or, with `unknown`, could not)."""

    name: str  # METADATA's Name, as written there
    version: str
    arch: str
    index: str
    read: str  # the date it was read, ISO 8601
    file: str | None = None
    sha256: str | None = None
    requires_python: str | None = None
    requires_dist: tuple[str, ...] | None = None  # None: not known
    unknown: str | None = None  # why the metadata is not known
    standin_basis: str | None = None  # what the stand-in copies when the metadata is not known

    def matches(self, name: str, version: str, arch: str) -> bool:
        """Whether this is that distribution's wheel at that version for arch."""
        return (canonicalize_name(self.name), self.version, self.arch) == (canonicalize_name(name), version, arch)

    def sort_key(self) -> tuple[str, Version, str]:
        return canonicalize_name(self.name), Version(self.version), self.arch


def load_record(path: Path = RECORD_FILE) -> list[RealWheel]:
    """The recorded wheels; a missing or damaged record is one line saying how to make it again."""
    try:
        entries = json.loads(path.read_text())["wheels"]
        return [RealWheel(**{**entry, "requires_dist": _tuple_or_none(entry.get("requires_dist"))})
                for entry in entries]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise FleetError(f"lab: cannot read the real wheels' record {path} ({exc}); "
                         "run `ascend-fleet lab refresh-metadata` to read it again") from None


def _tuple_or_none(lines: list[str] | None) -> tuple[str, ...] | None:
    return None if lines is None else tuple(lines)


def write_record(wheels: list[RealWheel], path: Path = RECORD_FILE) -> None:
    """The record as JSON, sorted, one field a line: a refresh's diff shows what changed upstream."""
    entries = [asdict(wheel) for wheel in sorted(wheels, key=RealWheel.sort_key)]
    path.write_text(json.dumps({"python": PYTHON, "wheels": entries}, indent=1) + "\n")


def find(record: list[RealWheel], name: str, version: str, arch: str) -> RealWheel:
    """The recorded wheel of name==version for arch."""
    for wheel in record:
        if wheel.matches(name, version, arch):
            return wheel
    raise FleetError(f"lab: the real wheels' record has no {name} {version} for {arch}; "
                     "add it to REAL_WHEELS in ascend_fleet/lab/sim/real_metadata.py and run "
                     "`ascend-fleet lab refresh-metadata`")


def cpu_torch_pins(wheel: RealWheel) -> list[str]:
    """The torch `+cpu` versions a wheel pins exactly (torch-npu 2.8.0.post2 x86_64: ["2.8.0+cpu"])."""
    pins = []
    for line in wheel.requires_dist or ():
        requirement = Requirement(line)
        if canonicalize_name(requirement.name) == "torch":
            pins += [s.version for s in requirement.specifier
                     if s.operator == "==" and not s.version.endswith(".*") and is_cpu_build(s.version)]
    return pins


def basis_of(record: list[RealWheel], wheel: RealWheel) -> RealWheel:
    """The recorded wheel an unknown build copies: PyPI's of its public version (torch 2.9.0+cpu: 2.9.0), else
    the one of its release it is installed over (torch_npu 2.9.0.post1+gitdc51c2d: 2.9.0, triton_ascend
    3.2.0.dev20260322: 3.2.0), else the newest release of its minor series below it (triton-ascend 3.2.2:
    3.2.0, PyPI's newest)."""
    version = Version(wheel.version)
    known = [w for w in record if w.requires_dist is not None and w.matches(wheel.name, w.version, wheel.arch)]
    releases = [w for w in known if Version(w.version).local is None]
    same = [w for w in known if w.version == version.public] or \
        [w for w in releases if Version(w.version).release == version.release] or \
        sorted((w for w in releases if Version(w.version).release[:2] == version.release[:2]
                and Version(w.version) < version), key=lambda w: Version(w.version), reverse=True)
    if not same:
        raise FleetError(f"lab: neither {wheel.name} {wheel.version} nor a recorded wheel of its release or minor "
                         f"series has known metadata for {wheel.arch}; run `ascend-fleet lab refresh-metadata`")
    return same[0]


def standin_basis(record: list[RealWheel], wheel: RealWheel) -> RealWheel:
    """What wheel's stand-in copies: the wheel itself, or for a build whose metadata is not known the
    recorded wheel of its release (basis_of) less its CUDA packages, named with wheel's version and, when
    the record knows it, the build's own file name."""
    if wheel.requires_dist is not None:
        return wheel
    public = basis_of(record, wheel)
    return replace(public, version=wheel.version, index=wheel.index, sha256=None,
                   file=wheel.file or public.file.replace(f"-{public.version}-", f"-{wheel.version}-", 1),
                   requires_dist=tuple(line for line in public.requires_dist if not is_cuda_requirement(line)),
                   unknown=wheel.unknown, standin_basis=wheel.standin_basis)


def cuda_triton_pins(wheel: RealWheel) -> list[str]:
    """The CUDA triton versions a torch wheel requires on its own arch (torch 2.10.0 x86_64: ["3.6.0"]; none
    on aarch64, where its marker is false; torch 2.11.0: ["3.6.0"] on both)."""
    node = {"platform_system": "Linux", "platform_machine": wheel.arch, "python_version": PYTHON,
            "python_full_version": f"{PYTHON}.0", "sys_platform": "linux", "extra": ""}
    pins = []
    for line in wheel.requires_dist or ():
        requirement = Requirement(line)
        if canonicalize_name(requirement.name) == "triton" and (not requirement.marker
                                                                or requirement.marker.evaluate(node)):
            pins += [s.version for s in requirement.specifier if s.operator == "=="]
    return pins


def upstream_builds(profile_name: str) -> list[tuple[str, str, str]]:
    """(source, file, arch) of every build the upstream profile installs over a pin for the record's Python."""
    profile = load_profile(profile_name)
    return [(step.source, build.file, arch) for step in profile.pip.install if isinstance(step, OverrideStep)
            for arch in ARCHES if (build := step.build_for(arch, PYTHON)) is not None]


def read_build(source: str, file: str, arch: str, today: str) -> RealWheel:
    """A build over a pin, read from its source with pip, or an entry saying why it is not known and what its
    stand-in copies (basis_of)."""
    name, version = parse_wheel_filename(file)[:2]
    url = f"{source.rstrip('/')}/{quote(file)}"
    try:
        wheel = read_wheel(url, "", arch, PYPI_INDEX, today)
        return replace(wheel, index=source)
    except PipReadError as exc:
        distribution = file.split("-", 1)[0]
        release = ".".join(map(str, version.release))
        return RealWheel(name=distribution, version=str(version), arch=arch, index=source, read=today, file=file,
                         unknown=f"not read: {exc}",
                         standin_basis=f"PyPI's {distribution} {release} for {arch}, the pin it is installed over "
                                       f"(its Requires-Dist less CUDA packages); file name as upstream's Dockerfile "
                                       "names it")


# --- reading the record from an index, with pip ---


class PipReadError(Exception):
    """pip could not read a wheel's metadata from an index."""


def pip_report_argv(name: str, version: str, arch: str, index_url: str, target: Path, report: Path) -> list[str]:
    """pip resolving name==version alone (name alone: a URL) for a node's Python on arch and reporting it,
    downloading nothing: fast-deps reads METADATA with HTTP range requests (the index serves no PEP 658 metadata)."""
    abi = f"cp{PYTHON.replace('.', '')}"
    return [sys.executable, "-m", "pip", "--isolated", "--disable-pip-version-check", "install", "--quiet",
            "--dry-run", "--no-deps", "--ignore-installed", "--target", str(target), "--report", str(report),
            "--only-binary=:all:", *(f"--platform={tag}" for tag in node_platforms(arch)),
            "--python-version", PYTHON, "--implementation", "cp", "--abi", abi,
            "--use-feature=fast-deps", "--index-url", index_url, f"{name}=={version}" if version else name]


def pip_failure(stderr: str, returncode: int) -> str:
    """pip's reason in one line: the index not answering (its retries' last cause), else its last ERROR line."""
    broken = [line.split(BROKEN, 1)[1] for line in stderr.splitlines() if BROKEN in line]
    if broken:
        errno = NO_ANSWER_ERRNO.search(broken[-1])
        return f"the index did not answer ({broken[-1].split('(', 1)[0]}{': ' + errno[0] if errno else ''})"
    errors = [line for line in stderr.splitlines() if line.startswith("ERROR")]
    return (errors or [f"pip exited {returncode}"])[-1]


def read_wheel(name: str, version: str, arch: str, index_url: str, today: str) -> RealWheel:
    """The metadata of the wheel pip picks for name==version on arch from index_url."""
    with tempfile.TemporaryDirectory(prefix="ascend-fleet-metadata-") as tmp:
        report = Path(tmp) / "report.json"
        argv = pip_report_argv(name, version, arch, index_url, Path(tmp) / "target", report)
        result = subprocess.run(argv, capture_output=True, text=True, env=pip_environment(dict(os.environ)))
        if result.returncode != 0:
            raise PipReadError(pip_failure(result.stderr, result.returncode))
        (install,) = json.loads(report.read_text())["install"]
    metadata, download = install["metadata"], install["download_info"]
    return RealWheel(name=metadata["name"], version=metadata["version"], arch=arch, index=index_url, read=today,
                     file=download["url"].rsplit("/", 1)[-1], sha256=download["archive_info"]["hashes"]["sha256"],
                     requires_python=metadata.get("requires_python"),
                     requires_dist=tuple(metadata.get("requires_dist", ())))


def read_off_pypi(name: str, version: str, profile_name: str, arch: str, today: str) -> RealWheel:
    """A pin PyPI does not have, read from the index profile_name's `sources` names for it, or an entry saying
    why it is not known and what its stand-in copies (basis_of)."""
    index_url = load_profile(profile_name).pip.sources[name].rstrip("/")
    try:
        return read_wheel(name, version, arch, index_url, today)
    except PipReadError as exc:
        return RealWheel(name=name, version=version, arch=arch, index=index_url, read=today,
                         unknown=f"not read: {exc}",
                         standin_basis=f"PyPI's newest {name} of its minor series below it for {arch} (its "
                                       "Requires-Dist less CUDA packages, its tags); the file name is that "
                                       "wheel's with this version, not read")


def read_cpu_build(name: str, version: str, arch: str, index_url: str, today: str) -> RealWheel:
    """A +cpu build from the PyTorch CPU index, or an entry saying why it is not known."""
    try:
        return read_wheel(name, version, arch, index_url, today)
    except PipReadError as exc:
        basis = (f"PyPI's {name} {Version(version).public} for {arch}, less its CUDA packages "
                 f"({', '.join(f'{prefix}*' for prefix in CUDA_PREFIXES)}, {', '.join(sorted(CUDA_PACKAGES))})")
        return RealWheel(name=name, version=version, arch=arch, index=index_url, read=today,
                         unknown=f"not read: {exc}", standin_basis=basis)


def refresh_record(index_url: str = PYPI_INDEX, cpu_index_url: str = PYTORCH_CPU_INDEX,
                   path: Path = RECORD_FILE, progress: Callable[[str], None] = print) -> list[RealWheel]:
    """Read every wheel of REAL_WHEELS on every arch from index_url, then the +cpu torch builds the
    torch-npu wheels pin from cpu_index_url, the CUDA triton the torch wheels require, the upstream
    profile's builds over a pin from their source and OFF_PYPI's pins from their profile's index, and write
    the record. A wheel index_url does not have stops the refresh before the record is touched."""
    today = datetime.date.today().isoformat()
    wanted = [(name, version, arch) for name, versions in REAL_WHEELS.items() for version in versions
              for arch in ARCHES]

    def read(name: str, version: str, arch: str) -> RealWheel:
        try:
            wheel = read_wheel(name, version, arch, index_url, today)
        except PipReadError as exc:
            raise FleetError(f"lab: pip could not read {name}=={version} for {arch} from {index_url}: {exc}; "
                             "check the index (--index-url) or the version in REAL_WHEELS") from None
        progress(f"{name} {version} {arch}: {wheel.file}")
        return wheel

    with ThreadPoolExecutor(READERS) as pool:
        wheels = list(pool.map(read, *zip(*wanted)))
        cpu_builds = sorted({(version, wheel.arch) for wheel in wheels for version in cpu_torch_pins(wheel)})
        tritons = sorted({(version, wheel.arch) for wheel in wheels for version in cuda_triton_pins(wheel)})
        wheels += pool.map(lambda build: read_cpu_build("torch", *build, cpu_index_url, today), cpu_builds)
        wheels += pool.map(lambda pin: read("triton", *pin), tritons)
        wheels += pool.map(lambda build: read_build(*build, today), upstream_builds(UPSTREAM_PROFILE))
        wheels += pool.map(lambda pin: read_off_pypi(*pin, today),
                           [(name, version, profile, arch) for name, (version, profile) in OFF_PYPI.items()
                            for arch in ARCHES])
    for wheel in wheels[len(wanted):]:
        progress(f"{wheel.name} {wheel.version} {wheel.arch}: {wheel.unknown or wheel.file}")
    write_record(wheels, path)
    return wheels
