"""What a deploy of the lab's profiles fetches, published on the lab mirror.

For each profile: its vendor .run files (files/, with SHA256SUMS), its Python packages
(packages/ and the PEP 503 pages in simple/: stand-ins for what needs an NPU, real wheels
for everything else, chosen for the node's own interpreter), and the tiny model (models/).
The slow parts, `pip download` and the model build, are kept under CACHE_DIR: a `lab up`
after the first only builds the small stand-ins and links cached files into the mirror.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from email.parser import Parser
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version
from rich.console import Console

from ascend_fleet.config.profile import Profile, load_profile, profile_path
from ascend_fleet.core.errors import FleetError
from ascend_fleet.core.model_tree import publish_model
from ascend_fleet.core.package_index import write_simple_index
from ascend_fleet.fleet.profile_check import Platform
from ascend_fleet.fleet.profile_lock import LockError, lock_path, lock_profile, router_lock
from ascend_fleet.lab.base import NODE_GLIBC_MINOR, node_platforms
from ascend_fleet.lab.sim.vendor import VendorVersions, publish_vendor_packages
from ascend_fleet.lab.sim.wheels import build_lab_standins, build_standin_wheels
from ascend_fleet.lab.spec import CACHE_DIR

WHEELHOUSE = CACHE_DIR / "wheelhouse"
MODEL_CACHE = CACHE_DIR / "models"
TINYMODEL_SOURCE = Path(__file__).parent / "sim" / "tinymodel.py"  # a change to the builder rebuilds the model
# So a node can upgrade the venv's own pip and build tools from the mirror.
VENV_TOOLS = ("pip", "setuptools", "wheel")
# Revisions of the tiny Qwen3 model the mirror carries (revision -> weight seed): v2 lets a lab rehearse a model swap.
LAB_MODEL_REVISIONS = {"v1": 0, "v2": 1}
QWEN35_CACHE_SUFFIX = "qwen3.5"
QWEN35_397B_CACHE_SUFFIX = "qwen3.5-397b-shape"


def publish_profiles(profile_names: list[str], mirror_root: Path, arch: str, console: Console) -> None:
    """Put everything a deploy of these profiles fetches on the mirror rooted at mirror_root."""
    profiles = [load_profile(name) for name in profile_names]
    publish_vendor_files(profiles, mirror_root / "files", arch)
    for profile in profiles:
        publish_python_packages(profile, mirror_root / "packages", arch, console)
    write_simple_index(mirror_root)
    publish_tiny_model(mirror_root / "models", console)


def lock_profiles(profile_names: list[str], index_url: str, locks_dir: Path, arch: str, console: Console) -> None:
    """Each profile's lock against the lab mirror's index, as `ascend-fleet profile lock` makes a site's: the
    lab's nodes install from it (host data pip_locks_dir). A profile whose steps do not lock (they leave a
    complaint it does not accept) is installed step by step, as before, and said so."""
    for profile in (load_profile(name) for name in profile_names):
        platform = Platform(arch, profile.stack.python, f"2.{NODE_GLIBC_MINOR}")
        try:
            lock = lock_profile(profile, platform, [index_url], progress=lambda line: None)
        except LockError as exc:
            console.print(f"lab: profile {profile.name} is not locked, its nodes install it step by step: {exc}")
            continue
        lock.write(locks_dir / lock_path(profile.name, platform).name)


def publish_vendor_files(profiles: list[Profile], files_dir: Path, arch: str) -> None:
    """Every profile's .run files and SHA256SUMS; refused when a file is not what its profile pins."""
    publish_vendor_packages([VendorVersions.of(p.stack) for p in profiles], arch, files_dir)
    for profile in profiles:
        for file_name in profile.vendor_files(arch).values():
            if hashlib.sha256((files_dir / file_name).read_bytes()).hexdigest() != profile.sha256_of(file_name):
                raise FleetError(f"lab: the lab's {file_name} does not match the sha256 in "
                                 f"{profile_path(profile.name)}; run tests/sim/test_sim_vendor.py for the "
                                 "packages.files block to paste")


