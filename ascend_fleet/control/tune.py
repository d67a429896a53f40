"""`ascend-fleet tune INVENTORY --canary HOST --grid KEY=V1,V2 ... --slo ...`: measure serving settings
on one canary instance under load and SLOs, and name the best.

The canary instance leaves the gateway as a rollout drains it (fleet state, gateway deploy, its running
requests let finish). For each candidate of the grid the serve deploy restarts it with that candidate:
`pyinfra INVENTORY deploys/serve.py --limit HOST --data serving=... --data npu_env=... --data
serve_only=[INSTANCE]`, the templates and stages every deploy uses, never a hand-edited unit. Its
gates run, then `vllm bench serve` measures it directly, through an SSH tunnel to the instance's
loopback (the instance firewall keeps the control machine off its port), with `--goodput` at the
SLOs. Candidates the planner refuses are skipped with its reason, before anything changes.

At the end, and on Ctrl-C (CtrlC) or any failure, the canary is put back as its data says, gated
and returned to the gateway. `tune.json` in the fleet state keeps every candidate's result, so the
same command with `--resume` finishes a tune that stopped. The report: a table, a PNG of goodput and p99
latency per candidate, and the winner (the most goodput among candidates whose p99s meet the SLO and
that failed no request) as a group-data snippet.

Grid keys: the serving options of group data (`max_num_seqs`, `max_num_batched_tokens`,
`gpu_memory_utilization`, `block_size`, ...) and NPU environment variables (upper case, e.g.
`HCCL_BUFFSIZE`, into `npu_env`).
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import pprint
import signal
import time
from collections.abc import Callable
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

import typer
from pydantic import BaseModel
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from ascend_fleet.config.hostdata import Serving
from ascend_fleet.control import bench
from ascend_fleet.control.rollout import (
    SERVE_DEPLOY,
    Backend,
    RolloutInventory,
    Runner,
    Step,
    check_deploy_files,
    failing_gates,
    parse_data,
)
from ascend_fleet.core.command_options import above_zero, above_zero_or_inf, result_directory
from ascend_fleet.core.errors import FleetError, InputError, visible
from ascend_fleet.fleet.plan import plan_fleet

console = Console()
progress_console = Console(stderr=True)

SERVING_KEYS = frozenset(Serving.model_fields) - {"extra_args"}
# What a tune reports per candidate, from vllm bench serve's result.
MEASURED = ("completed", "failed", "request_goodput", "request_throughput", "output_throughput",
            "mean_ttft_ms", "p50_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p50_tpot_ms", "p99_tpot_ms",
            "p50_itl_ms", "p99_itl_ms")


class Candidate(BaseModel):
    settings: dict[str, Any]
    status: Literal["pending", "done", "skipped", "failed"] = "pending"
    reason: str = ""
    result: dict[str, float | int | None] = {}

    @property
    def label(self) -> str:
        return " ".join(f"{key}={value}" for key, value in self.settings.items())


class TuneRecord(BaseModel):
    """What `tune.json` keeps: the tune as asked, each candidate's outcome, and whether the canary is
    back as its data says (restored) and in the gateway."""

    inventory: str
    canary: str
    instance: str
    slo: dict[str, float]
    load: dict[str, Any]
    candidates: list[Candidate]
    started: str
    restored: bool = True
    finished: bool = False


def parse_grid(items: list[str]) -> dict[str, list]:
    """`KEY=V1,V2` (repeatable) -> {KEY: [V1, V2]}, values read as pyinfra reads --data."""
    grid = {}
    for item in items:
        key, sep, values = item.partition("=")
        key = key.strip()
        if not sep or not values.strip():
            raise InputError(f"--grid {item!r}: expected KEY=V1,V2,...; e.g. max_num_seqs=4,16,64")
        if key not in SERVING_KEYS and not key.isupper():
            raise InputError(f"--grid {visible(key)}: not a serving option ({', '.join(sorted(SERVING_KEYS))}) nor an NPU "
                             "environment variable (upper case, e.g. HCCL_BUFFSIZE)")
        if key in grid:
            raise InputError(f"--grid {key} given twice; list every value in one --grid {key}=...")
        grid[key] = [parse_data([f"v={value.strip()}"])["v"] for value in values.split(",")]
    if not grid:
        raise InputError("tune: pass at least one --grid KEY=V1,V2,...")
    return grid


def candidates_of(grid: dict[str, list]) -> list[dict[str, Any]]:
    return [dict(zip(grid, values)) for values in itertools.product(*grid.values())]


def candidate_data(fleet: RolloutInventory, host: str, instance: str, settings: dict[str, Any] | None) -> dict:
    """The pyinfra --data that restarts only the canary instance, with `settings` over its data's."""
    config = fleet.configs[host]
    serving = config.serving.model_dump(mode="json", exclude_none=True)
    npu_env = dict(config.npu_env)
    for key, value in (settings or {}).items():
        if key in SERVING_KEYS:
            serving[key] = value
        else:
            npu_env[key] = str(value)
    return {"serving": serving, "npu_env": npu_env, "serve_only": [instance]}


