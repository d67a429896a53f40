"""The gateways' virtual address: keepalived's config (checked by keepalived itself), the data the
gateways must agree on, where clients and rollouts are sent, and what status says of the holder."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from ascend_fleet import PROJECT_ROOT
from ascend_fleet.config.host_config import host_node_config
from ascend_fleet.config.hostdata import NodeConfig, node_config
from ascend_fleet.config.node_os import node_os, role_gaps
from ascend_fleet.control.bench import bench_target
from ascend_fleet.control.status import HostStatus, judge_gateways
from ascend_fleet.core.errors import FleetError
from ascend_fleet.core.remote import HostFacts
from ascend_fleet.fleet import virtual_address
from ascend_fleet.fleet.check import fleet_problems
from ascend_fleet.fleet.plan import load_inventory
from ascend_fleet.fleet.virtual_address import client_url, keepalived_config

GATEWAYS = ('gateway = [("gw-01.example.internal", {**_ssh, "ssh_hostname": "10.20.0.11"}), '
            '("gw-02.example.internal", {**_ssh, "ssh_hostname": "10.20.0.12"})]')


@pytest.fixture
def site(tmp_path) -> Path:
    """The example fleet (its group_data gives the gateways a virtual address), its gateways by address."""
    (tmp_path / "inventories").mkdir()
    for name in ("prod.py", "prod.known_hosts"):
        shutil.copy(PROJECT_ROOT / "inventories" / name, tmp_path / "inventories" / name)
    shutil.copytree(PROJECT_ROOT / "group_data", tmp_path / "group_data")
    edit(tmp_path / "inventories/prod.py", 'gateway = [("gw-01.example.internal", _ssh), '
                                           '("gw-02.example.internal", _ssh)]', GATEWAYS)
    return tmp_path


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{path} no longer holds {old!r}"
    path.write_text(text.replace(old, new, 1))


def inventory_of(site: Path):
    return load_inventory(site / "inventories/prod.py", site)


def test_each_gateway_sends_vrrp_to_the_others_starts_as_backup_and_never_takes_the_address_back(site):
    inventory = inventory_of(site)
    config = keepalived_config(host_node_config(inventory.get_host("gw-01.example.internal")), inventory)
    instance = config.split("vrrp_instance", 1)[1]
    for line in ("state BACKUP", "nopreempt", "version 3", "interface eth0", "virtual_router_id 51",
                 "advert_int 0.5", "unicast_src_ip 10.20.0.11", "10.20.0.100/24 dev eth0"):
        assert f"    {line}\n" in instance or f"        {line}\n" in instance, line
    peers = instance.split("unicast_peer {", 1)[1].split("}", 1)[0].split()
    assert peers == ["10.20.0.12"]
    assert "http://127.0.0.1:80/" in config and "ascend_fleet_nginx" in instance
    other = keepalived_config(host_node_config(inventory.get_host("gw-02.example.internal")), inventory)
    assert "unicast_src_ip 10.20.0.12" in other and other.split("unicast_peer {", 1)[1].split()[0] == "10.20.0.11"


@pytest.mark.skipif(shutil.which("keepalived") is None, reason="keepalived is installed by scripts/setup --test")
def test_keepalived_accepts_the_config(site, tmp_path):
    inventory = inventory_of(site)
    path = tmp_path / "keepalived.conf"
    path.write_text(keepalived_config(host_node_config(inventory.get_host("gw-01.example.internal")), inventory))
    checked = subprocess.run(["keepalived", "-t", "-f", str(path)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # It does refuse what it does not know: the check is worth running.
    path.write_text(path.read_text().replace("    version 3\n", "    vrrp_version 3\n"))
    refused = subprocess.run(["keepalived", "-t", "-f", str(path)], capture_output=True, text=True)
    assert refused.returncode != 0 and "Unknown keyword 'vrrp_version'" in refused.stdout + refused.stderr


def test_a_gateway_named_by_a_name_that_does_not_resolve_is_refused_in_one_line(site):
    edit(site / "inventories/prod.py", '"ssh_hostname": "10.20.0.12"', '"ssh_hostname": "gw-02.invalid"')
    inventory = inventory_of(site)
    with pytest.raises(FleetError) as caught:
        keepalived_config(host_node_config(inventory.get_host("gw-01.example.internal")), inventory)
    message = str(caught.value)
    assert "\n" not in message and message.startswith("gw-01.example.internal: gateway_vip: gateway "
                                                      "gw-02.example.internal's address 'gw-02.invalid'")


def test_gateways_that_disagree_on_the_address_are_refused_before_any_connection(site):
    edit(site / "inventories/prod.py", '{**_ssh, "ssh_hostname": "10.20.0.12"}',
         '{**_ssh, "ssh_hostname": "10.20.0.12", "gateway_vip": {"address": "10.20.0.101/24", "interface": "eth0"}}')
    assert fleet_problems(inventory_of(site)) == [
        "gw-02.example.internal: gateway_vip: 10.20.0.101/24 on eth0 (router 51) but gw-01.example.internal has "
        "10.20.0.100/24 on eth0 (router 51); expected the same on every gateway (set it once, in the gateway "
        "group's data)"]


def test_an_address_a_host_already_has_is_refused(site):
    edit(site / "group_data/prod.py", '"address": "10.20.0.100/24"', '"address": "10.20.0.12/24"')
    assert fleet_problems(inventory_of(site)) == [
        "gw-01.example.internal: gateway_vip: 10.20.0.12 is host gw-02.example.internal's own address; expected an "
        "address no host has, which keepalived moves between the gateways"]


@pytest.mark.parametrize(("value", "expected"), [
    ({"address": "10.20.0.100/24", "interface": "eth0; reboot"}, "gateway_vip.interface: String should match"),
    ({"address": "10.20.0.100/24\nx", "interface": "eth0"}, "gateway_vip.address"),
    ({"address": "10.20.0.100/24", "interface": "eth0", "advert_seconds": 0.333}, "hundredths of a second"),
    ({"address": "10.20.0.100/24", "interface": "eth0", "router_id": 256}, "gateway_vip.router_id"),
    # VRRP version 3 has no authentication (virtual_address.py): a key for it is unknown, not silently dropped.
    ({"address": "10.20.0.100/24", "interface": "eth0", "auth_pass": "x"}, "gateway_vip.auth_pass: unknown key"),
])
def test_hostile_or_mistyped_virtual_address_data_is_refused(value, expected):
    with pytest.raises(FleetError) as caught:
        node_config({"profile": "vllm-ascend-0.18.0", "gateway": {}, "gateway_vip": value}, "gw")
    assert expected in str(caught.value).splitlines()[0], str(caught.value)


def test_a_release_without_a_known_keepalived_cannot_hold_the_address():
    debian = node_os("Debian", "12")
    assert role_gaps(debian, worker=False, gateway=True, virtual_address=True) == []
    unknown = replace(debian, virtual_address_packages=None)  # as openEuler's is: no source gave it
    assert role_gaps(unknown, worker=False, gateway=True) == []
    assert role_gaps(unknown, worker=False, gateway=True, virtual_address=True) == ["virtual_address_packages"]
    assert node_os("openEuler", "24.03").virtual_address_packages is None


def test_clients_go_to_the_virtual_address_when_there_is_one(site):
    inventory = inventory_of(site)
    config = host_node_config(inventory.get_host("gw-01.example.internal"))
    assert client_url(config, "10.20.0.11") == "http://10.20.0.100:80"
    plain = NodeConfig(host="gw", profile="vllm-ascend-0.18.0", gateway={})
    assert client_url(plain, "10.20.0.11") == "http://10.20.0.11:80"


def gateway_status(host: str, holds: bool | None, down: bool = False, error: str | None = None) -> HostStatus:
    return HostStatus(host, "gateway", "p", error=error, holds_vip=holds,
                      routes=None if error else [{"key": "w1/vllm-0", "drained": down}])


def test_status_names_a_split_or_a_missing_holder_and_gateways_that_route_differently(site):
    vip = host_node_config(inventory_of(site).get_host("gw-01.example.internal")).gateway_vip
    one = [gateway_status("gw-01", True), gateway_status("gw-02", False)]
    judge_gateways(one, vip)
    assert [g.problems for g in one] == [[], []]
    both = [gateway_status("gw-01", True), gateway_status("gw-02", True)]
    judge_gateways(both, vip)
    assert both[0].problems == both[1].problems == [
        "gw-01 and gw-02 both hold the virtual address 10.20.0.100: they do not hear each other's VRRP (firewall, "
        "router id, interface)"]
    # The holder powered off: the other, read, does not hold it.
    none = [gateway_status("gw-01", None, error="unreachable"), gateway_status("gw-02", False)]
    judge_gateways(none, vip)
    assert none[0].problems == [] and "no gateway read holds the virtual address 10.20.0.100" in none[1].problems[0]
    drained = [gateway_status("gw-01", True), gateway_status("gw-02", False, down=True)]
    judge_gateways(drained, None)
    assert drained[1].problems == ["routes differ from gw-01's (w1/vllm-0 drained here, routed there); rerun "
                                   "deploys/gateway.py on every gateway"]


def test_bench_goes_through_the_virtual_address_and_names_the_gateway_that_holds_it(site, monkeypatch):
    inventory = inventory_of(site)
    held = {"gw-01.example.internal": False, "gw-02.example.internal": True}
    monkeypatch.setattr(virtual_address, "read_fleet_facts", lambda hosts: {
        name: HostFacts(name, {"holds": held[name]}) for name in hosts})
    target = bench_target(site / "inventories/prod.py", inventory, None)
    assert (target.gateway, target.base_url) == ("gw-02.example.internal (virtual address)", "http://10.20.0.100:80")
    # One gateway asked for: that one, by its own address.
    target = bench_target(site / "inventories/prod.py", inventory, "gw-01.example.internal")
    assert (target.gateway, target.base_url) == ("gw-01.example.internal", "http://10.20.0.11:80")
