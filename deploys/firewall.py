"""Firewall: each worker's and gateway's ports open to those that need them only (ascend_fleet/fleet/firewall.py)."""

from ascend_fleet.stages.firewall import firewall_stage

firewall_stage()
