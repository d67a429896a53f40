"""What each distribution release a node may run calls things: package manager, package and unit
names, the paths that differ, its system Python and the firewall it runs by default, once.

Every stage takes its names from here, and preflight refuses a node whose release, or whose part
in the fleet, this data cannot serve, before the driver stage changes anything. Each value has its
source in docs/sim-fidelity.md ("openEuler node data"); a value no source gave is None, and what
needs it is refused (`role_gaps`), never guessed.
"""

from __future__ import annotations

from dataclasses import dataclass

# What a role of the fleet installs; a release that has no known package for one cannot take the role.
WORKER_NEEDS = ("nftables", "nginx", "node_exporter", "driver_prerequisites")
GATEWAY_NEEDS = ("nginx", "prometheus", "prometheus_args_file", "nginx_exporter", "nginx_exporter_args_file",
                 "node_exporter", "gateway_python")
# What a gateway carrying the fleet's virtual address installs besides (fleet/virtual_address.py).
VIRTUAL_ADDRESS_NEEDS = ("virtual_address_packages",)


@dataclass(frozen=True)
class Service:
    """A daemon's package and the systemd service it ships (its name, without .service)."""

    package: str
    unit: str


@dataclass(frozen=True)
class NodeOs:
    """One distribution release, as ascend-fleet needs to know it."""

    distribution: str  # as pyinfra's LinuxDistribution fact names it (os-release NAME, shortened)
    release: str  # os-release VERSION_ID
    package_manager: str  # apt or dnf
    codename: str | None  # os-release VERSION_CODENAME: the archive's suite (apt), else None
    system_python: str  # major.minor of the release's python3
    default_firewall: str | None  # the firewall daemon a fresh install runs, or None
    nftables: str | None
    nginx: str | None
    nginx_default_site: str | None  # a default server the package enables that must go, or None
    node_exporter: Service | None
    # The file the node_exporter unit reads its ARGS from; None: a systemd drop-in gives its command line.
    node_exporter_args_file: str | None
    prometheus: Service | None
    prometheus_args_file: str | None
    nginx_exporter: Service | None
    nginx_exporter_args_file: str | None
    # keepalived (its unit of the same name, /etc/keepalived/keepalived.conf) and curl for its nginx check
    virtual_address_packages: tuple[str, ...] | None
    gateway_python: str | None  # the system python3 the gateway's route watcher runs with (node/route_watch.py)
    driver_prerequisites: tuple[str, ...] | None
    # The running kernel's packages the driver builds its module against, {kernel} = `uname -r`: Huawei's guide
    # installs them by that name, never the repository's newest (docs/sim-fidelity.md, "openEuler node data").
    kernel_headers: tuple[str, ...]
    # Whether preflight refuses a node whose repositories lack them (else they are installed where listed).
    kernel_headers_required: bool

    @property
    def name(self) -> str:
        return f"{self.distribution} {self.release}"

    def python_packages(self, version: str) -> list[str] | None:
        """The packages that give Python `version` with venv, when the release's own python3 is it."""
        if version != self.system_python:
            return None
        if self.package_manager == "apt":
            return [f"python{version}", f"python{version}-venv"]
        return ["python3"]  # openEuler's python3 carries the venv module and ensurepip


def _debian(distribution: str, release: str, codename: str, python: str) -> NodeOs:
    """Debian and Ubuntu: the packages the tool was built and tested with (Debian 12)."""
    return NodeOs(
        distribution=distribution, release=release, package_manager="apt", codename=codename, system_python=python,
        default_firewall=None, nftables="nftables", nginx="nginx-light",
        nginx_default_site="/etc/nginx/sites-enabled/default",
        node_exporter=Service("prometheus-node-exporter", "prometheus-node-exporter"),
        node_exporter_args_file="/etc/default/prometheus-node-exporter",
        prometheus=Service("prometheus", "prometheus"), prometheus_args_file="/etc/default/prometheus",
        nginx_exporter=Service("prometheus-nginx-exporter", "prometheus-nginx-exporter"),
        nginx_exporter_args_file="/etc/default/prometheus-nginx-exporter",
        virtual_address_packages=("keepalived", "curl"),
        gateway_python="python3",
        driver_prerequisites=("dkms", "gcc", "make", "pciutils", "net-tools"),
        kernel_headers=("linux-headers-{kernel}",),
        # Not refused yet: the lab's Debian nodes run this machine's kernel, whose headers no Debian archive has,
        # so a refusal could not be rehearsed; a real node running a kernel its archive dropped fails in the driver.
        kernel_headers_required=False,
    )


SERVED = (
    _debian("Debian", "11", "bullseye", "3.9"),
    _debian("Debian", "12", "bookworm", "3.11"),
    _debian("Debian", "13", "trixie", "3.13"),
    _debian("Ubuntu", "22.04", "jammy", "3.10"),
    _debian("Ubuntu", "24.04", "noble", "3.12"),
    NodeOs(
        distribution="openEuler", release="24.03", package_manager="dnf", codename=None, system_python="3.11",
        default_firewall="firewalld", nftables="nftables", nginx="nginx",
        nginx_default_site=None,  # its default server is in nginx.conf itself, on port 80
        node_exporter=Service("node_exporter", "node_exporter"), node_exporter_args_file=None,
        prometheus=Service("prometheus2", "prometheus"), prometheus_args_file=None,
        nginx_exporter=None, nginx_exporter_args_file=None,
        virtual_address_packages=None,  # no source here says how openEuler packages keepalived
        gateway_python="python3",  # the release's system Python (system_python above)
        driver_prerequisites=("dkms", "gcc", "make", "pciutils", "net-tools"),
        kernel_headers=("kernel-devel-{kernel}", "kernel-headers-{kernel}"),
        kernel_headers_required=True,
    ),
)


def node_os(distribution: str, release: str) -> NodeOs | None:
    """The data of this release (VERSION_ID "24.03" also matches a point release such as "24.03.1"), or None."""
    for known in SERVED:
        if known.distribution == distribution and (release == known.release or
                                                   release.startswith(f"{known.release}.")):
            return known
    return None


def not_served(distribution: str, release: str) -> str:
    served = ", ".join(known.name for known in SERVED)
    return (f"{distribution} {release or '(no VERSION_ID)'} is not served (served: {served}); "
            "reinstall the node with a served release")


def role_gaps(known: NodeOs, worker: bool, gateway: bool, virtual_address: bool = False) -> list[str]:
    """What the release lacks (no known package) for the roles the node takes."""
    needs = ((WORKER_NEEDS if worker else ()) + (GATEWAY_NEEDS if gateway else ())
             + (VIRTUAL_ADDRESS_NEEDS if gateway and virtual_address else ()))
    return [need for need in dict.fromkeys(needs) if getattr(known, need) is None]
