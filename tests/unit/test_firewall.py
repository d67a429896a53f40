"""The firewall's rules: who may reach each worker's instance, engine, peer and exporter ports and each
gateway's Prometheus, exporters, VRRP and SSH, names resolved on the control machine, and the nftables
file each host gets; hostile values never reach it."""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from ascend_fleet.config.host_config import host_node_config
from ascend_fleet.core.errors import FleetError
from ascend_fleet.facts.firewall import NftTableComment
from ascend_fleet.fleet import firewall
from ascend_fleet.fleet.check import fleet_problems
from ascend_fleet.fleet.plan import load_inventory
from ascend_fleet.stages.monitoring import NGINX_EXPORTER_PORT, NODE_EXPORTER_PORT, PROMETHEUS_PORT

PROJECT = Path(__file__).resolve().parents[2]
# What the control machine's resolver says about the example fleets' names.
ADDRESSES = {"gw-01.example.internal": ["10.0.0.2"], "gw-02.example.internal": ["10.0.0.3", "fd00::3"],
             "prometheus.example.internal": ["10.9.0.7"],
             **{f"npu-0{n}.example.internal": [f"10.0.1.{n}"] for n in range(1, 6)}}
WORKER, GATEWAY, OTHER_GATEWAY = "npu-01.example.internal", "gw-01.example.internal", "gw-02.example.internal"
GATEWAY_PORTS = [NODE_EXPORTER_PORT, PROMETHEUS_PORT, NGINX_EXPORTER_PORT]  # as the stage gives a gateway's
HOSTILE = ["10.0.0.1; flush ruleset", "10.0.0.1 }", "fe80::1%eth0", "fe80::1%x; flush ruleset", "a\nb",
           "10.0.0.0/33", "$(reboot)", "x" * 300]


@pytest.fixture
def resolver(monkeypatch):
    def resolve(name):
        if name not in ADDRESSES:
            raise socket.gaierror(-2, "Name or service not known")
        return ADDRESSES[name]
    monkeypatch.setattr(firewall, "resolve", resolve)


def load(monkeypatch, inventory: str = "prod.py", **data):
    monkeypatch.chdir(PROJECT)
    return load_inventory(PROJECT / "inventories" / inventory, override_data=data)


def host_rules(inventory, name=WORKER) -> firewall.FirewallRules:
    member = inventory.get_host(name)
    monitored = [NODE_EXPORTER_PORT, *((PROMETHEUS_PORT, NGINX_EXPORTER_PORT)
                                       if host_node_config(member).is_gateway else ())]
    return firewall.firewall_rules(firewall.host_openings(member, inventory, monitored))


def chain(rules: firewall.FirewallRules) -> list[str]:
    """The input chain's rules, one a line (its comments left out)."""
    return [line.strip() for line in rules.text.split("chain input {")[1].splitlines()[2:]
            if line.strip() != "}" and not line.strip().startswith("#")]


def elements(rules: firewall.FirewallRules, name: str) -> str:
    """What a set holds ("" when empty)."""
    body = rules.text.split(f"set {name} {{")[1].split("\n\t}")[0]
    found = re.search(r"elements = \{ (.*) \}", body)
    return found[1] if found else ""


def test_gateways_reach_both_colours_instance_ports_and_workers_the_peer_port(monkeypatch, resolver):
    rules = host_rules(load(monkeypatch))
    # Four instances a host, blue 8000-8003 and green 8004-8007.
    assert "tcp dport { 8000-8007 } ip saddr @instances_v4 accept" in chain(rules)
    assert "tcp dport { 8000-8007 } reject with tcp reset" in chain(rules)
    assert elements(rules, "instances_v4") == "10.0.0.2/31"  # gw-01 and gw-02, merged
    assert elements(rules, "instances_v6") == "fd00::3/128"
    assert elements(rules, "peer_v4") == "10.0.1.1/32, 10.0.1.2/31, 10.0.1.4/31"  # the five workers
    assert elements(rules, "peer_v6") == ""
    assert "tcp dport { 8090 } ip saddr @peer_v4 accept" in chain(rules)
    assert "tcp dport { 8090 } reject with tcp reset" in chain(rules)
    # Loopback, then the answers to the node's own connections, before any opening is judged: an outgoing
    # connection may have a local port inside an engine range (test_firewalls.py shows one).
    assert chain(rules)[:2] == ['iif "lo" accept', "ct state established,related accept"]
    # Only this table, and only those ports: nothing else on the node is matched (SSH neither, by default).
    assert rules.text.count("table inet ascend_fleet") == 3 and "flush" not in rules.text
    assert not any(" 22 " in line or "dport { 22" in line for line in chain(rules))