def refusal(fleet: RolloutInventory, host: str, instance: str, settings: dict[str, Any]) -> str | None:
    """Why the data or the planner refuses the canary with `settings` (one line), or None."""
    try:
        trial = RolloutInventory(fleet.inventory_path, candidate_data(fleet, host, instance, settings))
    except FleetError as exc:
        return str(exc)
    reports = [r for r in plan_fleet(trial.inventory).instances if r.host == host and r.instance.name == instance]
    errors = [finding for report in reports for finding in report.findings if finding.severity == "error"]
    return f"the planner refuses it: {errors[0].message}" if errors else None


def goodput_args(slo: dict[str, float]) -> list[str]:
    """vllm bench serve --goodput KEY:MS ...: a request is good when each of its own latencies is
    within the limit (the SLO's p99 keys name the metric)."""
    return ["--goodput", *[f"{key.split('_')[1]}:{limit:g}" for key, limit in slo.items()]]


def meets_slo(result: dict, slo: dict[str, float]) -> bool:
    return not result.get("failed") and all(v["passed"] for v in bench.judge(result, slo))


def winner(record: TuneRecord) -> Candidate | None:
    done = [c for c in record.candidates if c.status == "done" and meets_slo(c.result, record.slo)]
    return max(done, key=lambda c: c.result.get("request_goodput") or 0, default=None)


class CtrlC:
    """Ctrl-C during a tune, noted rather than raised: the terminal sends it to the tune's children
    too (vllm bench, ssh), so the step that runs ends by itself; a pyinfra deploy, in a process group of
    its own (rollout.run_child), finishes and the candidate is not measured. The tune then puts the
    canary back and exits 130. A KeyboardInterrupt raised wherever the tune happens to be, inside
    gevent's loop (pyinfra's), once left it waiting forever, with no child left, in a CI rehearsal.
    A second Ctrl-C stops at once, the canary left drained for --resume."""

    def __init__(self, report: Callable[[str], None]):
        self.report, self.pressed = report, False

    def __call__(self, _signum, _frame) -> None:
        if self.pressed:
            raise KeyboardInterrupt
        self.pressed = True
        self.report("Ctrl-C: ending the current candidate, then the canary goes back (Ctrl-C again: stop now)")

    @contextmanager
    def noted(self):
        previous = signal.signal(signal.SIGINT, self)
        try:
            yield self
        finally:
            signal.signal(signal.SIGINT, previous)


