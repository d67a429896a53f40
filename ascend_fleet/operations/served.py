"""Which instances have served: the fleet state's record the gateway routes by (fleetstate.py).

An instance enters the record when it passes its gate on its node and leaves it when it is
restarted, stopped or found down, so the gateway never lists one that has not served. The
record lives on the control machine; these operations write it when the deploy runs, as the
node's own operations before them left it.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable

from pyinfra import host
from pyinfra.api import operation

from ascend_fleet.config.fleetstate import FleetState


@operation()
def instance_served(fleet_state_dir: str, instance: str, find_problem: Callable[[], str | None]):
    """
    Record the instance as served once it passes its gate; if it does not, it stays out of the
    record and the host stops with the gate's line.

    + fleet_state_dir: the control machine's fleet state directory (host data fleet_state_dir)
    + instance: the instance's name on this host
    + find_problem: its gate: reads facts, returns None or one line saying what is wrong
    """
    if not host.state.is_executing:
        host.noop(f"{instance} enters the gateway once it passes its gate (checked when the deploy runs)")
        return
    state = FleetState(fleet_state_dir)
    served = state.served().get(host.name, set())
    problem = find_problem()
    if problem is not None:
        state.set_served(host.name, served - {instance})
        # printf, not echo: dash's echo reads backslashes in the line as escapes.
        yield f"printf '%s\\n' {shlex.quote(f'{host.name}: {problem}')} >&2; exit 1"
        return
    state.set_served(host.name, served | {instance})
    host.noop(f"{instance} served: the gateway routes to it")


@operation()
def instances_out_of_service(fleet_state_dir: str, still_serving: Callable[[set[str] | None], set[str]], why: str):
    """
    Take out of the record what of this host no longer serves, before anything else of the run
    can route to it.

    + fleet_state_dir: the control machine's fleet state directory (host data fleet_state_dir)
    + still_serving: given the instances recorded (or, for a host with no record yet, all it
      lists), returns those that still count; runs when the deploy runs
    + why: what takes them out, for the operation's output (e.g. "restarting")
    """
    if not host.state.is_executing:
        host.noop(f"instances out of the gateway's record when {why} (when the deploy runs)")
        return
    state = FleetState(fleet_state_dir)
    recorded = state.served().get(host.name)
    kept = still_serving(recorded)
    if recorded is None or kept != recorded:
        state.set_served(host.name, kept)
    host.noop(f"served: {', '.join(sorted(kept)) or 'none'}")
    yield from ()
