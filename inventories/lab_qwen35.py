"""The rehearsal lab serving Qwen3.5: `pyinfra inventories/lab_qwen35.py deploys/full.py`.

The same lab nodes as inventories/lab.py, with group_data/lab_qwen35.py instead of
group_data/lab.py: the tiny Qwen3.5-MoE W8A8 model through the example fleet's Qwen3.5
recipe, on the sim tier.
"""

from ascend_fleet.fleet_check import check_before_connecting
from ascend_fleet.lab.inventory import lab_groups

globals().update(lab_groups())

# Last: every deploy checks this inventory and its data here, before pyinfra connects to any host.
check_before_connecting()
