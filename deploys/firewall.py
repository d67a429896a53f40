"""Instance firewall: each worker's vLLM ports open to the gateway and monitoring only."""

from ascend_fleet.stages.firewall import firewall_stage

firewall_stage()