class Tune:
    """Runs a TuneRecord's pending candidates on the canary, and always puts the canary back."""

    def __init__(self, fleet: RolloutInventory, record: TuneRecord, load: bench.BenchOptions, report, result_dir: Path):
        self.fleet, self.record, self.load, self.report = fleet, record, load, report
        self.result_dir = result_dir
        host = fleet.configs[record.canary]
        self.backend: Backend = fleet.backend(record.canary, next(i for i in host.instances if i.name == record.instance))
        self.runner = Runner(fleet, None, lambda step, what: report(what), drain_timeout=600)
        self.step = Step(name="tune", hosts=[record.canary], instances=[self.backend.key], deploy=SERVE_DEPLOY, data={})

    def save(self) -> None:
        self.fleet.state.save_tune(self.record.model_dump(mode="json"))

    def deploy(self, settings: dict | None, label: str) -> str | None:
        """The serve deploy on the canary with `settings` (None: as its data says), then its gates."""
        data = candidate_data(self.fleet, self.record.canary, self.record.instance, settings)
        if settings is None:
            data = {"serve_only": data["serve_only"]}
        if (problem := self.runner.pyinfra(SERVE_DEPLOY, [self.record.canary], data, label)) is not None:
            return f"deploy: {problem}"
        if failing := failing_gates(self.fleet, [self.backend]):
            return f"gate {failing[0][1].gate}: {failing[0][1].detail}"
        return None

    def drain(self) -> None:
        self.record.restored = False
        self.save()
        self.report("draining the canary at the gateway")
        if (problem := self.runner.set_gateway(self.fleet.state.drained() | {self.backend.key}, "tune drain")):
            raise FleetError(f"tune: the routes deploy failed: {problem}")
        if (problem := self.runner.wait_idle([self.backend], self.step)) is not None:
            raise FleetError(f"tune: {problem}")

    def measure(self, index: int) -> dict:
        canary = self.fleet.inventory.get_host(self.record.canary)
        with bench.instance_target(self.fleet.inventory_path, canary, self.fleet.configs[canary.name],
                                   self.record.instance) as target:
            _, result = bench.measure(target, self.load, self.result_dir, f"candidate-{index:02d}.json",
                                      goodput_args(self.record.slo))
        return {key: result.get(key) for key in MEASURED}

    def run(self, deadline: float | None, ctrl_c: CtrlC) -> None:
        """Every pending candidate (until the deadline or a Ctrl-C), then the canary put back; on any exit."""
        pending = [(i, c) for i, c in enumerate(self.record.candidates) if c.status == "pending"]
        try:
            if pending:
                self.drain()
            for index, candidate in pending:
                if ctrl_c.pressed:
                    break
                if deadline is not None and time.monotonic() > deadline:
                    self.report(f"budget spent: {len(pending) - index} candidates left for --resume")
                    break
                self.report(f"candidate {index + 1}/{len(self.record.candidates)}: deploying {candidate.label}")
                if (problem := self.deploy(candidate.settings, f"tune {index + 1}")) is not None:
                    candidate.status, candidate.reason = "failed", problem
                elif not ctrl_c.pressed:
                    self.report(f"candidate {index + 1}: vllm bench serve {candidate.label}")
                    try:
                        candidate.result, candidate.status = self.measure(index + 1), "done"
                    except (FleetError, OSError) as exc:
                        candidate.status, candidate.reason = "failed", str(exc)
                if ctrl_c.pressed:  # its pyinfra or bench got the Ctrl-C too: not measured, left for --resume
                    candidate.status, candidate.reason, candidate.result = "pending", "", {}
                self.save()
        finally:
            self.restore()

    def restore(self) -> None:
        """The canary as its data says, gated, back in the gateway; recorded once it is."""
        if self.record.restored:
            return
        self.report("restoring the canary's own settings")
        if (problem := self.deploy(None, "tune restore")) is not None:
            raise FleetError(f"tune: the canary {self.backend.key} did not come back with its own settings ({problem}); "
                             "it stays drained: fix it and run the same tune with --resume")
        self.report("the canary back into the gateway")
        if (problem := self.runner.set_gateway(self.fleet.state.drained() - {self.backend.key}, "tune undrain")):
            raise FleetError(f"tune: the routes deploy failed, {self.backend.key} stays drained: {problem}; "
                             "run the same tune with --resume")
        if (failed := self.runner.gateway_gate()) is not None:
            raise FleetError(f"tune: {failed[0]}: {failed[1]}")
        self.record.restored = True
        self.record.finished = all(c.status != "pending" for c in self.record.candidates)
        self.save()


# ------------------------------------------------------------------ reporting


def render(record: TuneRecord) -> Table:
    best = winner(record)
    table = Table(title=Text(f"tune: {record.canary} {record.instance}"), header_style="bold")
    for column in ("candidate", "status", "goodput req/s", "req/s", "tok/s", "TTFT p50/p99 ms", "TPOT p50/p99 ms",
                   "ITL p99 ms", "failed", "SLO"):
        table.add_column(column, justify="left" if column in ("candidate", "status") else "right", overflow="fold")
    for candidate in record.candidates:
        r = candidate.result
        if candidate.status != "done":
            table.add_row(Text(candidate.label), candidate.status, *[""] * 7, Text(candidate.reason))
            continue
        ok = meets_slo(r, record.slo)
        name = Text(f"{candidate.label} (winner)", style="bold green") if candidate is best else Text(candidate.label)
        table.add_row(name, "done", f"{r['request_goodput'] or 0:.2f}", f"{r['request_throughput']:.2f}",
                      f"{r['output_throughput']:.0f}", f"{r['p50_ttft_ms']:.0f}/{r['p99_ttft_ms']:.0f}",
                      f"{r['p50_tpot_ms']:.1f}/{r['p99_tpot_ms']:.1f}", f"{r['p99_itl_ms']:.1f}", str(r["failed"]),
                      "[green]met[/]" if ok else "[red]missed[/]")
    return table


