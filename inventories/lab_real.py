"""The rehearsal lab on its real serving tier: `pyinfra inventories/lab_real.py deploys/full.py`.

The same lab nodes as inventories/lab.py, with group_data/lab_real.py instead of
group_data/lab.py: real vLLM for CPU (profile lab-real), one instance per worker. Bring the
lab up for it with `ascend-fleet lab up --nodes 1 --profile lab-real`.
"""

from ascend_fleet.fleet_check import check_before_connecting
from ascend_fleet.lab.inventory import lab_groups

globals().update(lab_groups())

# Last: every deploy checks this inventory and its data here, before pyinfra connects to any host.
check_before_connecting()
