"""`ascend-fleet tune` on the lab: the canary's vllm-0 steps with the performance model (worker1's
hardware file performs as Qwen2.5-72B on 910B3 at time scale 0.25, docs/sim-performance.md), a load
streams through the gateway the whole time, the tune is interrupted with Ctrl-C after its first
measured candidate and finished with --resume."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from ascend_fleet.control.loadgen import LoadGenerator
from ascend_fleet.core.node_layout import GATEWAY_CONFIG, instance_unit
from ascend_fleet.lab.lab import fleet_state_dir
from tests.lab.conftest import BIN, PROJECT, Lab, needs_bench_venv

pytestmark = [pytest.mark.lab, needs_bench_venv]

PERFORMS_AS = PROJECT / "tests/fixtures/models/qwen2.5-72b-instruct/config.json"
# Two seat counts x three memory shares: over 0.98 the planner's check refuses (as the host data
# applies it), so four of the six are skipped (each measured one is a restart and a benchmark).
GRID = ["--grid", "max_num_seqs=2,8", "--grid", "gpu_memory_utilization=0.9,0.985,0.99"]
LOAD = ["--num-prompts", "16", "--concurrency", "8", "--input-len", "64", "--output-len", "32"]
# Generous limits: whatever this shared machine's load, the candidates that run meet them.
SLO = ["--slo", "ttft_ms=60000,tpot_ms=5000"]


@pytest.fixture(scope="module")
def fleet(lab: Lab) -> Lab:
    lab.pyinfra("deploys/full.py", timeout=3600)
    return lab


@pytest.fixture(scope="module")
def modelled_canary(fleet: Lab):
    """worker1's hardware file with the performance section while the module runs; vllm-0 restarted
    as it was at the end (the instance then reads the file as it was)."""
    hardware = fleet.lab_dir / "nodes" / "worker1" / "ascend-lab" / "hardware.json"
    original = hardware.read_text()
    document = json.loads(original)
    document["performance"] = {"time_scale": 0.25, "performs_as": json.loads(PERFORMS_AS.read_text())}
    hardware.write_text(json.dumps(document))
    yield fleet
    hardware.write_text(original)
    fleet.run("worker1", f"systemctl restart {instance_unit('vllm-0')}")


def seats_of_vllm0(lab: Lab) -> str:
    command = lab.run("worker1", f"cat /proc/$(systemctl show -P MainPID {instance_unit('vllm-0')})/cmdline").stdout
    argv = command.split("\0")
    return argv[argv.index("--max-num-seqs") + 1]


def tune_argv(result_dir: Path, *more: str) -> list[str]:
    return [str(BIN / "ascend-fleet"), "tune", "inventories/lab.py", "--canary", "worker1", *GRID, *LOAD, *SLO,
            "--result-dir", str(result_dir), *more]


def test_tune_measures_each_candidate_restores_the_canary_and_survives_ctrl_c(modelled_canary, tmp_path):
    lab = modelled_canary
    gateway = f"http://{next(n for n in lab.status()['nodes'] if n['name'] == 'gateway')['address']}"
    state = fleet_state_dir(lab.lab_dir) / "tune.json"
    state.unlink(missing_ok=True)
    assert seats_of_vllm0(lab) == "8"  # group_data/lab.py
    load = LoadGenerator(gateway, "lab/Qwen3-Tiny", concurrency=2, max_tokens=16).start()
    try:
        # As at a terminal: a process group of its own that Ctrl-C reaches, and SIGINT not ignored (a
        # shell's background job, as scripts/test runs pytest, starts with it ignored, and so would the tune).
        # PYTHONFAULTHANDLER: if it hangs, SIGABRT makes it print where each thread is.
        first = subprocess.Popen(tune_argv(tmp_path), env={**lab.env, "PYTHONFAULTHANDLER": "1"}, cwd=PROJECT,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                                 preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        deadline = time.monotonic() + 900
        while not (state.exists() and any(c["status"] == "done" for c in json.loads(state.read_text())["candidates"])):
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()[0][-4000:]
            time.sleep(1)
        os.killpg(first.pid, signal.SIGINT)  # Ctrl-C: the canary goes back before the command ends
        try:
            interrupted = first.communicate(timeout=600)[0]
        except subprocess.TimeoutExpired:
            first.send_signal(signal.SIGABRT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                first.wait(timeout=30)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(first.pid, signal.SIGKILL)  # what it started (pyinfra, vllm bench, ssh) holds the pipe
            hung = first.communicate(timeout=30)[0]
            logs = sorted((fleet_state_dir(lab.lab_dir) / "logs").glob("*.log"))[-2:]
            pytest.fail(f"tune still running 600 s after Ctrl-C; its output and stacks:\n{hung[-8000:]}\n"
                        + "\n".join(f"{log.name}:\n{log.read_text()[-3000:]}" for log in logs))
        stopped = json.loads(state.read_text())
        assert first.returncode == 130, interrupted[-4000:]
        assert stopped["restored"] and not stopped["finished"], interrupted[-4000:]
        assert seats_of_vllm0(lab) == "8"
        assert " down;" not in lab.run("gateway", f"cat {GATEWAY_CONFIG}").stdout

        resumed = subprocess.run(tune_argv(tmp_path, "--resume", "--json"), env=lab.env, cwd=PROJECT,
                                 capture_output=True, text=True, timeout=1800)
    finally:
        report = load.stop()
    assert resumed.returncode == 0, resumed.stdout[-4000:] + resumed.stderr[-4000:]
    record = json.loads(resumed.stdout)
    print(f"tune: {json.dumps([(c['settings'], c['status'], c['result'].get('request_goodput'), c['result'].get('p99_tpot_ms')) for c in record['candidates']])}")
    print(f"load through the gateway during the tune: {json.dumps(report.summary())}")
    statuses = [c["status"] for c in record["candidates"]]
    assert statuses.count("done") == 2 and statuses.count("skipped") == 4
    for candidate in record["candidates"]:
        if candidate["settings"]["gpu_memory_utilization"] > 0.98:
            assert "is above 0.98: no HBM left for HCCL" in candidate["reason"], candidate
    assert record["winner"] is not None and record["restored"] and record["finished"]
    measured = {c["settings"]["max_num_seqs"]: c["result"] for c in record["candidates"] if c["status"] == "done"}
    # The model's effect: more seats, more throughput (8 clients, two seats queue six of them).
    assert measured[8]["output_throughput"] > measured[2]["output_throughput"]
    assert (tmp_path / "tune.png").read_bytes()[:4] == b"\x89PNG"
    assert "serving = {" in (tmp_path / "winner.py").read_text()
    assert seats_of_vllm0(lab) == "8" and " down;" not in lab.run("gateway", f"cat {GATEWAY_CONFIG}").stdout
    assert not report.failures and report.count > 0, report.summary()
