"""Requests go to healthy, warm instances (issue 34), on the second lab under load.

- The routing policies side by side in one run: multi-turn sessions (each request resends its history)
  through the gateway with least_conn, session_affinity and cache_aware; the prefix-cache hit rate from
  the instances' own /metrics and TTFT p50/p99 for each.
- Faults isolated by the gateway's route watcher, with the control machine doing nothing: an NPU of
  worker2 in Alarm, a kill -9 of one instance's engine core.
- An operator's `ascend-fleet drain worker2/vllm-1` and `undrain` under load.

The module runs on the second lab after test_rollout (which leaves it serving the lab's data) and leaves
it as it found it: least_conn, every instance in routing, monitoring as the lab's data says.
"""

from __future__ import annotations

import json
import re
import runpy
import time
from contextlib import contextmanager

import pytest

from ascend_fleet.control.loadgen import LoadGenerator
from ascend_fleet.core.node_layout import GATEWAY_CONFIG, ROUTE_WATCH_STATE, ROUTES_FILE, instance_unit
from tests.lab.conftest import PROJECT, Lab
from tests.lab.test_full_deploy import restore_hardware, rewrite_hardware
from tests.lab.test_monitoring import FAST, firing, wait_for

pytestmark = pytest.mark.lab

MODEL = "lab/Qwen3-Tiny"
GATEWAY = runpy.run_path(str(PROJECT / "group_data" / "gateway.py"))["gateway"]
POLICIES = ("least_conn", "session_affinity", "cache_aware")
OUT_WITHIN_SECONDS = 15


@pytest.fixture(scope="module")
def lab(second_lab):
    return second_lab.with_workers(3)


@pytest.fixture(scope="module")
def serving(lab):
    """The fleet serving, its NPU health read every 5 s and Prometheus looking every 5 s (the lab's data:
    once a minute), so a fault shows within the issue's 15 s; the lab's own settings back after."""
    lab.pyinfra("deploys/full.py", "--data", f"monitoring={json.dumps(FAST)}", timeout=3600)
    yield f"http://{lab.address('gateway')}"
    lab.pyinfra("deploys/gateway.py")
    lab.pyinfra("deploys/monitoring.py")


@contextmanager
def under_load(url: str, **options):
    generator = LoadGenerator(url, MODEL, **{"concurrency": 4, "max_tokens": 16, **options}).start()
    try:
        yield generator
    finally:
        generator.stop()


def route_state(lab: Lab) -> dict:
    return json.loads(lab.run("gateway", f"cat {ROUTE_WATCH_STATE}").stdout)["isolated"]


def instance_npus(lab: Lab, key: str) -> list[int]:
    routes = json.loads(lab.run("gateway", f"cat {ROUTES_FILE}").stdout)
    return next(b["npus"] for b in routes["backends"] if b["key"] == key)


def routed_with(lab: Lab, policy: str) -> None:
    # --limit: --data sets the key on every host, and a host with `gateway` data is a gateway.
    lab.pyinfra("deploys/gateway.py", "--limit", "gateway",
                "--data", f"gateway={json.dumps({**GATEWAY, 'routing': {'policy': policy}})}")


def test_routing_by_session_or_cache_at_least_doubles_the_prefix_cache_hit_rate(lab, serving):
    """Bounded multi-turn load, the same for each policy (`ascend-fleet load --turns 6`: 4 clients, 96
    requests); the hit rate is what the instances' /metrics counted during it."""
    figures = {}
    for policy in POLICIES:
        routed_with(lab, policy)
        load = lab.cli("load", "inventories/lab.py", "--turns", "6", "--requests", "96", "--concurrency", "4",
                       "--json", check=False)
        result = json.loads(load.stdout)
        figures[policy] = {key: result[key] for key in ("requests", "errors", "prefix_cache_hit_rate", "p50_ttft_s",
                                                        "p99_ttft_s")}
        print(f"{policy}: {json.dumps(figures[policy])}", flush=True)
    print("routing policies, multi-turn load:", json.dumps(figures, indent=1))
    assert all(f["errors"] == 0 and f["requests"] == 96 for f in figures.values()), figures
    baseline = figures["least_conn"]["prefix_cache_hit_rate"]
    assert baseline is not None and baseline < 0.5, figures
    assert figures["session_affinity"]["prefix_cache_hit_rate"] >= 2 * baseline, figures
    assert figures["cache_aware"]["prefix_cache_hit_rate"] >= 2 * baseline, figures
    routed_with(lab, "least_conn")


