"""The virtual address stage: keepalived on the gateway group when the data gives gateway_vip."""

from ascend_fleet.stages.virtual_address import virtual_address_stage

virtual_address_stage()
