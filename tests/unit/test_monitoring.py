"""Monitoring: the Prometheus config and alert rules the monitoring stage writes, checked and
exercised by promtool (Debian's prometheus package, installed by scripts/setup --test); the Grafana
dashboard's queries parse and read old and new vLLM metric names; the npu-smi textfile script."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from ascend_fleet import TEMPLATES
from ascend_fleet.config.hostdata import Monitoring
from ascend_fleet.core.node_layout import PROMETHEUS_FILE_SD_DIR
from ascend_fleet.core.templating import render
from ascend_fleet.stages.monitoring import SCRAPE_JOBS

PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(PROMTOOL is None,
                                reason="promtool missing: run scripts/setup --test (Debian's prometheus)")
DASHBOARD = TEMPLATES / "monitoring" / "grafana-dashboard.json"
DEFAULTS = Monitoring()  # the thresholds group data gets when it sets none
WORKER1 = {"host": "worker1", "instance_name": "vllm-0", "instance": "10.0.0.2:8000", "job": "vllm"}


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120)


def write_rules(directory: Path, monitoring: Monitoring = DEFAULTS) -> Path:
    rules = directory / "ascend-fleet.rules.yml"
    rules.write_text(render(TEMPLATES / "monitoring" / "ascend-fleet.rules.yml.j2", monitoring=monitoring))
    return rules


def test_rules_and_config_pass_promtool_check(tmp_path):
    rules = write_rules(tmp_path)
    assert promtool("check", "rules", str(rules)).returncode == 0
    monitoring = Monitoring(alertmanagers=["alertmanager.example:9093"])
    config = tmp_path / "prometheus.yml"
    config.write_text(render(TEMPLATES / "monitoring" / "prometheus.yml.j2", monitoring=monitoring,
                             gateway_host='"gw-01"', rules_file=str(rules), jobs=SCRAPE_JOBS,
                             file_sd_dir=PROMETHEUS_FILE_SD_DIR, prometheus_port=9090))
    result = promtool("check", "config", str(config))
    assert result.returncode == 0, result.stdout + result.stderr
    parsed = yaml.safe_load(config.read_text())
    assert [job["job_name"] for job in parsed["scrape_configs"]] == ["prometheus", *SCRAPE_JOBS]


def test_a_broken_rule_is_refused_by_promtool(tmp_path):
    rules = write_rules(tmp_path)
    rules.write_text(rules.read_text().replace("up{job=\"vllm\"} == 0", "up{job=\"vllm\" == 0"))
    result = promtool("check", "rules", str(rules))
    assert result.returncode != 0 and "FAILED" in result.stdout + result.stderr


def series(name: str, values: str, **labels) -> dict:
    label_text = ",".join(f'{k}="{v}"' for k, v in {**WORKER1, **labels}.items() if v is not None)
    return {"series": f"{name}{{{label_text}}}", "values": values}


def histogram(name: str, le_counts: dict[str, str]) -> list[dict]:
    """Bucket series growing by the given per-step increments, e.g. {"0.5": "0+1x20", "+Inf": "0+1x20"}."""
    return [series(f"{name}_bucket", values, le=le) for le, values in le_counts.items()]


def alert(name: str, eval_time: str, fires: bool, **labels) -> dict:
    """What promtool should see at eval_time; a label given as None is one the alert does not carry."""
    exp_labels = {k: v for k, v in {**WORKER1, **labels}.items() if v is not None}
    return {"eval_time": eval_time, "alertname": name, "exp_alerts": [{"exp_labels": exp_labels}] if fires else []}


def run_rule_tests(tmp_path: Path, tests: list[dict], monitoring: Monitoring = DEFAULTS) -> None:
    rules = write_rules(tmp_path, monitoring)
    # promtool compares annotations too unless a test leaves them out of exp_alerts: drop them here.
    text = yaml.safe_load(rules.read_text())
    for rule in text["groups"][0]["rules"]:
        rule.pop("annotations")
    rules.write_text(yaml.safe_dump(text))
    spec = tmp_path / "rules.test.yml"
    spec.write_text(yaml.safe_dump({"rule_files": [rules.name], "evaluation_interval": "15s", "tests": tests}))
    result = promtool("test", "rules", str(spec))
    assert result.returncode == 0, result.stdout + result.stderr


def test_instance_down_fires_after_its_for_duration(tmp_path):
    run_rule_tests(tmp_path, [{
        "interval": "15s",
        "input_series": [series("up", "1 1 0x20")],
        "alert_rule_test": [alert("InstanceDown", "1m", False),
                            alert("InstanceDown", "2m", True, severity="critical")],
    }])


@pytest.mark.parametrize("kv_metric", ["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"])
def test_kv_cache_above_90_percent_for_5_minutes_fires_under_either_name(tmp_path, kv_metric):
    run_rule_tests(tmp_path, [{
        "interval": "1m",
        "input_series": [series(kv_metric, "0.95x10"), series(kv_metric, "0.5x10", instance_name="vllm-1")],
        "alert_rule_test": [alert("KVCacheNearlyFull", "4m", False),
                            alert("KVCacheNearlyFull", "6m", True, severity="warning")],
    }])


@pytest.mark.parametrize("itl_metric", ["vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"])
def test_latency_p99_alerts_under_either_itl_name(tmp_path, itl_metric):
    # Every request: TTFT between 2.5 s and 5 s, ITL between 75 and 100 ms.
    slow = {"0.1": "0x20", "2.5": "0x20", "5.0": "0+10x20", "+Inf": "0+10x20"}
    slow_tokens = {"0.05": "0x20", "0.075": "0x20", "0.1": "0+100x20", "+Inf": "0+100x20"}
    labels = {"severity": "warning", "job": None, "instance": None}
    run_rule_tests(tmp_path, [{
        "interval": "1m",
        "input_series": [*histogram("vllm:time_to_first_token_seconds", slow), *histogram(itl_metric, slow_tokens)],
        "alert_rule_test": [alert("TTFTHigh", "3m", False), alert("TTFTHigh", "8m", True, **labels),
                            alert("InterTokenLatencyHigh", "8m", True, **labels)],
    }])


def test_a_growing_queue_fires_and_a_steady_one_does_not(tmp_path):
    run_rule_tests(tmp_path, [{
        "interval": "1m",
        "input_series": [series("vllm:num_requests_waiting", "0+2x20"),
                         series("vllm:num_requests_waiting", "5x20", instance_name="vllm-1")],
        "alert_rule_test": [alert("WaitingRequestsGrowing", "12m", True, severity="warning")],
    }])


def test_an_unhealthy_npu_fires_with_its_host_and_npu(tmp_path):
    node = {"job": "npu_node", "instance": "10.0.0.2:9100", "instance_name": None}
    run_rule_tests(tmp_path, [{
        "interval": "15s",
        "input_series": [series("ascend_npu_health", "0 0 3x10", npu="5", chip="910B3", **node),
                         series("ascend_npu_health", "0x12", npu="4", chip="910B3", **node)],
        "alert_rule_test": [alert("NpuUnhealthy", "2m", True, severity="critical", npu="5", chip="910B3", **node)],
    }])


def test_the_virtual_address_moving_fires_on_its_new_holder_only_and_two_holders_are_critical(tmp_path):
    def holds(host: str, values: str) -> dict:
        return {"series": f'ascend_fleet_gateway_holds_vip{{job="gateway_node",host="{host}",address="10.0.0.100"}}',
                "values": values}

    def gateway_alert(name: str, eval_time: str, fires: bool, **labels) -> dict:
        return {"eval_time": eval_time, "alertname": name, "exp_alerts": [{"exp_labels": labels}] if fires else []}

    moved = {"severity": "warning", "job": "gateway_node", "host": "gw-02", "address": "10.0.0.100"}
    run_rule_tests(tmp_path, [{
        # gw-01 holds it, then is gone (powered off: its scrape fails, its series go stale); gw-02 takes it at 2m.
        "interval": "15s",
        "input_series": [holds("gw-01", "1x7 stale"), holds("gw-02", "0x7 1x40")],
        "alert_rule_test": [gateway_alert("VirtualAddressMoved", "1m", False),
                            gateway_alert("VirtualAddressMoved", "3m", True, **moved),
                            gateway_alert("VirtualAddressMoved", "12m", False),
                            gateway_alert("VirtualAddressNotHeldOnce", "3m", False)],
    }, {
        "interval": "15s",
        "input_series": [holds("gw-01", "1x20"), holds("gw-02", "0x4 1x16")],
        "alert_rule_test": [gateway_alert("VirtualAddressNotHeldOnce", "3m", True, severity="critical",
                                          address="10.0.0.100")],
    }, {
        # A fresh pair: keepalived starts as backup on both (0), then gw-01 takes the address; later gw-01's
        # keepalived restarts and takes it back. No other gateway held it: nothing moved.
        "interval": "15s",
        "input_series": [holds("gw-01", "0x3 1x16 0 1x20"), holds("gw-02", "0x40")],
        "alert_rule_test": [gateway_alert("VirtualAddressMoved", "2m", False),
                            gateway_alert("VirtualAddressMoved", "6m", False)],
    }])


def test_an_instance_out_of_routing_fires_while_it_is_out_and_a_stopped_watcher_fires(tmp_path):
    def isolated(host: str, values: str) -> dict:
        return {"series": f'ascend_fleet_route_isolated{{job="gateway_node",host="{host}",backend="w2/vllm-1"}}',
                "values": values}

    def gateway_alert(name: str, eval_time: str, fires: bool, **labels) -> dict:
        return {"eval_time": eval_time, "alertname": name, "exp_alerts": [{"exp_labels": labels}] if fires else []}

    # gw-01's watcher takes w2/vllm-1 out at 1m and puts it back at 3m; gw-02's a little later.
    run_rule_tests(tmp_path, [{
        "interval": "15s",
        "input_series": [isolated("gw-01", "0x3 1x8 0x20"), isolated("gw-02", "0x4 1x8 0x20"),
                         {"series": 'ascend_fleet_route_watch_checked_seconds{job="gateway_node",host="gw-01"}',
                          "values": "0+15x8 120x20"}],
        "alert_rule_test": [gateway_alert("InstanceOutOfRouting", "30s", False),
                            gateway_alert("InstanceOutOfRouting", "2m", True, severity="warning", backend="w2/vllm-1"),
                            gateway_alert("InstanceOutOfRouting", "4m", False),
                            gateway_alert("RouteWatcherStopped", "2m", False),
                            gateway_alert("RouteWatcherStopped", "4m", True, severity="critical", job="gateway_node",
                                          host="gw-01")],
    }])


def dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]


def test_dashboard_queries_parse_and_read_both_metric_names(tmp_path):
    queries = dashboard_queries()
    assert len(queries) >= 6
    # Grafana's variables, as Grafana would substitute them.
    concrete = [re.sub(r"\$__rate_interval", "1m", q).replace("$host", ".*") for q in queries]
    rules = tmp_path / "dashboard.rules.yml"
    rules.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}", "expr": q} for i, q in enumerate(concrete)]}]}))
    result = promtool("check", "rules", str(rules))
    assert result.returncode == 0, result.stdout + result.stderr
    text = "\n".join(queries)
    for new, old in (("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
                     ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")):
        for query in queries:
            if new in query or old in query:
                assert new in query and old in query and " or " in query, query
    assert "ascend_npu_health" in text and 'up{job="vllm"' in text
