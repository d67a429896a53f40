"""Instances bigger than a node (multi_node.py): which host is head and which rank, the `vllm serve`
options and environment each member gets (vllm-ascend's two-node guide for Qwen3.5-397B-A17B), and
the fleet-wide refusals, each one line naming host and key, before any host is touched."""

from __future__ import annotations

from pathlib import Path

import pytest

from ascend_fleet.core.errors import FleetError
from ascend_fleet.fleet.plan import fleet_node_configs, fleet_roles, load_inventory
from ascend_fleet.fleet.vllm_serve import check_vllm_args, vllm_args
from ascend_fleet.sizing.planner import reserved_ports

GROUP_DATA = """
profile = "vllm-ascend-0.18.0"
model = {"id": "Eco-Tech/Qwen3.5-397B-A17B-w8a8-mtp", "revision": "r1", "source": "hf", "served_model_name": "qwen3.5"}
tensor_parallel_size = 8
serving = {"max_model_len": 32768, "gpu_memory_utilization": 0.9, "enable_expert_parallel": True,
           "quantization": "ascend", "quantization_scheme": "w8a8"}
rollout_waves = ["canary"]
"""
VLLM = "0.18.0"  # the vLLM of GROUP_DATA's profile
PAIR = '{"group": "pair_a", "rpc_port": 13389, "api_server_count": 2, "nic": "enp67s0f0"}'


def member(n: int, **more) -> dict:
    return {"chip": "910B3", "npu_count": 8, "nvme_mount": "/mnt/nvme", "serving_address": f"192.168.13.{30 + n}",
            "npu_addresses": [f"10.20.0.{10 * n + npu}" for npu in range(8)], "npu_netmask": "255.255.255.0", **more}


def fleet(tmp_path: Path, hosts: dict[str, dict], groups: str, data: str = GROUP_DATA, pair: str = PAIR):
    (tmp_path / "group_data").mkdir()
    (tmp_path / "group_data" / "all.py").write_text(data)
    (tmp_path / "group_data" / "pair_a.py").write_text(f"data_parallel = {pair}\n")
    (tmp_path / "fleet.py").write_text(f"workers = {list(hosts.items())!r}\ncanary = {list(hosts)!r}\n{groups}")
    return load_inventory(tmp_path / "fleet.py", tmp_path)


def test_the_first_host_of_the_group_is_the_head_and_the_next_runs_headless_from_rank_1(tmp_path):
    inventory = fleet(tmp_path, {"npu-01": member(1), "npu-02": member(2)}, "pair_a = ['npu-01', 'npu-02']\n")
    configs = {config.host: config for config in fleet_node_configs(inventory)}
    roles = fleet_roles(inventory)
    head, other = roles["npu-01"], roles["npu-02"]
    assert (head.is_head, other.is_head, other.start_rank, head.size) == (True, False, 1, 2)
    # One instance per member over all 8 NPUs, TP8 (the guide's layout).
    instance = configs["npu-02"].instances[0]
    assert (instance.name, instance.npus) == ("vllm-0", list(range(8)))
    head_args = vllm_args(configs["npu-01"], configs["npu-01"].instances[0], "/m", VLLM, head)
    member_args = vllm_args(configs["npu-02"], instance, "/m", VLLM, other)
    assert " ".join(head_args).count("--data-parallel-size 2 --data-parallel-size-local 1 --data-parallel-address "
                                     "192.168.13.31 --data-parallel-rpc-port 13389 --api-server-count 2") == 1
    assert "--headless --data-parallel-size 2 --data-parallel-size-local 1 --data-parallel-address 192.168.13.31 " \
           "--data-parallel-rpc-port 13389 --data-parallel-start-rank 1" in " ".join(member_args)
    assert "--tensor-parallel-size 8" in " ".join(member_args)
    # Every option exists in the pinned vLLM's own table.
    assert check_vllm_args(head_args, "0.18.0") == check_vllm_args(member_args, "0.18.0") == []
    # Each member reaches the others on its own address and NIC (the guide's exports).
    env = configs["npu-02"].instance_env(instance)
    assert {k: env[k] for k in ("HCCL_IF_IP", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "HCCL_SOCKET_IFNAME")} == {
        "HCCL_IF_IP": "192.168.13.32", "GLOO_SOCKET_IFNAME": "enp67s0f0", "TP_SOCKET_IFNAME": "enp67s0f0",
        "HCCL_SOCKET_IFNAME": "enp67s0f0"}


