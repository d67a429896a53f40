"""systemd units: what pyinfra's systemd.service does not cover."""

from __future__ import annotations

import shlex
from pathlib import PurePosixPath

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation
from pyinfra.facts.systemd import SystemdEnabled

from ascend_fleet.facts.systemd import UnitState, last_line_command


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
def masked(unit: str):
    """
    Stop a unit and mask it, so that nothing starts it again: not the boot, not a package update,
    not a unit that wants it. A unit the node does not have is left alone.

    + unit: the systemd unit, e.g. firewalld.service
    """
    state = host.get_fact(UnitState, unit=unit)
    if state["LoadState"] in ("masked", "not-found") and state["ActiveState"] != "active":
        host.noop(f"{unit} is {state['LoadState']} and not running")
        return
    yield f"systemctl mask --now {shlex.quote(unit)}"


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
    restart = start_saying_why(unit, "restart")
    yield f"systemctl daemon-reload && {{ {restart}; }} && sleep {int(gateway_memory_seconds)}"


@operation()
def running(unit: str, restarted: bool = False, unrouted_marker: str | None = None):
    """
    A unit running and enabled at boot, like pyinfra's systemd.service, but a start that fails says
    why in one line: what the start logged last (the start check's reason, vLLM's own error), where
    systemctl only says "see systemctl status".

    + unit: the systemd unit, e.g. ascend-fleet-vllm-0.service
    + restarted: its unit file or environment changed: reread unit files and restart it (start it if
      it is not running)
    + unrouted_marker: a file made just before a restart of the running unit, saying no gateway routes
      to it, so its stop need not wait for them (the unit's next start removes it)
    """
    is_running = host.get_fact(UnitState, unit=unit)["SubState"] == "running"
    if restarted:
        yield "systemctl daemon-reload"
    if restarted and is_running and unrouted_marker:
        yield StringCommand("mkdir", "-p", QuoteString(str(PurePosixPath(unrouted_marker).parent)),
                            "&&", "touch", QuoteString(unrouted_marker))
    if restarted or not is_running:
        yield start_saying_why(unit, "restart" if is_running else "start")
    if not host.get_fact(SystemdEnabled, services=[unit]).get(unit, False):
        yield f"systemctl enable {shlex.quote(unit)}"
    elif is_running and not restarted:
        host.noop(f"{unit} is running")


def start_saying_why(unit: str, verb: str) -> str:
    """Shell that starts or restarts (verb) a unit; when the start fails it prints one line on stderr,
    "<unit> did not start: <reason>", the reason being the last line this start logged (else what
    systemctl said), and exits 1."""
    quoted = shlex.quote(unit)
    reason = last_line_command(quoted, since='"@$started"', old_main='"$before"')
    return (f"started=$(date +%s.%N); before=$(systemctl show -P ExecMainPID {quoted}); "
            f"out=$(systemctl {verb} {quoted} 2>&1) || {{ journalctl --sync 2>/dev/null; reason=$({reason}); "
            f"printf '%s did not start: %s; see journalctl -u %s\\n' {quoted} \"${{reason:-$out}}\" {quoted} >&2; "
            "exit 1; }")
