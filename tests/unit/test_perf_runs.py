"""ascend_fleet/sizing/perf_runs.yaml: the published A2 runs the performance model is fitted to and judged by
(issue 48, item 1). The file loads through its schema, holds what the issue asks for, and splits the
fit runs the same way however it is ordered."""

from __future__ import annotations

import random

import pytest
import yaml

from ascend_fleet.core.errors import FleetError
from ascend_fleet.sizing.perf_runs import RUNS_FILE, PerfRuns, load_runs

RUNS = load_runs()
FIT = [run for run in RUNS.runs if run.fit]


def test_at_least_twelve_runs_are_used_for_fitting_each_measured_and_sourced():
    assert len(FIT) >= 12
    assert all(run.figure == "measured" and run.quote for run in FIT)
    assert {run.source.kind for run in FIT} <= {"file", "issue"}  # upstream's own material, not the handbook


def test_the_published_runs_cover_dense_moe_and_hybrid_tp_1_to_8_and_concurrency_1_to_64():
    upstream = [run for run in RUNS.runs if run.source.kind != "handbook"]
    assert {run.model.kind for run in upstream} == {"dense", "moe", "hybrid"}
    tps = {run.parallel.tp for run in upstream}
    assert min(tps) == 1 and max(tps) == 8
    concurrencies = {run.workload.concurrency for run in upstream} - {None}
    assert min(concurrencies) == 1 and max(concurrencies) >= 64
    # what the fit runs alone reach: hybrid models and 64 concurrent requests only as nightly floors
    assert {run.model.kind for run in FIT} == {"dense", "moe"}
    assert {1, 4, 8} <= {run.parallel.tp for run in FIT}


def test_the_handbook_run_stays_unfitted_with_the_reason():
    handbook = [run for run in RUNS.runs if run.source.kind == "handbook"]
    assert [run.fit for run in handbook] == [False]
    assert "not a trustworthy source" in handbook[0].fit_note and handbook[0].published.tpot_ms == 38


def test_nightly_floors_are_marked_as_floors_and_not_fitted():
    floors = [run for run in RUNS.runs if run.figure == "floor"]
    assert floors and all(not run.fit and run.floor_ratio == 0.97 for run in floors)
    assert all(run.source.path.startswith("tests/e2e/nightly/") for run in floors)


def test_every_file_run_is_cited_at_a_commit_with_its_lines_quoted():
    for run in RUNS.runs:
        if run.source.kind == "file":
            assert len(run.source.commit) == 40 and run.source.lines
            quoted = [int(line.split(":", 1)[0]) for line in run.quote.splitlines()]
            assert quoted == run.source.lines, run.id


def test_the_split_halves_the_fit_runs_and_each_kind_with_two_runs_is_in_both():
    fitting, held_out = RUNS.halves()
    assert sorted(run.id for run in fitting + held_out) == sorted(run.id for run in FIT)
    assert abs(len(fitting) - len(held_out)) <= len({run.model.kind for run in FIT})
    for kind in ("dense", "moe"):
        assert any(run.model.kind == kind for run in fitting) and any(run.model.kind == kind for run in held_out)


def test_the_split_does_not_depend_on_the_files_order():
    data = yaml.safe_load(RUNS_FILE.read_text())
    random.Random(48).shuffle(data["runs"])
    fitting, held_out = PerfRuns.model_validate(data).halves()
    assert {run.id for run in fitting} == {run.id for run in RUNS.halves()[0]}
    assert {run.id for run in held_out} == {run.id for run in RUNS.halves()[1]}


def one_run_changed(tmp_path, change):
    data = yaml.safe_load(RUNS_FILE.read_text())
    change(next(run for run in data["runs"] if run["id"] == "issue4656-qwen3-32b-tp4-c1-in15k"))
    path = tmp_path / "perf_runs.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True))
    return path


@pytest.mark.parametrize(("change", "message"), [
    (lambda run: run.update(fit=False), "fit: false needs a fit_note"),
    (lambda run: run["published"].update(tpot_ms=None), "no published figure"),
    (lambda run: run["source"].update(url="https://github.com/vllm-project/vllm-ascend/issues/4657"),
     "is not issue #4656"),
    (lambda run: run.update(figure="floor", floor_ratio=0.97), "a floor bounds a run and is not fitted"),
    (lambda run: run["parallel"].update(pp=2), "parallel.pp: unknown key"),
])
def test_a_run_without_its_provenance_is_refused_in_one_line_naming_the_file(tmp_path, change, message):
    path = one_run_changed(tmp_path, change)
    with pytest.raises(FleetError) as refused:
        load_runs(path)
    assert str(path) in str(refused.value) and message in str(refused.value)
    assert "\n" not in str(refused.value)