@pytest.mark.parametrize("hosts, groups, pair, expected", [
    ({"npu-01": member(1), "npu-02": member(2)}, "pair_a = ['npu-01', 'npu-02']\n",
     '{"group": "pair_a", "rpc_port": 8000, "nic": "eth0"}',
     "npu-01: the DP RPC port 8000 of multi-node instance pair_a (head npu-01) clashes with instance vllm-0's port "
     "8000; move data_parallel.rpc_port or instance vllm-0's port"),
    ({"npu-01": member(1), "npu-02": member(2)}, "pair_a = ['npu-01', 'npu-02']\n",
     '{"group": "pair_a", "rpc_port": 51003, "nic": "eth0"}',
     "npu-01: the DP RPC port 51003 of multi-node instance pair_a (head npu-01) clashes with instance vllm-0's "
     "VLLM_PORT 51000-51015; move data_parallel.rpc_port or instance vllm-0's vllm_port"),
    ({"npu-01": member(1), "npu-02": member(2, tensor_parallel_size=4)}, "pair_a = ['npu-01', 'npu-02']\n", PAIR,
     "npu-02: tensor_parallel_size differs from that of npu-01, the head of data_parallel group pair_a"),
    ({"npu-01": member(1)}, "pair_a = ['npu-01']\n", PAIR,
     "npu-01: data_parallel.group: pair_a holds only this host; a multi-node instance needs two or more"),
    ({"npu-01": member(1), "npu-02": {**member(2), "npu_addresses": []}}, "pair_a = ['npu-01', 'npu-02']\n", PAIR,
     "npu-02: npu_netmask: set without npu_addresses"),
    ({"npu-01": member(1), "npu-02": {**member(2), "serving_address": None}}, "pair_a = ['npu-01', 'npu-02']\n", PAIR,
     "npu-02: serving_address: missing; a multi-node instance's member needs its address"),
], ids=["rpc port on the api port", "rpc port in vllm range", "members differ", "one host", "member without npu network",
        "member without address"])
def test_a_multi_node_instance_that_cannot_work_is_refused_in_one_line(tmp_path, hosts, groups, pair, expected):
    with pytest.raises(FleetError) as caught:
        fleet_node_configs(fleet(tmp_path, hosts, groups, pair=pair))
    assert str(caught.value).startswith(expected) and "\n" not in str(caught.value)


def test_the_head_reserves_its_rpc_port_and_its_instances_ranges_not_29500(tmp_path):
    """vLLM 0.18.0 takes the DP master ports upward from VLLM_PORT (get_open_ports_list), so the head's
    instance range holds them; 29500, the dataclass default, is neither reserved nor refused (an
    instance may take it)."""
    hosts = {"npu-01": member(1, instance_ports={"api": 29500}), "npu-02": member(2)}
    inventory = fleet(tmp_path, hosts, "pair_a = ['npu-01', 'npu-02']\n")
    configs = {config.host: config for config in fleet_node_configs(inventory)}
    head = fleet_roles(inventory)["npu-01"]
    reserved = reserved_ports(configs["npu-01"].instance_records(), head.head_ports())
    assert reserved == "13389,29500,51000-51015,60000-60031"


