"""The gateway stage: Nginx on the gateway group, one upstream over every instance."""

from ascend_fleet.stages.serving import gateway_stage

gateway_stage()
