"""The monitoring stage on the lab: the gateway's real Prometheus scrapes every instance, every
worker's node_exporter (NPU health from npu-smi) and nginx; its deployed rules pass promtool on the
node; stopping an instance fires InstanceDown and a Critical NPU fires NpuUnhealthy, read from
Prometheus's HTTP API. The module deploys monitoring that looks every 5 s, with InstanceDown's `for:`
at 10 s (production: 15 s and 1 minute), and puts the lab's own settings back at the end."""

from __future__ import annotations

import json
import time

import pytest
import requests

from ascend_fleet.core.node_layout import NPU_METRICS_UNIT, PROMETHEUS_CONFIG, instance_unit
from tests.lab.conftest import Lab

pytestmark = pytest.mark.lab

PROMETHEUS_PORT = 9090
ALERT_TIMEOUT_SECONDS = 90
FAST = {"scrape_interval": "5s", "evaluation_interval": "5s", "instance_down_for": "10s", "npu_metrics_interval": "5s"}


@pytest.fixture(scope="module")
def fleet(lab: Lab) -> Lab:
    lab.pyinfra("deploys/full.py", "--data", f"monitoring={json.dumps(FAST)}", timeout=3600)
    yield lab
    lab.pyinfra("deploys/monitoring.py")


def prometheus(lab: Lab, path: str, **params):
    gateway = next(n["address"] for n in lab.status()["nodes"] if n["role"] == "gateway")
    answer = requests.get(f"http://{gateway}:{PROMETHEUS_PORT}/api/v1/{path}", params=params, timeout=10)
    answer.raise_for_status()
    return answer.json()["data"]


def wait_for(what: str, probe, timeout: float = ALERT_TIMEOUT_SECONDS):
    """probe() until it returns something truthy; that value, and the seconds it took."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        value = probe()
        if value:
            return value, time.monotonic() - started
        time.sleep(1)
    raise AssertionError(f"{what}: not within {timeout}s")


def firing(lab: Lab, alertname: str, **labels) -> list[dict]:
    return [a for a in prometheus(lab, "alerts")["alerts"]
            if a["labels"]["alertname"] == alertname and a["state"] == "firing"
            and all(a["labels"].get(k) == v for k, v in labels.items())]


def test_prometheus_scrapes_every_instance_worker_and_gateway(fleet):
    def all_up():
        targets = prometheus(fleet, "targets", state="active")["activeTargets"]
        return targets if targets and all(t["health"] == "up" for t in targets) else None

    targets, _ = wait_for("every target up", all_up, timeout=60)
    by_job: dict[str, set] = {}
    for target in targets:
        by_job.setdefault(target["labels"]["job"], set()).add(
            (target["labels"].get("host"), target["labels"].get("instance_name")))
    workers = fleet.workers
    assert by_job["vllm"] == {(w, i) for w in workers for i in ("vllm-0", "vllm-1")}
    assert by_job["npu_node"] == {(w, None) for w in workers}
    assert by_job["nginx"] == {("gateway", None)}
    # Before this module's deploy the NPU metrics textfile was rewritten once a minute: what an earlier
    # test did to a node (a fault, a reboot) can show for that long after the deploy converged it, and
    # its alert until the next evaluation after that. Within the alert timeout, every NPU reads
    # healthy and nothing fires. A pending SLO alert is not firing: it judges the last 5 minutes'
    # latency, which earlier tests' load on a busy machine set (InterTokenLatencyHigh pending at 68 ms
    # in a rehearsal).
    def every_npu_healthy():
        health = prometheus(fleet, "query", query="ascend_npu_health")["result"]
        return len(health) == 8 * len(workers) and all(s["value"][1] == "0" for s in health)

    wait_for("every NPU of every worker reads healthy", every_npu_healthy)
    kv = prometheus(fleet, "query", query="vllm:kv_cache_usage_perc or vllm:gpu_cache_usage_perc")["result"]
    assert len(kv) == 2 * len(workers)
    wait_for("a converged fleet fires no alert",
             lambda: not [a for a in prometheus(fleet, "alerts")["alerts"] if a["state"] == "firing"])


def test_deployed_rules_and_config_pass_promtool_on_the_gateway(fleet):
    out = fleet.run("gateway", f"promtool check config {PROMETHEUS_CONFIG}").stdout
    assert "SUCCESS" in out and "12 rules found" in out
    rules = {r["name"]: r for g in prometheus(fleet, "rules")["groups"] for r in g["rules"]}
    assert {"InstanceDown", "KVCacheNearlyFull", "TTFTHigh", "InterTokenLatencyHigh", "WaitingRequestsGrowing",
            "NpuUnhealthy", "NpuHealthUnknown", "GatewayDown", "InstanceOutOfRouting", "RouteWatcherStopped"} <= set(rules)
    assert rules["InstanceDown"]["duration"] == 10  # FAST
    assert rules["KVCacheNearlyFull"]["duration"] == 300  # the production default


def test_stopping_an_instance_fires_instance_down(fleet):
    fleet.run("worker3", f"systemctl stop {instance_unit('vllm-0')}")
    try:
        alerts, seconds = wait_for("InstanceDown for worker3/vllm-0",
                                   lambda: firing(fleet, "InstanceDown", host="worker3", instance_name="vllm-0"))
        every_down = firing(fleet, "InstanceDown")
    finally:
        fleet.run("worker3", f"systemctl start {instance_unit('vllm-0')}")
    assert alerts[0]["annotations"]["summary"] == "vLLM instance worker3/vllm-0 is down"
    assert every_down == alerts, "only the stopped instance is down"
    print(f"InstanceDown fired {seconds:.0f}s after the unit stopped (scrape 5s, for 10s)")
    wait_for("InstanceDown resolved", lambda: not firing(fleet, "InstanceDown"))


def test_a_critical_npu_fires_npu_unhealthy(fleet):
    timer = fleet.run("worker1", f"systemctl cat {NPU_METRICS_UNIT}.timer").stdout
    assert "OnUnitActiveSec=5s" in timer, timer  # FAST's npu_metrics_interval
    hardware_file = fleet.lab_dir / "nodes" / "worker1" / "ascend-lab" / "hardware.json"
    original = hardware_file.read_text()
    hardware = json.loads(original)
    hardware["npu_health"][6] = "Critical"
    try:
        hardware_file.write_text(json.dumps(hardware))  # in place: the node's npu-smi sees it at once
        alerts, seconds = wait_for("NpuUnhealthy for worker1 NPU 6",
                                   lambda: firing(fleet, "NpuUnhealthy", host="worker1", npu="6"))
    finally:
        hardware_file.write_text(original)
    assert alerts[0]["value"] in ("3", "3e+00")
    print(f"NpuUnhealthy fired {seconds:.0f}s after npu-smi turned Critical (timer 5s)")
