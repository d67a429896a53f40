"""`ascend-fleet rollout`, `swap-model` and `load`: changing a serving fleet without failing a request."""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from ascend_fleet.errors import FleetError
from ascend_fleet.loadgen import LoadGenerator
from ascend_fleet.rollout import (
    WEIGHTS_DEPLOY,
    Fleet,
    Runner,
    blue_green_problem,
    check_not_stopped,
    parse_data,
    plan_blue_green,
    plan_rollout,
    plan_swap,
    rollback_record,
    served_path,
    model_data,
)

rollout_app = typer.Typer()
console = Console()
progress_console = Console(stderr=True)

Inventory = Annotated[Path, typer.Argument(help="a pyinfra inventory, e.g. inventories/prod.py")]
Waves = Annotated[Optional[str], typer.Option(
    "--waves", help="comma-separated groups in order (default: the data's rollout_waves, else canary then the rest)")]
Data = Annotated[Optional[list[str]], typer.Option(
    "--data", help="KEY=VALUE passed to every pyinfra run, as pyinfra's --data (repeatable)")]
DrainTimeout = Annotated[float, typer.Option(
    "--drain-timeout", help="seconds to wait for a drained instance's running requests to reach 0")]
AsJson = Annotated[bool, typer.Option("--json", help="machine-readable result on stdout")]
STATUS_STYLES = {"done": "green", "failed": "red", "running": "yellow", "pending": "dim"}


@contextmanager
def step_progress(record: dict, quiet: bool):
    """A spinner line per step (on stderr), updated as the runner reports."""
    with Progress(SpinnerColumn(), TextColumn("{task.fields[step]:<22}"), TextColumn("{task.description}"),
                  TimeElapsedColumn(), console=progress_console, disable=quiet) as progress:
        tasks = {step["name"]: progress.add_task(step["status"], step=step["name"], start=False, total=1)
                 for step in record["steps"]}

        def report(step: dict, what: str) -> None:
            task = tasks[step["name"]]
            progress.start_task(task)
            finished = step["status"] in ("done", "failed")
            colour = STATUS_STYLES.get(step["status"], "")
            progress.update(task, description=f"[{colour}]{what}[/]", completed=1 if finished else 0)
            if finished:
                progress.stop_task(task)

        yield report


def summary(record: dict, title: str) -> Table:
    table = Table(title=title)
    for column in ("step", "hosts", "instances", "status", "seconds", "detail"):
        table.add_column(column, overflow="fold")
    for step in record["steps"]:
        colour = STATUS_STYLES.get(step["status"], "")
        table.add_row(step["name"], ", ".join(step["hosts"]), str(len(step["instances"])),
                      f"[{colour}]{step['status']}[/]", "" if step["seconds"] is None else f"{step['seconds']:g}",
                      step["detail"])
    return table


def run_record(fleet: Fleet, record: dict, drain_timeout: float, pause: float, as_json: bool, title: str) -> bool:
    with step_progress(record, as_json) as report:
        ok = Runner(fleet, record, report, drain_timeout, pause).run()
    if not as_json:
        console.print(summary(record, title))
    return ok


def failed_step(record: dict) -> dict:
    return next(step for step in record["steps"] if step["status"] == "failed")


