"""The lab's network: a bridge on the host, a network namespace and veth per node, a firewall."""

from __future__ import annotations

from pathlib import Path

from ascend_fleet import TEMPLATES
from ascend_fleet.lab.host import quiet, run
from ascend_fleet.lab.spec import LabSpec, NodeSpec
from ascend_fleet.lab.state import LabState
from ascend_fleet.templating import render

NODE_INTERFACE = "eth0"


def firewall_table(spec: LabSpec) -> str:
    return f"af_{spec.name}"


def create_bridge(state: LabState, spec: LabSpec) -> None:
    state.record("bridge", name=spec.bridge)
    run(["ip", "link", "add", spec.bridge, "type", "bridge"], what=f"creating bridge {spec.bridge}")
    run(["ip", "addr", "add", f"{spec.host_address}/{spec.network.prefixlen}", "dev", spec.bridge])
    run(["ip", "link", "set", spec.bridge, "up"])

    table = firewall_table(spec)
    state.record("nft-table", name=table)
    ruleset = render(TEMPLATES / "lab" / "firewall.nft.j2", table=table, bridge=spec.bridge,
                     mirror_port=spec.mirror_port)
    run(["nft", "-f", "-"], input=ruleset, what="loading the lab firewall")


def create_node_network(state: LabState, spec: LabSpec, node: NodeSpec) -> None:
    """A namespace whose eth0 is bridged to the lab; it outlives the node's reboots."""
    netns = spec.netns(node)
    state.record("netns", name=netns)
    run(["ip", "netns", "add", netns], what=f"creating network namespace {netns}")
    veth = spec.host_veth(node)
    state.record("link", name=veth)
    run(["ip", "link", "add", veth, "type", "veth", "peer", "name", NODE_INTERFACE, "netns", netns])
    run(["ip", "link", "set", veth, "master", spec.bridge, "up"])
    inside = ["ip", "-n", netns]
    run([*inside, "addr", "add", f"{node.address}/{spec.network.prefixlen}", "dev", NODE_INTERFACE])
    run([*inside, "link", "set", NODE_INTERFACE, "up"])
    run([*inside, "link", "set", "lo", "up"])


def remove_netns(entry: dict) -> None:
    if Path("/run/netns", entry["name"]).exists():
        quiet(["ip", "netns", "del", entry["name"]])


def remove_link(entry: dict) -> None:
    quiet(["ip", "link", "del", entry["name"]])


def remove_nft_table(entry: dict) -> None:
    quiet(["nft", "delete", "table", "inet", entry["name"]])
