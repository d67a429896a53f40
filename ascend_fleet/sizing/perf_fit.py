"""The performance model against the published A2 runs (perf_runs.yaml, issue 48): each run's
prediction beside its published figures, and the ratios.

    python -m ascend_fleet.sizing.perf_fit                prints the fit and the table for every run
    python -m ascend_fleet.sizing.perf_fit --write-docs   writes them into docs/sim-performance.md (its generated
                                                   section) and draws the held-out ratios (extra `chart`)

A run is predicted from its model's config.json (the architecture's `config`), its precision, TP/DP/EP,
graph mode, lengths and concurrency. What a run lacks for that is said (`unpredictable`), not guessed.
Its lengths are the published ones as fixed lengths (a dataset's means stand for its spread); a run
that publishes no output length (a TPOT at a prompt length) is timed over UNSTATED_OUTPUT_TOKENS.
The chip: the sources say "A2" or "910B" and most name no variant; the 64 GiB 910B3 is assumed.

The fit (fit(), on the fitting half only, deterministic): the model's decode step, for a run's
concurrency and mean context, is linear in the per-layer cost of the run's graph mode and the
per-sequence-layer cost; their least squares over the fitting half's published TPOTs (relative
errors) gives them. Efficiency.hbm is not fitted: with it free the least squares puts it below zero
(the fitting half is nearly all one model at TP4, so weight reads and per-layer costs are not told
apart); perfmodel's assumed share stands. Then Efficiency.compute is bisected to the fitting half's TTFTs
(closed-loop runs) through the simulation. Every other constant stays as perfmodel.py cites it."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from ascend_fleet.core.errors import FleetError

from . import perfmodel, planner
from .perf_runs import Run, load_runs

# The release's default when a run gives no graph option: ACL graph (vllm-ascend v0.15.0rc1,
# docs/source/user_guide/feature_guide/graph_mode.md lines 11, 15, 20: "ACLGraph is enabled by
# default"); its cudagraph_mode is not stated there, piecewise is assumed.
RELEASE_DEFAULT_GRAPH_MODE = "piecewise"

REPOSITORY = Path(__file__).resolve().parents[2]  # architecture.config paths are relative to it
CHIP = planner.CHIPS["910B3"]
UNSTATED_OUTPUT_TOKENS = 64
# vLLM's defaults where a run does not state them: --gpu-memory-utilization 0.9, --max-num-seqs 256;
# --max-num-batched-tokens 8192 binds only prompts longer than it (none of the runs without it).
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
PRECISION = {  # perf_runs precision -> the planner's (dtype, quantization)
    "checkpoint": ("bfloat16", None),  # every checkpoint of the runs is bfloat16 (its config's torch_dtype)
    "bf16": ("bfloat16", None),
    "fp16": ("float16", None),
    "w8a8": ("bfloat16", "w8a8"),
    "w4a8": ("bfloat16", "w4a8"),
}


def unpredictable(run: Run, efficiency: perfmodel.Efficiency = perfmodel.CALIBRATED) -> str | None:
    """Why the model (with `efficiency`) cannot predict `run`, None when it can."""
    if run.model.architecture is None:
        return "no config.json of the model (architecture unknown)"
    if run.precision not in PRECISION:
        return f"precision {run.precision}: how A2 (no FP8 units) holds and computes such weights is not established"
    if run.workload.concurrency is None:
        return "the source states no concurrency (an open-loop rate only)"
    if run.workload.input_tokens is None:
        return "the source states no input length"
    if run.speculative and run.speculative.acceptance_rate is None:
        return f"{run.speculative.method} drafts, but the source states no acceptance rate"
    if graph_mode(run) == "eager" and efficiency.layer_seconds_eager is None:
        return "eager mode: no eager run was fitted, its per-layer cost is unknown"
    return None


def shape_of(run: Run) -> planner.ModelShape:
    return planner.ModelShape.from_config(json.loads((REPOSITORY / run.model.architecture.config).read_text()))


def lengths(run: Run) -> tuple[int, int]:
    output = run.workload.output_tokens or UNSTATED_OUTPUT_TOKENS
    return round(run.workload.input_tokens), max(round(output), 2)


def graph_mode(run: Run) -> str:
    """The run's graph mode: its serving options', or the release's default (null: the same)."""
    return RELEASE_DEFAULT_GRAPH_MODE if run.graph_mode in (None, "default") else run.graph_mode


