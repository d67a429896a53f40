"""Instances bigger than a node (issue 14), on a lab of 4 workers and a gateway of its own:
inventories/lab_multinode.py serves two instances over two workers each (lab_pair_a: worker1, the
head, and worker2; lab_pair_b: worker3 and worker4), as vllm-ascend's guide serves Qwen3.5-397B-A17B
W8A8 on two Atlas A2 nodes, over the lab's NPU parameter plane.

The module runs on the second lab grown to 4 workers, last of the modules there (tests/conftest.py),
so three workers come deployed for another layout, which this deploy replaces, and the fourth is
fresh. It deploys once (its fixture) and each test leaves the fleet serving as the inventory says,
so the tests run in any order and alone.
"""

from __future__ import annotations

import json
import re
import runpy
import time

import pytest
import requests

from ascend_fleet.control.loadgen import LoadGenerator
from ascend_fleet.core.node_layout import GATEWAY_CONFIG, instance_env_file, instance_unit
from ascend_fleet.facts.hccn import HCCN_TOOL
from tests.lab.conftest import PROJECT, Lab
from tests.lab.test_firewalls import connect, engine_ports, listening
from tests.lab.test_full_deploy import planned_host_data, totals

pytestmark = pytest.mark.lab

INVENTORY = "inventories/lab_multinode.py"
WORKERS = ("worker1", "worker2", "worker3", "worker4")
HEADS = {"lab_pair_a": "worker1", "lab_pair_b": "worker3"}
MODEL_NAME = "qwen3.5"
UNIT = instance_unit("vllm-0")
GROUP_DATA = runpy.run_path(str(PROJECT / "group_data" / "lab_multinode.py"))


@pytest.fixture(scope="module")
def lab(second_lab):
    grown = second_lab.with_workers(len(WORKERS))
    return Lab(grown.lab_dir, grown.name, grown.subnet, inventory=INVENTORY)


@pytest.fixture(scope="module")
def deployed(lab):
    """The fleet deployed, then the same deploy again."""
    first = lab.pyinfra("deploys/full.py", timeout=3600)
    again = lab.pyinfra("deploys/full.py", timeout=3600)
    return {"first": first.stdout, "again": again.stdout}



def gateway_url(lab: Lab) -> str:
    return f"http://{lab.address('gateway')}"


def chat(lab: Lab) -> requests.Response:
    return requests.post(f"{gateway_url(lab)}/v1/chat/completions", timeout=60, json={
        "model": MODEL_NAME, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8})


def unit_starts(lab: Lab) -> dict[str, str]:
    """When each worker's instance unit last became active."""
    return {worker: lab.run(worker, f"systemctl show -P ActiveEnterTimestampMonotonic {UNIT}").stdout.strip()
            for worker in WORKERS}


def routed(lab: Lab) -> list[str]:
    """The instances the gateway's upstream lists (each line ends with # host/instance)."""
    return re.findall(r"^\s*server \S+ .*# (\S+)$", lab.run("gateway", f"cat {GATEWAY_CONFIG}").stdout, re.M)


def test_each_npu_has_its_planned_address_and_the_instances_serve_through_their_heads(lab, deployed):
    assert totals(deployed["first"])["errors"] == 0
    for worker in WORKERS:
        out = lab.run(worker, f"for i in $(seq 0 7); do {HCCN_TOOL} -i $i -ip -g; done").stdout
        assert re.findall(r"^ipaddr:(\S+)$", out, re.M) == planned_host_data(lab, worker)["npu_addresses"], out
    # The gateway reaches each instance through its head; the members serve no HTTP of their own.
    assert routed(lab) == ["worker1/vllm-0", "worker3/vllm-0"]
    for head, member in (("worker1", "worker2"), ("worker3", "worker4")):
        # `vllm serve`: the api_server module would ignore --headless and its head would refuse the member
        exec_start = re.search(r"^ExecStart=(.*)$", lab.run(member, f"systemctl cat {UNIT}").stdout, re.M)[1]
        assert re.match(r"\S+/bin/vllm serve /\S+ .*--headless ", exec_start), exec_start
        argv = lab.run(member, f"tr '\\0' ' ' < /proc/$(systemctl show -P MainPID {UNIT})/cmdline").stdout
        assert (f"--headless --data-parallel-size 2 --data-parallel-size-local 1 --data-parallel-address "
                f"{lab.address(head)} --data-parallel-rpc-port 13389 --data-parallel-start-rank 1") in argv, argv
        env = lab.run(member, f"cat {instance_env_file('vllm-0')}").stdout
        assert f"HCCL_IF_IP={lab.address(member)}" in env and "HCCL_SOCKET_IFNAME=eth0" in env
    reply = chat(lab)
    assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"]


