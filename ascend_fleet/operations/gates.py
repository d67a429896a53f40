"""Gates: checks that stop a host with one clear line, and change nothing when they pass."""

from __future__ import annotations

import shlex
from collections.abc import Callable

from pyinfra import host, logger
from pyinfra.api import operation


@operation()
def passed(description: str | Callable[[], str], find_problem: Callable[[], str | None]):
    """
    Stop the host here unless find_problem() finds nothing. It runs when the deploy executes,
    after the operations before it, so it sees the node as they left it (a driver loaded by
    the reboot, a service started).

    + description: what holds when the gate passes, e.g. "8 NPUs listed, all healthy", or a function
      that says it when the gate runs, shown in the run's output (what it could check depends on
      the node, and the operator needs to know)
    + find_problem: reads facts and returns None, or one line saying what is wrong and what to do
    """
    if not host.state.is_executing:
        host.noop(f"{description if isinstance(description, str) else 'a gate'} (checked when the deploy runs)")
        return
    problem = find_problem()
    if problem is None:
        if isinstance(description, str):
            host.noop(description)
        else:
            logger.info(f"{host.print_prefix}{description()}")
        return
    # printf, not echo: dash's echo reads backslashes in the line (JSON bodies it quotes have \n) as escapes.
    yield f"printf '%s\\n' {shlex.quote(f'{host.name}: {problem}')} >&2; exit 1"


@operation()
def stage_begins(stage: str):
    """
    Mark the start of a stage on every host, workers and gateway alike. It changes nothing;
    because all hosts share it, pyinfra cannot run a later stage's operations on one host
    (the gateway's checks) before an earlier stage's on another (the workers' services).

    + stage: the stage's name
    """
    host.noop(f"stage {stage}")
    yield from ()
