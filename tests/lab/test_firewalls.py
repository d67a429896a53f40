"""Every worker's and gateway's firewall on the session lab, checked with real connections between
nodes (bash's /dev/tcp over SSH on the node that connects): from a worker, the gateway's Prometheus
and nginx exporter, another worker's node_exporter and its VLLM_PORT and HCCL ports are refused; the
gateway (the monitoring host) reaches a worker's node_exporter, and the lab host (the operator's
machine, in monitoring_allowed_sources) Prometheus. A worker of four instances gets HCCL ranges its
CANN's span apart, reserved and closed to others. sshd_allowed_sources closes a gateway's SSH to
all but the networks it names, and a list that would leave out this machine is refused before
pyinfra connects. The module leaves the fleet deployed as the lab's data says."""

from __future__ import annotations

import json
import re
from contextlib import contextmanager

import pytest

from ascend_fleet.config.profile import load_profile
from ascend_fleet.core.node_layout import FIREWALL_UNIT, instance_env_file, instance_unit
from ascend_fleet.lab.state import LabState
from ascend_fleet.sizing.planner import VLLM_PORT_SPAN
from ascend_fleet.stages.monitoring import NGINX_EXPORTER_PORT, NODE_EXPORTER_PORT, PROMETHEUS_PORT
from tests.lab.conftest import ALL_AT_ONCE, Lab
from tests.lab.test_full_deploy import totals
from tests.lab.test_secrets import connect_from_here

pytestmark = pytest.mark.lab

# What `timeout 5 bash -c 'exec 3<>/dev/tcp/ADDRESS/PORT'` exits with.
OUTCOMES = {0: "open", 1: "refused", 124: "dropped"}
# The ports HCCL takes from HCCL_IF_BASE_PORT on the lab's CANN (group_data/lab.py's profile): 32.
HCCL_PORT_SPAN = load_profile("lab").stack.hccl_port_span


@pytest.fixture(scope="module")
def fleet(lab: Lab) -> Lab:
    lab.pyinfra("deploys/full.py", timeout=3600)
    return lab


def connect(lab: Lab, node: str, to: str, port: int) -> str:
    """Whether `node` opens a TCP connection to `to` (a node's name or an address) on `port`."""
    target = "127.0.0.1" if to == node else lab.address(to) if to in lab.nodes else to
    result = lab.run(node, f"timeout 5 bash -c 'exec 3<>/dev/tcp/{target}/{port}'", check=False)
    return OUTCOMES.get(result.returncode, f"exit {result.returncode}: {result.stderr.strip()}")


def instance_env(lab: Lab, worker: str, instance: str = "vllm-0") -> dict[str, str]:
    """An instance's deployed environment file."""
    return dict(line.split("=", 1) for line in lab.run(worker, f"cat {instance_env_file(instance)}").stdout.split()
                if "=" in line)


def engine_ports(lab: Lab, worker: str) -> dict[str, int]:
    """The last port of vllm-0's VLLM_PORT range and of its HCCL range, from its deployed environment."""
    env = instance_env(lab, worker)
    return {"VLLM_PORT": int(env["VLLM_PORT"]) + VLLM_PORT_SPAN - 1,
            "HCCL": int(env["HCCL_IF_BASE_PORT"]) + HCCL_PORT_SPAN - 1}


def listeners_by_holders(lab: Lab, node: str, ports: range) -> dict[frozenset[str], set[int]]:
    """The ports of `ports` listened on, by the processes that hold each socket (a forked child shares its
    parent's)."""
    held: dict[frozenset[str], set[int]] = {}
    for line in lab.run(node, f"ss -ltnpH '( sport >= :{ports[0]} and sport <= :{ports[-1]} )'").stdout.splitlines():
        port = int(line.split()[3].rpartition(":")[2])
        held.setdefault(frozenset(re.findall(r"pid=(\d+)", line)), set()).add(port)
    return held


@contextmanager
def listening(lab: Lab, node: str, port: int):
    """A listener on every address of `node` on `port` while the block runs: the one there (the lab's
    simulated HCCL listens on its range), else one of ours."""
    if lab.run(node, f"ss -ltnH 'sport = :{port}'").stdout.strip():
        yield
        return
    pid = lab.run(node, f"setsid timeout 120 python3 -m http.server {port} --bind 0.0.0.0 </dev/null >/dev/null 2>&1 "
                        f"& echo $!; for i in $(seq 50); do ss -ltnH 'sport = :{port}' | grep -q . && exit 0; "
                        "sleep 0.1; done; exit 1").stdout.strip()
    try:
        yield
    finally:
        lab.run(node, f"kill {pid}")


def test_a_worker_reaches_neither_the_gateways_monitoring_nor_another_workers_exporter_or_engine_ports(fleet):
    lab = fleet
    for port in (PROMETHEUS_PORT, NGINX_EXPORTER_PORT):
        assert connect(lab, "gateway", "gateway", port) == "open", port  # it listens
        assert connect(lab, "worker1", "gateway", port) == "refused", port
        assert connect_from_here(lab.address("gateway"), port) == "open", port  # monitoring_allowed_sources
    assert connect(lab, "worker2", "worker2", NODE_EXPORTER_PORT) == "open"
    assert connect(lab, "worker1", "worker2", NODE_EXPORTER_PORT) == "refused"
    for name, port in engine_ports(lab, "worker2").items():
        with listening(lab, "worker2", port):
            assert connect(lab, "worker2", "worker2", port) == "open", name
            assert connect(lab, "worker1", "worker2", port) == "refused", name
            assert connect(lab, "gateway", "worker2", port) == "refused", name