def test_each_member_names_its_own_serving_nic_and_preflight_holds_it_to_serving_address(tmp_path):
    """The guide exports the NIC per node: host data serving_nic comes before the group's
    data_parallel.nic, and preflight finds a name that is not there or does not carry the address."""
    from pyinfra.facts.hardware import Ipv4Addrs, NetworkDevices

    from ascend_fleet.stages.checks import serving_nic_problem
    from tests.fakehost import FakeHost, on

    hosts = {"npu-01": member(1), "npu-02": member(2, serving_nic="ens1f0")}
    pair = '{"group": "pair_a", "rpc_port": 13389}'
    (tmp_path / "none").mkdir()
    (tmp_path / "own").mkdir()
    with pytest.raises(FleetError, match=r"^npu-01: serving_nic: missing; name the NIC that carries serving_address"):
        fleet_node_configs(fleet(tmp_path / "none", hosts, "pair_a = ['npu-01', 'npu-02']\n", pair=pair))
    inventory = fleet(tmp_path / "own", hosts, "pair_a = ['npu-01', 'npu-02']\n", pair=PAIR)
    configs = {config.host: config for config in fleet_node_configs(inventory)}
    env = {host: config.instance_env(config.instances[0]) for host, config in configs.items()}
    assert (env["npu-01"]["GLOO_SOCKET_IFNAME"], env["npu-02"]["HCCL_SOCKET_IFNAME"]) == ("enp67s0f0", "ens1f0")

    def problem(config, devices: dict[str, list[str]]) -> str | None:
        with on(FakeHost({NetworkDevices: dict.fromkeys(devices, {}), Ipv4Addrs: devices}, name=config.host)):
            return serving_nic_problem(config)
    two = configs["npu-02"]
    assert problem(two, {"lo": ["127.0.0.1"], "ens1f0": ["192.168.13.32"]}) is None
    assert problem(two, {"lo": ["127.0.0.1"], "eth0": ["192.168.13.32"]}) == (
        "serving_nic ens1f0: no such NIC here (it has eth0, lo); name the one that carries serving_address "
        "192.168.13.32")
    assert problem(configs["npu-01"], {"enp67s0f0": ["10.0.0.5"]}) == (
        "data_parallel.nic enp67s0f0 does not carry serving_address 192.168.13.31 (it has 10.0.0.5); set "
        "serving_nic to the NIC that does, or correct serving_address")


def test_a_multi_node_instance_on_a_vllm_that_never_picks_its_dp_master_ports_is_refused(tmp_path):
    """vLLM 0.13.0's get_open_ports_list never returns with VLLM_PORT set (its option data says so)."""
    from ascend_fleet import PROJECT_ROOT
    from ascend_fleet.fleet.plan import check_fleet
    data = GROUP_DATA.replace("vllm-ascend-0.18.0", "vllm-ascend-0.13.0").replace(
        '"Eco-Tech/Qwen3.5-397B-A17B-w8a8-mtp"', '"Qwen/Qwen2.5-72B-Instruct"').replace(
        ', "enable_expert_parallel": True,\n           "quantization": "ascend", "quantization_scheme": "w8a8"', "")
    inventory = fleet(tmp_path, {"npu-01": member(1), "npu-02": member(2)}, "pair_a = ['npu-01', 'npu-02']\n", data)
    with pytest.raises(FleetError) as caught:
        check_fleet(inventory, PROJECT_ROOT / "tests" / "fixtures" / "models" / "qwen2.5-72b-instruct")
    assert str(caught.value) == (
        "npu-01 instance vllm-0: vLLM 0.13.0 never starts a multi-node instance with VLLM_PORT set (it picks its DP "
        "master ports from VLLM_PORT in a loop that never ends); serve data_parallel on a profile whose vLLM picks "
        "them upward from VLLM_PORT (vllm-ascend-0.18.0's)")


def test_a_member_without_the_npu_network_the_instance_needs_is_refused(tmp_path):
    hosts = {"npu-01": member(1), "npu-02": {k: v for k, v in member(2).items() if not k.startswith("npu_a")
                                             and k != "npu_netmask"}}
    with pytest.raises(FleetError, match=r"^npu-01: npu_peer_group pair_a: npu-02 has no npu_addresses; plan its NPU "
                                         r"network too \(the hosts of a multi-node instance reach each other over it\)"):
        fleet_node_configs(fleet(tmp_path, hosts, "pair_a = ['npu-01', 'npu-02']\n"))


def two_pairs(tmp_path: Path, monkeypatch):
    """Four workers serving two two-node instances (pair_a: npu-01 head, npu-02; pair_b: npu-03 head,
    npu-04), a gateway, waves canary (npu-01, npu-02) then wave1 (npu-03, npu-04)."""
    from ascend_fleet.control.rollout import RolloutInventory
    (tmp_path / "group_data").mkdir()
    (tmp_path / "group_data" / "all.py").write_text(GROUP_DATA.replace('["canary"]', '["canary", "wave1"]'))
    for pair in ("pair_a", "pair_b"):
        (tmp_path / "group_data" / f"{pair}.py").write_text(PAIR.join(("data_parallel = ", "\n")).replace("pair_a", pair))
    (tmp_path / "group_data" / "gateway.py").write_text("gateway = {}\n")
    hosts = {f"npu-0{n}": member(n) for n in range(1, 5)}
    (tmp_path / "fleet.py").write_text(
        f"workers = {list(hosts.items())!r}\ngateway = [('gw', {{}})]\ncanary = ['npu-01', 'npu-02']\n"
        "wave1 = ['npu-03', 'npu-04']\npair_a = ['npu-01', 'npu-02']\npair_b = ['npu-03', 'npu-04']\n")
    monkeypatch.chdir(tmp_path)
    return RolloutInventory(tmp_path / "fleet.py", {"fleet_state_dir": str(tmp_path / "state")})