def test_an_npu_in_alarm_takes_its_instance_out_of_routing_within_15_s_and_back_with_no_failed_request(lab, serving):
    npus = instance_npus(lab, "worker2/vllm-1")
    health = ["OK"] * 8
    health[npus[1]] = "Alarm"
    with under_load(serving) as load:
        time.sleep(3)
        original = rewrite_hardware(lab, "worker2", npu_health=health)
        try:
            out, seconds_out = wait_for("worker2/vllm-1 out of routing", lambda: route_state(lab).get("worker2/vllm-1"),
                                        timeout=60)
            status = json.loads(lab.cli("status", "inventories/lab.py", "--json", check=False).stdout)
            alert, _ = wait_for("InstanceOutOfRouting", lambda: firing(lab, "InstanceOutOfRouting",
                                                                       backend="worker2/vllm-1"), timeout=90)
        finally:
            restore_hardware(lab, "worker2", original)
        _, seconds_back = wait_for("worker2/vllm-1 back in routing",
                                   lambda: "worker2/vllm-1" not in route_state(lab), timeout=60)
        wait_for("InstanceOutOfRouting resolved", lambda: not firing(lab, "InstanceOutOfRouting"), timeout=90)
        report = load.stop()
    print(f"NPU {npus[1]} Alarm: out after {seconds_out:.1f}s ({out['reason']}), back {seconds_back:.1f}s after the "
          f"NPU was OK; load: {json.dumps(report.summary())}")
    assert seconds_out <= OUT_WITHIN_SECONDS
    assert out["reason"] == f"NPU {npus[1]} Alarm"
    row = next(i for h in status["hosts"] if h["host"] == "worker2" for i in h["instances"] if i["name"] == "vllm-1")
    assert row["routed"] == "isolated" and any("out of routing on gateway" in p for p in row["problems"]), row
    assert report.failures == [] and report.count > 50, report.summary()


def test_a_killed_engine_fails_only_its_requests_in_flight_and_its_instance_comes_back(lab, serving):
    main_pid = lab.run("worker2", f"systemctl show -P MainPID {instance_unit('vllm-1')}").stdout.strip()
    with under_load(serving, concurrency=6) as load:
        time.sleep(3)
        running = lab.run("worker2", "curl -s http://127.0.0.1:8001/metrics | grep '^vllm:num_requests_running'").stdout
        lab.run("worker2", f"pkill -9 -P {main_pid} -f 'VLLM::EngineCore'")
        killed_by = time.monotonic() - load._origin  # the kill landed before this (SSH's round trip before it)
        out, seconds_out = wait_for("worker2/vllm-1 out of routing",
                                    lambda: route_state(lab).get("worker2/vllm-1"), timeout=60)
        _, seconds_back = wait_for("worker2/vllm-1 back in routing",
                                   lambda: "worker2/vllm-1" not in route_state(lab), timeout=180)
        report = load.stop()
    failed = report.failures
    print(f"kill -9 of worker2/vllm-1's engine core by {killed_by:.1f}s (running then: {running.strip()}): out after "
          f"{seconds_out:.1f}s ({out['reason']}), back after {seconds_back:.1f}s; {len(failed)} of {report.count} "
          f"failed: {[(round(r.started, 2), r.error) for r in failed]}")
    assert seconds_out <= OUT_WITHIN_SECONDS
    # Only requests in flight on the instance when its engine died may fail: started before the kill, and
    # cut mid-stream by vLLM's error event, not refused or answered 500.
    assert all(r.started <= killed_by and r.error.startswith("error event mid-stream") for r in failed), \
        [(r.started, r.error) for r in failed]
    assert len(failed) <= 6


def test_an_operator_drains_one_instance_under_load_with_no_failed_request_and_its_neighbour_serves(lab, serving):
    def generated(port: int) -> float:
        text = lab.run("worker2", f"curl -s http://127.0.0.1:{port}/metrics").stdout
        return sum(float(v) for v in re.findall(r"^vllm:generation_tokens_total\{[^}]*\} (\S+)$", text, re.M))

    with under_load(serving) as load:
        time.sleep(2)
        drained = lab.cli("drain", "inventories/lab.py", "worker2/vllm-1")
        neighbour, alone = generated(8000), generated(8001)
        time.sleep(5)
        neighbour_grew, alone_grew = generated(8000) - neighbour, generated(8001) - alone
        config = lab.run("gateway", f"grep worker2 {GATEWAY_CONFIG}").stdout
        undrained = lab.cli("undrain", "inventories/lab.py", "worker2/vllm-1")
        time.sleep(2)
        report = load.stop()
    print(drained.stdout, undrained.stdout, f"load: {json.dumps(report.summary())}")
    assert "worker2/vllm-1 drained at gateway, no request running" in drained.stdout
    assert re.search(r"server \S+:8001 .* down;  # worker2/vllm-1", config), config
    assert neighbour_grew > 0 and alone_grew == 0, (neighbour_grew, alone_grew)
    assert "worker2/vllm-1 back in routing at gateway" in undrained.stdout
    assert report.failures == [] and report.count > 20, report.summary()
