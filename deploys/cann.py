"""The CANN stage: CANN toolkit, operator kernels/ops, NNAL."""

from ascend_fleet.stages.platform import cann_stage

cann_stage()
