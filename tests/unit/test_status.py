"""status: metrics under old and new vLLM names, facts read in one round trip, rows judged from facts."""

from __future__ import annotations

import json

import pytest
from prometheus_client.parser import text_string_to_metric_families
from pyinfra.facts.files import FileContents

from ascend_fleet.config.hostdata import node_config
from ascend_fleet.config.profile import load_profile
from ascend_fleet.control.status import (
    FleetStatus,
    gateway_routes,
    host_status,
    isolated_backends,
    render_problems,
    routing,
    worker_queries,
)
from ascend_fleet.core.node_layout import NGINX_CONF_DIR
from ascend_fleet.core.remote import FactQuery, HostFacts, fact_script, facts_of, process_outputs, split_outputs
from ascend_fleet.core.vllm_metrics import histogram_quantile, parse_metrics
from ascend_fleet.facts.ascend import AscendFirmware, CannPackages, NpuStatus
from ascend_fleet.fleet.probes import fact_key
from ascend_fleet.node.npu_metrics import parse_npu_smi_info, render_metrics

NEW_NAMES = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 2.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.25",model_name="m"} 50.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.5",model_name="m"} 100.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 100.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 100.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 25.0
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.01",model_name="m"} 0.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.025",model_name="m"} 90.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.05",model_name="m"} 100.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"} 100.0
vllm:inter_token_latency_seconds_count{engine="0",model_name="m"} 100.0
vllm:inter_token_latency_seconds_sum{engine="0",model_name="m"} 2.0
"""
OLD_NAMES = NEW_NAMES.replace("kv_cache_usage_perc", "gpu_cache_usage_perc").replace(
    "inter_token_latency_seconds", "time_per_output_token_seconds")


@pytest.mark.parametrize("text", [NEW_NAMES, OLD_NAMES], ids=["new names", "old names"])
def test_metrics_read_the_same_under_old_and_new_names(text):
    metrics = parse_metrics(text)
    assert (metrics.running, metrics.waiting, metrics.kv_cache_usage) == (3, 2, 0.5)
    assert metrics.ttft.p50 == pytest.approx(0.25) and metrics.ttft.p99 == pytest.approx(0.495)
    assert metrics.inter_token_latency.p50 == pytest.approx(0.01 + 0.015 * 50 / 90)
    assert metrics.inter_token_latency.p99 == pytest.approx(0.0475)


def test_an_idle_instance_has_no_percentiles_and_inf_bucket_gives_the_last_bound():
    assert parse_metrics("").ttft.p99 is None
    assert histogram_quantile(0.99, [(0.1, 0.0), (float("inf"), 0.0)]) is None
    assert histogram_quantile(0.99, [(0.1, 1.0), (0.5, 1.0), (float("inf"), 10.0)]) == 0.5


def test_every_fact_comes_back_from_one_script_and_parses_as_in_a_deploy():
    queries = {"firmware": FactQuery(AscendFirmware), "cann": FactQuery(CannPackages),
               "config": FactQuery(FileContents, {"path": f"{NGINX_CONF_DIR}/x.conf"})}
    facts = facts_of(queries)
    script = fact_script(queries, facts, "@@m:")
    assert "firmware/version.info" in script and script.count("@@m:") == 3
    # What the shell would print: the firmware's version.info, nothing for CANN, no config file.
    output = f"@@m:firmware\nVersion=7.7.0.6.236\n@@m:cann\n@@m:config\n{facts['config'].missing_flag}\n"
    values, errors = process_outputs(facts, split_outputs(output, "@@m:"))
    assert values == {"firmware": "7.7.0.6.236", "cann": {}, "config": None} and errors == {}


NPU_SMI = """\
+------------------------------------------------------------------------------------------------+
| npu-smi 25.2.0                   Version: 25.2.0                                               |
+---------------------------+---------------+----------------------------------------------------+
| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |
+===========================+===============+====================================================+
| 0     910B3               | OK            | 93.5        45                0    / 0             |
| 0                         | 0000:C1:00.0  | 0           0    / 0          3080 / 65536         |
+===========================+===============+====================================================+
| 1     910B3               | Critical      | 93.5        45                0    / 0             |
| 0                         | 0000:C2:00.0  | 0           0    / 0          40000 / 65536        |
+===========================+===============+====================================================+
"""


def test_npu_metrics_file_says_what_npu_smi_said():
    npus = parse_npu_smi_info(NPU_SMI.splitlines())
    assert [(n["id"], n["health"], n["hbm_used_mb"]) for n in npus] == [(0, "OK", 3080), (1, "Critical", 40000)]
    assert NpuStatus().process(["rc=0", *NPU_SMI.splitlines()])["npus"] == npus
    samples = {(s.name, s.labels.get("npu")): s.value
               for family in text_string_to_metric_families(render_metrics(True, npus)) for s in family.samples}
    assert samples[("ascend_npu_smi_up", None)] == 1
    assert samples[("ascend_npu_health", "1")] == 3
    assert samples[("ascend_npu_hbm_used_bytes", "1")] == 40000 * 1024 * 1024
    down = {s.name: s.value for f in text_string_to_metric_families(render_metrics(False, [])) for s in f.samples}
    assert down == {"ascend_npu_smi_up": 0}


ROUTES = json.dumps({"backends": [
    {"key": "worker1/vllm-0", "url": "http://10.0.0.2:8000", "npus": [0], "drained": False},
    {"key": "worker1/vllm-1", "url": "http://10.0.0.2:8001", "npus": [1], "drained": True}]}, indent=1)
ROUTE_STATE = json.dumps({"isolated": {"worker1/vllm-0": {"reason": "NPU 0 Alarm", "since": 0}}})


def test_gateway_routes_come_from_its_routes_file_and_the_route_watchers_state():
    routes = gateway_routes(ROUTES.splitlines())
    assert routes == [{"key": "worker1/vllm-0", "drained": False}, {"key": "worker1/vllm-1", "drained": True}]
    assert gateway_routes(None) is None and gateway_routes(["{not json"]) is None
    assert isolated_backends(ROUTE_STATE.splitlines()) == {"worker1/vllm-0": {"reason": "NPU 0 Alarm", "since": 0}}
    assert isolated_backends(None) == {}


WORKER_DATA = {"profile": "lab", "chip": "910B3", "npu_count": 2, "nvme_mount": "/mnt/nvme",
               "tensor_parallel_size": 1, "serving": {"max_model_len": 2048, "gpu_memory_utilization": 0.9},
               "model": {"id": "lab/Qwen3-Tiny", "revision": "v1", "source": "http", "url": "http://m"}}


def worker_facts(profile, unit_state="active", health=200, driver=None) -> dict:
    stack = profile.stack
    facts = {
        "driver": {"version": driver or stack.driver, "firmware_range": None, "complete": True},
        "firmware": stack.firmware, "cann": {"toolkit": stack.cann, "kernels": stack.cann},
        "npus": NpuStatus().process(["rc=0", *NPU_SMI.replace("Critical", "OK      ").splitlines()]),
        # a converged x86_64 node: torch_npu is the build the profile puts over its pin
        "pip": {"torch-npu": profile.node_version("torch-npu", "x86_64"), "vllm-ascend": stack.vllm_ascend},
        "arch": "x86_64",
    }
    for name in ("vllm-0", "vllm-1"):
        facts[fact_key("unit", name)] = {"LoadState": "loaded", "ActiveState": unit_state, "SubState": "x",
                                 "Result": "exit-code" if unit_state == "failed" else "success",
                                 "last_line": "ERROR NPU 0 is already in use"}
        facts[fact_key("health", name)] = {"status": health, "body": ""}
        facts[fact_key("models", name)] = {"status": 200, "body": json.dumps(
            {"data": [{"id": "lab/Qwen3-Tiny", "root": "/mnt/nvme/models/lab/Qwen3-Tiny/v1"}]})}
        facts[fact_key("metrics", name)] = {"status": 200, "body": NEW_NAMES}
    return facts


def test_a_healthy_worker_matches_its_profile():
    profile = load_profile("lab")
    config = node_config(WORKER_DATA, "worker1")
    status = host_status(config, profile, HostFacts("worker1", worker_facts(profile)))
    assert status.ok and not any(v.drift for v in status.versions.values())
    first = status.instances[0]
    assert (first.model, first.revision, first.health, first.npu_health) == ("lab/Qwen3-Tiny", "v1", 200, ["OK"])
    assert first.metrics["kv_cache_usage"] == 0.5


def test_a_file_the_last_deep_verify_found_unlike_the_manifest_is_red_naming_it():
    profile = load_profile("lab")
    config = node_config(WORKER_DATA, "worker1")
    assert worker_queries(config, profile)["weights"].arguments == {
        "model_dir": "/mnt/nvme/models", "model_id": "lab/Qwen3-Tiny", "revision": "v1"}
    shard = "model-00001-of-00002.safetensors"
    marker = {"model_id": "lab/Qwen3-Tiny", "revision": "v1", "manifest_sha256": "f" * 64, "files": {}, "sizes": {}}
    record = {"manifest_sha256": "f" * 64, "checked_at": 1796342400, "restages": 0,
              "mismatched": {shard: "sha256 0b… does not match the manifest's 9e…"}}
    facts = worker_facts(profile) | {"weights": {**marker, "deep_verify": record}}
    status = host_status(config, profile, HostFacts("worker1", facts))
    assert not status.ok and status.problems == [
        f"weights: the deep verify of 2026-12-04T00:00:00+00:00 found {shard} sha256 0b… does not match the "
        "manifest's 9e…; the next deploy restages it"]
    shown = [line.plain for line in render_problems(FleetStatus([status], "now", 0))]
    assert shown == [f"worker1: {status.problems[0]}"]
    restaged = {**marker, "deep_verify": {**record, "mismatched": {}, "restages": 1}}
    assert host_status(config, profile, HostFacts("worker1", worker_facts(profile) | {"weights": restaged})).ok


def test_the_pin_a_build_should_have_replaced_is_drift():
    """The lab's profile (as vllm-ascend-0.18.0) puts torch_npu 2.9.0.post1+git<hash> over the wheel's
    torch-npu==2.9.0: a node left with the pin has not got upstream's stack."""
    profile = load_profile("lab")
    facts = worker_facts(profile)
    facts["pip"]["torch-npu"] = profile.stack.torch_npu
    status = host_status(node_config(WORKER_DATA, "worker1"), profile, HostFacts("worker1", facts))
    assert status.versions["torch_npu"].drift
    assert status.versions["torch_npu"].expected == profile.node_version("torch-npu", "x86_64") != profile.stack.torch_npu


