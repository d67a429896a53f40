"""The gateways' routes alone (the drained set applied): what a rollout and `ascend-fleet drain` run."""

from ascend_fleet.stages.serving import routes_stage

routes_stage()
