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

    + unit: the systemd unit, e.g. ascend-fleet-vllm-0.service
    """
    if host.get_fact(UnitState, unit=unit)["ActiveState"] != "failed":
        host.noop(f"{unit} has not failed")
        return
    yield f"systemctl reset-failed {shlex.quote(unit)}"