def test_a_failed_unit_is_red_with_systemds_result_and_its_last_log_line():
    profile = load_profile("lab")
    config = node_config(WORKER_DATA, "worker1")
    status = host_status(config, profile, HostFacts("worker1", worker_facts(profile, "failed", health=0, driver="24.1.0")))
    assert not status.ok and status.versions["driver"].drift
    assert status.instances[0].problems == ["unit failed/x, result exit-code: ERROR NPU 0 is already in use",
                                            "/health answers nothing"]


def test_an_instance_systemd_brought_back_is_yellow_with_how_its_last_process_ended():
    profile = load_profile("lab")
    config = node_config(WORKER_DATA, "worker1")
    facts = worker_facts(profile)
    facts[fact_key("unit", "vllm-0")] |= {"NRestarts": "2", "last_exit": "Main process exited, code=exited, status=0/SUCCESS"}
    status = host_status(config, profile, HostFacts("worker1", facts))
    assert status.ok  # it serves again
    assert status.instances[0].warnings == [
        "restarted by systemd 2 times since its deploy: Main process exited, code=exited, status=0/SUCCESS"]
    assert status.instances[1].warnings == []


def test_an_unreachable_host_is_a_red_row_per_instance():
    config = node_config(WORKER_DATA, "worker1")
    status = host_status(config, load_profile("lab"), HostFacts("worker1", error="cannot connect over SSH: timed out"))
    assert not status.ok and [i.problems for i in status.instances] == [["host: cannot connect over SSH: timed out"]] * 2


