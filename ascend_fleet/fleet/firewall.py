"""Who may reach what on each worker and gateway: the nftables table of its own each gets.

Each host gets one table (`inet ascend_fleet`, templates/instance-firewall.nft.j2) of openings: ports
(or an IP protocol) that answer loopback and the sources named here, and anyone else a TCP reset (a
dropped packet for a protocol). It matches nothing else: the ports it does not name (a gateway's
serving port, which clients reach; the site mirror's, from which every node installs) and the other
tables are left as they are.

- A worker's instance API ports (both colours'): the gateway hosts (nginx), the monitoring hosts
  (Prometheus) and `instance_allowed_sources`.
- Its engine ports, each instance's `VLLM_PORT` range and HCCL range (and a multi-node head's DP RPC
  port): the hosts of that instance only (a multi-node instance's members, by their address and
  their serving_address); a single-node instance's engines talk over loopback alone.
- Its weights peer port: the workers.
- node_exporter's port on every host, and Prometheus's and the nginx exporter's on gateways: the
  monitoring hosts (`monitoring_hosts`) and `monitoring_allowed_sources`.
- VRRP (IP protocol 112) on gateways: the other gateways (keepalived's unicast peers).
- SSH, where the data names `sshd_allowed_sources`: those only (else SSH is left alone).

The control machine needs no way in but SSH: `status` and the rollout gates ask each instance from its
own node over SSH, `load` and `bench` go through the gateway.

Names are resolved here, on the control machine, while the deploy is prepared: a name that does not
resolve stops the run before any host is changed. Only ipaddress networks without a zone and ints
reach the template.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
import socket
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache

from ascend_fleet import TEMPLATES
from ascend_fleet.config.fleetstate import COLOURS
from ascend_fleet.config.host_config import host_node_config
from ascend_fleet.config.hostdata import NodeConfig
from ascend_fleet.core.errors import FleetError
from ascend_fleet.core.templating import render
from ascend_fleet.fleet.multi_node import head_ports

FAMILY, TABLE = "inet", "ascend_fleet"
# The loaded table's comment carries this and the rules' digest, so a fact can tell which rules are live.
COMMENT_PREFIX = "ascend-fleet rules sha256:"
VRRP = 112  # IANA's protocol number of VRRP: keepalived's adverts between the gateways
SSH_PORT = 22  # pyinfra's, when the host's data names no ssh_port
OPENING_NAME = re.compile(r"[a-z][a-z0-9_]*")  # the table's set names are made of it
# An entry no host name can be (digits and dots only, or a colon): an IPv4 or IPv6 address or network.
ADDRESS_LIKE = re.compile(r"[0-9./]+|[0-9A-Fa-f.:/]*:[0-9A-Fa-f.:/]*")

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def host_address(member) -> str:
    """How the fleet addresses an inventory host, as the gateway config and Prometheus do."""
    return member.data.get("ssh_hostname") or member.name


def networks(entry: str, host: str, what: str) -> list[Network]:
    """An address, a network (CIDR) or a name resolved on the control machine (every address it has). What
    reads as an address is one: the resolver would take 10.0.0 for 10.0.0.0 and 1234 for 0.0.4.210."""
    try:
        found = [ipaddress.ip_network(entry, strict=False)]
    except ValueError:
        if ADDRESS_LIKE.fullmatch(entry):
            raise FleetError(f"{host}: firewall: {what} {entry!r} is not an address or network "
                             f"({_address_error(entry)}); give e.g. 10.0.0.7, 10.0.0.0/24 or fd00::/64") from None
        try:
            found = [ipaddress.ip_network(address) for address in resolve(entry)]
        except (OSError, UnicodeError, ValueError) as exc:
            raise FleetError(f"{host}: firewall: {what} {entry!r} does not resolve on this machine ({exc}); give an "
                             "address, fix the name, or set instance_firewall: false") from None
    if any(getattr(network.network_address, "scope_id", None) for network in found):
        raise FleetError(f"{host}: firewall: {what} {entry!r} names an IPv6 zone (%...), which no nftables rule "
                         "matches; give the address without it")
    return found


def _address_error(entry: str) -> str:
    """What ipaddress says is wrong with an address or network of the family it reads as."""
    try:
        (ipaddress.IPv6Network if ":" in entry else ipaddress.IPv4Network)(entry, strict=False)
    except ValueError as exc:
        return str(exc)
    return "not an address"


def addresses(members: Iterable, host: str, what: str) -> list[Network]:
    """The networks of inventory hosts' addresses, for `host`'s rules; `what` names their role in errors."""
    return [network for member in members
            for network in networks(host_address(member), host, f"{what} {member.name}'s address")]


def sources(entries: Iterable[str], host: str, key: str) -> list[Network]:
    """The networks of a data list of addresses, networks and names."""
    return [network for entry in entries for network in networks(entry, host, f"{key} entry")]


@cache  # every host's rules name every gateway and worker: one lookup per name and run, not per host
def resolve(name: str) -> list[str]:
    """Every address the control machine's resolver gives a name (IPv6 without its zone). An address is its
    own answer: asked of the resolver, each took a thread of pyinfra's pool (0.1 s a thousand hosts)."""
    try:
        return [str(ipaddress.ip_address(name.split("%", 1)[0]))]
    except ValueError:
        pass
    return [info[4][0].split("%", 1)[0] for info in socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)]


