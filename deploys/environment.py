"""The environment stage: Ascend environment for logins and services (CUDA stripped), HCCL settings, host tuning."""

from ascend_fleet.stages.environment import environment_stage

environment_stage()