def test_routing_needs_every_gateway_to_route():
    from ascend_fleet.control.status import HostStatus
    gateway = HostStatus("gw", "gateway", "lab", routes=gateway_routes(ROUTES.splitlines()))
    assert routing("worker1/vllm-0", [gateway]) == "yes"
    assert routing("worker1/vllm-1", [gateway]) == "drained"
    assert routing("worker2/vllm-0", [gateway]) == "absent"
    assert routing("worker1/vllm-0", [HostStatus("gw", "gateway", "lab", error="down")]) == "unknown"
    watching = HostStatus("gw2", "gateway", "lab", routes=gateway_routes(ROUTES.splitlines()),
                          isolated=isolated_backends(ROUTE_STATE.splitlines()))
    assert routing("worker1/vllm-0", [gateway, watching]) == "isolated"  # one gateway took it out


def test_a_multi_node_instance_is_one_row_group_its_head_red_naming_the_member_that_is_down():
    from ascend_fleet.control.status import join_members
    from ascend_fleet.fleet.multi_node import DataParallelRole
    profile = load_profile("lab")
    data = {**WORKER_DATA, "tensor_parallel_size": 2, "serving_address": "10.0.0.2",
            "data_parallel": {"group": "pair", "nic": "eth0"},
            "npu_addresses": ["10.20.0.11", "10.20.0.12"], "npu_netmask": "255.255.255.0"}
    roles = {host: DataParallelRole("pair", "worker1", "10.0.0.2", rank, 2, 1, 29550, None, ("worker1", "worker2"))
             for rank, host in enumerate(("worker1", "worker2"))}
    link = {"link": "UP", "net_health": "Success", "neighbour": "x", "tls": 0, "said": {}}
    head_facts = {**worker_facts(profile), "npu_network": {0: link, 1: link}}
    # worker2's unit failed and its NPU 1 lost its link.
    member_facts = {**worker_facts(profile, "failed"), "npu_network": {0: link, 1: {**link, "link": "DOWN"}}}
    head = host_status(node_config(data, "worker1"), profile, HostFacts("worker1", head_facts), roles["worker1"])
    member = host_status(node_config(data, "worker2"), profile, HostFacts("worker2", member_facts), roles["worker2"])
    assert member.instances[0].multi_node == "rank 1 of pair (head worker1)"
    assert member.instances[0].routed == "via head" and member.instances[0].health is None  # asked no HTTP
    assert member.problems == ["NPU network: NPU 1 link DOWN"]
    assert head.ok
    join_members([head, member], roles)
    assert head.instances[0].multi_node == "head of pair"
    assert head.instances[0].members == [{"host": "worker2", "rank": 1, "unit": "failed",
                                          "problems": ["NPU network: NPU 1 link DOWN",
                                                       "unit failed/x, result exit-code: ERROR NPU 0 is already in use"]}]
    assert head.instances[0].problems == ["member worker2 of pair: NPU network: NPU 1 link DOWN"]