def gateway_hosts(inventory: Iterable) -> list:
    """The hosts whose nginx sends requests to the instances (and whose keepalived moves the virtual address)."""
    return [member for member in inventory if host_node_config(member).is_gateway]


def monitoring_hosts(inventory: Iterable) -> list:
    """The hosts that run Prometheus and scrape every exporter and instance: the gateway hosts
    (stages/monitoring.py). The one place that says who they are."""
    return gateway_hosts(inventory)


def instance_sources(config: NodeConfig, inventory: Iterable) -> list[Network]:
    """Who may reach the instance ports: every gateway host of the inventory (nginx), every monitoring
    host (Prometheus) and the data's instance_allowed_sources. None at all is refused: the instances
    would answer nobody."""
    inventory = list(inventory)  # every host, also those a --limit leaves out
    found = (addresses(gateway_hosts(inventory), config.host, "gateway")
             + addresses(monitoring_hosts(inventory), config.host, "monitoring host")  # by_family merges repeats
             + sources(config.instance_allowed_sources, config.host, "instance_allowed_sources"))
    if not found:
        raise FleetError(f"{config.host}: instance firewall: the inventory has no gateway host and the data no "
                         "instance_allowed_sources, so nothing could reach the instances; list who may in "
                         "instance_allowed_sources, or set instance_firewall: false")
    return found


def peer_sources(config: NodeConfig, inventory: Iterable) -> list[Network]:
    """Who may fetch from the peer port (weights, packages, wheels): every worker of the inventory."""
    return addresses([member for member in inventory if host_node_config(member).is_worker], config.host, "worker")


def monitoring_sources(config: NodeConfig, inventory: Iterable) -> list[Network]:
    """Who may reach the exporters and Prometheus: the monitoring hosts and monitoring_allowed_sources."""
    return (addresses(monitoring_hosts(inventory), config.host, "monitoring host")
            + sources(config.monitoring_allowed_sources, config.host, "monitoring_allowed_sources"))


def instance_members(config: NodeConfig, inventory) -> list:
    """The hosts of this host's multi-node instance, the head first; none for single-node instances."""
    return inventory.get_group(config.data_parallel.group) if config.data_parallel else []


def member_sources(config: NodeConfig, inventory) -> list[Network]:
    """Who may reach the engine ports: the hosts of the same instance, by their address and their
    serving_address (where HCCL_IF_IP puts them)."""
    members = instance_members(config, inventory)
    serving = [network for member in members if (address := host_node_config(member).serving_address)
               for network in networks(str(address), config.host, f"member {member.name}'s serving_address")]
    return addresses(members, config.host, "member") + serving


def instance_ports(host) -> list[int]:
    """The API ports of both colours' instances: a blue/green swap starts the other set beside the serving one."""
    return sorted({instance.port for colour in COLOURS for instance in host_node_config(host, colour).instances})


def engine_ports(host, inventory) -> list[int]:
    """The ports an instance's engines take besides its API port (VLLM_PORT's range and HCCL's, both
    colours'), and a multi-node head's DP RPC port."""
    config = host_node_config(host)
    ports = {port for colour in COLOURS for record in host_node_config(host, colour).instance_records()
             for taken in record.port_ranges() if taken.field != "port" for port in taken.ports}
    members = instance_members(config, inventory)
    if members and members[0].name == host.name:
        ports |= {port for taken in head_ports(config.data_parallel.rpc_port) for port in taken.ports}
    return sorted(ports)


def ssh_port(host) -> int:
    """The port pyinfra reaches the host's SSH on (its data's ssh_port)."""
    port = host.data.get("ssh_port")
    port = SSH_PORT if port is None else port
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise FleetError(f"{host.name}: ssh_port: {port!r} is not a port; expected a whole number from 1 to 65535")
    return port


def by_family(found: Iterable[Network]) -> dict[int, list[str]]:
    """{4: [...], 6: [...]}: each family's networks merged, as nftables interval sets take them."""
    found = list(found)
    return {version: [str(n) for n in ipaddress.collapse_addresses(n for n in found if n.version == version)]
            for version in (4, 6)}


def spans(ports: Iterable[int]) -> list[str]:
    """Ports as nftables set elements, runs merged: [8000, 8001, 8002, 8090] -> ["8000-8002", "8090"]."""
    found: list[list[int]] = []
    for port in sorted(set(ports)):
        if found and found[-1][1] == port - 1:
            found[-1][1] = port
        else:
            found.append([port, port])
    return [f"{first}-{last}" if first != last else str(first) for first, last in found]


