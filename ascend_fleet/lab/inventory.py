"""The lab as pyinfra inventory groups, read from the state file `lab up` wrote."""

from __future__ import annotations

from pathlib import Path

from ascend_fleet.lab.lab import fleet_state_dir, ssh_config_file, ssh_dir
from ascend_fleet.lab.mirror import locks_dir
from ascend_fleet.lab.network import NODE_INTERFACE
from ascend_fleet.lab.spec import DEFAULT_LAB_DIR, LabSpec, NodeSpec
from ascend_fleet.lab.state import LabState


def host_data(lab_dir: Path, node: NodeSpec, spec: LabSpec) -> dict:
    """SSH settings (the lab's key, its own known_hosts, strict checking), the node's hardware,
    the lab mirror's URLs (pip index, vendor files, models; an offline lab's: its gateway's bundle) and, for a worker, its NPUs' address plan
    on the lab's parameter plane (gateway and net-detect target: the host's address there).
    On a bastion lab, the ssh config that reaches the node through the bastion: it matches the node's
    address, which stays ssh_hostname because the fleet reaches the node by it too (the gateway's
    upstreams, the instance firewall, Prometheus)."""
    keys = ssh_dir(lab_dir)
    hardware = node.hardware
    mirror_url = spec.mirror_url
    plan = {}
    if node.role == "worker" and hardware.npus:
        plan = {"npu_addresses": spec.npu_addresses(node), "npu_netmask": str(spec.npu_network.netmask),
                "npu_gateway": spec.npu_host_address, "npu_netdetect": spec.npu_host_address,
                # Where the hosts of a multi-node instance reach each other: the lab bridge.
                "serving_address": node.address}
    if node.role == "gateway" and spec.gateway_vip:
        # One address over the gateways, on the lab bridge (each node's eth0).
        plan = {"gateway_vip": {"address": spec.gateway_vip, "interface": NODE_INTERFACE},
                # The first gateway takes it when both start together; nopreempt keeps it wherever it is (the first to start).
                "gateway_vrrp_priority": 150 if node.index == 0 else 100}
    if spec.offline_bundle:
        # A site without internet: everything from its bundle, which the gateway serves (group mirror).
        mirror_url = spec.site_mirror_url
        sources = {"bundle_dir": str(spec.offline_bundle)}
    else:
        sources = {"pip_locks_dir": str(locks_dir(lab_dir))}
    return {
        "ssh_hostname": node.address,
        "ssh_user": "root",
        "ssh_key": str(keys / "id_ed25519"),
        "ssh_known_hosts_file": str(keys / "known_hosts"),
        "ssh_strict_host_key_checking": "yes",
        **({"ssh_config_file": str(ssh_config_file(lab_dir))} if spec.jump_host else {}),
        "chip": hardware.chip,
        "npu_count": hardware.npus,
        "nvme_mount": hardware.nvme.mount if hardware.nvme else None,
        "model_mirror_url": mirror_url,
        "pip_index_url": f"{mirror_url}/simple",
        "vendor_mirror_url": f"{mirror_url}/files",
        **sources,
        # Each lab keeps its rollout state apart: several labs share inventories/lab.py.
        "fleet_state_dir": str(fleet_state_dir(lab_dir)),
        # The lab host is the operator's machine: it reads Prometheus and the exporters, as a site's would.
        "monitoring_allowed_sources": [spec.host_address],
        **plan,
    }


def lab_groups(lab_dir: Path = DEFAULT_LAB_DIR) -> dict[str, list]:
    """{group: [(host, data)]}: every node carries its data in its first group, the rest list names.
    A bastion is in no group: it is the way to the fleet, not a host of it."""
    state = LabState.require(lab_dir)
    groups: dict[str, list] = {}
    for node in state.spec.nodes:
        if not node.groups:
            continue
        first, *others = node.groups
        groups.setdefault(first, []).append((node.name, host_data(lab_dir, node, state.spec)))
        for group in others:
            groups.setdefault(group, []).append(node.name)
    return groups
