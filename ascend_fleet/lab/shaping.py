"""Link rates in the lab: a token bucket (tc tbf) on each node's link, both ways, and on the
mirror's, so a transfer takes the time a network of that speed gives it, not the machine's.

The host end of a node's veth shapes what the node receives, the node's own eth0 what it
sends, and the lab bridge what the host sends into the lab (the mirror: the origin's link;
traffic between nodes is bridged from port to port and never passes the bridge's queue).
The qdiscs go with their links when `lab down` deletes them.
"""

from __future__ import annotations

from ascend_fleet.lab.host import quiet, run
from ascend_fleet.lab.network import NODE_INTERFACE
from ascend_fleet.lab.spec import LabSpec

# Bytes the bucket holds: at least one 64 KiB GSO segment, so big packets pass whole.
BURST_BYTES = 128 * 1024
LATENCY_MS = 100


def shaped_links(spec: LabSpec) -> list[list[str]]:
    """`tc` arguments up to the device, for every shaped link of the lab."""
    links = [["dev", spec.bridge]]
    for node in spec.nodes:
        links += [["dev", spec.host_veth(node)], ["-n", spec.netns(node), "dev", NODE_INTERFACE]]
    return links


def limit_links(spec: LabSpec, rate_mbit: float) -> None:
    """Every node's link (both ways) and the mirror's at rate_mbit."""
    for link in shaped_links(spec):
        namespace, device = link[:-2], link[-2:]
        run(["tc", *namespace, "qdisc", "replace", *device, "root", "tbf", "rate", f"{rate_mbit}mbit",
             "burst", str(BURST_BYTES), "latency", f"{LATENCY_MS}ms"],
            what=f"limiting {device[1]} to {rate_mbit} Mbit/s")


def clear_links(spec: LabSpec) -> None:
    """Back to unlimited links."""
    for link in shaped_links(spec):
        namespace, device = link[:-2], link[-2:]
        quiet(["tc", *namespace, "qdisc", "del", *device, "root"])
