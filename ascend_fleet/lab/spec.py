"""What a lab is made of: node names, roles, groups, addresses and simulated hardware.

`LabSpec.build()` turns the `lab up` options and an optional hardware file into a
complete, validated description before anything is created, so bad input is one
line and leaves nothing behind.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ascend_fleet.config.hostdata import NodeConfig
from ascend_fleet.config.profile import available_profiles, is_cpu_build, load_profile
from ascend_fleet.core.errors import FleetError, InputError, visible
from ascend_fleet.fleet.os_repository import MIRROR_GROUP
from ascend_fleet.lab.flavours import DEFAULT_OS, OsName
from ascend_fleet.sizing.planner import ModelShape

DEFAULT_LAB_DIR = Path(os.environ.get("ASCEND_FLEET_LAB_DIR", "/var/lib/ascend-fleet/lab"))
CACHE_DIR = Path(os.environ.get("ASCEND_FLEET_CACHE_DIR", "/var/cache/ascend-fleet"))
GATEWAY = "gateway"
MAX_GATEWAYS = 4
# Where an offline lab's gateway serves its bundle: the site mirror's port when the data does not say.
SITE_MIRROR_PORT = NodeConfig.model_fields["site_mirror_port"].default
# A bastion lab's jump host (`lab up --bastion`): the only node the control machine reaches over SSH.
BASTION = "bastion"
# The gateway's serving port (group_data/gateway.py's listen_port): on a bastion lab the one port of the
# nodes the control machine still reaches, as clients reach a site's load balancer.
GATEWAY_SERVING_PORT = 80
# The stacks whose packages the lab mirror carries unless `lab up --profile` says otherwise.
DEFAULT_PROFILES = ("lab", "lab-previous")
# The private IPv4 ranges (RFC 1918). The lab's bridges give this machine a route to the lab subnet and to its
# NPU parameter plane: a public range would send this machine's own traffic for those addresses into the lab.
PRIVATE_RANGES = tuple(ipaddress.IPv4Network(block) for block in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"))

# HBM per chip as the node's simulated hardware reports it (npu-smi totals).
CHIP_HBM_MB = {"910B3": 65536, "910B4": 32768}

Health = Literal["OK", "Warning", "Alarm", "Critical"]
NicState = Literal["up", "down"]
# Where the parameter plane's addresses start above its network address (below: the host, the switch side).
NPU_FIRST_HOST = 16


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NvmeSpec(_Strict):
    """The node's local NVMe data disk: a loop-mounted ext4 image of this size."""

    size_gb: float = Field(8, gt=0)
    mount: str = "/mnt/nvme"

    @field_validator("mount")
    @classmethod
    def _absolute(cls, mount: str) -> str:
        if not mount.startswith("/") or mount == "/":
            raise ValueError("must be an absolute path below /")
        return mount


class Preexisting(_Strict):
    """State the node starts with, as a used server would have it."""

    cuda_env: bool = Field(False, description="CUDA paths in /etc/environment and /etc/profile.d/cuda.sh")
    profile: str | None = Field(None, description="a profile whose driver and firmware are installed and running")

    @field_validator("profile")
    @classmethod
    def _known_profile(cls, name: str | None) -> str | None:
        if name is not None and name not in available_profiles():
            raise ValueError(f"no profile {name!r} (profiles: {', '.join(available_profiles())})")
        return name


class Performance(_Strict):
    """How fast the node's simulated vLLM steps (docs/sim-performance.md): the performance model, as
    the real model whose config.json performs_as names, time_scale lab seconds per modelled second."""

    time_scale: float = Field(1.0, gt=0)
    performs_as: Path | None = Field(None, description="a real model's config.json; default: the served model")

    @field_validator("performs_as")
    @classmethod
    def _a_model_config(cls, path: Path | None) -> Path | None:
        if path is not None:
            try:
                ModelShape.from_config(json.loads(path.read_text()))
            except (OSError, ValueError) as exc:
                raise ValueError(f"{path}: {exc}; name a model's config.json") from None
        return path

    def hardware_json(self) -> dict:
        config = json.loads(self.performs_as.read_text()) if self.performs_as else None
        return {"time_scale": self.time_scale, "performs_as": config}


