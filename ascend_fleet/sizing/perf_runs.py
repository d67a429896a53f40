"""The published vllm-ascend runs on Atlas A2 that the performance model is fitted to and judged by
(perf_runs.yaml beside this file, issue 48): their schema, the checks of each run's provenance, and the
split of the runs used for fitting into a fitting half and a held-out half.

Not copied into the lab's simulated vLLM (unlike perfmodel.py), so pydantic and PyYAML are free to use."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ascend_fleet.core.errors import FleetError, describe_validation

RUNS_FILE = Path(__file__).with_name("perf_runs.yaml")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Architecture(Strict):
    """What the performance model needs of a model, from its config.json (`config`: where that copy is)."""

    config: str
    layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    experts: int | None = None
    experts_per_token: int | None = None
    full_attention_layers: int | None = None  # hybrid models: the layers that keep a KV cache
    active_params_billion: float | None = None  # only where a source states it (a model name's "A3B")


class Model(Strict):
    name: str
    kind: Literal["dense", "moe", "hybrid"]
    architecture: Architecture | None
    architecture_note: str


class Release(Strict):
    version: str | None  # a vllm-ascend release, "main@<commit>", or null where the source does not say
    note: str


class Speculative(Strict):
    method: str
    num_speculative_tokens: int = Field(gt=0)
    acceptance_rate: float | None = None


class Parallel(Strict):
    tp: int = Field(ge=1)
    dp: int = Field(ge=1)
    ep: bool
    nodes: int = Field(ge=1)


class Workload(Strict):
    input_tokens: float | None = Field(gt=0)
    output_tokens: float | None = Field(gt=0)
    lengths: Literal["fixed", "mean", "max"] | None
    concurrency: int | None = Field(ge=1)
    request_rate: float | Literal["inf"] | None  # requests a second; null: a closed loop (or not stated)
    requests: int | None = Field(ge=1)
    max_num_seqs: int | None = Field(ge=1)
    max_num_batched_tokens: int | None = Field(ge=1)
    note: str


class Published(Strict):
    """The figures as the source publishes them (means; milliseconds; tokens a second)."""

    ttft_ms: float | None = Field(gt=0)
    tpot_ms: float | None = Field(gt=0)
    output_throughput_tok_s: float | None = Field(gt=0)
    total_throughput_tok_s: float | None = Field(gt=0)
    approximate: bool = False  # published as "20+ ms", "about 20 ms", "~1850"
    note: str

    @model_validator(mode="after")
    def some_figure(self) -> Published:
        if not any((self.ttft_ms, self.tpot_ms, self.output_throughput_tok_s, self.total_throughput_tok_s)):
            raise ValueError("no published figure: a run needs a TTFT, a TPOT or a throughput")
        return self


class Hardware(Strict):
    chip: str | None
    shown_by_source: bool  # false: the source names no chip and `evidence` says what points to A2
    evidence: str = Field(min_length=1)


class Source(Strict):
    kind: Literal["file", "issue", "handbook"]
    repository: str | None = None
    path: str | None = None
    commit: str | None = Field(default=None, pattern=r"^[0-9a-f]{40}$")
    tag: str | None = None
    lines: list[int] | None = None
    number: int | None = None
    url: str | None = None

    @model_validator(mode="after")
    def locates(self) -> Source:
        needs = {"file": ("repository", "path", "commit", "lines"), "issue": ("repository", "number", "url"),
                 "handbook": ("path", "lines")}[self.kind]
        missing = [name for name in needs if getattr(self, name) is None]
        if missing:
            raise ValueError(f"a {self.kind} source needs {', '.join(missing)}")
        if self.kind == "issue" and self.url != f"https://github.com/{self.repository}/issues/{self.number}":
            raise ValueError(f"url {self.url} is not issue #{self.number} of {self.repository}")
        return self


class Run(Strict):
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9.-]*$")
    model: Model
    precision: Literal["checkpoint", "bf16", "fp16", "fp8", "w8a8", "w4a8"]
    precision_note: str
    vllm_ascend: Release
    graph_mode: Literal["eager", "piecewise", "full_decode_only", "default"] | None
    graph_mode_note: str
    speculative: Speculative | None
    speculative_note: str | None = None
    parallel: Parallel
    workload: Workload
    published: Published
    figure: Literal["measured", "floor"]
    floor_ratio: float | None = Field(default=None, gt=0, le=1)  # a floor: passes above floor_ratio x the figure
    hardware: Hardware
    source: Source
    quote: str = Field(min_length=1)
    fit: bool
    fit_note: str | None = None

    @model_validator(mode="after")
    def consistent(self) -> Run:
        if not self.fit and not self.fit_note:
            raise ValueError("fit: false needs a fit_note saying why")
        if (self.figure == "floor") != (self.floor_ratio is not None):
            raise ValueError("a floor, and only a floor, has a floor_ratio")
        if self.figure == "floor" and self.fit:
            raise ValueError("a floor bounds a run and is not fitted (fit: false)")
        if self.source.kind == "file" and any(f"{line}: " not in self.quote for line in self.source.lines):
            raise ValueError("the quote must carry every cited line, each as '<line>: <text>'")
        return self

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.id.encode()).hexdigest()


class PerfRuns(Strict):
    runs: list[Run]

    @model_validator(mode="after")
    def unique_ids(self) -> PerfRuns:
        ids = [run.id for run in self.runs]
        duplicates = sorted({run_id for run_id in ids if ids.count(run_id) > 1})
        if duplicates:
            raise ValueError(f"run ids used twice: {', '.join(duplicates)}")
        return self

    def halves(self) -> tuple[list[Run], list[Run]]:
        """The fit runs split into (fitting, held-out): within each kind of model (dense, MoE, hybrid),
        ordered by the SHA-256 of their ids, every other run, the first to fitting. So each kind with two
        runs or more is in both halves, and the split follows from the ids alone, not the file's order."""
        fitting, held_out = [], []
        for kind in ("dense", "moe", "hybrid"):
            runs = sorted((run for run in self.runs if run.fit and run.model.kind == kind), key=lambda run: run.digest)
            fitting += runs[0::2]
            held_out += runs[1::2]
        return fitting, held_out


def load_runs(path: Path = RUNS_FILE) -> PerfRuns:
    try:
        return PerfRuns.model_validate(yaml.safe_load(path.read_text()))
    except ValidationError as exc:
        raise FleetError(f"{path}: {describe_validation(exc, PerfRuns)}; correct the run from its source") from None
