"""The NPU network stage at command level: what the hccn_tool facts read from its answers, what the
operation sets for a node's state, and the one line a host that fails a check stops with. The facts'
shell runs for real under sh against a stand-in hccn_tool that answers in hccn_tool's own lines."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ascend_fleet.config.hostdata import node_config
from ascend_fleet.facts.hccn import HCCN_TOOL, NpuNicConfig, NpuNicHealth, NpuPings
from ascend_fleet.operations import hccn
from ascend_fleet.stages.npu_network import npu_network_problem
from tests.fakehost import FakeHost, commands, on

ADDRESSES = [f"10.20.0.{11 + npu}" for npu in range(2)]
WORKER = {"profile": "lab", "chip": "910B3", "npu_count": 2, "nvme_mount": "/mnt/nvme", "tensor_parallel_size": 2,
          "model": {"id": "lab/Qwen3-Tiny", "revision": "v1", "source": "http", "url": "http://mirror"},
          "serving": {"max_model_len": 2048, "gpu_memory_utilization": 0.9},
          "npu_addresses": ADDRESSES, "npu_netmask": "255.255.255.0", "npu_gateway": "10.20.0.254"}
# The stand-in answers each -g in hccn_tool's own lines (docs/sim-fidelity.md) as a configured, healthy
# NIC does; NPU 1's link is down and its netdetect address never set. -netdetect -g answers in both forms
# that exist: `netdetect addr:` (Huawei's source) and `netdetect address:` (real A2 transcripts).
STAND_IN = r"""#!/bin/sh
npu=$2
case "$3 $4" in
"-ip -g") echo "ipaddr:10.20.0.1$((npu + 1))"; echo "netmask:255.255.255.0";;
"-gateway -g") echo "default gateway:10.20.0.254, Iface:eth$npu";;
"-netdetect -g") [ "$npu" = 1 ] && echo "netdetect addr: 0.0.0.0" || echo "netdetect address: 10.20.0.254";;
"-link -g") [ "$npu" = 1 ] && echo "link status: DOWN" || echo "link status: UP";;
"-net_health -g") [ "$npu" = 1 ] && echo "net health status: Fault" || echo "net health status: Success";;
"-lldp -g") echo "Chassis ID TLV"; echo "Ifname: 100GE1/0/$npu";;
"-tls -g") echo "dev_id:$npu, tls switch[0](0:disable, 1:enable), tls preconfigured[1]";;
"-ping -g") echo "3 packets transmitted, 3 received, 0.00% packet loss";;
esac
"""


def run_fact(fact, tmp_path: Path, **arguments) -> list[str]:
    """The fact's command, run by sh with the stand-in at hccn_tool's path; its output lines."""
    tool = tmp_path / "hccn_tool"
    tool.write_text(STAND_IN)
    tool.chmod(0o755)
    script = str(fact().command(**arguments)).replace(HCCN_TOOL, str(tool)).replace("/etc/hccn.conf",
                                                                                     str(tmp_path / "hccn.conf"))
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True).stdout.splitlines()


def test_the_nic_config_fact_reads_address_gateway_netdetect_and_the_persisted_file(tmp_path):
    (tmp_path / "hccn.conf").write_text("address_0=10.20.0.11\nnetmask_0=255.255.255.0\ngateway_0=10.20.0.254\n")
    read = NpuNicConfig().process(run_fact(NpuNicConfig, tmp_path, npu_count=2))
    assert read[0] == {"address": "10.20.0.11", "netmask": "255.255.255.0", "gateway": "10.20.0.254",
                       "netdetect": "10.20.0.254",
                       "persisted": {"address": "10.20.0.11", "netmask": "255.255.255.0", "gateway": "10.20.0.254"}}
    # A netdetect address never set reads 0.0.0.0.
    assert (read[1]["address"], read[1]["netdetect"], read[1]["persisted"]) == ("10.20.0.12", None, {})


def test_an_npu_without_an_address_reads_as_none():
    lines = ["--- npu 0", "[ip]", "Get ipconf failed, because no ip was preset there!",
             "[gateway]", "Get gateway failed, because no gateway was preset there!", "[netdetect]", "--- npu conf"]
    assert NpuNicConfig().process(lines) == {0: {"address": None, "netmask": None, "gateway": None,
                                                 "netdetect": None, "persisted": {}}}


def test_the_health_fact_reads_link_net_health_neighbour_and_tls(tmp_path):
    health = NpuNicHealth().process(run_fact(NpuNicHealth, tmp_path, npu_count=2))
    assert {k: health[0][k] for k in ("link", "net_health", "neighbour", "tls")} == {
        "link": "UP", "net_health": "Success", "neighbour": "100GE1/0/0", "tls": 0}
    assert (health[1]["link"], health[1]["net_health"]) == ("DOWN", "Fault")
    assert health[1]["said"]["link"] == "link status: DOWN"


def test_the_ping_fact_pings_every_target_at_once_and_reads_each_summary(tmp_path):
    targets = [(0, "10.20.0.21"), (1, "10.20.0.22")]
    pings = NpuPings().process(run_fact(NpuPings, tmp_path, targets=targets))
    assert set(pings) == set(targets)
    assert pings[(1, "10.20.0.22")]["received"] == 3
    assert NpuPings().process(["--- npu 0 10.20.0.21", "connect: Network is unreachable"])[(0, "10.20.0.21")] == {
        "sent": None, "received": None, "said": "connect: Network is unreachable"}


def nic(address: str, persisted: bool = True) -> dict:
    set_ = {"address": address, "netmask": "255.255.255.0", "gateway": "10.20.0.254", "netdetect": "10.20.0.254"}
    return {**set_, "persisted": set_ if persisted else {}}


def test_a_node_whose_nics_are_as_planned_gets_no_command():
    fake = FakeHost({NpuNicConfig: {0: nic("10.20.0.11"), 1: nic("10.20.0.12")}})
    assert commands(hccn.npu_nics, fake, nics=node_config(WORKER, "worker1").npu_nic_settings()) == []
    assert fake.noops == ["the 2 NPU NICs have their addresses, gateways and netdetect addresses"]


def test_a_fresh_node_gets_every_setting_address_first_and_a_drifted_one_only_what_differs():
    settings = node_config(WORKER, "worker1").npu_nic_settings()
    fresh = commands(hccn.npu_nics, FakeHost({NpuNicConfig: {}}), nics=settings)
    assert fresh[:3] == [f"{HCCN_TOOL} -i 0 -ip -s address 10.20.0.11 netmask 255.255.255.0",
                         f"{HCCN_TOOL} -i 0 -gateway -s gateway 10.20.0.254",
                         f"{HCCN_TOOL} -i 0 -netdetect -s address 10.20.0.254"]
    assert len(fresh) == 6
    # NPU 1's address is live but not kept in /etc/hccn.conf: set again, so it survives a reboot.
    drifted = {0: {**nic("10.20.0.11"), "gateway": None}, 1: nic("10.20.0.12", persisted=False)}
    assert commands(hccn.npu_nics, FakeHost({NpuNicConfig: drifted}), nics=settings) == [
        f"{HCCN_TOOL} -i 0 -gateway -s gateway 10.20.0.254",
        f"{HCCN_TOOL} -i 1 -ip -s address 10.20.0.12 netmask 255.255.255.0",
        f"{HCCN_TOOL} -i 1 -gateway -s gateway 10.20.0.254",
        f"{HCCN_TOOL} -i 1 -netdetect -s address 10.20.0.254"]


def test_a_host_with_a_nic_down_stops_with_one_line_naming_npu_and_check(tmp_path, monkeypatch):
    monkeypatch.setattr("ascend_fleet.stages.npu_network.SETTLE_SECONDS", 0)
    config = node_config(WORKER, "worker1")
    fake = FakeHost({NpuNicConfig: NpuNicConfig().process(run_fact(NpuNicConfig, tmp_path, npu_count=2)),
                     NpuNicHealth: NpuNicHealth().process(run_fact(NpuNicHealth, tmp_path, npu_count=2))})
    with on(fake):
        problem = npu_network_problem(config)
    assert problem == ("NPU network: NPU 1: link DOWN (-link -g: link status: DOWN); check its optical module, "
                       "cable and switch port")


@pytest.mark.parametrize("health, expected", [
    ({"net_health": "Fault"}, "NPU 0: net health Fault (-net_health -g: net health status: Fault); its netdetect "
                              "address 10.20.0.254 does not answer"),
    ({"tls": 1}, "NPU 0: TLS switch 1, the fleet's is 0 (npu_tls); `hccn_tool -i 0 -tls -s enable 0`"),
    ({"neighbour": None}, "NPU 0: no LLDP neighbour"),
], ids=["net health", "tls", "lldp"])
def test_each_check_names_its_npu(health, expected, monkeypatch):
    monkeypatch.setattr("ascend_fleet.stages.npu_network.SETTLE_SECONDS", 0)
    good = {"link": "UP", "net_health": "Success", "neighbour": "x", "tls": 0,
            "said": {"net_health": "net health status: Fault"}}
    fake = FakeHost({NpuNicConfig: {0: nic("10.20.0.11"), 1: nic("10.20.0.12")},
                     NpuNicHealth: {0: {**good, **health}, 1: good}})
    with on(fake):
        assert npu_network_problem(node_config(WORKER, "worker1")).startswith(f"NPU network: {expected}")


def test_a_host_whose_nics_pass_every_check_and_has_no_peers_passes_without_pinging(monkeypatch):
    """No npu_peer_group and no multi-node instance: nothing to ping (the fake has no NpuPings answer,
    so asking would fail the test); the lab found the gate crashing here on pyinfra's empty fact."""
    healthy = {"link": "UP", "net_health": "Success", "neighbour": "x", "tls": 0, "said": {}}
    fake = FakeHost({NpuNicConfig: {0: nic("10.20.0.11"), 1: nic("10.20.0.12")}, NpuNicHealth: {0: healthy, 1: healthy}})
    with on(fake):
        assert npu_network_problem(node_config(WORKER, "worker1")) is None
    assert NpuPings().default() == {}  # what pyinfra gives for a command that printed nothing