def publish_python_packages(profile: Profile, packages_dir: Path, arch: str, console: Console) -> None:
    """The stand-in wheels (every recorded real wheel's, and the profile's own where no real one is
    recorded), and the real wheels a node of the profile installs, into packages_dir."""
    standins = build_lab_standins(packages_dir, arch)
    built = {(name, str(version)) for name, version, _, _ in (parse_wheel_filename(w.name) for w in standins)}
    s = profile.stack
    unrecorded = {key: version for key, version in
                  {"torch_npu": s.torch_npu, "vllm_ascend": s.vllm_ascend, "vllm": s.vllm}.items()
                  if (canonicalize_name(key), version) not in built}
    if unrecorded:
        standins += build_standin_wheels({"torch": s.torch, **unrecorded}, packages_dir)
    for number, requirements in enumerate(node_requirements(profile, standins, arch), 1):
        what = f"profile {profile.name}, pip install {number}"
        for wheel in cached_wheels(requirements, s.python, arch, what, console):
            link_into(wheel, packages_dir)
    # The gateways' vllm-router, as its lock pins it (the lab's gateways run Debian 12: the stack's Python).
    lock = router_lock(profile.router, arch, s.python) if profile.router else None
    if lock is not None:
        pins = [f"{name}=={version}" for name, version in lock.pins.items()]
        for wheel in cached_wheels(pins, s.python, arch, f"profile {profile.name}, vllm-router", console):
            link_into(wheel, packages_dir)


def node_requirements(profile: Profile, standins: list[Path], arch: str) -> list[list[str]]:
    """What pip must fetch from the real index for a node of this profile, per install step (the steps may
    need versions no one resolution holds: vllm 0.18.0's step takes numpy>=2 through opencv-python-headless
    5.1, vllm-ascend's moves it below 2): the step's requirements and those of every stand-in they can reach
    (any version a requirement admits, as pip may pick it), less what a stand-in provides; the first step
    adds the venv's own tools."""
    by_name: dict[str, list[tuple[Version, Path]]] = {}
    for wheel in standins:
        name, version, _, _ = parse_wheel_filename(wheel.name)
        by_name.setdefault(name, []).append((version, wheel))
    node = {**Platform(arch, profile.stack.python, f"2.{NODE_GLIBC_MINOR}").markers(), "extra": ""}
    steps = [list(step.requirements) for step in profile.install_steps()]
    steps[0] += VENV_TOOLS
    return [step_requirements([Requirement(r) for r in step], by_name, node) for step in steps]


def step_requirements(pending: list[Requirement], by_name: dict[str, list[tuple[Version, Path]]],
                      node: dict[str, str]) -> list[str]:
    """The real requirements pending reaches on the node, through any stand-in version it admits."""
    real: set[str] = set()
    reached: set[Path] = set()
    while pending:
        requirement = pending.pop()
        if requirement.marker and not requirement.marker.evaluate(node):
            continue
        admitted = [wheel for version, wheel in by_name.get(canonicalize_name(requirement.name), [])
                    if requirement.specifier.contains(version, prereleases=True)]
        if not admitted:
            real.add(str(requirement))
        for wheel in set(admitted) - reached:
            reached.add(wheel)
            pending += [Requirement(r) for r in requires_dist(wheel)]
    return sorted(real)


def requires_dist(wheel: Path) -> list[str]:
    """The Requires-Dist lines of a wheel's METADATA."""
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return Parser().parsestr(archive.read(metadata).decode()).get_all("Requires-Dist") or []