@dataclass(frozen=True)
class Opening:
    """TCP ports, or an IP protocol, that answer loopback and `sources` only."""

    name: str  # its sets' names in the table
    ports: tuple[int, ...]  # TCP destination ports; empty with protocol
    sources: tuple[Network, ...]
    protocol: int | None = None  # an IP protocol (VRRP) instead of ports

    def __post_init__(self):
        """Only what nftables takes as written reaches the template: a name, ints, ipaddress networks."""
        if not OPENING_NAME.fullmatch(self.name):
            raise ValueError(f"opening name {self.name!r}: expected {OPENING_NAME.pattern}")
        for port in self.ports:
            if type(port) is not int or not 1 <= port <= 65535:
                raise ValueError(f"opening {self.name}: port {port!r}: expected an int from 1 to 65535")
        if self.protocol is not None and (type(self.protocol) is not int or not 0 <= self.protocol <= 255
                                          or self.ports):
            raise ValueError(f"opening {self.name}: protocol {self.protocol!r}: expected an int from 0 to 255, "
                             "without ports")
        if self.protocol is None and not self.ports:
            raise ValueError(f"opening {self.name}: neither ports nor a protocol")
        for network in self.sources:
            if not isinstance(network, Network) or getattr(network.network_address, "scope_id", None):
                raise ValueError(f"opening {self.name}: source {network!r}: expected an IPv4 or IPv6 network "
                                 "without a zone")

    def settings(self) -> dict:
        return {"name": self.name, "ports": spans(self.ports), "protocol": self.protocol,
                "sources": by_family(self.sources)}


def opening(name: str, ports: Iterable[int], found: Iterable[Network]) -> Opening:
    return Opening(name, tuple(ports), tuple(found))


def host_openings(host, inventory, monitored: Iterable[int]) -> list[Opening]:
    """Every opening of a worker's or gateway's table; `monitored` the ports its monitoring listeners
    (exporters, Prometheus) take, which stages/monitoring.py defines."""
    config = host_node_config(host)
    found = []
    if config.is_worker:
        found += [opening("instances", instance_ports(host), instance_sources(config, inventory)),
                  opening("engines", engine_ports(host, inventory), member_sources(config, inventory)),
                  opening("peer", [config.model.peer_port], peer_sources(config, inventory))]
    found.append(opening("monitoring", monitored, monitoring_sources(config, inventory)))
    if config.is_gateway:
        others = [member for member in gateway_hosts(inventory) if member.name != host.name]
        found.append(Opening("vrrp", (), tuple(addresses(others, config.host, "gateway")), protocol=VRRP))
    if config.sshd_allowed_sources:
        found.append(opening("ssh", [ssh_port(host)],
                             sources(config.sshd_allowed_sources, config.host, "sshd_allowed_sources")))
    return found


@dataclass(frozen=True)
class FirewallRules:
    text: str  # the nftables file
    comment: str  # its table's comment once loaded: the digest of the rules without it


def firewall_rules(openings: list[Opening]) -> FirewallRules:
    """The nftables file of one host."""
    settings = {"family": FAMILY, "table": TABLE, "openings": [each.settings() for each in openings]}
    unsigned = render(TEMPLATES / "instance-firewall.nft.j2", comment="", **settings)
    comment = COMMENT_PREFIX + hashlib.sha256(unsigned.encode()).hexdigest()
    return FirewallRules(render(TEMPLATES / "instance-firewall.nft.j2", comment=comment, **settings), comment)


def connects_from(address: str) -> str | None:
    """The address this machine's connections to `address` leave from (its route's source), or None
    when it has no route there. A UDP socket's connect sends nothing."""
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(address).version == 6 else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((address, SSH_PORT))
            return probe.getsockname()[0].split("%", 1)[0]
    except (OSError, ValueError):
        return None


def ssh_lockout_problems(inventory: Iterable) -> Iterator[str]:
    """One line per host whose sshd_allowed_sources leave out the address this machine connects to it
    from, checked before connecting (fleet_check). It cannot be told for a host reached through an ssh
    config file (a bastion: the node sees the bastion's address, not this machine's), nor for one
    whose address does not resolve here or has no route from here; behind NAT the route's source is
    not what the node sees either, so list the address the node sees as well."""
    for member in inventory:
        config = host_node_config(member)
        if (not config.sshd_allowed_sources or not config.instance_firewall
                or not (config.is_worker or config.is_gateway) or member.data.get("ssh_config_file")):
            continue
        try:
            target = resolve(host_address(member))[0]
            allowed = sources(config.sshd_allowed_sources, config.host, "sshd_allowed_sources")
        except (OSError, UnicodeError, IndexError):
            continue
        except FleetError as exc:
            yield str(exc)
            continue
        own = connects_from(target)
        if own and not any(ipaddress.ip_address(own) in network for network in allowed):
            yield (f"{member.name}: sshd_allowed_sources: {config.sshd_allowed_sources} leaves out {own}, the address "
                   f"this machine connects to the host from (its route to {target}); add it, or the firewall "
                   "stage would cut this machine off the host's SSH")
