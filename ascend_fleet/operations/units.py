"""systemd units: what pyinfra's systemd.service does not cover."""

from __future__ import annotations

import shlex

from pyinfra import host
from pyinfra.api import operation

from ascend_fleet.facts.systemd import UnitState


@operation()
def failure_cleared(unit: str):
    """
    Clear a failed unit's failure, so that the next start is tried: a crash loop that reached the
    unit's StartLimitBurst refuses every start ("start request repeated too quickly") until then.
    A unit still in its crash loop (waiting to restart) is stopped first: its pending restart would
    run what it failed on, and a start would wait for that restart's outcome (after a driver reboot,
    enabled instances start and fail before the deploy has put CANN back).

    + unit: the systemd unit, e.g. ascend-fleet-vllm-0.service
    """
    state = host.get_fact(UnitState, unit=unit)
    quoted = shlex.quote(unit)
    if state["SubState"] == "auto-restart":
        yield f"systemctl stop {quoted} && systemctl reset-failed {quoted}"
    elif state["ActiveState"] == "failed":
        yield f"systemctl reset-failed {quoted}"
    else:
        host.noop(f"{unit} has not failed")


@operation()
def restarted_while_routed(unit: str, gateway_memory_seconds: int):
    """
    Restart a unit the gateway routes to (its new unit file read first), then wait while the
    gateway still counts the restart against it. Nginx takes a server out for fail_timeout after
    max_fails failed attempts, even if it answers again at once: the next instance going down
    sooner could leave no server it tries. Run with pyinfra's _parallel to bound how many at once.

    + unit: the systemd unit, e.g. ascend-fleet-vllm-0.service; its start waits for /health (ExecStartPost)
    + gateway_memory_seconds: the gateway's fail_timeout
    """
    quoted = shlex.quote(unit)
    yield f"systemctl daemon-reload && systemctl restart {quoted} && sleep {int(gateway_memory_seconds)}"
