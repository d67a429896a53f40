"""The gateway's vllm-router unit: what pyinfra's systemd.service does not cover."""

from __future__ import annotations

import shlex

from pyinfra import host
from pyinfra.api import operation
from pyinfra.facts.systemd import SystemdEnabled

from ascend_fleet.facts.systemd import UnitState


@operation()
def stopped(unit: str):
    """
    A unit not running and not started at boot, as pyinfra's systemd.service(running=False, enabled=False),
    and nothing at all where the node has no such unit (a gateway that never routed cache_aware).

    + unit: the systemd unit, e.g. the router's (node_layout.ROUTER_UNIT)
    """
    state = host.get_fact(UnitState, unit=unit)
    if state["LoadState"] in ("", "not-found"):
        host.noop(f"no {unit}")
        return
    running = state["ActiveState"] not in ("inactive", "failed", "")
    if running or host.get_fact(SystemdEnabled, services=[unit]).get(unit, False):
        yield f"systemctl disable --now {shlex.quote(unit)}"
    else:
        host.noop(f"{unit} is stopped and not started at boot")
