"""`ascend-fleet plan`: capacity plan of one vLLM Ascend instance, or of every instance of a
fleet (`ascend-fleet plan INVENTORY`), before anything is deployed."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from ascend_fleet.config.profile import load_profile
from ascend_fleet.core.command_options import above_zero
from ascend_fleet.core.errors import FleetError, InputError, visible
from ascend_fleet.fleet.plan import (
    MODELS_DIR,
    FleetPlan,
    InstanceReport,
    limited_hosts,
    load_inventory,
    model_shape,
    model_support,
    plan_fleet,
    read_model_config,
    read_modelslim_description,
)
from ascend_fleet.sizing import perf_fit, perfmodel
from ascend_fleet.sizing.perfmodel import LoadResult, predict
from ascend_fleet.sizing.planner import (
    GIB,
    MIB,
    ConfigError,
    InstancePlan,
    check_model_support,
    chip_by_name,
    format_gib,
    judge,
    kv_cache_copies,
    plan_instance,
    planned_quantization,
)

console = Console()

VERDICT_STYLES = {"fits": "green", "tight": "yellow", "does not fit": "red"}


def plan(
    inventory: Annotated[Optional[Path], typer.Argument(
        help="a pyinfra inventory: plan every instance of every worker with its own data")] = None,
    model_config: Annotated[Optional[Path], typer.Option(
        "--model-config", help="config.json, or the model directory holding it")] = None,
    models_dir: Annotated[Optional[Path], typer.Option(
        "--models-dir", help="with INVENTORY: local model configs as <org>/<name>/<revision>/config.json "
                             f"[default: {MODELS_DIR}]")] = None,
    chip: Annotated[str, typer.Option("--chip", help="NPU model: 910B3 or 910B4")] = "910B3",
    tp: Annotated[int, typer.Option("--tp", min=1, help="--tensor-parallel-size")] = 1,
    dp: Annotated[int, typer.Option("--dp", min=1, help="--data-parallel-size (engines, e.g. one per node)")] = 1,
    enable_expert_parallel: Annotated[bool, typer.Option("--enable-expert-parallel", help="spread experts over all tp x dp NPUs")] = False,
    mtp: Annotated[bool, typer.Option("--mtp", help="speculative decoding with the model's MTP layers (their weights resident)")] = False,
    max_model_len: Annotated[int, typer.Option("--max-model-len", min=1)] = 32768,
    gpu_memory_utilization: Annotated[float, typer.Option(
        "--gpu-memory-utilization", max=1, callback=above_zero, help="the share of each NPU's HBM vLLM may use")] = 0.9,
    dtype: Annotated[str, typer.Option("--dtype", help="float16, bfloat16 or float32")] = "bfloat16",
    quantization: Annotated[Optional[str], typer.Option("--quantization", help="w8a8, w4a8 or int4")] = None,
    usable_hbm_gib: Annotated[Optional[float], typer.Option(
        "--usable-hbm-gib", callback=above_zero, help="override the chip table's usable HBM per NPU")] = None,
    profile: Annotated[Optional[str], typer.Option(
        "--profile", help="with --model-config: also check that this stack profile serves the model")] = None,
    predict_concurrency: Annotated[Optional[int], typer.Option(
        "--predict-concurrency", min=1, help="also predict TTFT, TPOT and throughput with the performance model for "
                                             "this many clients sending back to back (docs/sim-performance.md)")] = None,
    input_len: Annotated[int, typer.Option("--input-len", min=1, help="--predict-concurrency: prompt tokens")] = 1024,
    output_len: Annotated[int, typer.Option("--output-len", min=1, help="--predict-concurrency: output tokens")] = 256,
    max_num_seqs: Annotated[int, typer.Option("--max-num-seqs", min=1, help="--predict-concurrency: seats")] = 256,
    max_num_batched_tokens: Annotated[int, typer.Option("--max-num-batched-tokens", min=1)] = 8192,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
    limit: Annotated[Optional[list[str]], typer.Option(
        "--limit", help="with INVENTORY: only these hosts' instances (names, groups or patterns, as pyinfra's "
                        "--limit); what hosts must agree on is still planned over the whole fleet")] = None,
) -> None:
    """Weights, KV cache and concurrency per NPU, and a verdict: fits, tight, or does not fit.

    With INVENTORY, chip, TP size and serving options come from each host's data and the
    model's config.json from --model-config, --models-dir or the model's http URL.
    """
    if models_dir is not None:
        check_models_dir(models_dir, inventory, model_config)
    if inventory is not None:
        plan_inventory(inventory, model_config, models_dir or MODELS_DIR, as_json, limit)
        return
    if model_config is None:
        raise FleetError("plan: pass an INVENTORY, or --model-config for a single instance")
    override = int(usable_hbm_gib * GIB) if usable_hbm_gib is not None else None
    try:
        shape = model_shape(read_model_config(model_config), read_modelslim_description(model_config))
    except ConfigError as exc:
        raise InputError(f"{visible(model_config)}: {exc}; pass the model's own config.json") from None
    stack = load_profile(profile) if profile is not None else None
    try:
        quantization, quantization_findings = planned_quantization(shape, quantization, ascend=False)
        result = plan_instance(
            shape,
            chip_by_name(chip),
            tp=tp,
            dp=dp,
            ep=enable_expert_parallel,
            mtp=mtp,
            max_model_len=max_model_len,
            gpu_memory_utilization=gpu_memory_utilization,
            dtype=dtype,
            quantization=quantization,
            hbm_bytes_override=override,
            kv_copies=kv_cache_copies(shape, stack.hybrid_kv_cache_allocation if stack else None),
        )
    except ConfigError as exc:  # an option the planner does not know (--chip, --dtype, --quantization)
        raise InputError(f"plan: {exc}") from None
    # a release that cannot serve the model at all is the first thing to say
    support = [] if stack is None else check_model_support(str(model_config), shape.model_type, stack.name,
                                                           stack.stack.model_dump(), model_support())
    findings = [*support, *result.findings, *quantization_findings]
    result = replace(result, findings=findings, verdict=judge(findings))
    predicted = None
    if predict_concurrency and not result.errors:
        predicted = predict(shape, result, chip_by_name(chip), predict_concurrency, input_len, output_len,
                            max_num_seqs, max_num_batched_tokens)
    if as_json:
        print(json.dumps({**result.to_dict(), **({"predicted": asdict(predicted),
                                                  "predicted_held_out_ratios": perfmodel.HELD_OUT_RATIOS}
                                                 if predicted else {})}, indent=2))
    else:
        print_plan(result, model_config)
        if predicted:
            print_prediction(predicted, predict_concurrency, input_len, output_len)
    if result.errors:
        raise FleetError(f"{result.verdict}: {result.errors[0].message}")


def check_models_dir(models_dir: Path, inventory: Path | None, model_config: Path | None) -> None:
    """A --models-dir given is one the plan reads: the planner would otherwise go on without it, to the
    model's http URL or to a plan of --model-config, and say nothing."""
    if not models_dir.is_dir():
        raise FleetError(f"plan: --models-dir {models_dir}: no such directory; pass the directory holding "
                         "<org>/<name>/<revision>/config.json, or leave the option out")
    if inventory is None:
        raise FleetError(f"plan: --models-dir {models_dir} is read only with an INVENTORY; pass one, or drop "
                         "--models-dir")
    if model_config is not None:
        raise FleetError(f"plan: --models-dir {models_dir} is not read when --model-config names the config; "
                         "drop one of them")


