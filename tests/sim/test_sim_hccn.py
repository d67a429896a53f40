"""The simulated hccn_tool on a node root: output lines, error messages, exit codes, /etc/hccn.conf.

The NPU ports are stood in by FakeNet (addresses, carrier, ping replies in a dict); the lab test
tests/lab/test_sim_npu_network.py runs the same tool against real interfaces.
"""

import json
import subprocess
import sys

import pytest

from ascend_fleet.lab.sim import vendor
from ascend_fleet.lab.spec import LabSpec

sim = vendor.sim
installer = vendor.payload_module("ascend_sim_install")
hccn = vendor.payload_module("hccn_tool")

BOOT = "11111111-2222-3333-4444-555555555555"
SWITCH = "10.214.200.1"


class FakeNet:
    """Ports as a dict: address, carrier, admin state; peers: address -> reachable from which ports."""

    def __init__(self, ports, down=()):
        self.ports = {port: {"address": None, "carrier": port not in down, "admin": True} for port in ports}
        self.reachable = {SWITCH}
        self.gateways, self.pings = {}, []

    def address(self, port):
        return self.ports[port]["address"]

    def set_address(self, port, address, prefix, table):
        self.ports[port]["address"] = (address, prefix)

    def set_gateway(self, port, gateway, table):
        self.gateways[port] = gateway

    def carrier(self, port):
        return self.ports[port]["carrier"] and self.ports[port]["admin"]

    def set_admin(self, port, up):
        self.ports[port]["admin"] = up

    def ping(self, port, address, count, size):
        self.pings.append((port, address, count, size))
        if not self.carrier(port) or address not in self.reachable:
            return {}
        return {seq: 0.05 + seq / 100 for seq in range(count)}


@pytest.fixture
def node(tmp_path):
    """A node root with 4 NPUs on the plane (NPU 3's link down, NPU 2's TLS on) and the driver loaded."""
    root = tmp_path / "root"
    (root / "proc/sys/kernel/random").mkdir(parents=True)
    (root / "proc/sys/kernel/random/boot_id").write_text(BOOT + "\n")
    spec = LabSpec.build(2, None, subnet="10.213.200.0/24", name="t200")
    worker = spec.node("worker1")
    hardware = worker.hardware.model_copy(update={"npus": 4, "npu_nic": {3: "down"}, "npu_tls": {2: 1}})
    worker = worker.model_copy(update={"hardware": hardware})
    (root / "etc/ascend-lab").mkdir(parents=True)
    (root / "etc/ascend-lab/hardware.json").write_text(json.dumps(
        hardware.hardware_json(worker.name, worker.role, spec.npu_plane_json(worker))))
    node = sim.Node(root)
    installer.write_driver_files(node, {"version": "25.2.0", "fw_range": ("7.7.0", "7.7.99")},
                                 vendor.PAYLOAD_DIR, sim.DEFAULT_BASE, True, "an-earlier-boot")
    installer.write_firmware_files(node, "7.7.0.6.236", sim.DEFAULT_BASE)
    (root / "run/ascend-sim").mkdir(parents=True)
    (root / "run/ascend-sim/loaded.json").write_text(json.dumps({
        "boot_id": BOOT, "driver_version": "25.2.0", "fw_range": ["7.7.0", "7.7.99"],
        "firmware_version": "7.7.0.6.236"}))
    return node


@pytest.fixture
def net():
    return FakeNet([f"hccn{i}" for i in range(4)], down={"hccn3"})


def run(node, net, *argv):
    return hccn.execute(node, net, list(argv))


def test_installed_beside_npu_smi_in_the_drivers_tools_and_not_on_path(node):
    tool = node.path("/usr/local/Ascend/driver/tools/hccn_tool")
    assert tool.is_file() and tool.stat().st_mode & 0o111
    assert not node.path("/usr/local/sbin/hccn_tool").exists() and not node.path("/usr/local/bin/hccn_tool").exists()