def plan_of(run: Run, shape: planner.ModelShape) -> planner.InstancePlan:
    prompt, output = lengths(run)
    dtype, quantization = PRECISION[run.precision]
    return planner.plan_instance(shape, CHIP, tp=run.parallel.tp, dp=run.parallel.dp, ep=run.parallel.ep,
                                 max_model_len=prompt + output,
                                 gpu_memory_utilization=DEFAULT_GPU_MEMORY_UTILIZATION, dtype=dtype,
                                 quantization=quantization)


def step_cost(run: Run, efficiency: perfmodel.Efficiency, shape: planner.ModelShape,
              plan: planner.InstancePlan) -> perfmodel.StepCost:
    speculative = run.speculative
    return perfmodel.StepCost.for_plan(
        shape, plan, CHIP, efficiency=efficiency, graph_mode=graph_mode(run),
        speculative_tokens=speculative.num_speculative_tokens if speculative else 0,
        acceptance_rate=speculative.acceptance_rate if speculative else 0.0)


def predict_run(run: Run, efficiency: perfmodel.Efficiency = perfmodel.CALIBRATED) -> perfmodel.LoadResult:
    shape = shape_of(run)
    plan = plan_of(run, shape)
    cost = step_cost(run, efficiency, shape, plan)
    prompt, output = lengths(run)
    limits = perfmodel.SchedulerLimits(
        max_num_seqs=run.workload.max_num_seqs or DEFAULT_MAX_NUM_SEQS,
        max_num_batched_tokens=run.workload.max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS,
        kv_cache_tokens=plan.kv_cache_tokens * run.parallel.dp)
    concurrency = run.workload.concurrency
    return perfmodel.simulate(perfmodel.fixed_load(4 * concurrency, prompt, output), limits, cost,
                              max_concurrency=concurrency)


def decode_terms(run: Run, efficiency: perfmodel.Efficiency) -> tuple[float, dict[str, float]]:
    """The run's steady decode step (every sequence at the mean context) as known seconds plus the
    coefficients of the fitted unknowns: {"<graph mode>": layers, "sequence": layers x sequences}."""
    shape = shape_of(run)
    cost = step_cost(run, efficiency, shape, plan_of(run, shape))
    prompt, output = lengths(run)
    sequences = run.workload.concurrency
    context = sequences * (prompt + output / 2)
    touched = 1 - (1 - cost.expert_share_per_token) ** sequences
    read = (cost.dense_weight_bytes + cost.expert_weight_bytes * touched + cost.kv_bytes_per_token * context
            + cost.state_bytes_per_sequence * sequences)
    peak = CHIP.fp16_flops * (2 if cost.int8 else 1)
    compute = (cost.flops_per_token * sequences + cost.attention_flops_per_context_token * context) / (
        peak * efficiency.compute)
    memory = read / (CHIP.hbm_bytes_per_second * efficiency.hbm)
    known = max(memory, compute) + cost.collectives_seconds(sequences) + efficiency.step_overhead_seconds
    return known, {graph_mode(run): cost.layers, "sequence": cost.layers * sequences}