def plan_inventory(inventory: Path, model_config: Path | None, models_dir: Path, as_json: bool,
                   limit: list[str] | None = None) -> None:
    """Every instance of every worker (or of the hosts --limit picks); refuses (one line naming host and
    instance) what does not fit."""
    loaded = load_inventory(inventory)
    chosen = limited_hosts(loaded, limit, inventory)
    fleet = plan_fleet(loaded, model_config, models_dir)
    if chosen is not None:
        fleet = FleetPlan([report for report in fleet.instances if report.host in chosen])
    if not fleet.instances:
        error = FleetError(f"plan: {inventory} has no worker (a host whose data sets npu_count): nothing to plan; "
                           "give your NPU hosts npu_count, or plan one instance with --model-config")
        error.exit_code = 2  # asked for what the inventory cannot give, as a usage mistake
        raise error
    if as_json:
        print(json.dumps(fleet.to_dict(), indent=2))
    else:
        print_fleet(fleet, inventory)
    error = fleet.first_error()
    if error:
        raise FleetError(error)


def print_fleet(fleet: FleetPlan, inventory: Path) -> None:
    """One row per group of instances whose plans are alike (a fleet of a thousand identical workers is one
    row, readable at 80 columns), the hosts of each group below it; then each distinct warning once with its
    hosts. --json keeps one entry per instance."""
    groups = plan_groups(fleet)
    table = Table(title=Text(f"plan: {inventory} (GiB per NPU)"), box=box.SIMPLE_HEAD, pad_edge=False,
                  show_edge=False)
    # Short headers: nine columns in 80 (`conc.` the concurrency at max_model_len, `seqs` the max-num-seqs it suggests)
    for column in ("#", "inst.", "layout", "weights", "KV tokens", "conc.", "seqs", "headroom", "verdict"):
        table.add_column(column, justify="left" if column in ("layout", "verdict") else "right")
    for number, (row, reports) in enumerate(groups.items(), start=1):
        table.add_row(str(number), str(len(reports)), *row[:-1], Text(row[-1], style=VERDICT_STYLES[row[-1]]))
    console.print(table)
    for number, reports in enumerate(groups.values(), start=1):
        hosts = list(dict.fromkeys(report.host for report in reports))
        instances = sorted({report.instance.name for report in reports})
        hccl = [f"{first}-{last}" for first, last in sorted({(r.hccl_ports[0], r.hccl_ports[-1]) for r in reports})]
        console.print(f"group {number}: {len(hosts)} host{'s' if len(hosts) > 1 else ''} "
                      f"({few(hosts)}), instances {few(instances)}, HCCL ranges {few(hccl)}", highlight=False, markup=False)
    for message, hosts in fleet.warnings().items():
        console.print(f"[yellow]warning:[/] {escape(message)} ({escape(', '.join(hosts))})", highlight=False)