def cached_wheels(requirements: list[str], python: str, arch: str, what: str, console: Console) -> list[Path]:
    """The wheels that satisfy requirements on the node, downloaded once into the wheelhouse.

    Each resolved set is listed in wheelhouse/sets/<key>.txt; while its files are there,
    pip is not run at all (it would ask the index again).
    """
    key = hashlib.sha256(json.dumps([requirements, python, arch, NODE_GLIBC_MINOR]).encode()).hexdigest()[:16]
    listing = WHEELHOUSE / "sets" / f"{key}.txt"
    if listing.exists():
        wheels = [WHEELHOUSE / name for name in listing.read_text().split()]
        if all(wheel.exists() for wheel in wheels):
            return wheels
    console.print(f"lab: downloading the Python packages of {what} into {WHEELHOUSE} (once)")
    names = download_wheels(requirements, python, arch)
    listing.parent.mkdir(parents=True, exist_ok=True)
    partial = listing.with_name(f".{listing.name}.{os.getpid()}")  # another lab up may be reading it
    partial.write_text("\n".join(names) + "\n")
    os.replace(partial, listing)
    return [WHEELHOUSE / name for name in names]


def download_wheels(requirements: list[str], python: str, arch: str) -> list[str]:
    """pip download for the node's interpreter into the wheelhouse; the names of the files it resolved."""
    WHEELHOUSE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".incoming-", dir=WHEELHOUSE) as incoming:
        # Wheels only: the node has no compiler, and the host's would build for the wrong system.
        argv = [sys.executable, "-m", "pip", "download", "--quiet", "--dest", incoming,
                "--find-links", str(WHEELHOUSE), "--only-binary=:all:", "--implementation", "cp",
                "--python-version", python, "--abi", f"cp{python.replace('.', '')}",
                *(f"--platform={tag}" for tag in node_platforms(arch)), *requirements]
        result = subprocess.run(argv, capture_output=True, text=True)
        if result.returncode != 0:
            errors = [line for line in result.stderr.splitlines() if line.startswith("ERROR")] or ["(no message)"]
            raise FleetError(f"lab: pip download for the nodes' Python {python} on {arch} failed: {errors[0]}; "
                             "every package must have a wheel for that interpreter")
        names = sorted(path.name for path in Path(incoming).iterdir())
        for name in names:
            os.replace(Path(incoming) / name, WHEELHOUSE / name)
    return names


def link_into(path: Path, directory: Path) -> None:
    """Hard-link path into directory (a copy across filesystems)."""
    target = directory / path.name
    target.unlink(missing_ok=True)
    try:
        os.link(path, target)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        shutil.copy2(path, target)


def publish_tiny_model(models_dir: Path, console: Console) -> list[Path]:
    """The lab's tiny models on the mirror, each built once per version of their builder: the Qwen3
    one at each revision, the Qwen3.5-MoE W8A8 one that the Qwen3.5 recipe serves, and one of
    Qwen3.5-397B-A17B's shape that the multi-node lab serves over two workers an instance."""
    # Imported here: numpy and tokenizers would add 0.3 s to every `ascend-fleet` command.
    from ascend_fleet.lab.sim import tinymodel

    key = hashlib.sha256(TINYMODEL_SOURCE.read_bytes()).hexdigest()[:12]
    builds = {
        # v1 keeps its old cache name: labs that built it before v2 existed reuse it.
        **{key if revision == "v1" else f"{key}-{revision}":
           functools.partial(tinymodel.build_tiny_model, revision=revision, seed=seed)
           for revision, seed in LAB_MODEL_REVISIONS.items()},
        f"{key}-{QWEN35_CACHE_SUFFIX}": tinymodel.build_tiny_qwen35_moe,
        f"{key}-{QWEN35_397B_CACHE_SUFFIX}": functools.partial(
            tinymodel.build_tiny_qwen35_moe, name=tinymodel.QWEN35_397B_SHAPE_ID, dims=tinymodel.TINY_397B_SHAPE),
    }
    published = []
    for name, build in builds.items():
        cached = MODEL_CACHE / name
        if not cached.exists():
            console.print(f"lab: building the tiny model {name} into {cached} (once)")
            MODEL_CACHE.mkdir(parents=True, exist_ok=True)
            # Built beside its place and renamed in: the cache never holds half a model.
            building = Path(tempfile.mkdtemp(prefix=f".{cached.name}.", dir=MODEL_CACHE))
            build(building)
            try:
                building.rename(cached)
            except OSError:  # another lab up renamed its build in first
                shutil.rmtree(building)
        published.append(publish_model(cached, models_dir))
    return published
