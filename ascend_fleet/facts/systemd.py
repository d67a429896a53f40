"""Facts about systemd units beyond pyinfra's own (which only say running or not)."""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase

UNIT_PROPERTIES = ("LoadState", "ActiveState", "SubState", "Result", "NRestarts")


class InstanceEnvironments(FactBase):
    """Names of the instances with an environment file (`<name>.env`) in a directory; [] if none."""

    default = list

    def command(self, directory: str) -> str:
        return f"ls {shlex.quote(directory)} 2>/dev/null | sed -n 's/[.]env$//p'; true"

    def process(self, output: list[str]) -> list[str]:
        return [line for line in output if line]



class InstanceDevices(FactBase):
    """The NPUs each instance's environment file (`<name>.env` in a directory) gives it
    (ASCEND_RT_VISIBLE_DEVICES), by instance name: what a running instance holds; {} if none."""

    default = dict

    def command(self, directory: str) -> str:
        return f"grep -Hs '^ASCEND_RT_VISIBLE_DEVICES=' {shlex.quote(directory)}/*.env; true"

    def process(self, output: list[str]) -> dict[str, tuple[int, ...]]:
        devices = {}
        for line in output:
            path, _, value = line.partition(":ASCEND_RT_VISIBLE_DEVICES=")
            numbers = value.strip().strip('"').split(",")
            devices[path.rsplit("/", 1)[-1].removesuffix(".env")] = tuple(int(n) for n in numbers if n.isdigit())
        return devices

def last_line_command(quoted_unit: str, since: str = "", old_main: str = "") -> str:
    """Shell printing the last line a unit's own processes logged (not systemd's messages about it),
    "" if none: the main process's own when it exited non-zero (its error, not the start check's
    "exited before /health answered"), else the unit's. To read only what one start logged: since,
    a journalctl --since expression ("@$started"), and old_main, the main PID before it ("$before"),
    whose lines (its shutdown on a restart) are not this start's error."""
    # -r: with --since, -n 1 alone is the first line after it, not the last.
    journal = "journalctl --no-pager -q -o cat -r -n 1" + (f" --since {since}" if since else "")
    new_main = f" && [ \"$main\" != {old_main} ]" if old_main else ""
    return (f"main=$(systemctl show -P ExecMainPID {quoted_unit} 2>/dev/null); line=; "
            f"if [ \"$(systemctl show -P ExecMainStatus {quoted_unit} 2>/dev/null)\" != 0 ]{new_main}; then "
            f"line=$({journal} _SYSTEMD_UNIT={quoted_unit} _PID=$main 2>/dev/null); fi; "
            f"[ -n \"$line\" ] || line=$({journal} _SYSTEMD_UNIT={quoted_unit} 2>/dev/null); printf '%s' \"$line\"")


class UnitState(FactBase):
    """Where a unit is and why: {"LoadState": "loaded", "ActiveState": "failed", "SubState": "failed",
    "Result": "exit-code", "NRestarts": "2", "last_line": "ERROR ... NPU 0 is already in use",
    "last_exit": "Main process exited, code=exited, status=0/SUCCESS"}. last_line is the
    last thing the unit's own processes logged (not systemd's messages about it), "" if nothing:
    the main process's own last line when it failed (its error, not the start check's "exited
    before /health answered"), else the unit's. last_exit is systemd's line about the main
    process's last exit, "" if none is in the journal. NRestarts counts systemd's own restarts
    (Restart=) since the unit was last started by hand or by a deploy."""

    def command(self, unit: str) -> str:
        quoted = shlex.quote(unit)
        return (f"systemctl show --property={','.join(UNIT_PROPERTIES)} {quoted} 2>/dev/null; "
                f"echo \"last_line=$({last_line_command(quoted)})\"; "
                f"echo \"last_exit=$(journalctl --no-pager -q -o cat -u {quoted} --grep 'Main process exited' -n 1 "
                f"2>/dev/null)\"; true")

    def process(self, output: list[str]) -> dict[str, str]:
        state = dict(line.split("=", 1) for line in output if "=" in line)
        return {key: state.get(key, "") for key in (*UNIT_PROPERTIES, "last_line", "last_exit")}
