"""An example fleet serving a model bigger than a node: Qwen3.5-397B-A17B W8A8 (its MTP head too) on
four Atlas 800 A2 nodes (8 x 910B3 each), two instances of two nodes, as vllm-ascend's guide serves it
(group_data/prod_397b.py). Copy it, put your hosts, addresses and NICs in, keep the shape.

    ascend-fleet plan inventories/prod_397b.py --model-config DIR    # TP8 x DP2 + EP + MTP per instance
    pyinfra inventories/prod_397b.py deploys/full.py

Each instance is an inventory group (q397_a, q397_b) with group data of its own (data_parallel); its
first host is the head, which the gateway routes to. Each NPU's RoCE address is host data: the NPUs of
an instance's hosts reach each other over them (the NPU network stage checks it before serving).
"""

from pathlib import Path

from ascend_fleet.fleet_check import check_before_connecting

_ssh = {
    "ssh_user": "root",
    "ssh_strict_host_key_checking": "yes",
    "ssh_known_hosts_file": str(Path(__file__).resolve().with_name("prod.known_hosts")),
}


def _node(n: int) -> dict:
    """npu-0n: its address on the serving network (HCCL_IF_IP) and its 8 NPUs' on the parameter plane."""
    return {**_ssh, "chip": "910B3", "npu_count": 8, "nvme_mount": "/mnt/nvme",
            "serving_address": f"192.168.13.{30 + n}",
            "npu_addresses": [f"10.20.0.{n * 10 + npu}" for npu in range(8)]}


workers = [(f"npu-0{n}.example.internal", _node(n)) for n in range(1, 5)]
q397_a = ["npu-01.example.internal", "npu-02.example.internal"]
q397_b = ["npu-03.example.internal", "npu-04.example.internal"]
# Rollout waves by instance: the head's wave moves its whole instance.
canary = ["npu-01.example.internal"]
wave1 = ["npu-03.example.internal"]

gateway = [("gw-01.example.internal", _ssh)]

# Last: every deploy checks this inventory and its data here, before pyinfra connects to any host.
check_before_connecting()
