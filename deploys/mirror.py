"""The site mirror alone: `pyinfra INVENTORY deploys/mirror.py` (the hosts of group mirror serve bundle_dir)."""

from ascend_fleet.stages.mirror import mirror_stage

mirror_stage()
