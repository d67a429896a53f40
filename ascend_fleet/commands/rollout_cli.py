"""`ascend-fleet rollout`, `swap-model` and `load`: changing a serving fleet without failing a request."""

from __future__ import annotations

import json
import os
import signal
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from ascend_fleet.control.bench import ensure_bench_venv, parse_share
from ascend_fleet.control.loadgen import LoadGenerator
from ascend_fleet.control.rollout import (
    MONITORING_DEPLOY,
    ROUTES_DEPLOY,
    SERVE_DEPLOY,
    WEIGHTS_DEPLOY,
    BenchGate,
    Record,
    RolloutInventory,
    Runner,
    Step,
    abandonable,
    blue_green_problem,
    check_deploy_files,
    check_not_stopped,
    check_rollout_arguments,
    describe_stopped,
    model_data,
    model_path,
    new_model_problem,
    parse_data,
    plan_blue_green,
    plan_rollout,
    plan_swap,
    prefix_cache_totals,
    recorded,
    rollback_record,
    served_path,
)
from ascend_fleet.core.command_options import above_zero, finite
from ascend_fleet.core.errors import FleetError, InputError
from ascend_fleet.fleet.plan import check_fleet

rollout_app = typer.Typer()
console = Console()
progress_console = Console(stderr=True)

Inventory = Annotated[Path, typer.Argument(help="a pyinfra inventory, e.g. inventories/prod.py")]
Waves = Annotated[Optional[str], typer.Option(
    "--waves", help="comma-separated groups in order (default: the data's rollout_waves, else canary then the rest)")]
Data = Annotated[Optional[list[str]], typer.Option(
    "--data", help="KEY=VALUE passed to every pyinfra run, as pyinfra's --data (repeatable)")]
DrainTimeout = Annotated[float, typer.Option(
    "--drain-timeout", min=0, callback=finite, help="seconds to wait for a drained instance's running requests to reach 0")]
AsJson = Annotated[bool, typer.Option("--json", help="machine-readable result on stdout")]
STATUS_STYLES = {"done": "green", "failed": "red", "running": "yellow", "pending": "dim"}


@contextmanager
def step_progress(record: Record, quiet: bool):
    """A spinner line per step (on stderr), updated as the runner reports."""
    with Progress(SpinnerColumn(), TextColumn("{task.fields[step]:<22}", markup=False), TextColumn("{task.description}"),
                  TimeElapsedColumn(), console=progress_console, disable=quiet) as progress:
        tasks = {step.name: progress.add_task(step.status, step=step.name, start=False, total=1)
                 for step in record.steps}

        def report(step: Step, what: str) -> None:
            task = tasks[step.name]
            progress.start_task(task)
            finished = step.status in ("done", "failed")
            colour = STATUS_STYLES.get(step.status, "")
            progress.update(task, description=f"[{colour}]{escape(what)}[/]", completed=1 if finished else 0)
            if finished:
                progress.stop_task(task)

        yield report


def summary(record: Record, title: str) -> Table:
    """The steps as a table; names and details are values (a group, a host, an error), never read as markup."""
    table = Table(title=Text(title))
    for column in ("step", "hosts", "instances", "status", "seconds", "detail"):
        table.add_column(column, overflow="fold")
    for step in record.steps:
        table.add_row(Text(step.name), Text(", ".join(step.hosts)), str(len(step.instances)),
                      Text(step.status, style=STATUS_STYLES.get(step.status, "")),
                      "" if step.seconds is None else f"{step.seconds:g}", Text(step.detail))
    return table


def run_record(fleet: RolloutInventory, record: Record, drain_timeout: float, pause: float, as_json: bool, title: str) -> bool:
    with step_progress(record, as_json) as report:
        ok = Runner(fleet, record, report, drain_timeout, pause).run()
    if not as_json:
        console.print(summary(record, title))
    return ok


def failed_step(record: Record) -> Step:
    return next(step for step in record.steps if step.status == "failed")


def wave_names(waves: str | None) -> list[str] | None:
    """--waves as group names: split at commas, spaces around them dropped ('canary, wave1')."""
    if waves is None:
        return None
    names = [name.strip() for name in waves.split(",") if name.strip()]
    if not names:
        raise InputError(f"--waves {waves!r}: no group named; pass groups in order, e.g. --waves canary,wave1")
    return names


@contextmanager
def changing_nothing(command: str):
    """The checks before a command's first change: a refusal says that nothing changed."""
    try:
        yield
    except FleetError as exc:
        raise type(exc)(f"{command} changed nothing: {exc}") from None  # an InputError stays one: exit 2


