"""The rehearsal lab as an inventory: `pyinfra inventories/lab.py deploys/full.py`.

Groups come from `ascend-fleet lab up` (gateway, workers, canary, wave1, wave2, ...);
set ASCEND_FLEET_LAB_DIR to use a lab kept somewhere other than the default.
"""

from ascend_fleet.fleet_check import check_before_connecting
from ascend_fleet.lab.inventory import lab_groups

globals().update(lab_groups())

# Last: every deploy checks this inventory and its data here, before pyinfra connects to any host.
check_before_connecting()
