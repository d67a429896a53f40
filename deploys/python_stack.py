"""The Python stage: the serving virtualenv with the profile's pinned Python stack."""

from ascend_fleet.stages.python_stack import python_stage

python_stage()