def check_resumable(record: Record, inventory: Path, deploy: str, data: list[str] | None, fleet: RolloutInventory) -> None:
    """--resume goes on with the stopped rollout as it was planned, or not at all."""
    if record.kind == "rollout" and record.deploy == deploy and (not data or record.data == fleet.data):
        return
    again = (f"resume it with `ascend-fleet rollout {inventory} {record.deploy} --resume` (no --data)"
             if record.kind == "rollout" else "run that swap-model again")
    raise FleetError(f"--resume: the stopped {describe_stopped(record, fleet.state.drained())}; {again}, "
                     f"or put back what it drained with `ascend-fleet rollout {inventory} --abandon`")


@rollout_app.command("rollout")
def rollout(
    inventory: Inventory,
    deploy: Annotated[Optional[str], typer.Argument(
        help="the deploy to roll out, e.g. deploys/full.py (none with --abandon)")] = None,
    waves: Waves = None,
    max_unavailable: Annotated[Optional[int], typer.Option(
        "--max-unavailable", min=1, help="most instances out of the gateway at once; larger waves are split")] = None,
    pause: Annotated[float, typer.Option("--pause", min=0, callback=finite, help="seconds to wait after each wave")] = 0,
    resume: Annotated[bool, typer.Option("--resume", help="continue the stopped rollout at the step that failed")] = False,
    abandon: Annotated[bool, typer.Option(
        "--abandon", help="give up the stopped rollout: put what it drained back into the gateway, each instance "
                          "once it passes its gates, and close its record")] = False,
    limit: Annotated[Optional[list[str]], typer.Option(
        "--limit", help="only this worker (repeatable), e.g. one rebuilt from bare metal")] = None,
    data: Data = None,
    drain_timeout: DrainTimeout = 600,
    bench_gate: Annotated[Optional[Path], typer.Option(
        "--bench-gate", help="a result of `ascend-fleet bench` (best: --instance on a canary instance): after the "
                             "canary wave, one of its instances is benchmarked with the same load and the rollout "
                             "stops if a metric regressed")] = None,
    max_regression: Annotated[str, typer.Option(
        "--max-regression", help="--bench-gate: how much worse goodput, throughput or a p99 may get")] = "5%",
    as_json: AsJson = False,
) -> None:
    """Roll DEPLOY out wave by wave: drain at the gateway, deploy, gate every instance, put it back.

    The deploy file, the inventory and every host's data are checked before anything is drained.
    The first wave that fails stops the rollout with that wave drained and the rest serving;
    fix what it names, then run the same command with --resume, or give it up with --abandon.
    """
    if abandon:
        given = {"--resume": resume, "--waves": waves, "--max-unavailable": max_unavailable, "--limit": limit}
        return abandon_rollout(inventory, data or [], [name for name, value in given.items() if value], as_json)
    with ExitStack() as held:
        with changing_nothing("rollout"):
            if deploy is None:
                raise FleetError("missing DEPLOY, e.g. deploys/full.py (only --abandon goes without one)")
            fleet = RolloutInventory(inventory, parse_data(data or []))
            check_deploy_files(deploy, ROUTES_DEPLOY)
            # The capacity plan preflight would refuse, before a wave is drained for it.
            check_fleet(fleet.inventory)
            # Every argument before the lease: a typo writes nothing on the first gateway.
            names = wave_names(waves)
            gate = None if bench_gate is None else BenchGate(baseline=str(bench_gate),
                                                             max_regression=parse_share(max_regression))
            check_rollout_arguments(fleet, names, limit, gate)
            if gate is not None:
                ensure_bench_venv("rollout --bench-gate")  # the first run builds it, minutes not held under the lease
            held.enter_context(fleet.leased(f"a rollout of {deploy}"))
            fleet = RolloutInventory(inventory, fleet.data)
            record = check_not_stopped(fleet.state, resume)
            if record is None:
                record = plan_rollout(fleet, deploy, names, max_unavailable, limit, gate)
            else:
                check_resumable(record, inventory, deploy, data, fleet)
                fleet = RolloutInventory(inventory, record.data)
                progress_console.print(f"resuming the {describe_stopped(record, fleet.state.drained())}",
                                       highlight=False, soft_wrap=True, markup=False)
        ok = run_record(fleet, record, drain_timeout, pause, as_json, f"rollout of {deploy} on {inventory}")
    if as_json:
        print(json.dumps({"ok": ok, **record.model_dump()}, indent=2))
    if not ok:
        step = failed_step(record)
        raise FleetError(f"rollout stopped at {step.name}: {step.detail}; {', '.join(step.hosts)} stay "
                         f"drained, the other waves serve. Fix it, then: ascend-fleet rollout {inventory} {deploy} "
                         f"--resume (or give it up: ascend-fleet rollout {inventory} --abandon)")


