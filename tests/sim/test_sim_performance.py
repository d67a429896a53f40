"""The simulated server paced by the performance model (docs/sim-performance.md): a node whose
hardware file asks for it steps as the real model the tiny one stands for, scaled in time, so the
serving knobs change what a client measures. No lab: the server runs from its wheel on 127.0.0.1."""

from __future__ import annotations

import json
import statistics
import threading
import time
from pathlib import Path

import pytest

from tests.sim import test_sim_server
from tests.sim.test_sim_server import SimServer, make_node_root, write_model

site_dir = test_sim_server.site_dir  # its fixture: the stand-in wheels unpacked
MODELS = Path(__file__).resolve().parents[1] / "fixtures" / "models"
TIME_SCALE = 0.25
# Token ids: 800-token prompts, each its own first token so that none finds another's blocks in the
# prefix cache (vllm bench serve's random prompts share none). Long prompts make the others' prefills a
# large part of a shared step, so the model's TPOT with 64 seats is about 3x that with 4 (with 400 tokens
# it was 1.27x, and a busy CI machine's noise once took it under the test's 1.2).
PROMPT = list(range(10, 10 + 800))
OUTPUT_TOKENS = 24
REQUESTS = 40
GAP_SECONDS = 0.03  # between sends: a steady load that four seats cannot keep up with


@pytest.fixture(scope="module")
def paced_root(tmp_path_factory) -> Path:
    root = make_node_root(tmp_path_factory.mktemp("node"))
    hardware_file = root / "etc/ascend-lab/hardware.json"
    hardware = json.loads(hardware_file.read_text())
    hardware["performance"] = {"time_scale": TIME_SCALE,
                               "performs_as": json.loads((MODELS / "qwen2.5-72b-instruct/config.json").read_text())}
    hardware_file.write_text(json.dumps(hardware))
    return root


def run_load(server: SimServer) -> dict:
    """REQUESTS streamed completions sent GAP_SECONDS apart; per request its TTFT and TPOT."""
    results: list[tuple[float, float]] = []

    def one(index: int) -> None:
        started = time.monotonic()
        prompt = [1000 + index, *PROMPT[1:]]
        response = server.post("/v1/completions", {"model": "tiny", "prompt": prompt, "max_tokens": OUTPUT_TOKENS,
                                                   "ignore_eos": True, "stream": True})
        times = []
        for line in response:
            if line.startswith(b"data: {"):
                times.append(time.monotonic())
        assert response.status == 200 and len(times) == OUTPUT_TOKENS
        results.append((times[0] - started, (times[-1] - times[0]) / (OUTPUT_TOKENS - 1)))

    threads = [threading.Thread(target=one, args=(index,)) for index in range(REQUESTS)]
    began = time.monotonic()
    for thread in threads:
        thread.start()
        time.sleep(GAP_SECONDS)
    for thread in threads:
        thread.join(timeout=300)
    duration = time.monotonic() - began
    assert len(results) == REQUESTS
    return {"tokens_per_second": REQUESTS * OUTPUT_TOKENS / duration,
            "mean_ttft": statistics.fmean(ttft for ttft, _ in results),
            "mean_tpot": statistics.fmean(tpot for _, tpot in results)}


def serve(site_dir, root, model_dir, tmp_path, max_num_seqs: int) -> SimServer:
    server = SimServer(site_dir, root, tmp_path / f"seqs{max_num_seqs}.log", "0,1,2,3",
                       [str(model_dir), "--served-model-name", "tiny", "--tensor-parallel-size", "4",
                        "--max-model-len", "2048", "--max-num-seqs", str(max_num_seqs)],
                       {"VLLM_SIM_LOAD_BASE_SECONDS": "0.2"})
    server.health_statuses()
    return server


def test_more_seats_give_more_throughput_and_a_longer_tpot_as_the_model_says(site_dir, paced_root, tmp_path):
    model_dir = write_model(tmp_path / "tiny")
    measured = {}
    for seats in (4, 64):
        server = serve(site_dir, paced_root, model_dir, tmp_path, seats)
        try:
            measured[seats] = run_load(server)
        finally:
            server.stop()
        assert "time scale 0.25" in server.output() and "qwen2, 72.7B parameters, on 910B3, TP4" in server.output()
    few, many = measured[4], measured[64]
    print(f"\nmax_num_seqs 4: {few}\nmax_num_seqs 64: {many}")
    assert many["tokens_per_second"] > 1.5 * few["tokens_per_second"]
    assert many["mean_tpot"] > 1.2 * few["mean_tpot"]  # others' prefills share its steps
    assert many["mean_ttft"] < few["mean_ttft"]  # with four seats the rest queue
