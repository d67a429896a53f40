"""`ascend-fleet bench` on the lab: real `vllm bench serve` (the bench virtualenv that scripts/test
builds) through the lab's gateway. A run writes its result with the profile, model and serving
options it ran under; an impossible SLO makes it exit non-zero, and --compare shows the change.
A rollout with --bench-gate stops after its canary wave when that wave benchmarks worse."""

from __future__ import annotations

import json
import runpy

import pytest

from ascend_fleet.config.profile import load_profile
from ascend_fleet.core.node_layout import GATEWAY_CONFIG, instance_unit
from ascend_fleet.lab.lab import fleet_state_dir
from tests.lab.conftest import PROJECT, Lab, needs_bench_venv

pytestmark = [pytest.mark.lab, needs_bench_venv]

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


def test_a_rollout_that_halves_the_seats_stops_at_the_bench_gate_after_the_canary_wave(fleet, tmp_path):
    """Baseline: worker1's vllm-0 benchmarked directly; the rollout's data halves max_num_seqs (8 -> 4),
    which halves what eight clients get served: the canary wave is measured, found worse and left
    drained, with one line naming the metric; wave1 and wave2 keep the old settings and serve."""
    load = ("--num-prompts", "16", "--request-rate", "inf", "--max-concurrency", "8", "--input-len", "64",
            "--output-len", "32")
    baseline_run = fleet.cli("bench", "inventories/lab.py", "--instance", "worker1/vllm-0", *load,
                             "--slo", "ttft_ms=600000,tpot_ms=60000", "--result-dir", str(tmp_path / "baseline"),
                             timeout=BENCH_TIMEOUT_SECONDS)
    baseline = next((tmp_path / "baseline").glob("*.json"))
    assert json.loads(baseline.read_text())["ascend_fleet"]["instance"] == "worker1/vllm-0", baseline_run.stdout
    halved = {**runpy.run_path(str(PROJECT / "group_data" / "lab.py"))["serving"], "max_num_seqs": 4}
    try:
        stopped = fleet.cli("rollout", "inventories/lab.py", "deploys/serve.py", "--data",
                            f"serving={json.dumps(halved)}", "--bench-gate", str(baseline), "--max-regression", "25%",
                            check=False, timeout=3600)
        assert stopped.returncode == 1, stopped.stdout[-3000:] + stopped.stderr[-3000:]
        line = stopped.stderr.strip().splitlines()[-1]  # the one line, after the progress display
        assert "rollout stopped at canary: worker1/vllm-0 bench gate against" in line, stopped.stderr[-3000:]
        assert "past the 25% allowed" in line and any(metric in line for metric in (
            "output_throughput", "request_goodput", "p99_ttft_ms", "p99_tpot_ms")), line
        record = json.loads((fleet_state_dir(fleet.lab_dir) / "rollout.json").read_text())
        assert [s["status"] for s in record["steps"]] == ["failed", "pending", "pending"]
        gateway = fleet.run("gateway", f"cat {GATEWAY_CONFIG}").stdout
        assert [line.split("#")[1].strip() for line in gateway.splitlines() if " down;" in line] == \
            ["worker1/vllm-0", "worker1/vllm-1"]
        for worker in ("worker2", "worker3"):  # untouched, serving with the old seats
            assert seats(fleet, worker) == "8"
    finally:
        fleet.cli("rollout", "inventories/lab.py", "--abandon", check=False, timeout=900)
        fleet.pyinfra("deploys/serve.py", "--limit", "worker1")
    assert seats(fleet, "worker1") == "8"


def seats(lab: Lab, worker: str) -> str:
    """--max-num-seqs of the worker's vllm-0, from its process's command line."""
    argv = lab.run(worker, f"cat /proc/$(systemctl show -P MainPID {instance_unit('vllm-0')})/cmdline").stdout.split("\0")
    return argv[argv.index("--max-num-seqs") + 1]
