"""The performance model against the published A2 runs (perf_runs.yaml, issue 48): each run's
prediction beside its published figures, and the ratios.

    python -m ascend_fleet.perf_fit      prints the table for every run

A run is predicted from its model's config.json (the architecture's `config`), its precision, TP/DP/EP,
graph mode, lengths and concurrency. What a run lacks for that is said (`unpredictable`), not guessed.
Its lengths are the published ones as fixed lengths (a dataset's means stand for its spread); a run
that publishes no output length (a TPOT at a prompt length) is timed over UNSTATED_OUTPUT_TOKENS.
The chip: the sources say "A2" or "910B" and most name no variant; the 64 GiB 910B3 is assumed."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from . import perfmodel, planner
from .perf_runs import Run, load_runs

REPOSITORY = Path(__file__).resolve().parents[1]  # architecture.config paths are relative to it
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


def unpredictable(run: Run) -> str | None:
    """Why the model cannot predict `run`, None when it can."""
    if run.model.architecture is None:
        return "no config.json of the model (architecture unknown)"
    if run.precision not in PRECISION:
        return f"precision {run.precision}: how A2 (no FP8 units) holds and computes such weights is not established"
    if run.workload.concurrency is None:
        return "the source states no concurrency (an open-loop rate only)"
    if run.workload.input_tokens is None:
        return "the source states no input length"
    return None


def shape_of(run: Run) -> planner.ModelShape:
    return planner.ModelShape.from_config(json.loads((REPOSITORY / run.model.architecture.config).read_text()))


def lengths(run: Run) -> tuple[int, int]:
    output = run.workload.output_tokens or UNSTATED_OUTPUT_TOKENS
    return round(run.workload.input_tokens), max(round(output), 2)


def predict_run(run: Run) -> perfmodel.LoadResult:
    shape = shape_of(run)
    prompt, output = lengths(run)
    dtype, quantization = PRECISION[run.precision]
    plan = planner.plan_instance(shape, CHIP, tp=run.parallel.tp, dp=run.parallel.dp, ep=run.parallel.ep,
                                 max_model_len=prompt + output, gpu_memory_utilization=DEFAULT_GPU_MEMORY_UTILIZATION,
                                 dtype=dtype, quantization=quantization)
    return perfmodel.predict(shape, plan, CHIP, concurrency=run.workload.concurrency, prompt_tokens=prompt,
                             output_tokens=output,
                             max_num_seqs=run.workload.max_num_seqs or DEFAULT_MAX_NUM_SEQS,
                             max_num_batched_tokens=run.workload.max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS)


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


def compare(run: Run) -> Comparison:
    published = {name: getattr(run.published, name) for name in FIGURES}
    reason = unpredictable(run)
    if reason:
        return Comparison(run, reason, tuple(Figure(name, published[name], None) for name in FIGURES))
    result = predict_run(run)
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


def main() -> None:
    comparisons = [compare(run) for run in load_runs().runs]
    print(table(comparisons, halves_by_id()))
    ratios = [c.figure("tpot_ms").ratio for c in comparisons if c.run.fit and c.figure("tpot_ms").ratio]
    if ratios:
        print(f"fit runs' TPOT ratio (predicted/published): {min(ratios):.2f}-{max(ratios):.2f}, "
              f"geometric mean {math.exp(sum(map(math.log, ratios)) / len(ratios)):.2f}")


if __name__ == "__main__":
    main()
