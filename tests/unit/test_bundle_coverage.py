"""A bundle's OS packages against what a host's stages install there, judged at preflight from the manifest:
a bundle made for one gateway, given to a site with two, lacks keepalived (the users' site lab met it half way
through the deploy, at the virtual address stage: `E: Unable to locate package keepalived`)."""

from __future__ import annotations

import json

from ascend_fleet.config.hostdata import NodeConfig, node_config
from ascend_fleet.config.node_os import node_os
from ascend_fleet.core.bundle_layout import MANIFEST
from ascend_fleet.fleet.bundle import os_coverage_refusal
from ascend_fleet.fleet.os_repository import fleet_packages

DEBIAN = node_os("Debian", "12")


def bundle_for(tmp_path, packages):
    entry = {"distribution": "Debian", "release": "12", "arch": "x86_64", "repository": "os/debian-12-x86_64"}
    if packages is not None:
        entry["packages"] = packages
    (tmp_path / MANIFEST).write_text(json.dumps({"files": {}, "os": [entry]}))
    return tmp_path


def gateway(vip: str | None) -> NodeConfig:
    data = {"profile": "lab", "gateway": {"listen_port": 80}, "ssh_hostname": "10.0.0.2"}
    if vip:
        data["gateway_vip"] = {"address": vip, "interface": "eth0"}
    return node_config(data, "gateway2")


def one_gateways() -> list[str]:
    """The OS packages of a bundle made for a fleet of one gateway."""
    return fleet_packages(object(), DEBIAN, [gateway(None)], mirror_hosts=False)


def test_a_second_gateways_keepalived_missing_from_the_bundle_is_refused_in_one_line(tmp_path):
    out = bundle_for(tmp_path, one_gateways())
    needed = fleet_packages(object(), DEBIAN, [gateway("10.0.0.254/24")], mirror_hosts=False)
    assert os_coverage_refusal(out, DEBIAN, "x86_64", needed) == (
        f"bundle {out}'s Debian 12 x86_64 packages lack curl, keepalived, which this host's stages install (the bundle was "
        f"made for another shape of the fleet); make it again from this inventory with `ascend-fleet bundle INVENTORY "
        f"--out {out} --os 'Debian 12' --arch x86_64` where the archive answers")


def test_a_bundle_with_every_package_the_host_installs_passes(tmp_path):
    out = bundle_for(tmp_path, [*one_gateways(), "curl", "keepalived"])
    needed = fleet_packages(object(), DEBIAN, [gateway("10.0.0.254/24")], mirror_hosts=False)
    assert os_coverage_refusal(out, DEBIAN, "x86_64", needed) is None


def test_a_bundle_made_before_its_manifest_listed_packages_is_not_judged_on_them(tmp_path):
    out = bundle_for(tmp_path, None)
    assert os_coverage_refusal(out, DEBIAN, "x86_64", ["keepalived"]) is None