def abandon_rollout(inventory: Path, data: list[str], others: list[str], as_json: bool) -> None:
    """`rollout --abandon`: the stopped record's drained instances back, those that pass their gates;
    the fleet as the stopped rollout saw it (its --data, and any given on top)."""
    with ExitStack() as held:
        with changing_nothing("rollout --abandon"):
            if others:
                raise FleetError(f"--abandon takes no {', '.join(others)}: it puts back what the stopped rollout "
                                 "drained, whichever waves and hosts it had")
            given = parse_data(data)
            as_given = RolloutInventory(inventory, given)
            held.enter_context(as_given.leased("a rollout --abandon"))
            state = as_given.state
            record = abandonable(state)
            fleet = RolloutInventory(inventory, {**record.data, **given})
            check_deploy_files(ROUTES_DEPLOY)
        what = describe_stopped(record, state.drained())
        progress_console.print(f"abandoning the {what}", highlight=False, soft_wrap=True, markup=False)
        with progress_console.status("gating the drained instances, then putting them back into the gateway"):
            left_out = Runner(fleet, record, lambda *_: None, 0).abandon()
    if as_json:
        print(json.dumps({"ok": not left_out, **record.model_dump()}, indent=2))
    if left_out:
        out = "; ".join(f"{key} ({why})" for key, why in left_out.items())
        raise FleetError(f"rollout abandoned, but {out} stays out of the gateway: fix it, then run "
                         f"ascend-fleet rollout {inventory} --abandon again to put it back")
    if not as_json:
        def steps(*statuses: str) -> str:
            return ", ".join(s.name for s in record.steps if s.status in statuses) or "none"

        console.print(f"abandoned; every instance it drained is back in the gateway. Its change is on "
                      f"{steps('done')}, maybe on {steps('failed', 'running')} (where it stopped), not on "
                      f"{steps('pending')}.", highlight=False, soft_wrap=True, markup=False)


@rollout_app.command("swap-model")
def swap_model(
    inventory: Inventory,
    model: Annotated[str, typer.Option("--model", help="<org>/<name> of the new model")],
    revision: Annotated[Optional[str], typer.Option("--revision", help="its revision (default: the data's)")] = None,
    waves: Waves = None,
    data: Data = None,
    drain_timeout: DrainTimeout = 600,
    as_json: AsJson = False,
) -> None:
    """Serve another model (or revision) without failing a request, under the same served name:
    stage its weights beside the old; then, where the planner says a node can hold both models,
    blue/green per wave (start the node's other instances on it, gate, switch the gateway, drain
    and stop the old), else restart one instance per node at a time onto it, gated.

    Any failure puts every instance it changed back on the model it served before.
    """
    with ExitStack() as held:
        with changing_nothing("swap-model"):
            fleet = RolloutInventory(inventory, parse_data(data or []))
            check_deploy_files(WEIGHTS_DEPLOY, SERVE_DEPLOY, ROUTES_DEPLOY, MONITORING_DEPLOY)
            # Every argument before the lease: a typo writes nothing on the first gateway.
            new = model_data(fleet, model, revision)
            names = wave_names(waves)
            fleet.waves(names)
            held.enter_context(fleet.leased(f"a swap-model to {model}"))
            fleet = RolloutInventory(inventory, fleet.data)
            stopped = recorded(fleet.state)
            if stopped and not stopped.finished and stopped.kind == "rollout":
                raise FleetError(f"a rollout of {stopped.deploy} is stopped; finish it with `ascend-fleet rollout "
                                 f"{inventory} {stopped.deploy} --resume`, or give it up with "
                                 f"`ascend-fleet rollout {inventory} --abandon`, before a swap")
            backends = fleet.all_backends()
            previous = {b.key: served_path(fleet, b) for b in backends}
            if all(previous[b.key] == model_path(fleet, b.host, new) for b in backends):
                # Nothing to change; the same command after a swap that finished says so and succeeds.
                served = f"{new['id']}@{new['revision']}"
                if as_json:
                    print(json.dumps({"ok": True, "already_serving": served}))
                else:
                    console.print(f"already serving {served} on every instance; nothing to do", highlight=False,
                                  soft_wrap=True, markup=False)
                return
            if (problem := new_model_problem(new)) is not None:
                raise FleetError(problem)
            # Blue/green keeps both models resident until the gateway switch; one instance per node at a
            # time needs no room beside the serving model.
            refused = blue_green_problem(fleet, new)
        strategy = ("blue/green per wave" if refused is None
                    else f"one instance per node at a time (blue/green refused: {refused})")
        progress_console.print(f"swap-model: {strategy}", highlight=False, markup=False)
        with progress_console.status(escape(f"staging {new['id']}@{new['revision']} beside the served weights")):
            problem = Runner(fleet, None, lambda *_: None, drain_timeout).pyinfra(
                WEIGHTS_DEPLOY, fleet.workers, {**fleet.data, "model": new}, "weights")
        if problem is not None:
            raise FleetError(f"swap-model: staging the weights failed, nothing was restarted: {problem}")
        record = plan_swap(fleet, new, names) if refused else plan_blue_green(fleet, new, names)
        ok = run_record(fleet, record, drain_timeout, 0, as_json, f"swap to {new['id']}@{new['revision']}")
        rollback = None
        if not ok:
            rollback = rollback_record(record, previous, fleet)
            run_record(fleet, rollback, drain_timeout, 0, as_json, "putting the previous model back")
    if as_json:
        print(json.dumps({"ok": ok, "strategy": strategy, **record.model_dump(),
                          "rollback": rollback.model_dump() if rollback else None}, indent=2))
    if not ok:
        step, back = failed_step(record), "done" if rollback.finished else "FAILED, see the table"
        raise FleetError(f"swap-model stopped at {step.name}: {step.detail}; putting the previous model "
                         f"back: {back}. Fix it, then run the same swap-model again (swapped instances are skipped)")
    if not as_json:
        console.print(f"every instance serves {new['id']}@{new['revision']} as {new['served_model_name']}. "
                      f"Set model revision {new['revision']} (id {new['id']}) in your group data, or the next "
                      "deploy puts the old model back.", highlight=False, markup=False)