def reserved_ports(lab: Lab, node: str) -> set[int]:
    ranges = lab.run(node, "sysctl -n net.ipv4.ip_local_reserved_ports").stdout.strip().split(",")
    return {port for spec in ranges if spec
            for port in range(int(spec.split("-")[0]), int(spec.split("-")[-1]) + 1)}


def test_the_heads_engine_ports_are_the_ones_the_plan_reserves(lab, deployed):
    """Every port a head's vLLM listens on (API, VLLM_PORT's, the DP master port vLLM 0.18.0 takes upward
    from VLLM_PORT, the DP RPC port, HCCL's) is one the environment stage reserved; none is 29500."""
    for head in HEADS.values():
        pid = lab.run(head, f"systemctl show -P MainPID {UNIT}").stdout.strip()
        listening = lab.run(head, "ss -ltnpH").stdout.splitlines()
        ports = {int(line.split()[3].rsplit(":", 1)[1]) for line in listening if f"pid={pid}," in line}
        assert 13389 not in ports  # the handshake socket closes once every engine is in (vLLM's too)
        env = dict(line.split("=", 1) for line in lab.run(head, f"cat {instance_env_file('vllm-0')}").stdout.split()
                   if "=" in line)
        vllm_port = int(env["VLLM_PORT"])
        assert len(ports & set(range(vllm_port, vllm_port + 5))) == 2, ports  # internal and DP master
        assert ports and ports <= reserved_ports(lab, head) and 29500 not in ports, (ports, reserved_ports(lab, head))
        assert 13389 in reserved_ports(lab, head)


def test_the_heads_hccl_ports_answer_the_hosts_of_its_instance_only(lab, deployed):
    """The firewall (ascend_fleet/fleet/firewall.py): the head's HCCL range answers its member, not the other
    instance's hosts."""
    port = engine_ports(lab, "worker1")["HCCL"]
    with listening(lab, "worker1", port):
        assert connect(lab, "worker2", "worker1", port) == "open"
        assert connect(lab, "worker3", "worker1", port) == "refused"


def test_a_serving_nic_without_the_serving_address_stops_preflight_in_one_line(lab, deployed):
    result = lab.pyinfra("deploys/preflight.py", "--limit", "worker2", "--data", "serving_nic=lo", check=False)
    assert result.returncode != 0
    assert (f"worker2: serving_nic lo does not carry serving_address {lab.address('worker2')} (it has 127.0.0.1); "
            "set serving_nic to the NIC that does, or correct serving_address") in result.stdout, result.stdout[-3000:]


def test_a_rerun_changes_nothing(deployed):
    counts = totals(deployed["again"])
    assert counts["changed"] == 0 and counts["errors"] == 0, counts


def test_an_npu_nic_down_stops_both_hosts_of_its_instance_in_one_line_each_and_nothing_restarts(lab, deployed):
    peer_address = planned_host_data(lab, "worker2")["npu_addresses"][5]
    before = unit_starts(lab)
    with lab.npu_link_down("worker2", 5):
        result = lab.pyinfra("deploys/full.py", check=False)
    assert result.returncode != 0
    assert ("worker2: NPU network: NPU 5: link DOWN (-link -g: link status: DOWN); check its optical module, "
            "cable and switch port") in result.stdout, result.stdout[-4000:]
    # Its head cannot reach it over NPU 5: refused too, naming the address and the check's own line.
    assert re.search(rf"worker1: NPU network: NPU 5 does not reach {re.escape(peer_address)} of npu_peer_group "
                     rf"lab_pair_a \(-ping -g address {re.escape(peer_address)}: 3 packets transmitted, 0 received",
                     result.stdout), result.stdout[-4000:]
    assert totals(result.stdout)["changed"] == 0
    assert unit_starts(lab) == before
    assert chat(lab).status_code == 200