def plot(record: TuneRecord, path: Path) -> None:
    """Goodput (bars) and p99 TTFT and TPOT (lines) per measured candidate, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    done = [c for c in record.candidates if c.status == "done"]
    labels = [c.label.replace(" ", "\n") for c in done]
    figure, goodput_axis = pyplot.subplots(figsize=(max(6, 1.4 * len(done)), 4.5))
    goodput_axis.bar(labels, [c.result["request_goodput"] or 0 for c in done], color="#4c72b0")
    goodput_axis.set_ylabel("goodput (req/s meeting the SLO)")
    latency_axis = goodput_axis.twinx()
    latency_axis.plot(labels, [c.result["p99_ttft_ms"] for c in done], "o-", color="#dd8452", label="p99 TTFT ms")
    latency_axis.plot(labels, [c.result["p99_tpot_ms"] for c in done], "s-", color="#55a868", label="p99 TPOT ms")
    latency_axis.set_yscale("log")
    latency_axis.set_ylabel("p99 latency (ms)")
    latency_axis.legend(loc="upper left")
    goodput_axis.set_title(f"tune of {record.canary} {record.instance}; SLO "
                           + ", ".join(f"{k} <= {v:g}" for k, v in record.slo.items()))
    figure.tight_layout()
    figure.savefig(path)
    pyplot.close(figure)


def snippet(record: TuneRecord, fleet: RolloutInventory) -> str:
    """The winner as group data to paste (serving and npu_env as the canary's data has them, changed)."""
    best = winner(record)
    data = candidate_data(fleet, record.canary, record.instance, best.settings)
    r = best.result
    lines = [f"# ascend-fleet tune winner on {record.canary} {record.instance}: {best.label}",
             f"# goodput {r['request_goodput'] or 0:.2f} req/s, p99 TTFT {r['p99_ttft_ms']:.0f} ms, "
             f"p99 TPOT {r['p99_tpot_ms']:.1f} ms (SLO {', '.join(f'{k} <= {v:g}' for k, v in record.slo.items())})",
             f"serving = {pprint.pformat(data['serving'], sort_dicts=False)}",
             f"npu_env = {pprint.pformat(data['npu_env'], sort_dicts=False)}"]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ the command


def tune(
    inventory: Annotated[Path, typer.Argument(help="a pyinfra inventory, e.g. inventories/prod.py")],
    canary: Annotated[str, typer.Option("--canary", help="the worker whose instance is tuned")],
    grid: Annotated[list[str], typer.Option("--grid", help="KEY=V1,V2,... (repeatable): a serving option or "
                                                           "an NPU environment variable; every combination runs")],
    slo: Annotated[str, typer.Option("--slo", help="upper limits judged at p99: ttft_ms=2000,tpot_ms=50")] = bench.DEFAULT_SLO,
    instance: Annotated[Optional[str], typer.Option("--instance", help="the canary's instance (default: its first)")] = None,
    dataset: Annotated[str, typer.Option("--dataset", help="random or sharegpt")] = "random",
    dataset_path: Annotated[Optional[Path], typer.Option("--dataset-path")] = None,
    num_prompts: Annotated[int, typer.Option("--num-prompts", min=1)] = 200,
    request_rate: Annotated[float, typer.Option("--request-rate", callback=above_zero_or_inf, help="requests per second")] = 10.0,
    concurrency: Annotated[Optional[int], typer.Option("--concurrency", min=1, help="instead of a rate: this many "
                                                                                    "clients back to back")] = None,
    input_len: Annotated[int, typer.Option("--input-len", min=1)] = 256,
    output_len: Annotated[int, typer.Option("--output-len", min=1)] = 128,
    budget_minutes: Annotated[Optional[float], typer.Option(
        "--budget-minutes", callback=above_zero, help="start no candidate after this long")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="finish the stopped tune recorded in the fleet state")] = False,
    result_dir: Annotated[Path, typer.Option("--result-dir")] = Path("tune-results"),
    as_json: Annotated[bool, typer.Option("--json", help="the record as JSON on stdout")] = False,
) -> int:
    """Restart one canary instance with each combination of --grid, benchmark it directly under the SLO
    (goodput), and report the best; the canary goes back as its data says, whatever happens."""
    check_deploy_files(SERVE_DEPLOY)
    limits = bench.parse_slo(slo)
    grid_values = parse_grid(grid)
    if dataset == "sharegpt" and (dataset_path is None or not dataset_path.is_file()):
        raise InputError("--dataset sharegpt needs --dataset-path FILE")
    fleet = RolloutInventory(inventory, {})
    config = fleet.configs.get(canary)
    if config is None or not config.is_worker:
        raise InputError(f"--canary {visible(canary)}: not a worker of {inventory}; workers: {', '.join(fleet.workers)}")
    if canary in fleet.roles:
        raise InputError(f"--canary {canary}: serves a multi-node instance; tune takes an instance of one host")
    names = [i.name for i in config.instances]
    instance = instance or names[0]
    if instance not in names:
        raise InputError(f"--instance {visible(instance)}: {canary} serves {', '.join(names)}")
    load = bench.BenchOptions(dataset, str(dataset_path) if dataset_path else None, num_prompts,
                              float("inf") if concurrency else request_rate, concurrency, input_len, output_len)
    asked = [Candidate(settings=settings) for settings in candidates_of(grid_values)]
    result_directory(result_dir, "--result-dir")
    bench.ensure_bench_venv("tune")  # built before the lease: the first run takes minutes
    with fleet.leased(f"a tune of {canary} {instance}"):  # the fleet's tune record, from here on
        previous = fleet.state.tune()
        record = resumed(previous, asked, canary, instance, limits) if resume else None
        if record is None:
            if previous and not TuneRecord.model_validate(previous).finished:
                raise FleetError(f"an unfinished tune of {previous['canary']} {previous['instance']} is recorded in "
                                 f"{fleet.state.directory / 'tune.json'}: run it again with --resume")
            record = TuneRecord(inventory=str(inventory), canary=canary, instance=instance, slo=limits,
                                load=load.to_dict(),
                                candidates=asked, started=datetime.now(timezone.utc).isoformat(timespec="seconds"))
            for candidate in record.candidates:
                if (why := refusal(fleet, canary, instance, candidate.settings)) is not None:
                    candidate.status, candidate.reason = "skipped", why
        deadline = time.monotonic() + budget_minutes * 60 if budget_minutes else None
        with Progress(
                SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                console=progress_console, disable=as_json) as progress:
            task = progress.add_task("tune", total=len(record.candidates))

            def report(what: str) -> None:
                progress.update(task, description=escape(what),
                                completed=sum(c.status != "pending" for c in record.candidates))

            recorded_load = bench.BenchOptions(**{k: v for k, v in record.load.items() if v is not None})
            with CtrlC(report).noted() as ctrl_c:
                Tune(fleet, record, recorded_load, report, result_dir).run(deadline, ctrl_c)
    if ctrl_c.pressed:
        left = sum(c.status == "pending" for c in record.candidates)
        progress_console.print(f"interrupted: {canary} {instance} is back with its own settings and in the gateway; "
                               f"the same command with --resume runs the {left} candidates left", markup=False)
        raise typer.Exit(130)
    return finish(record, fleet, result_dir, as_json)