def plan_groups(fleet: FleetPlan) -> dict[tuple[str, ...], list[InstanceReport]]:
    """The instances by the row their plan prints as (layout, weights, KV tokens, concurrency, suggested
    max-num-seqs, headroom, verdict), in the order their first instance comes."""
    groups: dict[tuple[str, ...], list[InstanceReport]] = {}
    for report in fleet.instances:
        result = report.plan
        row = (layout(result), f"{result.weight_bytes_per_npu / GIB:.1f}", f"{result.kv_cache_tokens:,}",
               f"{result.max_concurrency:.2f}x", str(result.suggested_max_num_seqs),
               f"{result.headroom_bytes_per_npu / GIB:.1f}", report.verdict)
        groups.setdefault(row, []).append(report)
    return groups


def few(names: list[str], shown: int = 3) -> str:
    """`a, b, c` or `a, b, c and 7 more`."""
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")


def layout(result: InstancePlan) -> str:
    """How the instance is parallel, and whether it carries the MTP draft: TP4 + EP + MTP."""
    return (f"TP{result.tp}" + (f" x DP{result.dp}" if result.dp > 1 else "") + (" + EP" if result.ep else "")
            + (" + MTP" if result.mtp_weight_bytes_per_npu else ""))


def print_plan(result: InstancePlan, model_config: Path) -> None:
    """One table of per-NPU figures, then the findings."""
    table = Table(title=Text(f"plan: {model_config}"), show_header=False)
    table.add_column(style="bold")
    table.add_column(justify="right")
    rows = [
        ("model type", result.model_type),
        ("layout", f"{layout(result)} on {result.npus} x {result.chip}"),
        ("weights", f"{result.quantization or result.dtype}, {result.parameter_count / 1e9:.2f}B params, {_gib_and_gb(result.weight_bytes_total)} total"),
        ("weights per NPU", _gib_and_gb(result.weight_bytes_per_npu)
         + (f", MTP draft {format_gib(result.mtp_weight_bytes_per_npu, 2)} of it" if result.mtp_weight_bytes_per_npu else "")),
        ("budget per NPU", f"{format_gib(result.budget_bytes_per_npu, 2)} ({result.gpu_memory_utilization} x {format_gib(result.usable_hbm_bytes_per_npu, 2)})"),
        ("activation reserve", format_gib(result.activation_reserve_bytes_per_npu, 2)),
        ("KV cache pool per NPU", format_gib(result.kv_cache_pool_bytes_per_npu, 2)),
        ("KV cache bytes/token", f"{result.kv_cache_bytes_per_token:,} ({result.kv_cache_bytes_per_token_per_npu:,} per NPU)"),
        ("linear state per sequence", f"{result.linear_state_bytes_per_sequence_per_npu / MIB:.1f} MiB per NPU"),
        ("KV cache tokens", f"{result.kv_cache_tokens:,} per engine"),
        (f"max concurrency at {result.max_model_len:,}", f"{result.max_concurrency:.2f}x"),
        ("suggested --max-num-seqs", str(result.suggested_max_num_seqs)),
        ("HCCL reserve per NPU", format_gib(result.hccl_reserve_bytes_per_npu, 2)),
        ("HBM headroom per NPU", format_gib(result.headroom_bytes_per_npu, 2)),
    ]
    for label, value in rows:
        table.add_row(label, Text(value))  # model_type is config.json's: never read as markup
    table.add_row("verdict", Text(result.verdict, style=VERDICT_STYLES[result.verdict]))
    console.print(table)
    for finding in result.findings:
        style = "red" if finding.severity == "error" else "yellow"
        console.print(f"[{style}]{finding.severity}:[/] {escape(finding.message)}", highlight=False)


def print_prediction(predicted: LoadResult, concurrency: int, input_len: int, output_len: int) -> None:
    """The performance model's figures, labelled as what they are."""
    console.print(f"predicted by the performance model (not measured; docs/sim-performance.md), {concurrency} "
                  f"clients, {input_len} prompt + {output_len} output tokens each:", highlight=False)
    console.print(f"  TTFT mean {predicted.mean_ttft_ms:,.0f} ms (p99 {predicted.p99_ttft_ms:,.0f}), TPOT mean "
                  f"{predicted.mean_tpot_ms:,.1f} ms (p99 {predicted.p99_tpot_ms:,.1f}), "
                  f"{predicted.output_throughput:,.0f} output tok/s", highlight=False)
    console.print(f"  the model's error on upstream's held-out A2 runs, predicted / published: "
                  f"{perf_fit.band_text(perfmodel.HELD_OUT_RATIOS)}", highlight=False)


def _gib_and_gb(value: int) -> str:
    """Weights in GiB and in the decimal GB model cards and the handbook quote."""
    return f"{format_gib(value, 2)} ({value / 1e9:.1f} GB)"
