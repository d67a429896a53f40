"""The NPUs' parameter plane on lab nodes: hccn_tool sets real addresses, pings really cross, a broken
NPU NIC breaks exactly its own traffic, and the device forgets what /etc/hccn.conf does not keep.

A lab of its own (2 workers of 4 NPUs, no NVMe; worker1's NPU 3 link down, worker2's NPU 2 TLS on),
with only the driver and firmware installed by hand: nothing is deployed.
"""

import shlex

import pytest

from ascend_fleet.lab.state import LabState
from tests.lab.conftest import TEST_LAB_DIR, TEST_NET, Lab, require_root
from tests.lab.test_sim_platform import HDK_FLAGS, PKGS, USER, Mirror, driver_file, fetch, firmware_file

pytestmark = pytest.mark.lab

TOOL = "/usr/local/Ascend/driver/tools/hccn_tool"
HARDWARE = """\
defaults: {npus: 4, nvme: null}
nodes:
  worker1: {npu_nic: {3: down}}
  worker2: {npu_tls: {2: 1}}
"""
# What the driver package checks for; stand-ins, as in test_sim_vendor_nspawn (no apt run).
TOOLS = "for t in lspci ifconfig; do printf '#!/bin/sh\\n' > /usr/local/bin/$t; chmod +x /usr/local/bin/$t; done"
HEADERS = "mkdir -p /lib/modules/$(uname -r)/build"


@pytest.fixture(scope="module")
def plane(tmp_path_factory):
    """The lab up, the newest published driver and a firmware it accepts installed on both workers, booted."""
    require_root()
    hardware = tmp_path_factory.mktemp("npu-network") / "hardware.yaml"
    hardware.write_text(HARDWARE)
    lab = Lab(TEST_LAB_DIR.with_name(f"{TEST_LAB_DIR.name}-plane"), f"p{TEST_NET}", f"10.213.{TEST_NET + 5}.0/24")
    lab.down()
    lab.up(2, "--hardware", str(hardware))
    try:
        for worker in lab.workers:
            arch = lab.run(worker, "uname -m").stdout.strip()
            mirror = Mirror(lab.mirror_url, arch)
            driver = mirror.newest_driver()
            lab.run(worker, f"mkdir -p {PKGS}")
            fetch(lab, worker, mirror, driver_file(driver, arch))
            lab.run(worker, f"{USER} && {TOOLS} && {HEADERS}")
            result = lab.run(worker, f"{PKGS}/{driver_file(driver, arch)} {HDK_FLAGS} --install-for-all", check=False)
            assert result.returncode in (0, 2), result.stdout + result.stderr
            fw_range = lab.run(worker, "sed -n 's/^compatible_version_fw=\\[\\(.*\\)\\]$/\\1/p' "
                                       "/usr/local/Ascend/driver/version.info").stdout.strip().split(",")
            firmware = mirror.firmware_in(*fw_range)
            fetch(lab, worker, mirror, firmware_file(firmware))
            result = lab.run(worker, f"{PKGS}/{firmware_file(firmware)} {HDK_FLAGS}", check=False)
            assert result.returncode in (0, 2), result.stdout + result.stderr
            lab.reboot(worker)
        yield lab
    finally:
        lab.down()


def plan(lab: Lab) -> dict[str, list[str]]:
    spec = LabState.require(lab.lab_dir).spec
    return {node.name: spec.npu_addresses(node) for node in spec.workers}


def hccn(lab: Lab, node: str, *args: str):
    return lab.run(node, f"{TOOL} {' '.join(shlex.quote(a) for a in args)}", check=False)


def address_npu(lab: Lab, node: str, npu: int, address: str) -> None:
    """The NPU's planned address set with hccn_tool (netmask, gateway and net-detect: the host's side)."""
    spec = LabState.require(lab.lab_dir).spec
    netmask, switch = str(spec.npu_network.netmask), spec.npu_host_address
    result = hccn(lab, node, "-i", str(npu), "-ip", "-s", "address", address, "netmask", netmask)
    assert (result.returncode, result.stdout) == (0, "Cmd executed successfully!\n"), result.stderr
    if npu != 3 or node != "worker1":  # a down port still takes its gateway and net-detect address
        assert hccn(lab, node, "-i", str(npu), "-gateway", "-s", "gateway", switch).returncode == 0
    assert hccn(lab, node, "-i", str(npu), "-netdetect", "-s", "address", switch).returncode == 0


