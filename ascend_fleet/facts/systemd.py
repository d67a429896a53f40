"""Facts about systemd units beyond pyinfra's own (which only say running or not)."""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase

UNIT_PROPERTIES = ("LoadState", "ActiveState", "SubState", "Result")


class UnitState(FactBase):
    """Where a unit is and why: {"LoadState": "loaded", "ActiveState": "failed", "SubState": "failed",
    "Result": "exit-code", "last_line": "ERROR ... NPU 0 is already in use"}. last_line is the
    last thing the unit's own processes logged (not systemd's messages about it), "" if nothing."""

    def command(self, unit: str) -> str:
        quoted = shlex.quote(unit)
        return (f"systemctl show --property={','.join(UNIT_PROPERTIES)} {quoted} 2>/dev/null; "
                f"echo \"last_line=$(journalctl --no-pager -q -o cat -n 1 _SYSTEMD_UNIT={quoted} 2>/dev/null)\"; true")

    def process(self, output: list[str]) -> dict[str, str]:
        state = dict(line.split("=", 1) for line in output if "=" in line)
        return {key: state.get(key, "") for key in (*UNIT_PROPERTIES, "last_line")}
