"""The OS packages of a bundle: for each distribution release and arch the site's nodes run, every package
the stages install, with all its dependencies, as a repository the node's own package manager reads.

apt (Debian, Ubuntu): downloaded on the control machine by its own apt with a state of its own (the
release's archive as the only source, an empty dpkg status so that every dependency comes along whatever the
control machine has), then indexed by apt-ftparchive as a flat repository the nodes read as
`deb [trusted=yes] URL/os/<name> ./`. trusted=yes because a subset of the archive carries no archive
signature: the bundle's manifest, checked before any deploy, vouches for every file instead.
dnf (openEuler): downloaded by the control machine's dnf (`dnf download --resolve --alldeps` into an empty
install root, the release's repositories as the only ones), indexed by createrepo_c; the nodes read it as a
repository of their own (gpgcheck=0 for the same reason as trusted=yes).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from ascend_fleet import TEMPLATES
from ascend_fleet.config.hostdata import NodeConfig
from ascend_fleet.config.node_os import SERVED, NodeOs, role_gaps
from ascend_fleet.config.per_run import profile_of_the_run
from ascend_fleet.core.errors import FleetError
from ascend_fleet.core.templating import render

# The group whose hosts serve the bundle (stages/mirror.py): they read their own copy of it from disk.
MIRROR_GROUP = "mirror"
DEB_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}
# Where the archives are when --os does not say (RELEASE=URL) (the distributions' own). openEuler's is the release's
# root on repo.openeuler.org, under which openEuler.repo's baseurls lie.
DEFAULT_ARCHIVES = {"Debian": "http://deb.debian.org/debian",
                    "openEuler": "https://repo.openeuler.org/openEuler-{release}-LTS"}
# openEuler.repo's binary repositories below the release's root (docs/sim-fidelity.md, "openEuler lab node").
OPENEULER_REPOSITORIES = {"OS": "OS/{arch}", "everything": "everything/{arch}", "EPOL": "EPOL/main/{arch}",
                          "update": "update/{arch}"}
TOOL_TIMEOUT = 3600  # seconds for one step of a release's packages (hundreds of MB)


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


def fleet_packages(scope: object, known: NodeOs, configs: list[NodeConfig], mirror_hosts: bool) -> list[str]:
    """What the stages install on this release for these hosts' roles (node_os.py names each package; a
    role the release lacks a package for is refused at preflight, node_os.role_gaps, and left out here);
    the workers' profiles read once for the scope (per_run.profile_of_the_run)."""
    names: list[str | None] = [known.nginx] if mirror_hosts else []
    for config in configs:
        if role_gaps(known, config.is_worker, config.is_gateway, config.gateway_vip is not None):
            continue
        if config.is_worker:
            profile = profile_of_the_run(scope, config.profile)
            python = known.python_packages(profile.stack.python) or profile.pip.python_packages.get(known.name, [])
            names += [known.nginx, known.nftables, known.node_exporter and known.node_exporter.package,
                      *(known.driver_prerequisites or ()), *python,
                      *profile.pip.system_packages.get(known.package_manager, [])]
        if config.is_gateway:
            names += [known.nginx, known.nftables, known.prometheus and known.prometheus.package,
                      known.nginx_exporter and known.nginx_exporter.package, known.gateway_python,
                      known.node_exporter and known.node_exporter.package,
                      *((known.virtual_address_packages or ()) if config.gateway_vip else ())]
    return sorted({name for name in names if name})


# A kernel release as an RPM-family node's `uname -r` prints it: VERSION-RELEASE.ARCH (openEuler's kernel.spec,
# KernelVer %{version}-%{release}.%{_target_cpu}); it becomes the headers packages' names.
KERNEL_RELEASE = re.compile(r"[0-9][A-Za-z0-9._+~]*-[A-Za-z0-9._+~]+\.(x86_64|aarch64)")


def kernel_releases(kernels: list[str]) -> list[str]:
    """The kernels `bundle --kernel` names, each refused in one line unless it reads as `uname -r` prints one
    (a release without its arch would be left out of every arch's packages without a word)."""
    for kernel in kernels:
        if not KERNEL_RELEASE.fullmatch(kernel):
            raise FleetError(f"bundle: --kernel {kernel!r}: expected a kernel release as `uname -r` prints it on the "
                             "node, VERSION-RELEASE.ARCH with ARCH x86_64 or aarch64 (e.g. "
                             "6.6.0-28.0.0.34.oe2403.aarch64)")
    return list(kernels)


def kernel_headers_packages(known: NodeOs, arch: str, kernels: list[str]) -> list[str]:
    """The headers packages of the kernels the site's nodes run (`uname -r`, as `bundle --kernel` gives them) on
    this arch, where the release requires them (node_os.py). An RPM kernel's `uname -r` ends in its arch
    (openEuler's kernel.spec: KernelVer %{version}-%{release}.%{_target_cpu})."""
    if not known.kernel_headers_required:
        return []
    return [template.format(kernel=kernel) for kernel in kernels if kernel.endswith(f".{arch}")
            for template in known.kernel_headers]


