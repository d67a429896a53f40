"""`ascend-fleet tune`'s own logic, without a fleet: the grid, what a candidate deploys, the goodput
arguments, the winner, and the report (table, PNG, group-data snippet)."""

from __future__ import annotations

import os
import signal
import time
from types import SimpleNamespace

import pytest

from ascend_fleet.config.hostdata import Serving
from ascend_fleet.control.tune import (
    Candidate,
    CtrlC,
    TuneRecord,
    candidate_data,
    candidates_of,
    goodput_args,
    parse_grid,
    plot,
    render,
    snippet,
    winner,
)
from ascend_fleet.core.errors import FleetError

SLO = {"p99_ttft_ms": 2000.0, "p99_tpot_ms": 50.0}


def measured(goodput: float, ttft: float, tpot: float, failed: int = 0) -> dict:
    return {"completed": 20 - failed, "failed": failed, "request_goodput": goodput, "request_throughput": goodput + 1,
            "output_throughput": 100 * goodput, "mean_ttft_ms": ttft / 2, "p50_ttft_ms": ttft / 2, "p99_ttft_ms": ttft,
            "mean_tpot_ms": tpot / 2, "p50_tpot_ms": tpot / 2, "p99_tpot_ms": tpot, "p50_itl_ms": tpot / 2,
            "p99_itl_ms": tpot}


def record(*candidates: Candidate) -> TuneRecord:
    return TuneRecord(inventory="inventories/lab.py", canary="worker1", instance="vllm-0", slo=SLO, load={},
                      candidates=list(candidates), started="2026-12-03T07:00:00+00:00")


def test_the_grid_reads_serving_options_and_npu_environment_and_runs_every_combination():
    grid = parse_grid(["max_num_seqs=4,16", "HCCL_BUFFSIZE=200,512", "gpu_memory_utilization=0.9"])
    assert grid == {"max_num_seqs": [4, 16], "HCCL_BUFFSIZE": [200, 512], "gpu_memory_utilization": [0.9]}
    assert candidates_of(grid) == [
        {"max_num_seqs": 4, "HCCL_BUFFSIZE": 200, "gpu_memory_utilization": 0.9},
        {"max_num_seqs": 4, "HCCL_BUFFSIZE": 512, "gpu_memory_utilization": 0.9},
        {"max_num_seqs": 16, "HCCL_BUFFSIZE": 200, "gpu_memory_utilization": 0.9},
        {"max_num_seqs": 16, "HCCL_BUFFSIZE": 512, "gpu_memory_utilization": 0.9},
    ]


@pytest.mark.parametrize("item, phrase", [
    ("max_num_seq=4,8", "--grid max_num_seq: not a serving option"),
    ("max_num_seqs", "expected KEY=V1,V2"),
    ("max_num_seqs=", "expected KEY=V1,V2"),
])
def test_a_grid_key_that_is_nothing_tune_can_set_is_one_line(item, phrase):
    with pytest.raises(FleetError, match=phrase):
        parse_grid([item])


def test_a_candidate_changes_only_its_keys_and_restarts_only_the_canary_instance():
    config = SimpleNamespace(serving=Serving(max_model_len=2048, gpu_memory_utilization=0.9, max_num_seqs=8),
                             npu_env={"HCCL_BUFFSIZE": "200", "TASK_QUEUE_ENABLE": "1"})
    fleet = SimpleNamespace(configs={"worker1": config})
    data = candidate_data(fleet, "worker1", "vllm-0", {"max_num_seqs": 64, "HCCL_BUFFSIZE": 512})
    assert data["serve_only"] == ["vllm-0"]
    assert data["serving"] == {"max_model_len": 2048, "gpu_memory_utilization": 0.9, "max_num_seqs": 64,
                               "dtype": "bfloat16", "extra_args": []}
    assert data["npu_env"] == {"HCCL_BUFFSIZE": "512", "TASK_QUEUE_ENABLE": "1"}


def test_goodput_counts_requests_within_each_latency_limit():
    assert goodput_args(SLO) == ["--goodput", "ttft:2000", "tpot:50"]


def test_the_winner_has_the_most_goodput_among_candidates_that_met_the_slo_without_failures():
    slow = Candidate(settings={"max_num_seqs": 64}, status="done", result=measured(9.0, 5000, 40))  # p99 TTFT missed
    failing = Candidate(settings={"max_num_seqs": 32}, status="done", result=measured(8.0, 900, 30, failed=1))
    good = Candidate(settings={"max_num_seqs": 16}, status="done", result=measured(6.0, 900, 30))
    modest = Candidate(settings={"max_num_seqs": 4}, status="done", result=measured(3.0, 400, 20))
    refused = Candidate(settings={"gpu_memory_utilization": 0.99}, status="skipped", reason="the planner refuses it")
    assert winner(record(slow, failing, good, modest, refused)) is good
    assert winner(record(slow, failing, refused)) is None


def test_the_report_shows_each_candidate_the_winner_and_why_one_was_skipped(tmp_path):
    good = Candidate(settings={"max_num_seqs": 16}, status="done", result=measured(6.0, 900, 30))
    refused = Candidate(settings={"max_num_seqs": 99999}, status="skipped",
                        reason="the planner refuses it: too many sequences")
    tuned = record(good, refused)
    from rich.console import Console

    console = Console(record=True, width=200)
    console.print(render(tuned))
    text = console.export_text()
    assert "max_num_seqs=16 (winner)" in text and "met" in text
    assert "skipped" in text and "the planner refuses it: too many sequences" in text
    plot(tuned, tmp_path / "tune.png")
    assert (tmp_path / "tune.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    config = SimpleNamespace(serving=Serving(max_model_len=2048, gpu_memory_utilization=0.9, max_num_seqs=8,
                                             enable_prefix_caching=True), npu_env={"HCCL_BUFFSIZE": "200"})
    text = snippet(tuned, SimpleNamespace(configs={"worker1": config}))
    namespace: dict = {}
    exec(text, namespace)  # the snippet is group data: Python that sets serving and npu_env
    assert namespace["serving"]["max_num_seqs"] == 16 and namespace["serving"]["enable_prefix_caching"] is True
    assert namespace["npu_env"] == {"HCCL_BUFFSIZE": "200"}


def test_a_first_ctrl_c_is_noted_and_said_a_second_stops_at_once_and_the_handler_goes_back():
    before = signal.getsignal(signal.SIGINT)
    said = []
    with CtrlC(said.append).noted() as ctrl_c:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # the handler runs in the main thread, between bytecodes
        assert ctrl_c.pressed
        assert said == ["Ctrl-C: ending the current candidate, then the canary goes back (Ctrl-C again: stop now)"]
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
    assert signal.getsignal(signal.SIGINT) is before
