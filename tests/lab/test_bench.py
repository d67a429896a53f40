"""`ascend-fleet bench` on the lab: real `vllm bench serve` (the bench virtualenv that scripts/setup
builds) through the lab's gateway. A run writes its result with the profile, model and serving
options it ran under; an impossible SLO makes it exit non-zero, and --compare shows the change."""

from __future__ import annotations

import json

import pytest

from ascend_fleet.bench import BENCH_VENV, bench_venv_ready
from ascend_fleet.profile import load_profile
from tests.lab.conftest import Lab

pytestmark = [pytest.mark.lab, pytest.mark.skipif(not bench_venv_ready(BENCH_VENV),
                                                  reason=f"no bench virtualenv: run scripts/setup ({BENCH_VENV})")]

# Small and quick: the lab serves a tiny model on simulated NPUs, on a machine other tests share.
SMALL_RUN = ("--num-prompts", "12", "--request-rate", "inf", "--max-concurrency", "6", "--input-len", "64",
             "--output-len", "16")
BENCH_TIMEOUT_SECONDS = 1200


@pytest.fixture(scope="module")
def fleet(lab: Lab) -> Lab:
    lab.pyinfra("deploys/full.py", timeout=3600)
    return lab


def bench(lab: Lab, result_dir, *args: str):
    result = lab.cli("bench", "inventories/lab.py", *SMALL_RUN, "--result-dir", str(result_dir), *args,
                     check=False, timeout=BENCH_TIMEOUT_SECONDS)
    files = sorted(result_dir.glob("*.json"))
    return result, json.loads(files[-1].read_text()) if files else None


def test_bench_through_the_gateway_keeps_its_result_and_an_impossible_slo_fails(fleet, tmp_path):
    # Generous limits: whatever this shared machine's load, the run passes them.
    first, saved = bench(fleet, tmp_path / "first", "--slo", "ttft_ms=600000,tpot_ms=60000")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert saved["completed"] == 12 and saved["failed"] == 0
    run = saved["ascend_fleet"]
    assert run["profile"] == {"name": "lab", "stack": load_profile("lab").stack.model_dump(mode="json")}
    assert (run["model"]["id"], run["model"]["revision"]) == ("lab/Qwen3-Tiny", "v1")
    assert run["serving"]["max_num_seqs"] == 8 and run["instances"] == 2 * len(fleet.workers)
    assert run["gateway"]["host"] == "gateway" and all(v["passed"] for v in run["slo"])
    for key in ("request_throughput", "output_throughput", "p99_ttft_ms", "median_tpot_ms", "p99_itl_ms"):
        assert saved[key] > 0, key
    assert "SLO p99_ttft_ms <= 600000 ms" in first.stdout and "pass" in first.stdout
    first_file = next((tmp_path / "first").glob("*.json"))

    second, judged = bench(fleet, tmp_path / "second", "--slo", "ttft_ms=0.001", "--compare", str(first_file))
    assert second.returncode == 1, second.stdout[-3000:] + second.stderr[-3000:]
    assert judged["ascend_fleet"]["slo"][0]["passed"] is False
    assert judged["ascend_fleet"]["compared_with"] == str(first_file)
    assert "FAIL" in second.stdout and "previous" in second.stdout and "%" in second.stdout
    print(f"bench: {saved['completed']} requests, {saved['output_throughput']:.1f} output tok/s, "
          f"TTFT p99 {saved['p99_ttft_ms']:.0f} ms, TPOT p99 {saved['p99_tpot_ms']:.0f} ms")