def test_an_address_not_yet_set_is_the_real_error_and_exit_13(node, net):
    assert run(node, net, "-i", "0", "-ip", "-g") == (
        [], ["Get ipconf failed, because no ip was preset there!"], 13)


def test_setting_an_address_prints_success_reads_back_and_persists_in_hccn_conf(node, net):
    assert run(node, net, "-i", "1", "-ip", "-s", "address", "10.214.200.17", "netmask", "255.255.255.0") == (
        ["Cmd executed successfully!"], [], 0)
    assert net.address("hccn1") == ("10.214.200.17", 24)
    assert run(node, net, "-i", "1", "-ip", "-g") == (["ipaddr:10.214.200.17", "netmask:255.255.255.0"], [], 0)
    assert node.path("/etc/hccn.conf").read_text() == "address_1=10.214.200.17\nnetmask_1=255.255.255.0\n"


def test_an_address_another_npu_holds_conflicts(node, net):
    run(node, net, "-i", "0", "-ip", "-s", "address", "10.214.200.16", "netmask", "255.255.255.0")
    assert run(node, net, "-i", "1", "-ip", "-s", "address", "10.214.200.16", "netmask", "255.255.255.0") == (
        [], ["The ip address configured is conflicted!"], 7)


def test_gateway_and_netdetect_persist_and_read_back_in_the_real_forms(node, net):
    assert run(node, net, "-i", "0", "-gateway", "-g") == (
        [], ["Get gateway failed, because no gateway was preset there!"], 2)
    assert run(node, net, "-i", "0", "-gateway", "-s", "gateway", SWITCH) == (
        [], ["Unable to configure gateway, because ip is not configured!"], 26)
    run(node, net, "-i", "0", "-ip", "-s", "address", "10.214.200.16", "netmask", "255.255.255.0")
    assert run(node, net, "-i", "0", "-gateway", "-s", "gateway", "10.9.9.1")[1:] == (
        ["The segment of configured gateway doesn't match that of the configured ip adress!"], 8)
    assert run(node, net, "-i", "0", "-gateway", "-s", "gateway", SWITCH)[2] == 0
    assert run(node, net, "-i", "0", "-gateway", "-g") == ([f"default gateway:{SWITCH}, Iface:eth0"], [], 0)
    assert run(node, net, "-i", "0", "-netdetect", "-s", "address", SWITCH) == (["Cmd executed successfully!"], [], 0)
    assert run(node, net, "-i", "0", "-netdetect", "-g") == ([f"netdetect addr: {SWITCH}"], [], 0)
    conf = sim.read_key_values(node.path("/etc/hccn.conf"))
    assert conf == {"address_0": "10.214.200.16", "netmask_0": "255.255.255.0", "gateway_0": SWITCH,
                    "netdetect_0": SWITCH}


def test_link_net_health_and_lldp_follow_the_ports_carrier(node, net):
    assert run(node, net, "-i", "2", "-link", "-g") == (["link status: UP"], [], 0)
    assert run(node, net, "-i", "3", "-link", "-g") == (["link status: DOWN"], [], 0)
    assert run(node, net, "-i", "3", "-net_health", "-g") == (["net health status: Fault"], [], 0)
    assert run(node, net, "-i", "2", "-net_health", "-g") == (["net health status: Init"], [], 0)
    run(node, net, "-i", "2", "-ip", "-s", "address", "10.214.200.18", "netmask", "255.255.255.0")
    run(node, net, "-i", "2", "-netdetect", "-s", "address", SWITCH)
    assert run(node, net, "-i", "2", "-net_health", "-g") == (["net health status: Success"], [], 0)
    lldp, err, code = run(node, net, "-i", "2", "-lldp", "-g")
    assert code == 0 and "        Ifname: nt200-1-2" in lldp and f"        IPv4: {SWITCH}" in lldp
    assert lldp[0] == "Chassis ID TLV" and lldp[-1] == "End of LLDPDU TLV"
    assert run(node, net, "-i", "3", "-lldp", "-g") == ([], ["Command execute failed!"], 1)