class NodeHardware(_Strict):
    chip: Literal["910B3", "910B4"] = "910B3"
    npus: int = Field(8, ge=0, le=16)
    npu_health: dict[int, Health] = Field(default_factory=dict, description="NPU index -> health; others OK")
    npu_nic: dict[int, NicState] = Field(default_factory=dict,
                                         description="NPU index -> its RoCE port's link (down: no carrier); others up")
    npu_tls: dict[int, Literal[0, 1]] = Field(default_factory=dict,
                                              description="NPU index -> the TLS switch it starts with; others 0")
    nvme: NvmeSpec | None = Field(default_factory=NvmeSpec)
    ram_gb: int = Field(1024, gt=0, description="host RAM the node reports")
    glibc: str | None = Field(None, pattern=r"^\d+\.\d+$",
                              description="the glibc release the node reports (`getconf GNU_LIBC_VERSION`), to "
                                          "rehearse an older system; default: the base image's own (2.36)")
    preexisting: Preexisting = Field(default_factory=Preexisting)
    performance: Performance | None = Field(None, description="pace vLLM with the performance model")
    os: OsName = Field(DEFAULT_OS, description="the distribution the node runs (ascend_fleet/lab/flavours.py)")

    def hardware_json(self, node: str, role: str, plane: dict | None = None) -> dict:
        """The document nodes read at /etc/ascend-lab/hardware.json (docs/lab-contract.md); plane: the
        node's NPU ports (LabSpec.npu_plane_json), for the simulated hccn_tool."""
        return {
            "node": node,
            "role": role,
            "chip": self.chip,
            "npu_count": self.npus,
            "hbm_mb": CHIP_HBM_MB[self.chip],
            "npu_health": [self.npu_health.get(i, "OK") for i in range(self.npus)],
            "npu_nic": [self.npu_nic.get(i, "up") for i in range(self.npus)],
            "npu_tls": [self.npu_tls.get(i, 0) for i in range(self.npus)],
            "ram_gb": self.ram_gb,
            "nvme": self.nvme.model_dump() if self.nvme else None,
            "glibc": self.glibc,
            "npu_plane": plane,
            "performance": self.performance.hardware_json() if self.performance else None,
        }


class HardwareFile(_Strict):
    """The YAML given to `lab up --hardware`: defaults, per-node overrides, rollout groups."""

    defaults: dict = Field(default_factory=dict)
    nodes: dict[str, dict] = Field(default_factory=dict)
    groups: dict[str, list[str]] | None = None


class NodeSpec(_Strict):
    name: str
    role: Literal["worker", "gateway", "bastion"]
    index: int
    address: str
    groups: list[str]
    hardware: NodeHardware