def solve(rows: list[list[float]], targets: list[float]) -> list[float]:
    """Least squares by the normal equations (a handful of unknowns), Gaussian elimination."""
    size = len(rows[0])
    matrix = [[sum(row[i] * row[j] for row in rows) for j in range(size)]
              + [sum(row[i] * target for row, target in zip(rows, targets))] for i in range(size)]
    for col in range(size):
        pivot = max(range(col, size), key=lambda r: abs(matrix[r][col]))
        matrix[col], matrix[pivot] = matrix[pivot], matrix[col]
        if abs(matrix[col][col]) < 1e-30:
            raise ValueError(f"unknown {col} is not determined by the fitting runs")
        for r in range(size):
            if r != col:
                factor = matrix[r][col] / matrix[col][col]
                matrix[r] = [a - factor * b for a, b in zip(matrix[r], matrix[col])]
    return [matrix[i][size] / matrix[i][i] for i in range(size)]


def fit(runs: list[Run], start: perfmodel.Efficiency = perfmodel.ASSUMED) -> perfmodel.Efficiency:
    """The Efficiency the fitting runs give (module docstring)."""
    tpot_runs = [run for run in runs if not unpredictable(run) and run.published.tpot_ms]
    terms = [decode_terms(run, start) for run in tpot_runs]
    unknowns = sorted({name for _, coefficients in terms for name in coefficients})
    rows, targets = [], []
    for run, (known, coefficients) in zip(tpot_runs, terms):
        published = run.published.tpot_ms / 1000
        rows.append([coefficients.get(name, 0.0) / published for name in unknowns])
        targets.append((published - known) / published)
    values = dict(zip(unknowns, solve(rows, targets)))
    fitted = replace(
        start,
        layer_seconds_full_decode=values.get("full_decode_only", 0.0),
        layer_seconds_piecewise=values.get("piecewise", 0.0),
        layer_seconds_eager=values.get("eager"),
        sequence_layer_seconds=values["sequence"])
    ttft_runs = [run for run in runs if not unpredictable(run) and run.published.ttft_ms
                 and run.workload.request_rate in (None, "inf")]
    if not ttft_runs:
        return fitted
    low, high = 0.05, 1.0  # the share of the chip's peak: slower prefill below, faster above

    def ttft_error(compute: float) -> float:
        efficiency = replace(fitted, compute=compute)
        return sum(math.log(predict_run(run, efficiency).mean_ttft_ms / run.published.ttft_ms) for run in ttft_runs)

    for _ in range(20):
        middle = (low + high) / 2
        low, high = (middle, high) if ttft_error(middle) > 0 else (low, middle)
    return replace(fitted, compute=round((low + high) / 2, 3))




@dataclass(frozen=True)
class Figure:
    name: str
    published: float | None
    predicted: float | None

    @property
    def ratio(self) -> float | None:
        """predicted / published: above 1 a slower (TTFT, TPOT) or higher (throughput) prediction."""
        if self.published is None or self.predicted is None:
            return None
        return self.predicted / self.published


@dataclass(frozen=True)
class Comparison:
    run: Run
    reason: str | None  # why it is not predicted
    figures: tuple[Figure, ...]

    def figure(self, name: str) -> Figure:
        return next(figure for figure in self.figures if figure.name == name)


FIGURES = ("ttft_ms", "tpot_ms", "output_throughput_tok_s")


def compare(run: Run, efficiency: perfmodel.Efficiency = perfmodel.CALIBRATED) -> Comparison:
    published = {name: getattr(run.published, name) for name in FIGURES}
    reason = unpredictable(run, efficiency)
    if reason:
        return Comparison(run, reason, tuple(Figure(name, published[name], None) for name in FIGURES))
    result = predict_run(run, efficiency)
    predicted = {"ttft_ms": result.mean_ttft_ms, "tpot_ms": result.mean_tpot_ms,
                 "output_throughput_tok_s": result.output_throughput}
    return Comparison(run, None, tuple(Figure(name, published[name], predicted[name]) for name in FIGURES))