def test_a_rollout_under_load_moves_one_whole_instance_at_a_time_and_fails_no_request(lab, deployed):
    data = "npu_env=" + json.dumps({**GROUP_DATA["npu_env"], "HCCL_BUFFSIZE": 512})
    generator = LoadGenerator(gateway_url(lab), MODEL_NAME, concurrency=3, max_tokens=16).start()
    try:
        result = lab.cli("rollout", INVENTORY, "deploys/serve.py", "--data", data, "--max-unavailable", "1",
                         "--json", timeout=3600)
    finally:
        report = generator.stop()
    record = json.loads(result.stdout)
    assert record["ok"], result.stdout + result.stderr
    assert [(s["hosts"], s["instances"]) for s in record["steps"]] == [
        (["worker1", "worker2"], ["worker1/vllm-0"]), (["worker3", "worker4"], ["worker3/vllm-0"])]
    summary = report.summary()
    assert summary["requests"] > 20 and summary["errors"] == 0, summary
    # Never both instances out of the gateway: each head's time out of service (its unit's stop to
    # its start) ends before the other's begins.
    windows = sorted(tuple(int(v) for v in lab.run(head, f"systemctl show -P ActiveExitTimestampMonotonic {UNIT}; "
                                                         f"systemctl show -P ActiveEnterTimestampMonotonic {UNIT}"
                                                   ).stdout.split()) for head in HEADS.values())
    assert windows[0][1] < windows[1][0], windows
    for worker in WORKERS:
        assert "HCCL_BUFFSIZE=512" in lab.run(worker, f"cat {instance_env_file('vllm-0')}").stdout
    lab.pyinfra("deploys/serve.py")  # back to the inventory's settings


def test_a_member_lost_takes_its_instance_out_of_the_gateway_and_a_rerun_brings_it_back(lab, deployed):
    hold = lab.lab_dir / "nodes" / "worker4" / "hold"
    generator = LoadGenerator(gateway_url(lab), MODEL_NAME, concurrency=3, max_tokens=16).start()
    try:
        time.sleep(5)
        hold.touch()  # worker4 goes down and stays down: its power lost
        lost = time.monotonic() - generator._origin
        lab.run("worker4", "systemctl reboot", check=False)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and next(
                n for n in lab.status()["nodes"] if n["name"] == "worker4")["state"] == "running":
            time.sleep(1)
        time.sleep(20)  # the head's engine dies at its next request, systemd restarts it, nginx stops routing
        reading = json.loads(lab.cli("status", INVENTORY, "--json", check=False).stdout)
    finally:
        report = generator.stop()
    # Requests fail only while the loss is being noticed; afterwards the other instance takes them all.
    late = [r for r in report.results if not r.ok and r.started > lost + 15]
    assert not late, [f"{r.started:.1f}s: {r.error}" for r in late]
    assert sum(1 for r in report.results if r.ok and r.started > lost + 15) > 10
    head = next(i for h in reading["hosts"] if h["host"] == "worker3" for i in h["instances"])
    assert any(p.startswith("member worker4 of lab_pair_b: ") for p in head["problems"]), head["problems"]
    # Power back: the member boots, its unit starts, and a rerun puts the instance back in the gateway.
    hold.unlink()
    lab.wait_running("worker4", timeout=180)
    result = lab.pyinfra("deploys/full.py", timeout=3600)
    assert totals(result.stdout)["errors"] == 0
    assert routed(lab) == ["worker1/vllm-0", "worker3/vllm-0"]
    assert all(chat(lab).status_code == 200 for _ in range(4))
