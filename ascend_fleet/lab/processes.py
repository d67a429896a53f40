"""Long-running lab processes (node supervisors, the mirror): started detached, ended by recorded PID.

Every process is recorded with a marker, a string its command line must contain, so a
PID reused by something else after a crash is never signalled.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path


def spawn(argv: list[str], log: Path) -> int:
    """Start argv in its own session, output appended to log; it outlives this command."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True, close_fds=True)
    return process.pid


def children(pid: int) -> list[int]:
    """The PIDs of pid's children (for systemd-nspawn: the container's init), none once it is gone."""
    try:
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return []


def last_words(log: Path, lines: int = 3) -> str:
    """The last lines a process wrote to its log, on one line: an error that names a log quotes
    it, because `lab up` removes the lab's directory (its logs too) when it fails."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return "(no log)"
    tail = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
    return " | ".join(tail) or "(empty log)"


def is_ours(pid: int, marker: str) -> bool:
    """True while pid runs a command line containing marker (a zombie counts as gone)."""
    child_exit(pid)  # a child of ours that ended is reaped, not left a zombie
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z" and marker in cmdline


def stop(pid: int, marker: str, grace: float = 30.0) -> None:
    """SIGTERM, wait up to grace seconds, SIGKILL; then end what is left of its process group.

    Each process was started as the leader of its own group, so the group also holds what
    it started (nginx workers, systemd-nspawn) even when the leader already died.
    """
    if _belongs_to_someone_else(pid, marker):
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        if not is_ours(pid, marker):
            break
        os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and is_ours(pid, marker):
            time.sleep(0.1)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _belongs_to_someone_else(pid: int, marker: str) -> bool:
    """A live process with this PID but without our marker: the PID was reused. A zombie is still
    ours (its PID cannot be reused until it is reaped), and so is its process group."""
    child_exit(pid)  # a child of ours that ended is reaped, not left a zombie
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z" and not is_ours(pid, marker)


def child_exit(pid: int) -> str | None:
    """How a child of this process ended (`exited with status N`, `was killed by signal N`), reaping
    it; None while it runs. One reaped elsewhere (or no child of ours) has `exited`."""
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return "exited"
    if not done:
        return None
    if os.WIFSIGNALED(status):
        return f"was killed by signal {os.WTERMSIG(status)}"
    return f"exited with status {os.waitstatus_to_exitcode(status)}"
