"""What a stage knows about the host it runs on: its profile and its package family."""

from __future__ import annotations

from pyinfra import host, inventory
from pyinfra.facts.server import LinuxDistribution

from ascend_fleet.errors import FleetError
from ascend_fleet.fleet import fleet_roles
from ascend_fleet.host_config import host_node_config
from ascend_fleet.multi_node import DataParallelRole
from ascend_fleet.per_run import once_per_run
from ascend_fleet.profile import Profile, load_profile

APT_DISTRIBUTIONS = {"Debian", "Ubuntu"}
DNF_DISTRIBUTIONS = {"openEuler"}


def node_profile() -> Profile:
    """The stack profile this host's data names (validated; a bad one stops before any change)."""
    name = host.data.get("profile")
    if not name:
        raise FleetError(f"{host.name}: no `profile` in host or group data; set it in group_data/")
    try:
        return load_profile(name)
    except FleetError as exc:
        raise FleetError(f"{host.name}: {exc}") from None


def pip_index_url(profile: Profile) -> str:
    """The index the serving stack installs from: the profile's, else this host's `pip_index_url`."""
    return profile.pip.index_url or host.data.pip_index_url


def data_parallel_role(host_name: str) -> DataParallelRole | None:
    """The host's part in a multi-node instance (multi_node.py), or None: worked out once per run."""
    return once_per_run(host.state, "data parallel roles", lambda: fleet_roles(inventory)).get(host_name)


def runs_npus() -> bool:
    """Whether this host is a worker (it has NPUs): the platform and serving stages skip the others."""
    return host_node_config(host).is_worker


def package_family() -> str:
    """apt or dnf, from the host's distribution."""
    name = host.get_fact(LinuxDistribution)["name"]
    if name in APT_DISTRIBUTIONS:
        return "apt"
    if name in DNF_DISTRIBUTIONS:
        return "dnf"
    raise FleetError(f"{host.name}: distribution {name!r} is not supported (apt: Debian, Ubuntu; dnf: openEuler)")
