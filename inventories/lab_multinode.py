"""The rehearsal lab serving a model bigger than a node: `pyinfra inventories/lab_multinode.py deploys/full.py`
on a lab of 4 workers (`ascend-fleet lab up --nodes 4`).

Two instances, each over two workers as vllm-ascend's guide serves Qwen3.5-397B-A17B W8A8 on two
Atlas A2 nodes (TP8 on each, DP2 across them, expert parallel): lab_pair_a (worker1 the head, worker2)
and lab_pair_b (worker3 the head, worker4), with group_data/lab_multinode.py and
group_data/lab_pair_a.py, lab_pair_b.py. Their NPUs reach each other over the lab's parameter plane.
"""

from ascend_fleet.fleet_check import check_before_connecting
from ascend_fleet.lab.inventory import lab_groups

globals().update(lab_groups())

lab_pair_a = ["worker1", "worker2"]
lab_pair_b = ["worker3", "worker4"]

# Last: every deploy checks this inventory and its data here, before pyinfra connects to any host.
check_before_connecting()