def test_a_rollout_moves_a_multi_node_instance_as_one_unit_counting_it_once(tmp_path, monkeypatch):
    from ascend_fleet.control.rollout import plan_rollout
    fleet = two_pairs(tmp_path, monkeypatch)
    # The gateway reaches each instance through its head only.
    assert [b.key for b in fleet.all_backends()] == ["npu-01/vllm-0", "npu-03/vllm-0"]
    record = plan_rollout(fleet, "deploys/full.py", None, max_unavailable=1)
    # One step per instance, each with all its hosts, never both instances at once.
    assert [(step.hosts, step.instances) for step in record.steps] == [
        (["npu-01", "npu-02"], ["npu-01/vllm-0"]), (["npu-03", "npu-04"], ["npu-03/vllm-0"])]
    # --limit on a member rolls its whole instance.
    limited = plan_rollout(fleet, "deploys/full.py", None, max_unavailable=1, limit=["npu-04"])
    assert [step.hosts for step in limited.steps] == [["npu-03", "npu-04"]]


def test_a_blue_green_swap_of_a_multi_node_instance_is_refused_in_one_line(tmp_path, monkeypatch):
    from ascend_fleet.control.rollout import blue_green_problem
    fleet = two_pairs(tmp_path, monkeypatch)
    assert blue_green_problem(fleet, {}) == (
        "npu-01: its multi-node instance (pair_a) has no second colour to start beside it; swap the model without "
        "--blue-green (one instance at a time)")


def test_the_example_397b_fleet_plans_two_instances_of_two_nodes_that_fit_where_one_node_is_tight(monkeypatch):
    """inventories/prod_397b.py: vllm-ascend's two-node recipe for Qwen3.5-397B-A17B W8A8 (MTP) on 8 x 910B3
    nodes, planned once per instance at its head; the same instance on one node is what the planner
    calls tight (its weights leave the KV cache 8% of the budget)."""
    from ascend_fleet import PROJECT_ROOT
    from ascend_fleet.fleet.plan import check_fleet
    from ascend_fleet.sizing.planner import TIGHT, chip_by_name, plan_instance
    monkeypatch.chdir(PROJECT_ROOT)
    config_dir = PROJECT_ROOT / "tests" / "fixtures" / "models" / "qwen3.5-397b-a17b"
    plan = check_fleet(load_inventory(PROJECT_ROOT / "inventories" / "prod_397b.py", PROJECT_ROOT), config_dir)
    assert [(r.host, r.members, r.verdict, r.plan.dp, r.plan.tp) for r in plan.instances] == [
        ("npu-01.example.internal", ("npu-01.example.internal", "npu-02.example.internal"), "fits", 2, 8),
        ("npu-03.example.internal", ("npu-03.example.internal", "npu-04.example.internal"), "fits", 2, 8)]
    two_nodes = plan.instances[0].plan
    assert round(two_nodes.weight_bytes_per_npu / 2**30, 1) == 24.8 and two_nodes.kv_cache_tokens == 1_904_515
    one_node = plan_instance(shape_of(config_dir), chip_by_name("910B3"), tp=8, dp=1, ep=True, mtp=True,
                             max_model_len=32768, gpu_memory_utilization=0.9, dtype="bfloat16", quantization="w8a8")
    assert one_node.verdict == TIGHT and round(one_node.weight_bytes_per_npu / 2**30, 1) == 47.6


def shape_of(config_dir: Path):
    from ascend_fleet.fleet.plan import model_shape, read_model_config
    return model_shape(read_model_config(config_dir / "config.json"), None)
