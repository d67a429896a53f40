"""Monitoring: Prometheus on the gateway group, node_exporter and NPU health on the workers."""

from ascend_fleet.stages.monitoring import monitoring_stage

monitoring_stage()
