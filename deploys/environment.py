"""The environment stage: Ascend environment for logins and services (CUDA stripped), HCCL settings, host tuning
and the instances' ports reserved."""

from ascend_fleet.stages.environment import environment_stage, reserved_ports_stage

reserved_ports_stage()
environment_stage()