def test_a_workers_node_exporter_answers_the_monitoring_hosts_only(monkeypatch, resolver):
    inventory = load(monkeypatch)
    assert [member.name for member in firewall.monitoring_hosts(inventory)] == [GATEWAY, OTHER_GATEWAY]
    rules = host_rules(inventory)
    assert f"tcp dport {{ {NODE_EXPORTER_PORT} }} ip saddr @monitoring_v4 accept" in chain(rules)
    assert f"tcp dport {{ {NODE_EXPORTER_PORT} }} reject with tcp reset" in chain(rules)
    assert elements(rules, "monitoring_v4") == "10.0.0.2/31" and elements(rules, "monitoring_v6") == "fd00::3/128"
    # Who monitors is said in one place: another answer there changes every host's rules.
    monkeypatch.setattr(firewall, "monitoring_hosts", lambda members: [inventory.get_host(OTHER_GATEWAY)])
    assert elements(host_rules(inventory), "monitoring_v4") == "10.0.0.3/32"
    assert elements(host_rules(inventory), "instances_v4") == "10.0.0.2/31"  # nginx runs on both gateways


def test_a_single_node_instances_engine_ports_answer_loopback_only(monkeypatch, resolver):
    rules = host_rules(load(monkeypatch))
    # vLLM's 16 from VLLM_PORT and HCCL's 32 from HCCL_IF_BASE_PORT (the profile's CANN 8.5.1), four
    # instances of each colour.
    assert "tcp dport { 51000-51127, 60000-60255 } ip saddr @engines_v4 accept" in chain(rules)
    assert "tcp dport { 51000-51127, 60000-60255 } reject with tcp reset" in chain(rules)
    assert elements(rules, "engines_v4") == elements(rules, "engines_v6") == ""


def test_a_multi_node_instances_engine_ports_answer_its_own_members_only(monkeypatch, resolver):
    inventory = load(monkeypatch, "prod_397b.py")
    head, member, other = (host_rules(inventory, f"npu-0{n}.example.internal") for n in (1, 2, 3))
    # Each member by its address and its serving_address (HCCL_IF_IP); not the other instance's hosts.
    assert elements(head, "engines_v4") == elements(member, "engines_v4") == (
        "10.0.1.1/32, 10.0.1.2/32, 192.168.13.31/32, 192.168.13.32/32")
    assert elements(other, "engines_v4") == "10.0.1.3/32, 10.0.1.4/32, 192.168.13.33/32, 192.168.13.34/32"
    # The head's DP RPC port (data_parallel.rpc_port) too; one instance a member, both colours' ports.
    assert "tcp dport { 13389, 51000-51031, 60000-60063 } reject with tcp reset" in chain(head)
    assert "tcp dport { 51000-51031, 60000-60063 } reject with tcp reset" in chain(member)


def test_a_gateways_prometheus_and_exporters_answer_the_monitoring_hosts_and_the_data_only(monkeypatch, resolver):
    rules = host_rules(load(monkeypatch, monitoring_allowed_sources=["192.168.7.0/24", "prometheus.example.internal"]),
                       GATEWAY)
    assert "tcp dport { 9090, 9100, 9113 } ip saddr @monitoring_v4 accept" in chain(rules)
    assert "tcp dport { 9090, 9100, 9113 } reject with tcp reset" in chain(rules)
    assert elements(rules, "monitoring_v4") == "10.0.0.2/31, 10.9.0.7/32, 192.168.7.0/24"
    # VRRP (keepalived's adverts) from the other gateway alone; dropped from anyone else.
    assert chain(rules)[-3:] == ["meta l4proto 112 ip saddr @vrrp_v4 accept",
                                 "meta l4proto 112 ip6 saddr @vrrp_v6 accept", "meta l4proto 112 drop"]
    assert elements(rules, "vrrp_v4") == "10.0.0.3/32" and elements(rules, "vrrp_v6") == "fd00::3/128"
    # No instance, engine or peer port on a gateway; the serving port (80, clients) and SSH are not matched.
    assert "instances_v4" not in rules.text and "peer_v4" not in rules.text
    assert not any(re.search(r"\b(80|22|8070)\b", line) for line in chain(rules))


