"""Every stage in order: what `deploys/full.py` runs.

One call per line: pyinfra orders operations by the line numbers of the calls that made
them, so stages called from one loop line would interleave across hosts.
"""

from ascend_fleet.stages.checks import preflight_stage, verify_stage
from ascend_fleet.stages.environment import environment_stage, reserved_ports_stage
from ascend_fleet.stages.firewall import firewall_stage
from ascend_fleet.stages.mirror import mirror_stage
from ascend_fleet.stages.monitoring import monitoring_stage
from ascend_fleet.stages.npu_network import npu_network_stage
from ascend_fleet.stages.platform import cann_stage, driver_stage
from ascend_fleet.stages.python_stack import python_stage
from ascend_fleet.stages.serving import gateway_stage, serve_stage, weights_stage
from ascend_fleet.stages.virtual_address import virtual_address_stage


def full_deploy() -> None:
    preflight_stage()
    mirror_stage()  # before any stage that installs: on a site without internet they install from it
    firewall_stage()  # before the peer port (packages, wheels, weights) and the instances listen
    reserved_ports_stage()  # before any stage connects out: no connection takes an instance's port
    driver_stage()
    npu_network_stage()  # needs the driver's hccn_tool; a host it stops starts no instance
    cann_stage()
    python_stage()
    environment_stage()
    weights_stage()
    serve_stage()
    gateway_stage()
    monitoring_stage()
    virtual_address_stage()  # once nginx serves (keepalived's check asks it) and node_exporter reads its textfile
    verify_stage()
