"""What a stage knows about the host it runs on: its profile and its distribution release (node_os.py)."""

from __future__ import annotations

from io import StringIO
from pathlib import Path

from pyinfra import host, inventory
from pyinfra.facts.server import Arch, LinuxDistribution
from pyinfra.operations import apt, dnf, files

from ascend_fleet import TEMPLATES
from ascend_fleet.config.host_config import host_node_config
from ascend_fleet.config.node_os import NodeOs, node_os, not_served
from ascend_fleet.config.per_run import fact_of_the_run, once_per_run, profile_of_the_run
from ascend_fleet.config.profile import Profile
from ascend_fleet.core.bundle_layout import OS_DIR, listed_sha256
from ascend_fleet.core.errors import FleetError
from ascend_fleet.core.node_layout import BUNDLE_APT_SOURCE, BUNDLE_DNF_REPO, BUNDLE_DNF_REPO_ID, SITE_MIRROR_ROOT
from ascend_fleet.core.templating import render
from ascend_fleet.facts.kernel import KernelHeaders
from ascend_fleet.fleet.multi_node import DataParallelRole
from ascend_fleet.fleet.os_repository import MIRROR_GROUP, repository_name
from ascend_fleet.fleet.plan import fleet_roles
from ascend_fleet.operations import bundle
from ascend_fleet.operations.bundle import only_source


def node_profile() -> Profile:
    """The stack profile this host's validated data names (host_config.py: a missing or bad one stops the
    run in one line naming the host before any change), read once a run: the stages ask for it dozens of
    times per host."""
    return profile_of_the_run(host.state, host_node_config(host).profile)


def pip_index_url(profile: Profile) -> str:
    """The index the serving stack installs from: the profile's, else this host's `pip_index_url`; with a
    bundle (bundle_dir), the host's: where the site serves the bundle's index."""
    config = host_node_config(host)
    if config.bundle_dir:
        return config.pip_index_url
    return profile.pip.index_url or config.pip_index_url


def data_parallel_roles() -> dict[str, DataParallelRole]:
    """Each multi-node instance member's part (multi_node.py): worked out once per run."""
    return once_per_run(host.state, "data parallel roles", lambda: fleet_roles(inventory))


def data_parallel_role(host_name: str) -> DataParallelRole | None:
    """The host's part in a multi-node instance, or None."""
    return data_parallel_roles().get(host_name)


def runs_npus() -> bool:
    """Whether this host is a worker (it has NPUs): the platform and serving stages skip the others."""
    return host_node_config(host).is_worker


def host_arch() -> str:
    """The host's architecture (uname -m), e.g. "aarch64"."""
    return fact_of_the_run(host, Arch)


def host_release() -> tuple[str, str]:
    """The host's distribution and release (os-release VERSION_ID), e.g. ("openEuler", "24.03")."""
    distribution = fact_of_the_run(host, LinuxDistribution)
    return distribution["name"] or "unknown", str(distribution["release_meta"].get("VERSION_ID", ""))


def host_os() -> NodeOs:
    """What the host's release calls things; a release not served stops the run in one line."""
    distribution, release = host_release()
    known = node_os(distribution, release)
    if known is None:
        raise FleetError(f"{host.name}: {not_served(distribution, release)}")
    return known


def os_packages(name: str, packages: list[str]) -> None:
    """Install packages with the host's package manager (apt: no recommends, its lists at most an hour old);
    with a bundle (bundle_dir), from the bundle's repository alone."""
    known = host_os()
    from_bundle = bool(host_node_config(host).bundle_dir)
    if from_bundle and known.package_manager == "apt":
        apt.packages(name=name, packages=packages, no_recommends=True,
                     extra_install_args=" ".join(bundle_source(known)))
    elif from_bundle:
        bundle_source(known)
        bundle.dnf_packages(name=name, packages=packages, repository=BUNDLE_DNF_REPO_ID)
    elif known.package_manager == "apt":
        # The run's first install on the host brings the lists up to date; the later ones would
        # read the same lists' age again (two round trips each).
        refreshed = once_per_run(host.state, "hosts whose apt lists are brought up to date", set)
        first = host.name not in refreshed
        refreshed.add(host.name)
        apt.packages(name=name, packages=packages, no_recommends=True, update=first, cache_time=3600 if first else None)
    else:
        dnf.packages(name=name, packages=packages)


def running_kernel_headers() -> dict:
    """The running kernel's headers packages (node_os.py, facts/kernel.py); the node's repositories are asked
    unless it installs with dnf from the site's bundle alone (its own repositories do not answer there)."""
    known = host_os()
    from_bundle = bool(host_node_config(host).bundle_dir)
    return host.get_fact(KernelHeaders, package_manager=known.package_manager, templates=known.kernel_headers,
                         ask_repositories=not (from_bundle and known.package_manager == "dnf"))


def bundle_source(known: NodeOs) -> list[str]:
    """The bundle's repository for this host's release and arch as a source of its package manager (once a
    run), and apt's options that install from it alone. A host of group mirror reads its own copy."""
    config = host_node_config(host)

    def put_in_place() -> list[str]:
        name = repository_name(known, host_arch())
        url = (f"file://{SITE_MIRROR_ROOT}/{OS_DIR}/{name}" if MIRROR_GROUP in host.groups
               else f"{config.bundle_url}/{OS_DIR}/{name}")
        bundle_dir = Path(config.bundle_dir)
        if known.package_manager == "dnf":
            repomd = listed_sha256(bundle_dir, f"{OS_DIR}/{name}/repodata/repomd.xml")
            source = render(TEMPLATES / "bundle-dnf.repo.j2", name=BUNDLE_DNF_REPO_ID, url=url, repomd_sha256=repomd)
            files.put(name="The bundle's OS packages as a dnf repository", src=StringIO(source),
                      dest=BUNDLE_DNF_REPO, mode="0644")
            return []
        release = listed_sha256(bundle_dir, f"{OS_DIR}/{name}/Release")
        source = render(TEMPLATES / "bundle-apt-source.list.j2", url=url, release_sha256=release)
        bundle.apt_repository(name="The bundle's OS packages as an apt source", source=source,
                              path=BUNDLE_APT_SOURCE)
        return only_source(BUNDLE_APT_SOURCE)
    return once_per_run(host.state, ("bundle package source", host.name), put_in_place)


def nginx_installed() -> None:
    """The release's nginx, without a default site of the package's that would take a port."""
    known = host_os()
    os_packages("Nginx", [known.nginx])
    if known.nginx_default_site:
        files.link(name="No default site", path=known.nginx_default_site, present=False)


def python_packages(profile: Profile, known: NodeOs) -> list[str] | None:
    """What gives the profile's Python with venv on this release: its own python3 when that is the
    profile's, else the packages the profile names for the release (pip.python_packages), else None."""
    return known.python_packages(profile.stack.python) or profile.pip.python_packages.get(known.name)
