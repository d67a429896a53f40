"""From a fresh OS to serving, in order, idempotent: `pyinfra INVENTORY deploys/full.py`."""

from ascend_fleet.stages.full import full_deploy

full_deploy()
