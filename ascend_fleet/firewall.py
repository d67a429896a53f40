"""Who may reach a worker's vLLM instance ports and its peer port (weights, packages, wheels).

Every instance answers /v1, /health and /metrics on its own port, on all addresses: the
gateway's nginx and Prometheus (both on the gateway hosts) need them. Each worker gets an
nftables table of its own (`inet ascend_fleet`, templates/instance-firewall.nft.j2) that
accepts those ports from loopback, the gateway hosts and the data's `instance_allowed_sources`,
the peer port from loopback and the workers, and refuses both to anyone else. It
matches nothing else: SSH, the other ports and other tables are left as they are. The control
machine needs no way in: `status` and the rollout gates ask each instance from its own node
over SSH, `load` and `bench` go through the gateway.

Names are resolved here, on the control machine, while the deploy is prepared: a name that
does not resolve stops the run before any host is changed.
"""

from __future__ import annotations

import hashlib
import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache

from ascend_fleet import TEMPLATES
from ascend_fleet.errors import FleetError
from ascend_fleet.fleetstate import COLOURS
from ascend_fleet.host_config import host_node_config
from ascend_fleet.hostdata import NodeConfig
from ascend_fleet.templating import render

FAMILY, TABLE = "inet", "ascend_fleet"
# The loaded table's comment carries this and the rules' digest, so a fact can tell which rules are live.
COMMENT_PREFIX = "ascend-fleet rules sha256:"

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def host_address(member) -> str:
    """How the fleet addresses an inventory host, as the gateway config and Prometheus do."""
    return member.data.get("ssh_hostname") or member.name


def networks(entry: str, host: str, what: str) -> list[Network]:
    """An address, a network (CIDR) or a name resolved on the control machine (every address it has)."""
    try:
        return [ipaddress.ip_network(entry, strict=False)]
    except ValueError:
        pass
    try:
        return [ipaddress.ip_network(address) for address in resolve(entry)]
    except (socket.gaierror, UnicodeError) as exc:
        raise FleetError(f"{host}: instance firewall: {what} {entry!r} does not resolve on this machine ({exc}); "
                         "give an address, fix the name, or set instance_firewall: false") from None


@cache  # every worker's rules name every gateway and worker: one lookup per name and run, not per worker
def resolve(name: str) -> list[str]:
    """Every address the control machine's resolver gives a name (IPv6 without its zone)."""
    return [info[4][0].split("%", 1)[0] for info in socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)]


def instance_sources(config: NodeConfig, inventory: Iterable) -> list[Network]:
    """Who may reach the instance ports: every gateway host of the inventory (nginx and Prometheus
    run there) and the data's instance_allowed_sources. None at all is refused: the instances
    would answer nobody."""
    found = []
    for member in inventory:  # every host, also those a --limit leaves out
        if host_node_config(member).is_gateway:
            found += networks(host_address(member), config.host, f"gateway {member.name}'s address")
    for entry in config.instance_allowed_sources:
        found += networks(entry, config.host, "instance_allowed_sources entry")
    if not found:
        raise FleetError(f"{config.host}: instance firewall: the inventory has no gateway host and the data no "
                         "instance_allowed_sources, so nothing could reach the instances; list who may in "
                         "instance_allowed_sources, or set instance_firewall: false")
    return found


def peer_sources(config: NodeConfig, inventory: Iterable) -> list[Network]:
    """Who may fetch from the peer port (weights, packages, wheels): every worker of the inventory."""
    return [network for member in inventory if host_node_config(member).is_worker
            for network in networks(host_address(member), config.host, f"worker {member.name}'s address")]


def instance_ports(host) -> list[int]:
    """The API ports of both colours' instances: a blue/green swap starts the other set beside the serving one."""
    return sorted({instance.port for colour in COLOURS for instance in host_node_config(host, colour).instances})


def by_family(found: Iterable[Network]) -> dict[int, list[str]]:
    """{4: [...], 6: [...]}: each family's networks merged, as nftables interval sets take them."""
    found = list(found)
    return {version: [str(n) for n in ipaddress.collapse_addresses(n for n in found if n.version == version)]
            for version in (4, 6)}


@dataclass(frozen=True)
class FirewallRules:
    text: str  # the nftables file
    comment: str  # its table's comment once loaded: the digest of the rules without it


def firewall_rules(ports: list[int], sources: list[Network], peer_port: int, peers: list[Network]) -> FirewallRules:
    """The nftables file of one worker."""
    settings = {"family": FAMILY, "table": TABLE, "instance_ports": ports, "instance_sources": by_family(sources),
                "peer_port": peer_port, "peer_sources": by_family(peers)}
    unsigned = render(TEMPLATES / "instance-firewall.nft.j2", comment="", **settings)
    comment = COMMENT_PREFIX + hashlib.sha256(unsigned.encode()).hexdigest()
    return FirewallRules(render(TEMPLATES / "instance-firewall.nft.j2", comment=comment, **settings), comment)