def test_tls_switch_line_comes_from_the_hardware_file_and_enable_persists(node, net):
    line = "dev_id:{n}, tls switch[{s}](0:disable, 1:enable), tls preconfigured[0](0:non-preset, 1:preset), " \
           "tls alarm time threshold[60]days"
    assert run(node, net, "-i", "2", "-tls", "-g") == ([line.format(n=2, s=1)], [], 0)
    assert run(node, net, "-i", "1", "-tls", "-g") == ([line.format(n=1, s=0)], [], 0)
    assert run(node, net, "-i", "2", "-tls", "-s", "enable", "0") == (["Cmd executed successfully!"], [], 0)
    assert run(node, net, "-i", "2", "-tls", "-g")[0] == [line.format(n=2, s=0)]
    assert run(node, net, "-i", "2", "-tls", "-s", "enable", "5")[1:] == (["Get invalid enable value!"], 16)


def test_ping_prints_the_devices_lines_and_fails_on_a_lost_packet(node, net):
    run(node, net, "-i", "0", "-ip", "-s", "address", "10.214.200.16", "netmask", "255.255.255.0")
    assert run(node, net, "-i", "0", "-ping", "-g", "address", SWITCH) == ([
        f"device 0 PING {SWITCH}", "recv seq=0,time=0.050000ms", "recv seq=1,time=0.060000ms",
        "recv seq=2,time=0.070000ms", "3 packets transmitted, 3 received, 0.00% packet loss"], [], 0)
    assert net.pings[-1] == ("hccn0", SWITCH, 3, None)
    assert run(node, net, "-i", "0", "-ping", "-g", "address", "10.214.200.99") == ([
        "device 0 PING 10.214.200.99", "recv time out seq=0", "recv time out seq=1", "recv time out seq=2",
        "3 packets transmitted, 0 received, 100.00% packet loss"], ["Command execute failed!"], 1)


def test_ping_takes_only_the_real_parameters(node, net):
    out, err, code = run(node, net, "-i", "0", "-ping", "-g", "address", SWITCH, "cnt", "5")
    assert (err, code) == (["Get unknown option!"], 3)
    assert out[0] == "[ hccn_tool -i devid -ping ] needs the following parameters:"
    assert run(node, net, "-i", "0", "-ping", "-g")[1:] == (["The total count of input parameters is wrong!"], 4)


@pytest.mark.parametrize("argv, err, code", [
    (["-i", "9", "-ip", "-g"], ["Get invalid device id."], 4),
    (["-i", "x", "-ip", "-g"], ["Get invalid device id."], 4),
    (["-i", "0", "-bogus", "-g"], ["Get invalid major cmd.", "Enter [ hccn_tool -h ] for more details."], 3),
    (["-x", "0", "-ip", "-g"], ['Get invalid major cmd type. The valid major cmd type should be "-a" or "-i".',
                                "Enter [ hccn_tool -h ] for more details."], 1),
    (["-i", "0", "-ip", "-s", "address", "10.0.0.1"], ["The total count of input parameters is wrong!"], 4),
    (["-i", "0", "-ip", "-s", "address", "10.0.0.300", "netmask", "255.255.255.0"],
     ["The ip address you configured is invalid!"], 6),
    (["-i", "0", "-link", "-x"], ["Get unknown option!"], 3),
])
def test_errors_are_the_real_messages_and_exit_codes(node, net, argv, err, code):
    assert run(node, net, *argv)[1:] == (err, code)


def test_without_the_driver_loaded_no_device_id_resolves(node, net):
    (node.path(sim.RUN_DIR) / "loaded.json").unlink()
    assert run(node, net, "-i", "0", "-link", "-g") == ([], ["Get invalid device id."], 4)