def table(comparisons: list[Comparison], halves: dict[str, str]) -> str:
    def cell(figure: Figure) -> str:
        if figure.published is None:
            return f"{'-':>22}"
        predicted = "?" if figure.predicted is None else f"{figure.predicted:.1f}"
        ratio = "" if figure.ratio is None else f" x{figure.ratio:.2f}"
        return f"{figure.published:>7.1f} {predicted:>7}{ratio:>6}"

    header = f"{'run':<52} {'half':<8} {'TTFT ms pub pred ratio':>22} {'TPOT ms pub pred ratio':>22} {'out tok/s pub pred ratio':>24}"
    lines = [header]
    for comparison in comparisons:
        cells = " ".join(cell(figure) for figure in comparison.figures)
        lines.append(f"{comparison.run.id:<52} {halves.get(comparison.run.id, '-'):<8} {cells}")
        if comparison.reason:
            lines.append(f"{'':<52} not predicted: {comparison.reason}")
    return "\n".join(lines)


def halves_by_id() -> dict[str, str]:
    fitting, held_out = load_runs().halves()
    return {**{run.id: "fitting" for run in fitting}, **{run.id: "held-out" for run in held_out}}


# issue 48's bounds: |predicted / published - 1| within these on at least BOUND_SHARE of the held-out runs
BOUNDS = {"ttft_ms": 0.35, "tpot_ms": 0.20, "output_throughput_tok_s": 0.25}
BOUND_SHARE = 0.8
LABELS = {"ttft_ms": "TTFT", "tpot_ms": "TPOT", "output_throughput_tok_s": "output throughput"}


def held_out_ratios(comparisons: Sequence[Comparison]) -> dict[str, tuple[float, ...]]:
    """Each figure's predicted / published ratios over `comparisons`, TTFT on closed-loop runs only (an
    open loop's queueing is the rate's, not the model's)."""
    return {name: tuple(c.figure(name).ratio for c in comparisons if c.figure(name).ratio is not None
                        and (name != "ttft_ms" or c.run.workload.request_rate in (None, "inf")))
            for name in FIGURES}


def within(ratios: Sequence[float], name: str) -> list[float]:
    return [ratio for ratio in ratios if abs(ratio - 1) <= BOUNDS[name]]


def band_text(ratios: Mapping[str, Sequence[float]]) -> str:
    """The model's error band on the held-out runs, one clause a figure."""
    return "; ".join(
        f"{LABELS[name]} x{min(values):.2f}-{max(values):.2f} ({len(within(values, name))} of {len(values)} "
        f"within {BOUNDS[name]:.0%})" for name, values in ratios.items())


DOCS_PAGE = REPOSITORY / "docs" / "sim-performance.md"
CHART = DOCS_PAGE.with_name("sim-performance-held-out.png")
BEGIN = "<!-- generated by `python -m ascend_fleet.sizing.perf_fit --write-docs` from perf_runs.yaml: do not edit -->"
END = "<!-- end of the generated section -->"


def page_section(comparisons: Sequence[Comparison], halves: Mapping[str, str]) -> str:
    """The generated part of docs/sim-performance.md: the model callers use, its held-out band, the chart,
    and every run published beside predicted."""
    efficiency = perfmodel.CALIBRATED
    held_out = held_out_ratios([c for c in comparisons if halves.get(c.run.id) == "held-out"])

    def cells(figure: Figure) -> list[str]:
        if figure.published is None:
            return ["", ""]
        predicted = "not predicted" if figure.predicted is None else f"{figure.predicted:,.1f}"
        return [f"{figure.published:,.1f} / {predicted}", "" if figure.ratio is None else f"x{figure.ratio:.2f}"]

    lines = [
        BEGIN, "",
        f"`perfmodel.CALIBRATED`, fitted on the fitting half: compute {efficiency.compute:g} of the FP16 peak, "
        f"HBM {efficiency.hbm:g} (assumed), per layer and step {efficiency.layer_seconds_full_decode * 1e3:.3f} ms "
        f"(full-decode graph) / {efficiency.layer_seconds_piecewise * 1e3:.3f} ms (piecewise) / "
        f"{efficiency.layer_seconds_eager * 1e3:.3f} ms (eager), {efficiency.sequence_layer_seconds * 1e6:.2f} us "
        "per running sequence and layer.", "",
        "Held out (predicted / published; the issue's bound, and how many runs meet it):", "",
        "| figure | bound | within | ratios |", "|---|---|---|---|",
        *(f"| {LABELS[name]} | {BOUNDS[name]:.0%} on {BOUND_SHARE:.0%} | {len(within(values, name))} of "
          f"{len(values)} | {', '.join(f'{ratio:.2f}' for ratio in values)} |" for name, values in held_out.items()),
        "", f"![held-out ratios, predicted / published]({CHART.name})", "",
        "Every run (published / predicted, and predicted / published):", "",
        "| run | half | TTFT ms | | TPOT ms | | output tok/s | |", "|---|---|---|---|---|---|---|---|",
    ]
    for comparison in comparisons:
        reason = f" (not predicted: {comparison.reason})" if comparison.reason else ""
        columns = [f"`{comparison.run.id}`{reason}", halves.get(comparison.run.id, "not fitted"),
                   *(cell for figure in comparison.figures for cell in cells(figure))]
        lines.append("| " + " | ".join(columns) + " |")
    return "\n".join([*lines, "", END])