def archive_sources(known: NodeOs, archive: str, arch: str) -> str:
    """The release's suites as a sources.list (Debian keeps security updates in a sibling archive)."""
    security = f"{archive}-security" if known.distribution == "Debian" else archive
    suites = [(archive, known.codename), (archive, f"{known.codename}-updates"),
              (security, f"{known.codename}-security")]
    return render(TEMPLATES / "bundle-release-apt.list.j2", suites=suites, arch=DEB_ARCH[arch],
                  components="main universe" if known.distribution == "Ubuntu" else "main")


def build_apt_repository(dest: Path, known: NodeOs, arch: str, archive: str, packages: list[str],
                         progress: Callable[[str], None]) -> None:
    """packages and their dependencies for this release and arch into dest, with its Packages and Release.
    A rerun downloads only what dest lacks."""
    with _work_for(dest, known, ("apt-get", "apt-ftparchive"), "Debian/Ubuntu: apt install apt-utils") as work:
        (work / "lists" / "partial").mkdir(parents=True)
        (dest / "partial").mkdir(exist_ok=True)
        (work / "status").touch()
        (work / "sources.list").write_text(archive_sources(known, archive, arch))
        options = [f"-oDir::State::Lists={work / 'lists'}", f"-oDir::State::status={work / 'status'}",
                   f"-oDir::Cache={work}", f"-oDir::Cache::archives={dest}",
                   f"-oDir::Etc::sourcelist={work / 'sources.list'}", "-oDir::Etc::sourceparts=-",
                   f"-oAPT::Architecture={DEB_ARCH[arch]}", f"-oAPT::Architectures::={DEB_ARCH[arch]}",
                   "-oDebug::NoLocking=1", "-oAPT::Install-Recommends=0"]
        progress(f"OS packages for {known.name} {arch}: {len(packages)} and their dependencies from {archive}")
        _run_tool(["apt-get", "-q", *options, "update"], known, archive)
        _run_tool(["apt-get", "-q", "-y", *options, "install", "--download-only", *packages], known, archive)
    shutil.rmtree(dest / "partial", ignore_errors=True)
    (dest / "lock").unlink(missing_ok=True)
    for index in ("Packages", "Release"):
        (dest / index).unlink(missing_ok=True)
        (dest / index).write_text(_run_tool(["apt-ftparchive", index.lower(), "."], known, archive, cwd=dest))


def build_dnf_repository(dest: Path, known: NodeOs, arch: str, archive: str, packages: list[str],
                         progress: Callable[[str], None]) -> None:
    """packages and their dependencies for this release and arch into dest, with its repodata.
    A rerun downloads only what dest lacks."""
    with _work_for(dest, known, ("dnf", "createrepo_c"),
                   "Debian: apt install dnf dnf-plugins-core createrepo-c; dnf needs its download plugin") as work:
        (work / "repos").mkdir()
        (work / "repos" / "release.repo").write_text(render(
            TEMPLATES / "bundle-release-dnf.repo.j2",
            repositories=[(name, f"{archive}/{path.format(arch=arch)}")
                          for name, path in OPENEULER_REPOSITORIES.items()]))
        progress(f"OS packages for {known.name} {arch}: {len(packages)} and their dependencies from {archive}")
        _run_tool(["dnf", "-q", "-y", f"--installroot={work / 'root'}", f"--releasever={known.release}",
                   f"--forcearch={arch}", f"--setopt=reposdir={work / 'repos'}", f"--setopt=cachedir={work / 'cache'}",
                   "--setopt=install_weak_deps=False", "download", "--resolve", "--alldeps",
                   f"--destdir={dest}", *packages], known, archive)
    _run_tool(["createrepo_c", "--quiet", str(dest)], known, archive)


@contextmanager
def _work_for(dest: Path, known: NodeOs, tools: tuple[str, ...], install: str):
    """A scratch folder for the package manager's own state, once its tools are found here."""
    if any(shutil.which(tool) is None for tool in tools):
        raise FleetError(f"bundle: OS packages for {known.name} need {' and '.join(tools)} on this machine ({install})")
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"ascend-fleet-{tools[0]}-") as work:
        yield Path(work)


def _run_tool(argv: list[str], known: NodeOs, archive: str, cwd: Path | None = None) -> str:
    """The tool's output; its failure in one line."""
    result = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=TOOL_TIMEOUT, check=False)
    if result.returncode:
        lines = ([line for line in result.stderr.splitlines() if line.startswith(("E:", "Error"))]
                 or result.stderr.splitlines() or result.stdout.splitlines())
        raise FleetError(f"bundle: OS packages for {known.name} from {archive}: {' '.join(lines[-2:])}; give "
                         "the release's archive as --os 'RELEASE=URL'")
    return result.stdout