@pytest.fixture(scope="module")
def addressed(plane):
    """Every NPU's planned address set with hccn_tool."""
    for node, addresses in plan(plane).items():
        for npu, address in enumerate(addresses):
            address_npu(plane, node, npu, address)
    return plane


def test_addresses_set_with_hccn_tool_are_the_nodes_real_addresses(addressed):
    addresses = plan(addressed)
    for node in ("worker1", "worker2"):
        for npu, address in enumerate(addresses[node]):
            inside = addressed.run(node, f"ip -4 -o addr show dev hccn{npu}").stdout
            assert f"inet {address}/24 " in inside
            shown = hccn(addressed, node, "-i", str(npu), "-ip", "-g")
            assert shown.stdout == f"ipaddr:{address}\nnetmask:255.255.255.0\n"
    conf = addressed.run("worker2", "cat /etc/hccn.conf").stdout
    assert f"address_0={addresses['worker2'][0]}\n" in conf and "netmask_3=255.255.255.0\n" in conf


def test_a_ping_crosses_from_one_workers_npu_to_anothers(addressed):
    peer = plan(addressed)["worker2"][2]
    result = hccn(addressed, "worker1", "-i", "2", "-ping", "-g", "address", peer)
    lines = result.stdout.splitlines()
    assert result.returncode == 0, result.stdout + result.stderr
    assert lines[0] == f"device 2 PING {peer}"
    assert all(line.startswith(f"recv seq={seq},time=") for seq, line in enumerate(lines[1:4]))
    assert lines[4] == "3 packets transmitted, 3 received, 0.00% packet loss"
    assert hccn(addressed, "worker1", "-i", "0", "-ping", "-g", "address", plan(addressed)["worker2"][3]).returncode == 0


def test_a_broken_nic_breaks_exactly_its_own_npus_traffic(addressed):
    addresses = plan(addressed)
    assert hccn(addressed, "worker1", "-i", "3", "-link", "-g").stdout == "link status: DOWN\n"
    assert hccn(addressed, "worker1", "-i", "2", "-link", "-g").stdout == "link status: UP\n"
    assert hccn(addressed, "worker1", "-i", "3", "-net_health", "-g").stdout == "net health status: Fault\n"
    assert hccn(addressed, "worker1", "-i", "2", "-net_health", "-g").stdout == "net health status: Success\n"
    out = hccn(addressed, "worker1", "-i", "3", "-ping", "-g", "address", addresses["worker2"][3])
    assert out.returncode == 1 and "recv time out seq=0" in out.stdout and out.stderr == "Command execute failed!\n"
    towards = hccn(addressed, "worker2", "-i", "2", "-ping", "-g", "address", addresses["worker1"][3])
    assert towards.returncode == 1 and "3 packets transmitted, 0 received, 100.00% packet loss" in towards.stdout
    assert hccn(addressed, "worker2", "-i", "2", "-ping", "-g", "address", addresses["worker1"][2]).returncode == 0
    assert hccn(addressed, "worker1", "-i", "2", "-ping", "-g", "address", addresses["worker2"][3]).returncode == 0


def test_a_tls_switch_left_on_shows_in_tls_g(addressed):
    on = hccn(addressed, "worker2", "-i", "2", "-tls", "-g").stdout
    assert on.startswith("dev_id:2, tls switch[1](0:disable, 1:enable)")
    assert "tls switch[0]" in hccn(addressed, "worker2", "-i", "1", "-tls", "-g").stdout


def test_after_a_reboot_the_npus_have_what_hccn_conf_keeps_and_nothing_else(addressed):
    addresses = plan(addressed)["worker2"]
    addressed.run("worker2", "sed -i '/_1=/d' /etc/hccn.conf")  # NPU 1's settings were never persisted
    try:
        addressed.reboot("worker2")
        kept = hccn(addressed, "worker2", "-i", "0", "-ip", "-g")
        assert kept.stdout == f"ipaddr:{addresses[0]}\nnetmask:255.255.255.0\n"
        forgotten = hccn(addressed, "worker2", "-i", "1", "-ip", "-g")
        assert (forgotten.returncode, forgotten.stderr) == (13, "Get ipconf failed, because no ip was preset there!\n")
        assert hccn(addressed, "worker1", "-i", "2", "-ping", "-g", "address", addresses[2]).returncode == 0
    finally:  # NPU 1 addressed again, as `addressed` left it: the module's other tests read every NPU
        address_npu(addressed, "worker2", 1, addresses[1])
