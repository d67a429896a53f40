"""An example production fleet: copy this file, put your hosts in, keep the shape.

    pyinfra inventories/prod.py deploys/full.py

Every host here is also in pyinfra's file group `prod`, so group_data/prod.py (profile,
model, serving options) applies to all of them; group_data/all.py holds the defaults,
group_data/gateway.py the Nginx settings. Rollout goes canary, wave1, wave2
(group_data/all.py `rollout_waves`). Names prefixed with `_` are not groups.
"""

from pathlib import Path

from ascend_fleet.fleet_check import check_before_connecting

# Host keys are verified: connect only to hosts whose keys are in this file. Fill it
# with `ssh-keyscan HOST` output you have checked against each host's console.
_ssh = {
    "ssh_user": "root",
    "ssh_strict_host_key_checking": "yes",
    "ssh_known_hosts_file": str(Path(__file__).resolve().with_name("prod.known_hosts")),
}

# Atlas 800 A2-class nodes: 8 x 910B3, weights on local NVMe.
_worker = {**_ssh, "chip": "910B3", "npu_count": 8, "nvme_mount": "/mnt/nvme"}

workers = [(f"npu-{n:02d}.example.internal", _worker) for n in range(1, 6)]
canary = ["npu-01.example.internal"]
wave1 = ["npu-02.example.internal", "npu-03.example.internal"]
wave2 = ["npu-04.example.internal", "npu-05.example.internal"]

# CPU hosts running Nginx in front of every instance.
gateway = [("gw-01.example.internal", _ssh), ("gw-02.example.internal", _ssh)]

# Last: every deploy checks this inventory and its data here, before pyinfra connects to any host.
check_before_connecting()
