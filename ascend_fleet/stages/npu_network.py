"""The NPU network stage: each NPU's own NIC (its RoCE port on the parameter plane, which HCCL uses
between nodes) gets its planned address, gateway and netdetect address with hccn_tool; then
vllm-ascend's multi-node checklist runs on every NPU (link, net health, LLDP neighbour, TLS switch)
and each NPU pings the same NPU of the other hosts of its npu_peer_group. A host whose NPU network
does not pass stops here, before any instance on it (re)starts.
"""

from __future__ import annotations

import time

from pyinfra import host, inventory
from pyinfra.api import deploy

from ascend_fleet.config.host_config import host_node_config
from ascend_fleet.config.hostdata import NodeConfig
from ascend_fleet.config.per_run import once_per_run
from ascend_fleet.facts.hccn import HCCN_TOOL, NpuNicConfig, NpuNicHealth, NpuPings
from ascend_fleet.fleet.plan import npu_peer_group, npu_peers
from ascend_fleet.operations import gates, hccn

# A NIC whose address was just set brings its link up and probes its netdetect address within seconds.
SETTLE_SECONDS = 30
LINK_UP = "UP"
NET_HEALTHY = "Success"


def peer_addresses(config: NodeConfig) -> list[tuple[int, str]]:
    """(NPU, address) pairs this host's NPUs must reach: NPU i of every other member of its peer group."""
    if npu_peer_group(config) is None:
        return []
    peers = once_per_run(host.state, "npu peers",
                         lambda: npu_peers(inventory, [host_node_config(member) for member in inventory]))
    return [(npu, str(address)) for member in peers.get(config.host, ())
            for npu, address in enumerate(host_node_config(inventory.get_host(member)).npu_addresses)
            if npu < config.npu_count]


def nic_problems(config: NodeConfig) -> list[str]:
    """Each NPU whose NIC is not as planned or fails a check, one phrase each, naming NPU and check."""
    npus = config.npu_count
    # Taken once: a retry after the NICs had time to settle asks hccn_tool again.
    live = hccn.readings_left_unchanged(host.state).pop(host.name, None) or host.get_fact(NpuNicConfig, npu_count=npus)
    settings = config.npu_nic_settings()
    health = host.get_fact(NpuNicHealth, npu_count=npus)
    if not live or not health:
        return [f"hccn_tool ({HCCN_TOOL}) is missing; the NPU driver installs it"]
    problems = []
    for npu, wanted in settings.items():
        now, state = live.get(npu, {}), health.get(npu, {})
        said = state.get("said", {})
        if (now.get("address"), now.get("netmask")) != (wanted.address, wanted.netmask):
            problems.append(f"NPU {npu}: address {now.get('address')}/{now.get('netmask')}, planned "
                            f"{wanted.address}/{wanted.netmask} (-ip -g: {said_of(live, npu)})")
        elif state.get("link") != LINK_UP:
            problems.append(f"NPU {npu}: link {state.get('link')} (-link -g: {said.get('link')}); check its "
                            "optical module, cable and switch port")
        elif wanted.netdetect and state.get("net_health") != NET_HEALTHY:
            problems.append(f"NPU {npu}: net health {state.get('net_health')} (-net_health -g: "
                            f"{said.get('net_health')}); its netdetect address {wanted.netdetect} does not answer")
        elif state.get("neighbour") is None:
            problems.append(f"NPU {npu}: no LLDP neighbour (-lldp -g: {said.get('lldp')}); check the switch port")
        elif state.get("tls") != int(config.npu_tls):
            problems.append(f"NPU {npu}: TLS switch {state.get('tls')}, the fleet's is {int(config.npu_tls)} "
                            f"(npu_tls); `hccn_tool -i {npu} -tls -s enable {int(config.npu_tls)}`")
    targets = peer_addresses(config)
    if problems or not targets:
        return problems
    for (npu, address), ping in host.get_fact(NpuPings, targets=targets).items():
        if not ping["received"]:
            problems.append(f"NPU {npu} does not reach {address} of npu_peer_group {npu_peer_group(config)} "
                            f"(-ping -g address {address}: {ping['said']})")
    return problems


def said_of(live: dict, npu: int) -> str:
    """What -ip -g showed for an NPU, as the fact read it."""
    now = live.get(npu, {})
    return f"ipaddr:{now.get('address')} netmask:{now.get('netmask')}" if now.get("address") else "no address"


def npu_network_problem(config: NodeConfig) -> str | None:
    """One line for the host: its first NPU problem and how many more, after the NICs had time to settle."""
    deadline = time.monotonic() + SETTLE_SECONDS
    while (problems := nic_problems(config)) and time.monotonic() < deadline:
        time.sleep(2)
    if not problems:
        return None
    more = f" (and {len(problems) - 1} more: {'; '.join(problems[1:])})" if len(problems) > 1 else ""
    return f"NPU network: {problems[0]}{more}"


@deploy("NPU network")
def npu_network_stage() -> None:
    """Set each NPU NIC as planned (npu_addresses, npu_netmask, npu_gateway, npu_netdetect), then check it."""
    gates.stage_begins(name="Stage: NPU network", stage="NPU network")
    config = host_node_config(host)
    nics = config.npu_nic_settings()
    if not nics:
        return
    hccn.npu_nics(name="NPU NICs: address, gateway, netdetect (hccn_tool)", nics=nics)
    peers = f", reach {npu_peer_group(config)}'s NPUs" if npu_peer_group(config) else ""
    gates.passed(name="NPU network checks",
                 description=f"{len(nics)} NPU NICs as planned: link up, net health, LLDP neighbour, TLS {int(config.npu_tls)}{peers}",
                 find_problem=lambda: npu_network_problem(config))