def test_recovery_applies_hccn_conf_to_a_device_that_forgot_everything(node, net):
    run(node, net, "-i", "1", "-ip", "-s", "address", "10.214.200.17", "netmask", "255.255.255.0")
    run(node, net, "-i", "1", "-gateway", "-s", "gateway", SWITCH)
    run(node, net, "-i", "1", "-netdetect", "-s", "address", SWITCH)
    run(node, net, "-i", "2", "-tls", "-s", "enable", "0")
    # A reboot: the ports lose their addresses (the lab's supervisor), /run is emptied.
    forgotten = FakeNet([f"hccn{i}" for i in range(4)], down={"hccn3"})
    for state in node.path(hccn.DEVICE_STATE_DIR).iterdir():
        state.unlink()
    assert run(node, forgotten, "-i", "1", "-ip", "-g")[2] == 13
    assert run(node, forgotten, "-a", "-cfg", "recovery") == (["Cmd executed successfully!"], [], 0)
    assert run(node, forgotten, "-i", "1", "-ip", "-g")[0] == ["ipaddr:10.214.200.17", "netmask:255.255.255.0"]
    assert forgotten.gateways == {"hccn1": SWITCH}
    assert run(node, forgotten, "-i", "1", "-netdetect", "-g")[0] == [f"netdetect addr: {SWITCH}"]
    assert "tls switch[0]" in run(node, forgotten, "-i", "2", "-tls", "-g")[0][0]


def test_the_program_writes_stdout_stderr_and_its_exit_code(node):
    tool = node.path("/usr/local/Ascend/driver/tools/hccn_tool")
    script = (f"import sys, runpy; sys.argv = [{str(tool)!r}, '-i', '0', '-bogus', '-g'];"
              "import ascend_sim; ascend_sim.Node.__init__.__defaults__ = "
              f"({str(node.root)!r},); runpy.run_path({str(tool)!r}, run_name='__main__')")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            env={"PYTHONPATH": str(tool.parent)})
    assert (result.stdout, result.stderr, result.returncode) == (
        "", "Get invalid major cmd.\nEnter [ hccn_tool -h ] for more details.\n", 3)


# --- the plane's address plan and the hardware file's keys --------------------------------------------

def test_labs_side_by_side_get_planes_apart_and_each_npu_one_address():
    first = LabSpec.build(3, None, subnet="10.213.200.0/24", name="a")
    second = LabSpec.build(3, None, subnet="10.213.203.0/24", name="b")
    assert (str(first.npu_network), str(second.npu_network)) == ("10.214.200.0/24", "10.214.203.0/24")
    assert not first.npu_network.overlaps(second.npu_network) and first.npu_host_address == "10.214.200.1"
    everything = [a for node in first.workers for a in first.npu_addresses(node)]
    assert len(set(everything)) == 24 and everything[0] == "10.214.200.16" and everything[-1] == "10.214.200.39"


def test_a_plane_too_small_for_the_npus_is_one_line(tmp_path):
    with pytest.raises(Exception, match=r"^lab up: the NPU parameter plane 10.214.0.0/26 cannot hold 6 workers x 8 "
                                        r"NPUs \(it needs addresses up to 10.214.0.63\); give a larger plane$"):
        LabSpec.build(6, None, subnet="10.213.0.0/24", npu_subnet="10.214.0.0/26")


@pytest.mark.parametrize("key, value", [("npu_nic", "{9: down}"), ("npu_tls", "{8: 1}")])
def test_a_fault_on_an_npu_that_does_not_exist_is_one_line(tmp_path, key, value):
    hardware = tmp_path / "hardware.yaml"
    hardware.write_text(f"nodes:\n  worker1: {{{key}: {value}}}\n")
    with pytest.raises(Exception, match=rf"node worker1: {key} names NPU \d but the node has 8 NPUs \(0-7\)$"):
        LabSpec.build(1, hardware)
