"""Addresses, ports and sources that clash, refused before any connection from the data alone (issue 49):
the virtual address against every host's addresses and its subnet's ends, one machine under two names,
every port a host takes across its roles, the firewall's sources typed and resolved, the gateways'
addresses resolved, revisions as one path segment, and `gateway = {}` taking the fleet's lease."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
import yaml

from ascend_fleet import PROFILES, PROJECT_ROOT
from ascend_fleet.config.fleetlease import lease_of_deploy
from ascend_fleet.config.hostdata import node_config
from ascend_fleet.config.profile import load_profile
from ascend_fleet.core.errors import FleetError
from ascend_fleet.fleet.check import fleet_problems
from ascend_fleet.fleet.plan import load_inventory
from tests.unit.test_fleet_check import BIN, edit, resolving, run  # noqa: F401 (resolving: a fixture)
from tests.unit.test_hostdata import WORKER

PROFILE = "vllm-ascend-0.18.0"  # the example fleets'
GATEWAY_DATA = {"profile": WORKER["profile"], "gateway": {}}
GATEWAYS_BY_ADDRESS = ('gateway = [("gw-01.example.internal", {**_ssh, "ssh_hostname": "10.20.0.11"}), '
                       '("gw-02.example.internal", {**_ssh, "ssh_hostname": "10.20.0.12"})]')


@pytest.fixture
def site(tmp_path, monkeypatch) -> Path:
    """The example fleets (inventories/prod.py, prod_397b.py and group_data/), to change one value at a time,
    run from where prod.py's model config and its profile's vendor checksums are, as a site keeps them."""
    (tmp_path / "inventories").mkdir()
    for name in ("prod.py", "prod.known_hosts", "prod_397b.py"):
        shutil.copy(PROJECT_ROOT / "inventories" / name, tmp_path / "inventories" / name)
    shutil.copytree(PROJECT_ROOT / "group_data", tmp_path / "group_data")
    models = tmp_path / "files/models/Eco-Tech/Qwen3.5-27B-w8a8-mtp/master"
    models.mkdir(parents=True)
    shutil.copy(PROJECT_ROOT / "tests/fixtures/models/qwen3.5-27b/config.json", models)
    profile = yaml.safe_load((PROFILES / f"{PROFILE}.yaml").read_text())
    profile["packages"]["files"] = {name: {"sha256": hashlib.sha256(name.encode()).hexdigest()}
                                    for name in load_profile(PROFILE).vendor_files("aarch64").values()}
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / f"{PROFILE}.yaml").write_text(yaml.safe_dump(profile))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def problems_of(site: Path, inventory: str = "prod.py", **data) -> list[str]:
    return fleet_problems(load_inventory(site / "inventories" / inventory, site, data or None))


def refusal(data: dict, host: str = "gw-01") -> str:
    with pytest.raises(FleetError) as caught:
        node_config(data, host)
    message = str(caught.value)
    assert "\n" not in message
    return message


# --- Addresses that clash ---


def test_a_virtual_address_that_is_a_workers_serving_address_is_refused(site):
    problems = problems_of(site, "prod_397b.py", gateway_vip={"address": "192.168.13.32/24", "interface": "eth0"})
    assert ("gw-01.example.internal: gateway_vip: 192.168.13.32 is npu-02.example.internal's serving_address; "
            "expected an address no host has, which keepalived moves between the gateways") in problems


@pytest.mark.parametrize(("address", "which"), [("10.20.0.0/24", "network address of 10.20.0.0/24"),
                                                ("10.20.0.255/24", "broadcast address of 10.20.0.0/24"),
                                                ("10.20.0.127/25", "broadcast address of 10.20.0.0/25")])
def test_a_virtual_address_that_is_its_subnets_network_or_broadcast_is_refused(address, which):
    message = refusal({**GATEWAY_DATA, "gateway_vip": {"address": address, "interface": "eth0"}})
    assert message.startswith(f"gw-01: gateway_vip.address: {address.split('/')[0]} is the {which}, which no host "
                              "may hold; pick an address inside it that no host has")


def test_a_slash_32_virtual_address_has_no_network_or_broadcast_to_refuse():
    config = node_config({**GATEWAY_DATA, "gateway_vip": {"address": "10.20.0.100/32", "interface": "eth0"}}, "gw-01")
    assert str(config.gateway_vip.address) == "10.20.0.100/32"


def test_one_machine_under_two_names_is_refused(site):
    edit(site / "inventories/prod.py", 'gateway = [("gw-01.example.internal", _ssh), '
                                       '("gw-02.example.internal", _ssh)]', GATEWAYS_BY_ADDRESS)
    edit(site / "inventories/prod.py", '"ssh_hostname": "10.20.0.12"', '"ssh_hostname": "10.20.0.11"')
    assert ("gw-02.example.internal: ssh_hostname: '10.20.0.11' (SSH port 22) is how gw-01.example.internal is "
            "reached too: one machine under two names would get two sets of instances on the same NPUs and ports; "
            "list it once") in problems_of(site)


def test_a_name_and_an_address_of_the_same_machine_on_other_ssh_ports_are_two_machines(site):
    edit(site / "inventories/prod.py", 'gateway = [("gw-01.example.internal", _ssh), '
                                       '("gw-02.example.internal", _ssh)]',
         'gateway = [("gw-01.example.internal", {**_ssh, "ssh_hostname": "10.20.0.11", "ssh_port": 2201}), '
         '("gw-02.example.internal", {**_ssh, "ssh_hostname": "10.20.0.11", "ssh_port": 2202})]')
    assert not [line for line in problems_of(site) if "is how" in line]


# --- Ports that clash on one host ---

CACHE_AWARE = {"routing": {"policy": "cache_aware"}}


@pytest.mark.parametrize(("data", "host", "expected"), [
    ({**GATEWAY_DATA, "gateway": {"listen_port": 9090}}, "gw-01",
     "gw-01: gateway.listen_port: 9090 is Prometheus's port (on every gateway); pick another"),
    ({**GATEWAY_DATA, "gateway": {"listen_port": 9113}}, "gw-01",
     "gw-01: gateway.listen_port: 9113 is the nginx exporter's port (on every gateway); pick another"),
    ({**GATEWAY_DATA, "gateway": {"listen_port": 8080}}, "gw-01",
     "gw-01: gateway.listen_port: 8080 is nginx's stub_status port (on every gateway's loopback); pick another"),
    ({**GATEWAY_DATA, "gateway": {"listen_port": 9100}}, "gw-01",
     "gw-01: gateway.listen_port: 9100 is node_exporter's port (on every worker and gateway); pick another"),
    ({**GATEWAY_DATA, "gateway": {"routing": {"policy": "cache_aware", "router_port": 80}}}, "gw-01",
     "gw-01: gateway.listen_port: 80 is also gateway.routing.router_port on this host; give each its own port"),
    ({**GATEWAY_DATA, "gateway": {"routing": {"policy": "cache_aware", "router_port": 29000}}}, "gw-01",
     "gw-01: gateway.routing.router_port: 29000 is vllm-router's metrics port (on the gateway's loopback with "
     "routing cache_aware); pick another"),
    ({**WORKER, "gateway": {"listen_port": 8090}}, "worker1",
     "worker1: model.peer_port: 8090 is also gateway.listen_port on this host; give each its own port"),
    # Green's instances start beside blue's for a swap: 8002 is green vllm-0's.
    ({**WORKER, "gateway": {"listen_port": 8002}}, "worker1",
     "worker1: gateway.listen_port: 8002 lies in instance vllm-0-green's port 8002; move gateway.listen_port or "
     "the instance's port"),
    ({**WORKER, "model": {**WORKER["model"], "peer_port": 9100}}, "worker1",
     "worker1: model.peer_port: 9100 is node_exporter's port (on every worker and gateway); pick another"),
    ({**WORKER, "instance_ports": {"api": 9099}}, "worker1",
     "worker1: instance_ports.api: instance vllm-1's port 9100 takes node_exporter's port 9100 (on every worker "
     "and gateway); move instance_ports.api"),
], ids=["listen=prometheus", "listen=nginx exporter", "listen=stub_status", "listen=node_exporter",
        "router=listen", "router=router metrics", "worker gateway: listen=peer", "listen=green instance",
        "peer=node_exporter", "instance=node_exporter"])
def test_two_services_of_one_host_on_one_port_are_refused_naming_both(data, host, expected):
    assert refusal(data, host) == expected


def test_vllm_routers_port_is_free_unless_the_gateway_runs_it():
    assert node_config({**GATEWAY_DATA, "gateway": {"routing": {"router_port": 80}}}, "gw-01").is_gateway


def test_the_site_mirrors_port_on_a_gateway_is_checked_against_its_other_ports(site):
    (site / "inventories/prod.py").write_text((site / "inventories/prod.py").read_text().replace(
        "check_before_connecting()", 'mirror = ["gw-01.example.internal"]\ncheck_before_connecting()'))
    assert ("gw-01.example.internal: gateway.listen_port: 80 is also site_mirror_port on this host; give each its "
            "own port") in problems_of(site, site_mirror_port=80)
    assert not [line for line in problems_of(site) if "site_mirror_port" in line]


def test_a_multi_node_heads_rpc_port_is_checked_against_the_exporter(site):
    edit(site / "group_data/q397_a.py", '"rpc_port": 13389', '"rpc_port": 9100')
    assert ("npu-01.example.internal: data_parallel.rpc_port: 9100 is node_exporter's port (on every worker and "
            "gateway); pick another") in problems_of(site, "prod_397b.py")


# --- Checked too late: the firewall's sources, the gateways' addresses, revisions ---


@pytest.mark.parametrize(("entry", "why"), [
    ("10.0.0.0/33", "'33' is not a valid netmask"),
    ("10.0.0.300", "Octet 300 (> 255) not permitted in '10.0.0.300'"),
    # The resolver would take it for 10.0.0.0.
    ("10.0.0", "Expected 4 octets in '10.0.0'"),
    ("fd00::/129", "'129' is not a valid netmask"),
])
@pytest.mark.usefixtures("resolving")
def test_a_mistyped_address_in_monitoring_allowed_sources_is_refused_as_one(site, entry, why):
    assert problems_of(site, monitoring_allowed_sources=["10.9.0.0/24", entry]) == [
        f"npu-01.example.internal, npu-02.example.internal, npu-03.example.internal and 4 more: firewall: "
        f"monitoring_allowed_sources entry {entry!r} is not an address or network ({why}); give e.g. 10.0.0.7, "
        "10.0.0.0/24 or fd00::/64"]


@pytest.mark.usefixtures("resolving")
def test_a_name_in_monitoring_allowed_sources_is_resolved_before_connecting(site):
    assert problems_of(site, monitoring_allowed_sources=["grafana.example.internal"]) == []
    problems = problems_of(site, monitoring_allowed_sources=["grafna.example.internal"])
    assert problems == [
        "npu-01.example.internal, npu-02.example.internal, npu-03.example.internal and 4 more: firewall: "
        "monitoring_allowed_sources entry 'grafna.example.internal' does not resolve on this machine ([Errno -2] "
        "Name or service not known); give an address, fix the name, or set instance_firewall: false"]
    assert problems_of(site, monitoring_allowed_sources=["grafna.example.internal"], instance_firewall=False) == []


@pytest.mark.parametrize(("address", "expected"), [
    ("10.20.0.12", []),
    ("gw-02.invalid", ["gw-02.example.internal: gateway_vip: gateway gw-02.example.internal's address 'gw-02.invalid' "
                       "does not resolve on this machine ([Errno -2] Name or service not known); give its IPv4 address "
                       "as ssh_hostname"]),
])
@pytest.mark.usefixtures("resolving")
def test_a_gateway_address_that_does_not_resolve_is_refused_before_connecting(site, address, expected):
    # pyinfra keeps an inventory file's code once read in a process: one version of the file a test.
    edit(site / "inventories/prod.py", 'gateway = [("gw-01.example.internal", _ssh), '
                                       '("gw-02.example.internal", _ssh)]',
         GATEWAYS_BY_ADDRESS.replace('"10.20.0.12"', repr(address).replace("'", '"')))
    assert problems_of(site) == expected


@pytest.mark.usefixtures("resolving")
def test_without_a_virtual_address_the_firewall_still_needs_every_gateways_and_workers_address(site):
    data = site / "group_data/prod.py"
    data.write_text(data.read_text().replace('gateway_vip = {"address": "10.20.0.100/24", "interface": "eth0"}', ""))
    edit(site / "inventories/prod.py", '("gw-02.example.internal", _ssh)',
         '("gw-02.example.internal", {**_ssh, "ssh_hostname": "gw-02.invalid"})')
    edit(site / "inventories/prod.py", 'for n in range(1, 6)]', 'for n in range(1, 7)]')
    edit(site / "inventories/prod.py", 'wave2 = ["npu-04.example.internal", "npu-05.example.internal"]',
         'wave2 = ["npu-04.example.internal", "npu-05.example.internal", "npu-06.example.internal"]')
    assert problems_of(site) == [
        "npu-06.example.internal: ssh_hostname: not given, and the host's name does not resolve on this machine "
        "([Errno -2] Name or service not known), and the instance firewall names the host by its address; give the "
        "address as ssh_hostname, fix the name, or set instance_firewall: false",
        "gw-02.example.internal: ssh_hostname: 'gw-02.invalid' does not resolve on this machine ([Errno -2] Name or "
        "service not known), and the instance firewall names the host by its address; give the address as "
        "ssh_hostname, fix the name, or set instance_firewall: false"]
    assert problems_of(site, instance_firewall=False) == []


@pytest.mark.parametrize(("model", "key"), [
    ({"revision": "refs/pr/1"}, "model.revision"), ({"revision": ".."}, "model.revision"),
    ({"revision": "."}, "model.revision"), ({"id": "../etc"}, "model.id"), ({"id": "Qwen/.."}, "model.id"),
])
def test_a_revision_or_model_id_that_is_not_one_directory_is_refused(model, key):
    message = refusal({**WORKER, "model": {**WORKER["model"], **model}}, "worker1")
    assert message.startswith(f"worker1: {key}: expected "), message
    assert repr(next(iter(model.values()))) in message


def test_the_check_stops_the_deploy_before_it_connects(site):
    edit(site / "group_data/gateway.py", '"listen_port": 80', '"listen_port": 9090')
    line = ("gw-01.example.internal, gw-02.example.internal: gateway.listen_port: 9090 is Prometheus's port (on "
            "every gateway); pick another")
    rc, output = run(site, str(BIN / "pyinfra"), "-y", "inventories/prod.py", str(PROJECT_ROOT / "deploys/full.py"))
    assert rc == 2 and f"--> pyinfra error: {line}" in output and "Connecting to hosts" not in output, output
    assert run(site, str(BIN / "ascend-fleet"), "check", "inventories/prod.py") == (2, f"error: {line}\n")


# --- Safety switched off by data ---


def test_an_empty_gateway_mapping_is_a_gateway_and_a_plain_deploy_takes_the_lease_on_it(site, lease_host):
    (site / "group_data/gateway.py").write_text("gateway = {}\n")
    inventory = load_inventory(site / "inventories/prod.py", site, {"fleet_state_dir": str(site / "state")})
    lease = lease_of_deploy(inventory, ("deploys/full.py",))
    assert lease is not None and lease_host.ran_on == ["gw-01.example.internal"]
    lease.release()