def test_ssh_answers_the_named_networks_only_when_the_data_names_them(monkeypatch, resolver):
    inventory = load(monkeypatch, sshd_allowed_sources=["10.50.0.0/24"])
    for name in (WORKER, GATEWAY):
        rules = host_rules(inventory, name)
        assert chain(rules)[-3:] == [f"tcp dport {{ 22 }} {match}" for match in (
            "ip saddr @ssh_v4 accept", "ip6 saddr @ssh_v6 accept", "reject with tcp reset")]
        assert elements(rules, "ssh_v4") == "10.50.0.0/24"
    moved = load(monkeypatch, sshd_allowed_sources=["10.50.0.0/24"], ssh_port=2222)
    assert "tcp dport { 2222 } reject with tcp reset" in chain(host_rules(moved, GATEWAY))


@pytest.mark.parametrize("port", ["22; flush ruleset", 0, 70000, True, 22.5])
def test_a_hostile_ssh_port_is_one_line_naming_host_key_and_value(monkeypatch, resolver, port):
    inventory = load(monkeypatch, sshd_allowed_sources=["10.50.0.0/24"], ssh_port=port)
    with pytest.raises(FleetError) as error:
        host_rules(inventory, GATEWAY)
    assert str(error.value) == (f"{GATEWAY}: ssh_port: {port!r} is not a port; expected a whole number from 1 to "
                                "65535")


@pytest.mark.parametrize("key", ["instance_allowed_sources", "monitoring_allowed_sources", "sshd_allowed_sources"])
@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_sources_are_refused_in_one_line_before_any_rule_is_written(monkeypatch, resolver, key, value):
    inventory = load(monkeypatch, **{key: ["10.0.0.9", value]})
    with pytest.raises(FleetError) as error:
        host_rules(inventory)
    message = str(error.value)
    assert message.startswith(f"{WORKER}: firewall: {key} entry {value!r} ") and "\n" not in message, message


def test_allowed_sources_add_addresses_networks_and_names(monkeypatch, resolver):
    inventory = load(monkeypatch,
                     instance_allowed_sources=["192.168.7.0/24", "prometheus.example.internal", "10.0.0.9"])
    assert elements(host_rules(inventory), "instances_v4") == "10.0.0.2/31, 10.0.0.9/32, 10.9.0.7/32, 192.168.7.0/24"


def test_the_loaded_tables_comment_follows_the_rules(monkeypatch, resolver):
    first = host_rules(load(monkeypatch))
    assert first == host_rules(load(monkeypatch))
    assert f'comment "{first.comment}"' in first.text and first.comment.startswith(firewall.COMMENT_PREFIX)
    widened = host_rules(load(monkeypatch, instance_allowed_sources=["10.9.0.7"]))
    assert widened.comment != first.comment


def test_a_name_that_does_not_resolve_is_one_line_naming_host_and_input(monkeypatch, resolver):
    inventory = load(monkeypatch, instance_allowed_sources=["grafana.nowhere.internal"])
    with pytest.raises(FleetError) as error:
        host_rules(inventory)
    message = str(error.value)
    assert message.startswith(f"{WORKER}: firewall: instance_allowed_sources entry 'grafana.nowhere.internal' does "
                              "not resolve") and "\n" not in message


def test_an_unresolvable_gateway_name_names_the_gateway(monkeypatch, resolver):
    monkeypatch.delitem(ADDRESSES, OTHER_GATEWAY)
    with pytest.raises(FleetError, match=r"^npu-03.example.internal: firewall: gateway "
                                         r"gw-02.example.internal's address 'gw-02.example.internal' does not"):
        host_rules(load(monkeypatch), "npu-03.example.internal")


def test_nobody_allowed_is_refused_rather_than_closing_the_instances(monkeypatch, resolver):
    config = host_node_config(load(monkeypatch).get_host(WORKER))
    with pytest.raises(FleetError, match="no gateway host and the data no instance_allowed_sources"):
        firewall.instance_sources(config, [])


@pytest.mark.parametrize("opening", [
    lambda: firewall.Opening("ssh; flush", (22,), ()),
    lambda: firewall.Opening("ssh", ("22; flush ruleset",), ()),
    lambda: firewall.Opening("ssh", (True,), ()),
    lambda: firewall.Opening("ssh", (65536,), ()),
    lambda: firewall.Opening("vrrp", (), (), protocol=256),
    lambda: firewall.Opening("vrrp", (22,), (), protocol=112),
    lambda: firewall.Opening("none", (), ()),
    lambda: firewall.Opening("ssh", (22,), ("10.0.0.0/8",)),
    lambda: firewall.Opening("ssh", (22,), (ipaddress.ip_network("fe80::1%x; flush ruleset"),)),
], ids=["name", "port text", "bool", "port range", "protocol", "protocol with ports", "empty", "text source",
        "zone"])
