"""The lab's network: a bridge on the host, a network namespace and veth per node, a firewall; and the
NPUs' parameter plane: a second bridge with one veth per NPU, its node end inside the node's namespace.

The plane's ports model NPU RoCE ports, which a real node does not see as Linux interfaces: the
simulated hccn_tool sets their addresses. Several ports of one node share a subnet, so each
answers ARP only for its own address (arp_ignore=1, arp_announce=2) and answers from its own
address through its own port (a routing table and rule per port, which hccn_tool writes with the
address): a broken port k breaks exactly the traffic to and from NPU k.
"""

from __future__ import annotations

import ctypes
import os
import socket
import threading
from pathlib import Path

from ascend_fleet import TEMPLATES
from ascend_fleet.core.templating import render
from ascend_fleet.lab.host import quiet, run
from ascend_fleet.lab.spec import GATEWAY_SERVING_PORT, LabSpec, NodeSpec, npu_interface
from ascend_fleet.lab.state import LabState

NODE_INTERFACE = "eth0"
CLONE_NEWNET = 0x40000000


def firewall_table(spec: LabSpec) -> str:
    return f"af_{spec.name}"


def create_bridge(state: LabState, spec: LabSpec) -> None:
    state.record("bridge", name=spec.npu_bridge)
    run(["ip", "link", "add", spec.npu_bridge, "type", "bridge"], what=f"creating bridge {spec.npu_bridge}")
    run(["ip", "addr", "add", f"{spec.npu_host_address}/{spec.npu_network.prefixlen}", "dev", spec.npu_bridge])
    run(["ip", "link", "set", spec.npu_bridge, "up"])
    state.record("bridge", name=spec.bridge)
    run(["ip", "link", "add", spec.bridge, "type", "bridge"], what=f"creating bridge {spec.bridge}")
    run(["ip", "addr", "add", f"{spec.host_address}/{spec.network.prefixlen}", "dev", spec.bridge])
    run(["ip", "link", "set", spec.bridge, "up"])

    state.record("nft-table", name=firewall_table(spec))
    run(["nft", "-f", "-"], input=firewall_rules(spec), what="loading the lab firewall")


def firewall_rules(spec: LabSpec) -> str:
    """The lab's nft table: what the nodes reach on the host; behind a bastion, what the host reaches."""
    jump_host = spec.jump_host
    # Clients use the virtual address where the gateways have one; the rollout's gates ask each gateway at its own.
    gateway_addresses = [node.address for node in spec.nodes if node.role == "gateway"]
    gateway_addresses += [spec.gateway_vip.split("/")[0]] if spec.gateway_vip else []
    return render(TEMPLATES / "lab" / "firewall.nft.j2", table=firewall_table(spec), bridge=spec.bridge,
                  npu_bridge=spec.npu_bridge, mirror_port=None if spec.offline_bundle else spec.mirror_port,
                  bastion=jump_host.address if jump_host else None, gateway_addresses=gateway_addresses,
                  gateway_port=GATEWAY_SERVING_PORT)


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


def connect_from(netns: str | None, address: str, port: int, timeout: float) -> socket.socket:
    """A TCP connection made in a node's network namespace (None: the host's)."""
    sock = socket.socket() if netns is None else socket_in(netns)
    sock.settimeout(timeout)
    try:
        sock.connect((address, port))
    except OSError:
        sock.close()
        raise
    return sock


def socket_in(netns: str) -> socket.socket:
    """A TCP socket of a network namespace. A socket stays in the namespace it was made in, so a thread
    of its own enters the namespace (setns moves the calling thread alone), makes it and ends there."""
    made: dict = {}

    def make() -> None:
        try:
            with open(f"/run/netns/{netns}") as namespace:
                if ctypes.CDLL(None, use_errno=True).setns(namespace.fileno(), CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns {netns}: {os.strerror(ctypes.get_errno())}")
            made["socket"] = socket.socket()
        except OSError as exc:
            made["error"] = exc

    maker = threading.Thread(target=make)
    maker.start()
    maker.join()
    if "error" in made:
        raise made["error"]
    return made["socket"]


def remove_netns(entry: dict) -> None:
    if Path("/run/netns", entry["name"]).exists():
        quiet(["ip", "netns", "del", entry["name"]])


def remove_link(entry: dict) -> None:
    quiet(["ip", "link", "del", entry["name"]])


def remove_nft_table(entry: dict) -> None:
    quiet(["nft", "delete", "table", "inet", entry["name"]])


# What each port's own answers need (see the module's docstring); per port, so the node's eth0 keeps its own.
PORT_SYSCTLS = {"arp_ignore": "1", "arp_announce": "2", "rp_filter": "0"}


def create_npu_ports(state: LabState, spec: LabSpec, node: NodeSpec) -> None:
    """NPU i's port: a veth whose host end is on the plane's bridge (down where the hardware file says the
    NIC's link is down: no carrier inside) and whose node end is npu_interface(i), up, with no address."""
    netns = spec.netns(node)
    for npu in range(node.hardware.npus if node.role == "worker" else 0):
        port, inside = spec.npu_host_port(node, npu), npu_interface(npu)
        state.record("link", name=port)
        run(["ip", "link", "add", port, "type", "veth", "peer", "name", inside, "netns", netns],
            what=f"creating {node.name}'s NPU {npu} port")
        run(["ip", "link", "set", port, "master", spec.npu_bridge])
        if node.hardware.npu_nic.get(npu, "up") == "up":
            run(["ip", "link", "set", port, "up"])
        run(["ip", "-n", netns, "link", "set", inside, "up"])
        run(["ip", "netns", "exec", netns, "sysctl", "-q",
             *[f"net.ipv4.conf.{inside}.{key}={value}" for key, value in PORT_SYSCTLS.items()]])


def npu_table(npu: int) -> int:
    """The routing table, and rule preference, of NPU npu's port (hccn_tool writes them with its address)."""
    return 1000 + npu


def forget_npu_settings(netns: str, npus: int) -> None:
    """What an NPU forgets when its node powers off: its port's address, routes and rule. The node's
    namespace outlives the node's boots, so the supervisor does this before each boot; the driver's
    boot activation then applies /etc/hccn.conf, as the real driver's start-up does."""
    for npu in range(npus):
        inside = npu_interface(npu)
        quiet(["ip", "-n", netns, "addr", "flush", "dev", inside])
        quiet(["ip", "-n", netns, "route", "flush", "table", str(npu_table(npu))])
        while quiet(["ip", "-n", netns, "rule", "del", "pref", str(npu_table(npu))]):
            pass
        quiet(["ip", "-n", netns, "link", "set", inside, "up"])