def resumed(previous: dict | None, asked: list[Candidate], canary: str, instance: str,
            slo: dict[str, float]) -> TuneRecord | None:
    if previous is None:
        raise FleetError("--resume: no tune is recorded for this fleet; run it without --resume")
    record = TuneRecord.model_validate(previous)
    if (record.canary, record.instance, record.slo, [c.settings for c in record.candidates]) != \
            (canary, instance, slo, [c.settings for c in asked]):
        raise FleetError(f"--resume: the recorded tune is of {record.canary} {record.instance} with other "
                         "candidates or SLOs; run it with the same --canary, --instance, --grid and --slo")
    return record


def finish(record: TuneRecord, fleet: RolloutInventory, result_dir: Path, as_json: bool) -> int:
    best = winner(record)
    png = result_dir / "tune.png"
    drawn = importlib.util.find_spec("matplotlib") is not None  # optional: 167 MB for one PNG (extra `chart`)
    if drawn and any(c.status == "done" for c in record.candidates):
        plot(record, png)
    snippet_file = result_dir / "winner.py"
    if best:
        snippet_file.write_text(snippet(record, fleet))
    (result_dir / "tune.json").write_text(record.model_dump_json(indent=2) + "\n")
    if as_json:
        print(json.dumps({**record.model_dump(mode="json"), "winner": best.settings if best else None}, indent=2))
    else:
        console.print(render(record))
        left = [c for c in record.candidates if c.status == "pending"]
        if left:
            console.print(f"[yellow]{len(left)} candidates not run (budget): the same command with --resume runs them")
        if best:
            drawing = f"plot: {png}" if drawn else "no plot (pip install 'ascend-fleet[chart]' draws tune.png)"
            console.print(f"winner: {best.label}; group data to apply: {snippet_file}; {drawing}", markup=False)
        else:
            console.print("[bold red]no candidate met the SLO without failed requests[/]")
    return 0 if best else 1
