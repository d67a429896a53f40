"""The preflight stage: inputs valid, system supported, NVMe mounted, NPUs as the inventory says and free."""

from ascend_fleet.stages.checks import preflight_stage

preflight_stage()
