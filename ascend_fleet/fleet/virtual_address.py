"""What the gateways are together: one virtual address over all of them (keepalived).

Every gateway renders the same upstreams (stages/serving.py); clients use the virtual address when
the data gives one, which keepalived keeps on one healthy gateway:

- VRRP version 3, whose adverts may come more often than once a second: a backup takes over after
  3 adverts go unheard, so 0.5 s adverts move the address within about 2 s of a gateway's power-off.
  Version 2 counts whole seconds (over 3 s). keepalived ignores `authentication` with version 3 (RFC
  5798 dropped it; keepalived's vrrp.c says "VRRP version 3 does not support authentication"), so the
  gateways' firewall is what admits VRRP, from the other gateways only.
- Unicast to the other gateways: no multicast needed on the clients' network.
- Every gateway starts as BACKUP with `nopreempt`: a gateway that comes back does not take the
  address back, which would be a second interruption.
- A track script asks the gateway's own nginx on loopback; a gateway whose nginx does not answer
  gives the address up (keepalived's FAULT state) until it answers again.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable

from ascend_fleet import TEMPLATES
from ascend_fleet.config.host_config import host_node_config
from ascend_fleet.config.hostdata import NodeConfig
from ascend_fleet.core.errors import FleetError
from ascend_fleet.core.node_layout import KEEPALIVED_NOTIFY_PROGRAM, TEXTFILE_DIR, VIRTUAL_ADDRESS_TEXTFILE
from ascend_fleet.core.remote import FactQuery, read_fleet_facts
from ascend_fleet.core.templating import render
from ascend_fleet.facts.gateway import AddressHeld
from ascend_fleet.fleet.firewall import gateway_hosts, host_address, resolve

KEEPALIVED_SERVICE = "keepalived"
# Written by keepalived's notify program on each gateway, read by node_exporter (node_layout's textfile).
HOLDS_VIP_METRIC = "ascend_fleet_gateway_holds_vip"
# The first line of the config the stage writes: only a config that starts so is ever removed.
WRITTEN_BY = "# Written by ascend-fleet"
# Where keepalived's track script asks nginx: any HTTP answer counts (an instance's 401 or a
# drained fleet's 502 is still nginx answering).
NGINX_CHECK_TIMEOUT_SECONDS = 1


def vrrp_address(member, host: str) -> str:
    """The IPv4 address a gateway sends and takes VRRP on: its address, a name resolved on the control
    machine (keepalived's unicast peers are addresses)."""
    address = host_address(member)
    try:
        return str(ipaddress.IPv4Address(address))
    except ValueError:
        pass
    try:
        found = [a for a in resolve(address) if ipaddress.ip_address(a).version == 4]
    except (socket.gaierror, UnicodeError) as exc:
        raise FleetError(f"{host}: gateway_vip: gateway {member.name}'s address {address!r} does not resolve on "
                         f"this machine ({exc}); give its IPv4 address as ssh_hostname") from None
    if not found:
        raise FleetError(f"{host}: gateway_vip: gateway {member.name}'s address {address!r} has no IPv4 address; "
                         "VRRP here is IPv4: give its IPv4 address as ssh_hostname")
    return found[0]


def keepalived_config(config: NodeConfig, inventory: Iterable) -> str:
    """keepalived.conf of this gateway, its unicast peers every other gateway of the inventory."""
    gateways = gateway_hosts(inventory)
    source = next(vrrp_address(member, config.host) for member in gateways if member.name == config.host)
    peers = [vrrp_address(member, config.host) for member in gateways if member.name != config.host]
    return render(TEMPLATES / "keepalived.conf.j2", host=config.host, vip=config.gateway_vip,
                  priority=config.gateway_vrrp_priority, source=source, peers=peers, notify=KEEPALIVED_NOTIFY_PROGRAM,
                  listen_port=config.gateway.listen_port, check_timeout=NGINX_CHECK_TIMEOUT_SECONDS)


def notify_program(config: NodeConfig) -> str:
    """The program keepalived runs on each state change: it writes whether this gateway holds the address."""
    return render(TEMPLATES / "keepalived-notify.sh.j2", textfile_dir=TEXTFILE_DIR, textfile=VIRTUAL_ADDRESS_TEXTFILE,
                  metric=HOLDS_VIP_METRIC, address=config.gateway_vip.address.ip)


def address_holders(gateways: list) -> str:
    """Which of these gateway hosts (pyinfra hosts, of one virtual address) hold it now, asked on each
    over SSH at once, as words ("gw-02"); one that cannot be read counts as not holding it."""
    address = str(host_node_config(gateways[0]).gateway_vip.address.ip)
    query = {"holds": FactQuery(AddressHeld, {"address": address})}
    facts = read_fleet_facts({member.name: (member.data.dict(), query) for member in gateways})
    return " and ".join(member.name for member in gateways if facts[member.name].facts.get("holds")) \
        or "no gateway reached"


def gateway_url(config: NodeConfig, address: str) -> str:
    """This gateway's own URL (the gateway reached at address)."""
    return f"http://{address}:{config.gateway.listen_port}"


def client_url(config: NodeConfig, address: str) -> str:
    """Where clients reach the fleet through this gateway (reached at address): the virtual address when
    the data gives one."""
    return gateway_url(config, str(config.gateway_vip.address.ip) if config.gateway_vip else address)


def virtual_address_problems(inventory: Iterable, configs: list[NodeConfig]):
    """One line per way the gateways' data cannot give one virtual address: gateways that disagree
    on it (every gateway must carry the same), or an address some host of the fleet already has (the
    address the fleet reaches it by, or its serving_address)."""
    gateways = [config for config in configs if config.is_gateway]
    if not gateways:
        return
    first = gateways[0]
    for config in gateways[1:]:
        if config.gateway_vip != first.gateway_vip:
            yield (f"{config.host}: gateway_vip: {_shown(config)} but {first.host} has {_shown(first)}; expected "
                   "the same on every gateway (set it once, in the gateway group's data)")
            return
    if first.gateway_vip is None:
        return
    address = first.gateway_vip.address.ip
    expected = "expected an address no host has, which keepalived moves between the gateways"
    serving = {config.host: config.serving_address for config in configs}
    for member in inventory:
        if host_address(member) == str(address):
            yield f"{first.host}: gateway_vip: {address} is host {member.name}'s own address; {expected}"
        elif serving[member.name] == address:
            yield f"{first.host}: gateway_vip: {address} is {member.name}'s serving_address; {expected}"


def _shown(config: NodeConfig) -> str:
    vip = config.gateway_vip
    return "none" if vip is None else f"{vip.address} on {vip.interface} (router {vip.router_id})"