@rollout_app.command("load")
def load(
    inventory: Inventory,
    concurrency: Annotated[int, typer.Option("--concurrency", min=1, help="clients sending at once")] = 4,
    duration: Annotated[float, typer.Option("--duration", callback=above_zero, help="seconds to keep sending")] = 30,
    max_requests: Annotated[Optional[int], typer.Option(
        "--requests", min=1, help="stop after this many requests")] = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=1, help="tokens per answer")] = 16,
    give_up_after: Annotated[float, typer.Option(
        "--give-up-after", min=0, callback=finite, help="stop once no request has succeeded for this many seconds (0: never)")] = 10,
    turns: Annotated[int, typer.Option(
        "--turns", min=1, help="multi-turn sessions of this many requests, each resending the history so far "
                               "under the session's header (the gateway's routing.session_header)")] = 1,
    as_json: AsJson = False,
) -> int:
    """Streaming chat completions through the gateway at a fixed concurrency: requests, errors, p50/p99, and
    the instances' prefix-cache hit rate over the load (read from their /metrics before and after).

    A client whose request failed waits before its next (0.1 s, doubling to 2 s); Ctrl-C stops at
    once with a line saying what was sent (exit 130).
    """
    fleet = RolloutInventory(inventory, {})
    header = fleet.configs[fleet.gateways[0]].gateway.routing.session_header
    generator = LoadGenerator(fleet.client_url(), fleet.model_name, concurrency, max_tokens, duration,
                              max_requests, give_up_after or None, turns=turns, session_header=header,
                              label=f"load-{os.getpid()}-{int(time.time())}")
    where = fleet.client_url_described()
    before = prefix_cache_totals(fleet)
    previous = signal.signal(signal.SIGINT, lambda *_: generator.interrupt())
    try:
        with progress_console.status(escape(f"{concurrency} clients through {where}")):
            report = generator.start().wait()
    finally:
        signal.signal(signal.SIGINT, previous)
    after = prefix_cache_totals(fleet) if before else None
    looked_up = after[0] - before[0] if after else 0
    result = {**report.summary(),
              "prefix_cache_hit_rate": round((after[1] - before[1]) / looked_up, 4) if looked_up > 0 else None}
    if as_json:
        print(json.dumps({**result, "through": where}, indent=2))
    elif not (generator.interrupted or generator.gave_up):
        table = Table(title=Text(f"load through {where}"), show_header=False)
        for key, value in result.items():  # errors quote what the gateway answered: never markup
            table.add_row(key, Text("\n".join(value) if isinstance(value, list) else str(value)))
        console.print(table)
    if generator.interrupted:
        progress_console.print(f"load interrupted (Ctrl-C) after {result['duration_s']}s: {report.count} requests "
                               f"through {report.url}, {len(report.failures)} failed"
                               + (f" (last: {report.failures[-1].error})" if report.failures else "")
                               + f", p99 latency {result['p99_latency_s'] or '-'}s; {generator.in_flight()} "
                               "in flight not counted", highlight=False, soft_wrap=True, markup=False)
        return 130
    if generator.gave_up:
        raise FleetError(f"load: every request through {report.url} failed for {give_up_after:g}s "
                         f"({report.count} requests, last: {report.failures[-1].error}); stopped. Is the gateway "
                         f"up? See `ascend-fleet status {inventory}`")
    if report.failures:  # a load that lost requests fails, with --json too (scripts check the exit status)
        raise FleetError(f"{len(report.failures)} of {report.count} requests failed; first: {report.failures[0].error}")
    return 0