@rollout_app.command("rollout")
def rollout(
    inventory: Inventory,
    deploy: Annotated[str, typer.Argument(help="the deploy to roll out, e.g. deploys/full.py")],
    waves: Waves = None,
    max_unavailable: Annotated[Optional[int], typer.Option(
        "--max-unavailable", min=1, help="most instances out of the gateway at once; larger waves are split")] = None,
    pause: Annotated[float, typer.Option("--pause", help="seconds to wait after each wave")] = 0,
    resume: Annotated[bool, typer.Option("--resume", help="continue the stopped rollout at the step that failed")] = False,
    limit: Annotated[Optional[list[str]], typer.Option(
        "--limit", help="only this worker (repeatable), e.g. one rebuilt from bare metal")] = None,
    data: Data = None,
    drain_timeout: DrainTimeout = 600,
    as_json: AsJson = False,
) -> None:
    """Roll DEPLOY out wave by wave: drain at the gateway, deploy, gate every instance, put it back.

    The first wave that fails stops the rollout with that wave drained and the rest serving;
    fix what it names, then run the same command with --resume.
    """
    fleet = Fleet(inventory, parse_data(data or []))
    record = check_not_stopped(fleet.state, resume)
    if record is None:
        record = plan_rollout(fleet, deploy, waves.split(",") if waves else None, max_unavailable, limit)
    elif record["kind"] != "rollout" or record["deploy"] != deploy or (data and record["data"] != fleet.data):
        raise FleetError(f"--resume: the stopped {record['kind']} is of {record.get('deploy')} with data "
                         f"{json.dumps(record['data'])}; resume it with the same DEPLOY and no --data")
    else:
        fleet = Fleet(inventory, record["data"])
    ok = run_record(fleet, record, drain_timeout, pause, as_json, f"rollout of {deploy} on {inventory}")
    if as_json:
        print(json.dumps({"ok": ok, **record}, indent=2))
    if not ok:
        step = failed_step(record)
        raise FleetError(f"rollout stopped at {step['name']}: {step['detail']}; {', '.join(step['hosts'])} stay "
                         f"drained, the other waves serve. Fix it, then: ascend-fleet rollout {inventory} {deploy} --resume")


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
    fleet = Fleet(inventory, parse_data(data or []))
    stopped = fleet.state.rollout()
    if stopped and not stopped.get("finished") and stopped["kind"] == "rollout":
        raise FleetError(f"a rollout of {stopped['deploy']} is stopped; finish it with --resume before a swap")
    new = model_data(fleet, model, revision)
    # Blue/green keeps both models resident until the gateway switch; one instance per node at a
    # time needs no room beside the serving model.
    refused = blue_green_problem(fleet, new)
    strategy = ("blue/green per wave" if refused is None
                else f"one instance per node at a time (blue/green refused: {refused})")
    progress_console.print(f"swap-model: {strategy}", highlight=False)
    previous = {b.key: served_path(fleet, b) for b in fleet.all_backends()}
    with progress_console.status(f"staging {new['id']}@{new['revision']} beside the served weights"):
        problem = Runner(fleet, {}, lambda *_: None, drain_timeout).pyinfra(
            WEIGHTS_DEPLOY, fleet.workers, {**fleet.data, "model": new}, "weights")
    if problem is not None:
        raise FleetError(f"swap-model: staging the weights failed, nothing was restarted: {problem}")
    wave_names = waves.split(",") if waves else None
    record = plan_swap(fleet, new, wave_names) if refused else plan_blue_green(fleet, new, wave_names)
    ok = run_record(fleet, record, drain_timeout, 0, as_json, f"swap to {new['id']}@{new['revision']}")
    rollback = None
    if not ok:
        rollback = rollback_record(record, previous, fleet)
        run_record(fleet, rollback, drain_timeout, 0, as_json, "putting the previous model back")
    if as_json:
        print(json.dumps({"ok": ok, "strategy": strategy, **record, "rollback": rollback}, indent=2))
    if not ok:
        step, back = failed_step(record), "done" if rollback.get("finished") else "FAILED, see the table"
        raise FleetError(f"swap-model stopped at {step['name']}: {step['detail']}; putting the previous model "
                         f"back: {back}. Fix it, then run the same swap-model again (swapped instances are skipped)")
    if not as_json:
        console.print(f"every instance serves {new['id']}@{new['revision']} as {new['served_model_name']}. "
                      f"Set model revision {new['revision']} (id {new['id']}) in your group data, or the next "
                      "deploy puts the old model back.", highlight=False)


@rollout_app.command("load")
def load(
    inventory: Inventory,
    concurrency: Annotated[int, typer.Option("--concurrency", min=1, help="clients sending at once")] = 4,
    duration: Annotated[float, typer.Option("--duration", help="seconds to keep sending")] = 30,
    max_requests: Annotated[Optional[int], typer.Option("--requests", help="stop after this many requests")] = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", help="tokens per answer")] = 16,
    as_json: AsJson = False,
) -> None:
    """Streaming chat completions through the gateway at a fixed concurrency: requests, errors, p99."""
    fleet = Fleet(inventory, {})
    generator = LoadGenerator(fleet.gateway_urls()[0], fleet.model_name, concurrency, max_tokens, duration,
                              max_requests)
    with progress_console.status(f"{concurrency} clients through {generator.url}"):
        report = generator.start().wait()
    result = report.summary()
    if as_json:
        print(json.dumps(result, indent=2))
        return
    table = Table(title=f"load through {report.url}", show_header=False)
    for key, value in result.items():
        table.add_row(key, "\n".join(value) if isinstance(value, list) else str(value))
    console.print(table)
    if report.failures:
        raise FleetError(f"{len(report.failures)} of {report.count} requests failed; first: {report.failures[0].error}")
