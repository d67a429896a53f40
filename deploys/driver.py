"""The driver stage: NPU driver and firmware, one reboot if they changed, every NPU healthy after."""

from ascend_fleet.stages.platform import driver_stage

driver_stage()