class LabSpec(_Strict):
    name: str = Field("lab", pattern=r"^[a-z][a-z0-9]{0,7}$", description="part of every host-side name")
    lab_dir: Path = DEFAULT_LAB_DIR
    subnet: str = "10.213.0.0/24"
    npu_subnet: str | None = Field(None, description="the NPUs' parameter plane; default: the lab subnet with 1 "
                                                     "added to its second octet (10.213.200.0/24 -> 10.214.200.0/24)")
    mirror_port: int = 8080
    debian_upstream: str = "http://deb.debian.org"
    profiles: list[str] = Field(default_factory=lambda: list(DEFAULT_PROFILES),
                                description="profiles whose packages, wheels and model the mirror serves")
    bastion: bool = Field(False, description="a site behind a jump host: a `bastion` node, and no way from the "
                                             "host to the other nodes but through it (and to the gateway's "
                                             "serving port)")
    offline_bundle: Path | None = Field(None, description="a site without internet: the nodes reach nothing on "
                                        "the host (the lab mirror included) and the gateway, in group mirror, "
                                        "serves this bundle (`ascend-fleet bundle`), from which they install all")
    gateways: int = Field(1, ge=1, le=MAX_GATEWAYS, description="gateway nodes; with 2 or more they share a "
                                                              "virtual address (keepalived)")
    nodes: list[NodeSpec]

    @property
    def gateway_vip(self) -> str | None:
        """The gateways' virtual address (with the subnet's prefix) when there are two or more: the subnet's
        last host address, which no node takes."""
        if self.gateways < 2:
            return None
        return f"{self.network.broadcast_address - 1}/{self.network.prefixlen}"

    @property
    def serves_real_vllm(self) -> bool:
        """Whether a profile the mirror serves installs real vLLM for CPU (the real tier), not the stand-in."""
        return any(is_cpu_build(load_profile(name).stack.vllm) for name in self.profiles)

    @property
    def site_mirror_url(self) -> str:
        """Where an offline lab's gateway serves its bundle (site_mirror_port's default)."""
        return f"http://{self.gateway.address}:{SITE_MIRROR_PORT}"

    @property
    def network(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(self.subnet)

    @property
    def host_address(self) -> str:
        """The host's address on the lab bridge, where the mirror listens."""
        return str(self.network.network_address + 1)

    @property
    def mirror_url(self) -> str:
        return f"http://{self.host_address}:{self.mirror_port}"

    @property
    def bridge(self) -> str:
        return f"af-{self.name}-br"

    # --- the parameter plane: the NPUs' RoCE ports on a bridge of their own ---------------

    @property
    def npu_network(self) -> ipaddress.IPv4Network:
        return npu_network(self.subnet, self.npu_subnet)

    @property
    def npu_bridge(self) -> str:
        return f"af-{self.name}-pp"

    @property
    def npu_host_address(self) -> str:
        """The host's address on the plane: the switch side, which NPUs use as gateway and net-detect target."""
        return str(self.npu_network.network_address + 1)

    def npu_addresses(self, node: NodeSpec) -> list[str]:
        """NPU i's planned address at index i: worker w's NPUs from NPU_FIRST_HOST + (w-1) * stride."""
        base = self.npu_network.network_address + NPU_FIRST_HOST + (node.index - 1) * self.npu_stride
        return [str(base + i) for i in range(node.hardware.npus)] if node.role == "worker" else []

    @property
    def npu_stride(self) -> int:
        return max([n.hardware.npus for n in self.workers] + [1])

    def npu_plane_json(self, node: NodeSpec) -> dict | None:
        """What a node's simulated NPUs know of the plane: their ports and the switch they plug into."""
        if node.role != "worker" or not node.hardware.npus:
            return None
        return {"interfaces": [npu_interface(i) for i in range(node.hardware.npus)],
                "switch_ports": [self.npu_host_port(node, i) for i in range(node.hardware.npus)],
                "switch_address": self.npu_host_address, "switch_name": self.npu_bridge}

    def npu_host_port(self, node: NodeSpec, npu: int) -> str:
        """The host (switch) end of a node's NPU port; the node end is npu_interface(npu)."""
        return f"n{self.name}-{node.index}-{npu}"

    def netns(self, node: NodeSpec) -> str:
        return f"af-{self.name}-{node.name}"

    def host_veth(self, node: NodeSpec) -> str:
        """The host end of a node's link (interface names are at most 15 characters)."""
        suffix = {BASTION: "b", "gateway": f"g{node.index}" if node.index else "0"}.get(node.role, node.index)
        return f"af-{self.name}-{suffix}"

    @property
    def workers(self) -> list[NodeSpec]:
        return [n for n in self.nodes if n.role == "worker"]

    @property
    def jump_host(self) -> NodeSpec | None:
        """The bastion node of a bastion lab, else None."""
        return self.node(BASTION) if self.bastion else None

    @property
    def gateway(self) -> NodeSpec:
        return self.node(GATEWAY)

    def node(self, name: str) -> NodeSpec:
        for node in self.nodes:
            if node.name == name:
                return node
        raise FleetError(f"lab: no node named {name!r}; nodes are {', '.join(n.name for n in self.nodes)}")

    @classmethod
    def build(cls, workers: int, hardware_file: Path | None = None, **settings) -> LabSpec:
        """Validate everything `lab up` was given and lay out the nodes."""
        if workers < 1:
            raise FleetError(f"lab up: --nodes {workers}: a lab needs at least 1 worker node")
        name = settings.get("name", cls.model_fields["name"].default)
        if not re.fullmatch(cls.model_fields["name"].metadata[0].pattern, name):
            raise InputError(f"lab up: --name {visible(name)}: expected 1 to 8 lower-case letters and digits, a "
                             "letter first: it is part of the lab's bridge, namespace and interface names (at most "
                             "15 characters), e.g. lab2")
        for profile in settings.get("profiles", DEFAULT_PROFILES):
            load_profile(profile)  # a bad profile is one line before anything is created
        hardware = _load_hardware_file(hardware_file) if hardware_file else HardwareFile()
        names = [f"worker{i}" for i in range(1, workers + 1)]
        groups = hardware.groups if hardware.groups is not None else default_rollout_groups(names)
        _check_names(hardware_file, hardware, names, groups)
        subnet = settings.get("subnet", cls.model_fields["subnet"].default)
        network = lab_network(subnet)
        if network.num_addresses < workers + 16:
            raise InputError(f"lab up: --subnet {subnet}: too small for {workers} workers (the lab takes "
                             f"{workers + 16} addresses); give a larger one, e.g. /24")

        plane = npu_network(str(network), settings.get("npu_subnet"))
        if not _private(plane):
            raise InputError(f"lab up: --subnet {subnet}: its NPU parameter plane {plane} (the subnet one up in its "
                             "second octet) is not a private range (RFC 1918); pick a subnet in 10.0.0.0/8 below "
                             "10.255.0.0, e.g. 10.213.0.0/24")
        if plane.overlaps(network):
            raise FleetError(f"lab up: the NPU parameter plane {plane} overlaps the lab subnet {network}; "
                             "give the plane a subnet of its own")

        gateway_defaults = {"npus": 0, "nvme": None}
        nodes = [
            NodeSpec(
                name=GATEWAY, role="gateway", index=0, address=str(network.network_address + 2),
                groups=[GATEWAY, MIRROR_GROUP] if settings.get("offline_bundle") else [GATEWAY],
                hardware=_node_hardware(hardware_file, GATEWAY, {**gateway_defaults, **hardware.defaults},
                                        hardware.nodes.get(GATEWAY, {})),
            )
        ]
        # More gateways after the bastion's address (workers start at .11).
        for i in range(2, settings.get("gateways", 1) + 1):
            nodes.append(NodeSpec(name=f"{GATEWAY}{i}", role="gateway", index=i - 1,
                                  address=str(network.network_address + 2 + i), groups=[GATEWAY],  # .4, .5, ...
                                  hardware=NodeHardware(npus=0, nvme=None)))
        if settings.get("bastion"):
            # A jump host with sshd alone: no NPUs, no disk, in no group of the fleet.
            nodes.append(NodeSpec(name=BASTION, role="bastion", index=0, address=str(network.network_address + 3),
                                  groups=[], hardware=NodeHardware(npus=0, nvme=None)))
        for i, name in enumerate(names, start=1):
            nodes.append(NodeSpec(
                name=name, role="worker", index=i, address=str(network.network_address + 10 + i),
                groups=["workers"] + [g for g, members in groups.items() if name in members],
                hardware=_node_hardware(hardware_file, name, hardware.defaults, hardware.nodes.get(name, {})),
            ))
        spec = cls(nodes=nodes, **settings)
        last = plane.network_address + NPU_FIRST_HOST + workers * spec.npu_stride - 1
        if last >= plane.broadcast_address:
            raise FleetError(f"lab up: the NPU parameter plane {plane} cannot hold {workers} workers x "
                             f"{spec.npu_stride} NPUs (it needs addresses up to {last}); give a larger plane")
        return spec


def lab_network(subnet: str) -> ipaddress.IPv4Network:
    """`lab up --subnet` as the network the lab's bridge takes, or an InputError (exit 2) before anything is made:
    an IPv4 network without host bits, inside a private range (PRIVATE_RANGES)."""
    refused = f"lab up: --subnet {visible(subnet)}"
    try:
        network = ipaddress.IPv4Network(subnet)
    except ValueError as exc:
        if "has host bits set" in str(exc):
            meant = ipaddress.IPv4Network(subnet, strict=False)
            raise InputError(f"{refused}: has host bits set; give the network itself, e.g. {meant}") from None
        raise InputError(f"{refused}: not an IPv4 network ({exc}); give one as ADDRESS/PREFIX, e.g. "
                         "10.213.0.0/24") from None
    if not _private(network):
        raise InputError(f"{refused}: not a private range (RFC 1918: 10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16); "
                         "the lab would route this machine's own traffic for those addresses into it: pick a "
                         "private one, e.g. 10.213.0.0/24")
    return network


def _private(network: ipaddress.IPv4Network) -> bool:
    return any(network.subnet_of(block) for block in PRIVATE_RANGES)


def npu_interface(npu: int) -> str:
    """NPU npu's RoCE port inside its node's network namespace (the simulated hccn_tool's name for it too)."""
    return f"hccn{npu}"


def npu_network(subnet: str, npu_subnet: str | None = None) -> ipaddress.IPv4Network:
    """The parameter plane's subnet: the one given, else the lab subnet one step up in its second octet,
    so labs whose subnets do not overlap get planes that do not overlap either."""
    if npu_subnet:
        return ipaddress.IPv4Network(npu_subnet)
    lab = ipaddress.IPv4Network(subnet)
    shifted = int(lab.network_address) + (1 << 16)
    if shifted >= 1 << 32:
        raise FleetError(f"lab up: no parameter plane follows subnet {lab}; give one with npu_subnet")
    return ipaddress.IPv4Network((shifted, lab.prefixlen))


def default_rollout_groups(workers: list[str]) -> dict[str, list[str]]:
    """First worker is the canary; the rest split into two waves, wave1 the larger half."""
    rest = workers[1:]
    half = (len(rest) + 1) // 2
    groups = {"canary": workers[:1], "wave1": rest[:half], "wave2": rest[half:]}
    return {group: members for group, members in groups.items() if members}


def _load_hardware_file(path: Path) -> HardwareFile:
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise FleetError(f"lab up: cannot read hardware file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise FleetError(f"lab up: hardware file {path} is not valid YAML: {exc}".replace("\n", " ")) from None
    try:
        return HardwareFile.model_validate(raw)
    except ValidationError as exc:
        raise FleetError(f"lab up: hardware file {path}: {one_line(exc)}") from None


def _node_hardware(path: Path | None, node: str, defaults: dict, overrides: dict) -> NodeHardware:
    merged = {**defaults, **overrides}
    for nested in ("nvme", "preexisting"):
        if isinstance(defaults.get(nested), dict) and isinstance(overrides.get(nested), dict):
            merged[nested] = {**defaults[nested], **overrides[nested]}
    try:
        hardware = NodeHardware.model_validate(merged)
    except ValidationError as exc:
        raise FleetError(f"lab up: hardware file {path}: node {node}: {one_line(exc, NodeHardware)}") from None
    for key in ("npu_health", "npu_nic", "npu_tls"):
        bad = [i for i in getattr(hardware, key) if i >= hardware.npus or i < 0]
        if bad:
            raise FleetError(f"lab up: hardware file {path}: node {node}: {key} names NPU {bad[0]} "
                             f"but the node has {hardware.npus} NPUs (0-{hardware.npus - 1})")
    return hardware


def _check_names(path: Path | None, hardware: HardwareFile, workers: list[str], groups: dict) -> None:
    known = set(workers) | {GATEWAY}
    for node in hardware.nodes:
        if node not in known:
            raise FleetError(f"lab up: hardware file {path}: nodes.{node}: no such node in a lab of "
                             f"{len(workers)} workers (nodes: {', '.join(sorted(known))})")
    for group, members in groups.items():
        if not re.fullmatch(r"[a-z][a-z0-9_]*", group) or group in ("workers", GATEWAY):
            raise FleetError(f"lab up: hardware file {path}: groups.{group}: group names are lower-case "
                             "identifiers other than 'workers' and 'gateway'")
        for member in members:
            if member not in workers:
                raise FleetError(f"lab up: hardware file {path}: groups.{group}: {member!r} is not a worker "
                                 f"(workers: {', '.join(workers)})")


def one_line(exc: ValidationError, model: type[BaseModel]) -> str:
    """The first pydantic error as `key.path: message`, naming the valid keys for an unknown one."""
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error["loc"])
    if error["type"] == "extra_forbidden":
        valid = ", ".join(_model_at(model, error["loc"][:-1]).model_fields)
        return f"{where}: unknown option (valid here: {valid})"
    return f"{where}: {error['msg']}"


def _model_at(model: type[BaseModel], loc: tuple) -> type[BaseModel]:
    """The nested model a pydantic error location points into."""
    for part in loc:
        annotation = model.model_fields[part].annotation
        model = next(a for a in (annotation, *getattr(annotation, "__args__", ()))
                     if isinstance(a, type) and issubclass(a, BaseModel))
    return model
