"""The instance firewall's rules: who may reach the instance ports and the weights peer port,
names resolved on the control machine, and the nftables file each worker gets."""

from __future__ import annotations

import ipaddress
import socket
from pathlib import Path

import pytest

from ascend_fleet import firewall
from ascend_fleet.errors import FleetError
from ascend_fleet.facts.firewall import NftTableComment
from ascend_fleet.fleet import load_inventory
from ascend_fleet.host_config import host_node_config

PROJECT = Path(__file__).resolve().parents[2]
# What the control machine's resolver says about the example fleet's names.
ADDRESSES = {"gw-01.example.internal": ["10.0.0.2"], "gw-02.example.internal": ["10.0.0.3", "fd00::3"],
             "prometheus.example.internal": ["10.9.0.7"],
             **{f"npu-0{n}.example.internal": [f"10.0.1.{n}"] for n in range(1, 6)}}


@pytest.fixture
def resolver(monkeypatch):
    def resolve(name):
        if name not in ADDRESSES:
            raise socket.gaierror(-2, "Name or service not known")
        return ADDRESSES[name]
    monkeypatch.setattr(firewall, "resolve", resolve)


def prod(monkeypatch, **data):
    monkeypatch.chdir(PROJECT)
    return load_inventory(PROJECT / "inventories" / "prod.py", override_data=data)


def worker_rules(inventory, name="npu-01.example.internal") -> firewall.FirewallRules:
    worker = inventory.get_host(name)
    config = host_node_config(worker)
    return firewall.firewall_rules(firewall.instance_ports(worker), firewall.instance_sources(config, inventory),
                                   config.model.peer_port, firewall.peer_sources(config, inventory))


def test_gateways_reach_both_colours_instance_ports_and_workers_the_peer_port(monkeypatch, resolver):
    rules = worker_rules(prod(monkeypatch)).text
    ports = ", ".join(map(str, range(8000, 8008)))  # four instances a host, blue 8000-8003 and green 8004-8007
    assert f"tcp dport {{ {ports} }} ip saddr @instance_sources_v4 accept" in rules
    assert f"tcp dport {{ {ports} }} reject with tcp reset" in rules
    sets = rules.split("set ")[1:]
    assert "elements = { 10.0.0.2/31 }" in sets[0]  # gw-01 and gw-02, merged
    assert "elements = { fd00::3/128 }" in sets[1]
    assert "elements = { 10.0.1.1/32, 10.0.1.2/31, 10.0.1.4/31 }" in sets[2]  # the five workers
    assert "elements" not in sets[3]
    assert "tcp dport 8090 ip saddr @peer_sources_v4 accept" in rules and "tcp dport 8090 reject" in rules
    assert 'iif "lo" accept' in rules
    # Only this table, and only those ports: nothing else on the node is matched.
    assert rules.count("table inet ascend_fleet") == 3 and "flush" not in rules and "dport 22" not in rules


def test_allowed_sources_add_addresses_networks_and_names(monkeypatch, resolver):
    inventory = prod(monkeypatch, instance_allowed_sources=["192.168.7.0/24", "prometheus.example.internal", "10.0.0.9"])
    rules = worker_rules(inventory).text
    assert "elements = { 10.0.0.2/31, 10.0.0.9/32, 10.9.0.7/32, 192.168.7.0/24 }" in rules


def test_the_loaded_tables_comment_follows_the_rules(monkeypatch, resolver):
    first = worker_rules(prod(monkeypatch))
    assert first == worker_rules(prod(monkeypatch))
    assert f'comment "{first.comment}"' in first.text and first.comment.startswith(firewall.COMMENT_PREFIX)
    widened = worker_rules(prod(monkeypatch, instance_allowed_sources=["10.9.0.7"]))
    assert widened.comment != first.comment


def test_a_name_that_does_not_resolve_is_one_line_naming_host_and_input(monkeypatch, resolver):
    inventory = prod(monkeypatch, instance_allowed_sources=["grafana.nowhere.internal"])
    with pytest.raises(FleetError) as error:
        worker_rules(inventory)
    message = str(error.value)
    assert message.startswith("npu-01.example.internal: instance firewall: instance_allowed_sources entry "
                              "'grafana.nowhere.internal' does not resolve") and "\n" not in message


def test_an_unresolvable_gateway_name_names_the_gateway(monkeypatch, resolver):
    monkeypatch.delitem(ADDRESSES, "gw-02.example.internal")
    with pytest.raises(FleetError, match=r"^npu-03.example.internal: instance firewall: gateway "
                                         r"gw-02.example.internal's address 'gw-02.example.internal' does not"):
        worker_rules(prod(monkeypatch), "npu-03.example.internal")


def test_nobody_allowed_is_refused_rather_than_closing_the_instances(monkeypatch, resolver):
    config = host_node_config(prod(monkeypatch).get_host("npu-01.example.internal"))
    with pytest.raises(FleetError, match="no gateway host and the data no instance_allowed_sources"):
        firewall.instance_sources(config, [])


def test_names_resolve_on_the_control_machine():
    assert "127.0.0.1" in firewall.resolve("localhost")


def test_addresses_and_networks_are_taken_as_written_without_a_lookup(monkeypatch):
    monkeypatch.setattr(firewall, "resolve", lambda name: pytest.fail(f"looked up {name}"))
    assert firewall.networks("10.1.2.3", "h", "x") == [ipaddress.ip_network("10.1.2.3/32")]
    assert firewall.networks("10.1.2.3/16", "h", "x") == [ipaddress.ip_network("10.1.0.0/16")]
    assert firewall.networks("fd00::1", "h", "x") == [ipaddress.ip_network("fd00::1/128")]


def test_on_by_default_and_off_by_data(monkeypatch):
    inventory = prod(monkeypatch)
    assert host_node_config(inventory.get_host("npu-01.example.internal")).instance_firewall is True
    off = prod(monkeypatch, instance_firewall=False)
    assert host_node_config(off.get_host("npu-01.example.internal")).instance_firewall is False


def test_the_fact_reads_the_loaded_tables_comment():
    fact = NftTableComment()
    assert fact.process(["loaded", "ascend-fleet rules sha256:ab"]) == "ascend-fleet rules sha256:ab"
    assert fact.process(["loaded"]) == ""
    assert fact.default() is None  # no output: the table is not loaded
