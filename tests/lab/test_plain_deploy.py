"""A plain `pyinfra … deploys/full.py` on a serving fleet, under load (issue 17: one such deploy
once restarted every instance of the fleet at once and the gateway answered 502).

A change that touches every instance's unit restarts them `max_unavailable` at a time, each back
on /health before the next goes down, and the load through the gateway loses no request. The
module leaves the session lab serving with the lab's own data.
"""

from __future__ import annotations

import json

import pytest

from ascend_fleet.control.loadgen import LoadGenerator
from tests.lab.conftest import Lab, down_windows

pytestmark = pytest.mark.lab

SERVING = {"max_model_len": 2048, "gpu_memory_utilization": 0.9}


@pytest.fixture(scope="module")
def gateway(lab):
    lab.pyinfra("deploys/full.py", timeout=3600)
    return "http://" + lab.address("gateway")


def most_down_at_once(windows: dict[str, tuple[int, int]], since: int) -> int:
    edges = sorted([(left, 1) for left, back in windows.values() if left > since] +
                   [(back, -1) for left, back in windows.values() if left > since])
    down = most = 0
    for _, step in edges:
        down += step
        most = max(most, down)
    return most


def deploy_under_load(lab: Lab, gateway: str, *data: str) -> dict:
    before = max(back for _, back in down_windows(lab).values())
    load = LoadGenerator(gateway, "lab/Qwen3-Tiny", concurrency=3, max_tokens=16).start()
    try:
        result = lab.pyinfra("deploys/full.py", *(arg for pair in (("--data", d) for d in data) for arg in pair))
    finally:
        report = load.stop()
    windows = down_windows(lab)
    return {"output": result.stdout, "load": report.summary(), "restarted": sum(left > before for left, _ in
                                                                                windows.values()),
            "most_down": most_down_at_once(windows, before)}


def test_a_change_to_every_instance_restarts_one_at_a_time_and_fails_no_request(lab, gateway):
    changed = deploy_under_load(lab, gateway, f"serving={json.dumps({**SERVING, 'max_num_seqs': 6})}")
    assert changed["restarted"] == 6 and changed["most_down"] == 1, changed
    assert changed["load"]["errors"] == 0 and changed["load"]["requests"] > 0, changed["load"]["first_errors"]
    assert "restarted, 1 at a time while the others serve" in changed["output"]
    # Back to the lab's data, two at a time this time.
    restored = deploy_under_load(lab, gateway, "max_unavailable=2")
    assert restored["restarted"] == 6 and restored["most_down"] == 2, restored
    assert restored["load"]["errors"] == 0, restored["load"]["first_errors"]
