"""`ascend-fleet drain` and `undrain`: an operator takes one instance (or a host's) out of every gateway and
puts it back, under the fleet's lease, as a rollout does for its waves.

A drained instance stays out of routing through every later deploy (the fleet state's drained set), until
`undrain`, which puts it back only once it passes its gates. The gateways' route watchers take a failing
instance out by themselves; drain is for what an operator knows before the instance fails (a card to
replace, a node to look at).
"""

from __future__ import annotations

from typing import Annotated

import typer

from ascend_fleet.commands.rollout_cli import Data, DrainTimeout, Inventory, changing_nothing, console, progress_console
from ascend_fleet.control.rollout import (
    ROUTES_DEPLOY,
    RolloutInventory,
    Runner,
    Step,
    check_deploy_files,
    failing_gates,
    parse_data,
    recorded,
    step_of,
)
from ascend_fleet.core.errors import FleetError

drain_app = typer.Typer()
Target = Annotated[str, typer.Argument(help="HOST (every instance it serves) or HOST/INSTANCE, e.g. worker2/vllm-1")]


def report(step: Step, what: str) -> None:
    progress_console.print(f"{step.name}: {what}", highlight=False, markup=False)


@drain_app.command("drain")
def drain(inventory: Inventory, target: Target, data: Data = None, drain_timeout: DrainTimeout = 600) -> None:
    """Take TARGET out of every gateway, then wait until its requests in flight are done."""
    with changing_nothing(f"drain {target}"):
        fleet = RolloutInventory(inventory, parse_data(data or []))
        check_deploy_files(ROUTES_DEPLOY)
        backends = fleet.named_backends(target)
    keys = {backend.key for backend in backends}
    with fleet.leased(f"a drain of {target}"):
        fleet = RolloutInventory(inventory, fleet.data)  # the fleet's records, as the lease brought them
        step = step_of(f"drain {target}", sorted({b.host for b in backends}), backends, ROUTES_DEPLOY, fleet.data)
        runner = Runner(fleet, None, report, drain_timeout)
        if (problem := runner.set_gateway(fleet.state.drained() | keys, step.name)) is not None:
            raise FleetError(f"drain {target} changed nothing: {problem}")
        if (problem := runner.wait_idle(backends, step)) is not None:
            raise FleetError(f"{target} is drained at every gateway, but {problem}")
    console.print(f"{', '.join(sorted(keys))} drained at {', '.join(fleet.gateways)}, no request running; it "
                  f"stays out through every deploy until `ascend-fleet undrain {inventory} {target}`",
                  highlight=False, soft_wrap=True)


@drain_app.command("undrain")
def undrain(inventory: Inventory, target: Target, data: Data = None) -> None:
    """Put TARGET back into every gateway, each instance once it passes its gates."""
    with changing_nothing(f"undrain {target}"):
        fleet = RolloutInventory(inventory, parse_data(data or []))
        check_deploy_files(ROUTES_DEPLOY)
        backends = fleet.named_backends(target)
    with fleet.leased(f"an undrain of {target}"):
        fleet = RolloutInventory(inventory, fleet.data)
        record = recorded(fleet.state)
        stopped = record.instances() if record and not record.finished else set()
        drained = fleet.state.drained()
        if taken := sorted({b.key for b in backends} & drained & stopped):
            raise FleetError(f"undrain {target} changed nothing: {', '.join(taken)} was drained by the stopped "
                             f"rollout; `ascend-fleet rollout {inventory} --resume` or `--abandon` puts it back")
        wanted = [backend for backend in backends if backend.key in drained]
        if not wanted:
            console.print(f"{target}: nothing drained, nothing to do", highlight=False, markup=False)
            return
        if failing := failing_gates(fleet, wanted):
            out = "; ".join(f"{b.key} gate {verdict.gate}: {verdict.detail}" for b, verdict in failing)
            raise FleetError(f"undrain {target} changed nothing: {out}; fix it, then undrain again")
        runner = Runner(fleet, None, report, 0)
        if (problem := runner.set_gateway(drained - {b.key for b in wanted}, f"undrain {target}")) is not None:
            raise FleetError(f"undrain {target} changed nothing: {problem}")
    console.print(f"{', '.join(b.key for b in wanted)} back in routing at {', '.join(fleet.gateways)}",
                  highlight=False, soft_wrap=True, markup=False)