def test_a_workers_own_connections_from_a_port_of_its_engine_ranges_get_their_answers(fleet):
    """The rules judge who opens a connection, not the answers to the node's own: the kernel may give an
    outgoing connection (apt, pip, a weights download) a local port of an engine range that nothing
    listens on (before the deploy reserves them, or one vLLM does not take), and the answer comes back
    to that port. The VLLM_PORT range has such ports; the lab's HCCL listens on its whole range."""
    lab = fleet
    mirror = LabState.require(lab.lab_dir).spec.mirror_url
    last = engine_ports(lab, "worker1")["VLLM_PORT"]
    free = lab.run("worker1", f"for p in $(seq {last} -1 {last - VLLM_PORT_SPAN + 1}); do ss -tanH \"sport = :$p\" "
                              "| grep -q . || { echo $p; exit 0; }; done; exit 1").stdout.strip()
    answer = lab.run("worker1", f"curl -s -o /dev/null -w '%{{http_code}}' --max-time 10 --local-port {free} "
                                f"{mirror}/simple/", check=False)
    assert answer.stdout == "200", (free, answer.returncode, answer.stdout, answer.stderr)


def test_the_monitoring_host_reaches_every_workers_node_exporter_and_the_rules_load_at_boot(fleet):
    lab = fleet
    for worker in lab.workers:
        assert connect(lab, "gateway", worker, NODE_EXPORTER_PORT) == "open", worker
    for node in lab.nodes:
        assert lab.run(node, f"systemctl is-enabled {FIREWALL_UNIT}").stdout.strip() == "enabled", node
        assert "ascend-fleet rules sha256:" in lab.run(node, "nft list table inet ascend_fleet").stdout, node


def test_a_worker_of_four_instances_gets_hccl_ranges_32_apart_and_each_binds_its_own(fleet):
    """Issue 47: at TP2 a worker's 8 NPUs are four instances. Their HCCL ranges, read from the node's env
    files, lie the lab CANN's span (32, as CANN 8.5's) apart and do not meet; each instance's simulated
    HCCL listens on its whole range (16 apart, as the product placed them before, the second one failed
    with EJ0003); the reserved ports hold every range of both colours; another worker is refused at the
    last port of the last range."""
    lab, worker = fleet, "worker3"
    instances = [f"vllm-{i}" for i in range(4)]
    try:
        lab.pyinfra("deploys/full.py", "--limit", worker, "--data", "tensor_parallel_size=2", *ALL_AT_ONCE)
        bases = [int(instance_env(lab, worker, name)["HCCL_IF_BASE_PORT"]) for name in instances]
        assert HCCL_PORT_SPAN == 32 and bases == [60000, 60032, 60064, 60096]
        ranges = [range(base, base + HCCL_PORT_SPAN) for base in bases]
        assert all(a[-1] < b[0] for a, b in zip(ranges, ranges[1:]))  # disjoint
        for name in instances:
            assert lab.run(worker, f"systemctl is-active {instance_unit(name)}").stdout.strip() == "active", name
        held = listeners_by_holders(lab, worker, range(ranges[0][0], ranges[-1][-1] + 1))
        assert sorted(map(sorted, held.values())) == [list(taken) for taken in ranges], held
        # Both colours' four slots of 32: 60000-60255.
        reserved = lab.run(worker, "sysctl -n net.ipv4.ip_local_reserved_ports").stdout.strip()
        assert "60000-60255" in reserved.split(","), reserved
        last = ranges[-1][-1]
        assert connect(lab, worker, worker, last) == "open"
        assert connect(lab, "worker1", worker, last) == "refused"
    finally:
        # Back to TP4 in place: vllm-0 takes NPUs 0-3 while the TP2 vllm-1 still holds 2-3, so the serve stage
        # stops vllm-1 first (before it did not, and vllm-0 failed: "NPU 2 ... is already in use").
        back = lab.pyinfra("deploys/full.py", "--limit", worker, *ALL_AT_ONCE)  # the lab's own data: two instances
    assert "Instance vllm-1 stopped until its turn: vllm-0 takes its NPUs" in back.stdout
    assert [int(instance_env(lab, worker, name)["HCCL_IF_BASE_PORT"]) for name in instances[:2]] == [60000, 60032]
    assert lab.run(worker, f"test -e {instance_env_file('vllm-2')}", check=False).returncode != 0


def test_sshd_allowed_sources_close_a_gateways_ssh_to_all_but_them_and_never_to_this_machine(fleet):
    lab = fleet
    here = LabState.require(lab.lab_dir).spec.host_address  # where this machine's connections come from
    refused = lab.pyinfra("--limit", "gateway", "--data", f"sshd_allowed_sources={json.dumps(['10.9.9.9'])}",
                          "deploys/firewall.py", check=False)
    assert refused.returncode != 0
    assert (f"gateway: sshd_allowed_sources: ['10.9.9.9'] leaves out {here}, the address this machine connects to "
            "the host from") in refused.stdout, refused.stdout[-3000:]
    assert connect(lab, "worker1", "gateway", 22) == "open"  # nothing changed
    try:
        lab.pyinfra("--limit", "gateway", "--data", f"sshd_allowed_sources={json.dumps([here])}",
                    "deploys/firewall.py")
        assert connect(lab, "worker1", "gateway", 22) == "refused"
        assert connect(lab, "gateway", "worker1", 22) == "open"  # a worker's SSH is as it was
        assert connect_from_here(lab.address("gateway"), 22) == "open"
    finally:
        lab.pyinfra("--limit", "gateway", "deploys/firewall.py")
    assert connect(lab, "worker1", "gateway", 22) == "open"
    again = lab.pyinfra("deploys/firewall.py").stdout
    assert totals(again)["changed"] == 0, again[-3000:]
