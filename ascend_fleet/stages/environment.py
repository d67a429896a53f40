"""The environment stage: the Ascend environment for logins and for services, HCCL settings, host tuning."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.facts.server import Command
from pyinfra.operations import files, server, systemd

from ascend_fleet import TEMPLATES
from ascend_fleet.config.fleetstate import COLOURS
from ascend_fleet.config.host_config import host_node_config
from ascend_fleet.core.node_layout import (
    CONFIG_DIR,
    GOVERNOR_UNIT,
    LOGIN_SCRIPT,
    SERVICE_ENV_FILE,
    SYSCTL_FILE,
    unit_file,
)
from ascend_fleet.core.templating import render
from ascend_fleet.facts.ascend import ASCEND_HOME
from ascend_fleet.operations import gates, placed
from ascend_fleet.operations.environment import service_env_file
from ascend_fleet.sizing.planner import reserved_ports
from ascend_fleet.stages.context import data_parallel_role, node_profile, runs_npus

ENV_SCRIPTS = [f"{ASCEND_HOME}/cann/set_env.sh", f"{ASCEND_HOME}/ascend-toolkit/set_env.sh",
               f"{ASCEND_HOME}/nnal/atb/set_env.sh"]
HOST_SYSCTLS = {"vm.swappiness": 0, "kernel.numa_balancing": 0}
# The kernel takes no outgoing connection's port from these (its ephemeral range, 32768-60999 by
# default, covers VLLM_PORT 51000 and HCCL's 60000): the vendor's answer for HCCL's ports.
RESERVED_PORTS = "net.ipv4.ip_local_reserved_ports"
CPU_GOVERNOR = "performance"


def node_can(test: str) -> bool:
    return host.get_fact(Command, command=f"{test} && echo yes || echo no") == "yes"


@deploy("Ascend environment")
def environment_stage() -> None:
    gates.stage_begins(name="Stage: environment", stage="environment")
    if not runs_npus():
        return
    placed.file(name="Login environment", content=render(TEMPLATES / "ascend-env.sh.j2", env_scripts=ENV_SCRIPTS),
                dest=LOGIN_SCRIPT, mode="644")
    files.directory(name="Service environment directory", path=CONFIG_DIR, mode="755")
    # npu_env as the NodeConfig validated and converted it (numbers as strings), not the raw host data.
    service_env_file(name="Service environment (CUDA paths removed)", dest=SERVICE_ENV_FILE,
                     env_scripts=ENV_SCRIPTS, venv=node_profile().pip.venv, settings=host_node_config(host).npu_env)

    governor_unit = placed.file(name=f"CPU governor {CPU_GOVERNOR} unit", dest=unit_file(GOVERNOR_UNIT), mode="644",
                                content=render(TEMPLATES / "cpu-governor.service.j2", governor=CPU_GOVERNOR))
    if governor_unit.will_change:
        systemd.service(name="CPU governor at boot", service=GOVERNOR_UNIT, running=None, enabled=True,
                        daemon_reload=True)
        if node_can("test -w /sys/devices/system/cpu/cpu0/cpufreq/scaling_governor"):
            systemd.service(name=f"CPU governor {CPU_GOVERNOR} now", service=GOVERNOR_UNIT, running=True,
                            restarted=True)


@deploy("Reserved instance ports")
def reserved_ports_stage() -> None:
    """Host tuning and the instances' ports (vLLM's, HCCL's ranges) out of the kernel's ephemeral range, before
    any stage connects out: a download's connection that took a port of an HCCL range (the ephemeral range,
    32768-60999, covers 60000 up) and lingers in TIME_WAIT for a minute fails the instance's bind at start."""
    gates.stage_begins(name="Stage: reserved ports", stage="reserved_ports")
    if not runs_npus():
        return
    files.directory(name="Service environment directory", path=CONFIG_DIR, mode="755")
    # Both colours: a blue/green swap starts the other set of instances without this stage.
    role = data_parallel_role(host.name)
    records = [record for colour in COLOURS for record in host_node_config(host, colour).instance_records()]
    reserved = reserved_ports(records, role.head_ports() if role and role.is_head else ())
    sysctls = {**HOST_SYSCTLS, RESERVED_PORTS: reserved}
    sysctl_conf = placed.file(name="Host tuning and reserved instance ports (sysctl)", dest=SYSCTL_FILE, mode="644",
                              content=render(TEMPLATES / "sysctl-ascend-fleet.conf.j2", sysctls=sysctls))
    # Applied when they change. A container (a lab node) has a read-only /proc/sys but for its own
    # network's, and no cpufreq: there the host tuning is kept for boot, for a real host.
    if sysctl_conf.will_change and node_can("test -w /proc/sys/vm/swappiness"):
        server.shell(name="Apply host tuning", commands=[f"sysctl -p {SYSCTL_FILE}"])
    server.sysctl(name="Instance ports reserved from the ephemeral range now", key=RESERVED_PORTS, value=reserved)