def test_only_names_ints_and_networks_without_a_zone_reach_the_template(opening):
    with pytest.raises(ValueError):
        opening()


def test_ports_are_written_as_merged_runs():
    assert firewall.spans([8002, 8000, 8001, 8090, 8000]) == ["8000-8002", "8090"]


def test_names_resolve_on_the_control_machine():
    assert "127.0.0.1" in firewall.resolve("localhost")


def test_addresses_and_networks_are_taken_as_written_without_a_lookup(monkeypatch):
    monkeypatch.setattr(firewall, "resolve", lambda name: pytest.fail(f"looked up {name}"))
    assert firewall.networks("10.1.2.3", "h", "x") == [ipaddress.ip_network("10.1.2.3/32")]
    assert firewall.networks("10.1.2.3/16", "h", "x") == [ipaddress.ip_network("10.1.0.0/16")]
    assert firewall.networks("fd00::1", "h", "x") == [ipaddress.ip_network("fd00::1/128")]


def test_a_list_that_would_cut_this_machine_off_ssh_is_refused_before_connecting(monkeypatch, resolver):
    monkeypatch.setattr(firewall, "connects_from", lambda address: "10.50.0.9")
    assert list(firewall.ssh_lockout_problems(load(monkeypatch, sshd_allowed_sources=["10.50.0.0/24"]))) == []
    problems = list(firewall.ssh_lockout_problems(load(monkeypatch, sshd_allowed_sources=["10.60.0.1"])))
    assert problems[0] == (f"{WORKER}: sshd_allowed_sources: ['10.60.0.1'] leaves out 10.50.0.9, the address this "
                           "machine connects to the host from (its route to 10.0.1.1); add it, or the firewall stage "
                           "would cut this machine off the host's SSH")
    assert len(problems) == 7  # every worker and gateway
    # Through a bastion the node sees the bastion, not this machine: nothing to tell.
    assert list(firewall.ssh_lockout_problems(load(monkeypatch, sshd_allowed_sources=["10.60.0.1"],
                                                   ssh_config_file="site.ssh_config"))) == []
    assert list(firewall.ssh_lockout_problems(load(monkeypatch, sshd_allowed_sources=["10.60.0.1"],
                                                   instance_firewall=False))) == []


def test_every_deploys_check_before_connecting_names_it(monkeypatch, resolver):
    monkeypatch.setattr(firewall, "connects_from", lambda address: "10.50.0.9")
    problems = fleet_problems(load(monkeypatch, sshd_allowed_sources=["10.60.0.1"]))
    assert any(line.startswith(f"{GATEWAY}: sshd_allowed_sources: ['10.60.0.1'] leaves out 10.50.0.9")
               for line in problems), problems


def test_this_machines_source_address_is_its_routes():
    assert firewall.connects_from("127.0.0.1") == "127.0.0.1"
    assert firewall.connects_from("not an address") is None


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("nft"), reason="nft -c needs nft and root")
@pytest.mark.parametrize(("inventory", "name"), [("prod.py", WORKER), ("prod.py", GATEWAY),
                                                 ("prod_397b.py", "npu-01.example.internal")])
def test_nft_takes_the_rules_as_written(monkeypatch, resolver, tmp_path, inventory, name):
    rules = host_rules(load(monkeypatch, inventory, sshd_allowed_sources=["10.50.0.0/24", "fd00::/64"]), name)
    path = tmp_path / "rules.nft"
    path.write_text(rules.text)
    checked = subprocess.run(["nft", "-c", "-f", str(path)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr


def test_on_by_default_and_off_by_data(monkeypatch):
    inventory = load(monkeypatch)
    assert host_node_config(inventory.get_host(WORKER)).instance_firewall is True
    off = load(monkeypatch, instance_firewall=False)
    assert host_node_config(off.get_host(WORKER)).instance_firewall is False


def test_the_fact_reads_the_loaded_tables_comment():
    fact = NftTableComment()
    assert fact.process(["loaded", "ascend-fleet rules sha256:ab"]) == "ascend-fleet rules sha256:ab"
    assert fact.process(["loaded"]) == ""
    assert fact.default() is None  # no output: the table is not loaded
