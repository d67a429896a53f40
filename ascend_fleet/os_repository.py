"""The OS packages of a bundle: for each distribution release and arch the site's nodes run, every package
the stages install, with all its dependencies, as a repository the node's own package manager reads.

apt (Debian, Ubuntu): downloaded on the control machine by its own apt with a state of its own (the
release's archive as the only source, an empty dpkg status so that every dependency comes along whatever the
control machine has), then indexed by apt-ftparchive as a flat repository the nodes read as
`deb [trusted=yes] URL/os/<name> ./`. trusted=yes because a subset of the archive carries no archive
signature: the bundle's manifest, checked before any deploy, vouches for every file instead.
dnf (openEuler): not built yet; preflight refuses such a node with a bundle, before any change.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from ascend_fleet.errors import FleetError
from ascend_fleet.hostdata import NodeConfig
from ascend_fleet.node_os import SERVED, NodeOs
from ascend_fleet.profile import load_profile

OS_DIR = "os"
# The group whose hosts serve the bundle (stages/mirror.py): they read their own copy of it from disk.
MIRROR_GROUP = "mirror"
DEB_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}
# Where the archives are when --os-mirror does not say (the distributions' own redirectors).
DEFAULT_ARCHIVES = {"Debian": "http://deb.debian.org/debian"}
APT_TIMEOUT = 3600  # seconds for one release's packages (hundreds of MB)


def repository_name(known: NodeOs, arch: str) -> str:
    """The repository's folder under os/, e.g. debian-12-aarch64."""
    return f"{known.distribution.lower()}-{known.release}-{arch}"


def served_release(name: str) -> NodeOs:
    """A release as `--os` names it ("Debian 12"); a release not served is refused in one line."""
    for known in SERVED:
        if known.name == name:
            return known
    raise FleetError(f"bundle: --os {name!r} is not a served release (served: "
                     f"{', '.join(known.name for known in SERVED)})")


def fleet_packages(known: NodeOs, configs: list[NodeConfig], mirror_hosts: bool) -> list[str]:
    """What the stages install on this release for these hosts' roles (node_os.py names each package)."""
    names: list[str] = [known.nginx] if mirror_hosts else []
    for config in configs:
        if config.is_worker:
            profile = load_profile(config.profile)
            python = known.python_packages(profile.stack.python) or profile.pip.python_packages.get(known.name, [])
            names += [known.nginx, known.nftables, known.node_exporter.package, *known.driver_prerequisites,
                      *python, *profile.pip.system_packages.get(known.package_manager, [])]
        if config.gateway:
            names += [known.nginx, known.prometheus.package, known.nginx_exporter.package]
    return sorted(set(names))


def archive_sources(known: NodeOs, archive: str, arch: str) -> list[str]:
    """The release's suites in a sources.list (Debian keeps security updates in a sibling archive)."""
    components = "main universe" if known.distribution == "Ubuntu" else "main"
    security = f"{archive}-security" if known.distribution == "Debian" else archive
    option = f"[arch={DEB_ARCH[arch]}]"
    return [f"deb {option} {archive} {known.codename} {components}",
            f"deb {option} {archive} {known.codename}-updates {components}",
            f"deb {option} {security} {known.codename}-security {components}"]


def build_apt_repository(dest: Path, known: NodeOs, arch: str, archive: str, packages: list[str],
                         progress: Callable[[str], None]) -> None:
    """packages and their dependencies for this release and arch into dest, with its Packages and Release.
    A rerun downloads only what dest lacks."""
    if shutil.which("apt-get") is None or shutil.which("apt-ftparchive") is None:
        raise FleetError(f"bundle: OS packages for {known.name} need apt-get and apt-ftparchive on this machine "
                         "(Debian/Ubuntu: apt install apt-utils)")
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ascend-fleet-apt-") as state:
        work = Path(state)
        (work / "lists" / "partial").mkdir(parents=True)
        (dest / "partial").mkdir(exist_ok=True)
        (work / "status").touch()
        (work / "sources.list").write_text("\n".join(archive_sources(known, archive, arch)) + "\n")
        options = [f"-oDir::State::Lists={work / 'lists'}", f"-oDir::State::status={work / 'status'}",
                   f"-oDir::Cache={work}", f"-oDir::Cache::archives={dest}",
                   f"-oDir::Etc::sourcelist={work / 'sources.list'}", "-oDir::Etc::sourceparts=-",
                   f"-oAPT::Architecture={DEB_ARCH[arch]}", f"-oAPT::Architectures::={DEB_ARCH[arch]}",
                   "-oDebug::NoLocking=1", "-oAPT::Install-Recommends=0"]
        progress(f"OS packages for {known.name} {arch}: {len(packages)} and their dependencies from {archive}")
        _apt(["apt-get", "-q", *options, "update"], known, archive)
        _apt(["apt-get", "-q", "-y", *options, "install", "--download-only", *packages], known, archive)
    shutil.rmtree(dest / "partial", ignore_errors=True)
    (dest / "lock").unlink(missing_ok=True)
    for index, argv in (("Packages", ["apt-ftparchive", "packages", "."]),
                        ("Release", ["apt-ftparchive", "release", "."])):
        (dest / index).unlink(missing_ok=True)
        result = subprocess.run(argv, cwd=dest, capture_output=True, text=True, check=False)
        if result.returncode:
            raise FleetError(f"bundle: {' '.join(argv)} in {dest} failed: {result.stderr.strip()}")
        (dest / index).write_text(result.stdout)


def _apt(argv: list[str], known: NodeOs, archive: str) -> None:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=APT_TIMEOUT, check=False)
    if result.returncode:
        lines = [line for line in result.stderr.splitlines() if line.startswith("E:")] or result.stderr.splitlines()
        raise FleetError(f"bundle: OS packages for {known.name} from {archive}: {' '.join(lines[-2:])}; give "
                         "the release's archive with --os-mirror URL")
