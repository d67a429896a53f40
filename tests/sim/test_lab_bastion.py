"""A bastion lab's layout, inventory and host firewall, read without bringing it up (tests/lab/test_bastion.py
runs one)."""

from __future__ import annotations

import runpy
from pathlib import Path

from ascend_fleet.lab.inventory import lab_groups
from ascend_fleet.lab.network import firewall_rules
from ascend_fleet.lab.spec import GATEWAY_SERVING_PORT, LabSpec
from ascend_fleet.lab.state import LabState

PROJECT = Path(__file__).resolve().parents[2]


def hosts_of(spec: LabSpec) -> dict[str, dict]:
    LabState(spec.lab_dir, spec.model_dump(mode="json"), []).save()
    return {entry[0]: entry[1] for members in lab_groups(spec.lab_dir).values() for entry in members
            if isinstance(entry, tuple)}


def test_a_bastion_labs_hosts_are_reached_through_its_ssh_config_by_their_addresses(tmp_path):
    spec = LabSpec.build(2, lab_dir=tmp_path, bastion=True)
    hosts = hosts_of(spec)
    assert sorted(hosts) == ["gateway", "worker1", "worker2"]  # the bastion is no fleet host
    for name, data in hosts.items():
        assert data["ssh_config_file"] == str(tmp_path / "ssh" / "config")
        assert data["ssh_hostname"] == spec.node(name).address
    assert spec.node("bastion").address == "10.213.0.3"


def test_only_a_bastion_lab_keeps_this_machine_off_its_nodes(tmp_path):
    plain = LabSpec.build(1, lab_dir=tmp_path)
    assert "ssh_config_file" not in hosts_of(plain)["worker1"]
    assert "hook output" not in firewall_rules(plain)
    rules = firewall_rules(LabSpec.build(1, lab_dir=tmp_path / "b", bastion=True))
    assert "ip daddr 10.213.0.3 tcp dport 22 accept" in rules
    assert "ip daddr 10.213.0.2 tcp dport 80 accept" in rules


def test_the_port_left_open_is_the_gateway_groups_serving_port():
    assert runpy.run_path(str(PROJECT / "group_data" / "gateway.py"))["gateway"]["listen_port"] == GATEWAY_SERVING_PORT
