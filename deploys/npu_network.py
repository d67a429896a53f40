"""The NPU network stage: each NPU's RoCE NIC as planned (hccn_tool), then link, health, TLS and peers checked."""

from ascend_fleet.stages.npu_network import npu_network_stage

npu_network_stage()