def draw_chart(ratios: Mapping[str, Sequence[float]], path: Path) -> None:
    """The held-out ratios by figure, with the issue's bounds, as a PNG (matplotlib: the extra `chart`)."""
    try:
        import matplotlib
    except ImportError:
        raise FleetError("drawing the chart needs matplotlib: pip install 'ascend-fleet[chart]'") from None
    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, axis = pyplot.subplots(figsize=(7, 3.6))
    for row, (name, values) in enumerate(ratios.items()):
        axis.axvspan(1 - BOUNDS[name], 1 + BOUNDS[name], ymin=(row + 0.1) / len(ratios),
                     ymax=(row + 0.9) / len(ratios), color="#c6dbef")
        axis.scatter(values, [row] * len(values), color="#08519c", zorder=3)
    axis.axvline(1, color="grey", linewidth=0.8)
    axis.set_yticks(range(len(ratios)), [f"{LABELS[name]}\n(bound {BOUNDS[name]:.0%})" for name in ratios])
    axis.set_ylim(-0.5, len(ratios) - 0.5)
    axis.set_xscale("log")
    axis.set_xlabel("predicted / published (held-out runs)")
    axis.set_title("perfmodel.CALIBRATED on upstream's held-out Atlas A2 runs")
    figure.tight_layout()
    figure.savefig(path, metadata={"Software": None})
    pyplot.close(figure)


def write_docs(comparisons: Sequence[Comparison], halves: Mapping[str, str], page: Path = DOCS_PAGE) -> None:
    text = page.read_text()
    if BEGIN not in text or END not in text:
        raise FleetError(f"{page}: no generated section (the lines {BEGIN} and {END}); put them where it goes")
    before, rest = text.split(BEGIN, 1)
    page.write_text(before + page_section(comparisons, halves) + rest.split(END, 1)[1])
    draw_chart(held_out_ratios([c for c in comparisons if halves.get(c.run.id) == "held-out"]),
               page.with_name(CHART.name))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m ascend_fleet.sizing.perf_fit", description=__doc__.split("\n")[0])
    parser.add_argument("--write-docs", action="store_true", help=f"rewrite {DOCS_PAGE.name}'s generated section "
                        f"and draw {CHART.name}")
    arguments = parser.parse_args(argv)
    runs = load_runs()
    halves = halves_by_id()
    comparisons = [compare(run) for run in runs.runs]
    if arguments.write_docs:
        write_docs(comparisons, halves)
        print(f"wrote {DOCS_PAGE} and {CHART}")
        return
    print(f"fitted on the fitting half: {fit(runs.halves()[0])}\nperfmodel.CALIBRATED (what callers use, "
          f"the table's): {perfmodel.CALIBRATED}")
    print(table(comparisons, halves))
    print("held out: " + band_text(held_out_ratios([c for c in comparisons if halves.get(c.run.id) == "held-out"])))


if __name__ == "__main__":
    main()
