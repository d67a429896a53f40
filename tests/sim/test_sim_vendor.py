"""The simulated vendor packages: names, determinism, SHA256SUMS, layout, flags, versions, npu-smi output."""

import gzip
import hashlib
import io
import json
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from ascend_fleet.config.profile import available_profiles, load_profile
from ascend_fleet.lab.sim import vendor
from ascend_fleet.lab.sim.vendor import VendorVersions, publish_vendor_packages

sim = vendor.sim
installer = vendor.payload_module("ascend_sim_install")
npu_smi = vendor.payload_module("npu_smi")

OLD = VendorVersions("24.1.0", ("7.5.0", "7.5.99"), "7.5.0.3.220", "8.3.RC2", "8.3.RC2")
NEW = VendorVersions("25.2.0", ("7.7.0", "7.7.99"), "7.7.0.6.236", "8.5.0", "8.5.0")


def run_file_parts(path: Path) -> tuple[str, bytes]:
    """(shell header, payload) of a .run file, split where the header says."""
    data = path.read_bytes()
    header_lines = int(next(line for line in data.decode(errors="replace").splitlines()
                            if line.startswith("header_lines=")).split("=")[1])
    offset = sum(len(line) for line in data.splitlines(keepends=True)[:header_lines])
    return data[:offset].decode(), data[offset:]


def payload_members(path: Path) -> dict[str, bytes]:
    _, payload = run_file_parts(path)
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(payload))) as tar:
        return {member.name: tar.extractfile(member).read() for member in tar.getmembers()}


# --- names and files --------------------------------------------------------------------

def test_cann_8_3_stack_has_the_real_file_names(tmp_path):
    paths = publish_vendor_packages([OLD], "aarch64", tmp_path)
    assert sorted(p.name for p in paths) == [
        "Ascend-cann-kernels-910b_8.3.RC2_linux-aarch64.run",
        "Ascend-cann-nnal_8.3.RC2_linux-aarch64.run",
        "Ascend-cann-toolkit_8.3.RC2_linux-aarch64.run",
        "Ascend-hdk-910b-npu-driver_24.1.0_linux-aarch64.run",
        "Ascend-hdk-910b-npu-firmware_7.5.0.3.220.run",
    ]


def test_cann_8_5_renames_kernels_to_ops(tmp_path):
    names = {p.name for p in publish_vendor_packages([NEW], "x86_64", tmp_path)}
    assert "Ascend-cann-910b-ops_8.5.0_linux-x86_64.run" in names
    assert not any("kernels" in name for name in names)


def test_unknown_arch_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown arch 'arm64'"):
        publish_vendor_packages([OLD], "arm64", tmp_path)


def test_one_driver_version_with_two_firmware_ranges_is_refused(tmp_path):
    clash = VendorVersions("24.1.0", ("7.0.0", "7.9.99"), "7.5.0.3.220", "8.3.RC2", "8.3.RC2")
    with pytest.raises(ValueError, match="asked for twice"):
        publish_vendor_packages([OLD, clash], "x86_64", tmp_path)


def test_stacks_sharing_packages_publish_each_file_once(tmp_path):
    same_hdk = VendorVersions("24.1.0", ("7.5.0", "7.5.99"), "7.5.0.3.220", "8.2.RC1", "8.2.RC1")
    paths = publish_vendor_packages([OLD, same_hdk], "x86_64", tmp_path)
    assert len(paths) == 8  # one driver and one firmware, two of each CANN package


def test_output_is_byte_for_byte_deterministic(tmp_path):
    first = publish_vendor_packages([OLD, NEW], "x86_64", tmp_path / "a")
    second = publish_vendor_packages([OLD, NEW], "x86_64", tmp_path / "b")
    for a, b in zip(first, second):
        assert a.read_bytes() == b.read_bytes(), a.name
    assert (tmp_path / "a" / "SHA256SUMS").read_text() == (tmp_path / "b" / "SHA256SUMS").read_text()


def test_sha256sums_lists_every_package_for_sha256sum_check(tmp_path):
    paths = publish_vendor_packages([OLD, NEW], "x86_64", tmp_path)
    lines = (tmp_path / "SHA256SUMS").read_text().splitlines()
    assert lines == [f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.name}"
                     for p in sorted(paths, key=lambda p: p.name)]
    subprocess.run(["sha256sum", "--check", "--quiet", "SHA256SUMS"], cwd=tmp_path, check=True)



def test_one_firmware_file_serves_every_architecture(tmp_path):
    x86 = publish_vendor_packages([NEW], "x86_64", tmp_path / "x86_64")
    arm = publish_vendor_packages([NEW], "aarch64", tmp_path / "aarch64")
    firmware = {p.parent.name: p.read_bytes() for p in x86 + arm if "firmware" in p.name}
    assert firmware["x86_64"] == firmware["aarch64"]


@pytest.mark.parametrize("name", [n for n in available_profiles() if n == "lab" or n.startswith("lab-")])
def test_builder_output_matches_the_sha256_pinned_in_the_lab_profiles(name):
    profile = load_profile(name)
    built = {package.file_name: hashlib.sha256(vendor.build_run_file(package)).hexdigest()
             for arch in profile.arch for package in vendor.vendor_packages(VendorVersions.of(profile.stack), arch)}
    pinned = {file_name: entry.sha256 for file_name, entry in profile.packages.files.items()}
    block = "".join(f"    {file_name}: {{sha256: {digest}}}\n" for file_name, digest in built.items())
    assert built == pinned, f"profiles/{name}.yaml: the lab builds other packages; paste as packages.files:\n{block}"

# --- the makeself layout ---------------------------------------------------------------------

def test_run_file_is_a_shell_header_then_a_gzipped_tar(tmp_path):
    publish_vendor_packages([OLD], "x86_64", tmp_path)
    driver = tmp_path / "Ascend-hdk-910b-npu-driver_24.1.0_linux-x86_64.run"
    header, payload = run_file_parts(driver)
    assert header.startswith("#!/bin/sh\n") and os.access(driver, os.X_OK)
    assert f'payload_sha256="{hashlib.sha256(payload).hexdigest()}"' in header
    members = payload_members(driver)
    assert set(members) == {"package.json", "versions.py", "ascend_sim.py", "ascend_sim_install.py", "npu_smi.py",
                            "hccn_tool.py", "ascend_sim_activate.py", "ascend-sim-driver.service"}
    assert json.loads(members["package.json"]) == {
        "kind": "driver", "name": "Ascend-hdk-910b-npu-driver", "version": "24.1.0", "arch": "x86_64",
        "chip": "910b", "fw_range": ["7.5.0", "7.5.99"]}


def test_cann_packages_carry_only_the_installer(tmp_path):
    publish_vendor_packages([NEW], "x86_64", tmp_path)
    members = payload_members(tmp_path / "Ascend-cann-910b-ops_8.5.0_linux-x86_64.run")
    assert set(members) == {"package.json", "versions.py", "ascend_sim.py", "ascend_sim_install.py"}
    assert json.loads(members["package.json"])["kind"] == "ops"


def test_check_flag_verifies_integrity_and_catches_corruption(tmp_path):
    publish_vendor_packages([OLD], "x86_64", tmp_path)
    firmware = tmp_path / "Ascend-hdk-910b-npu-firmware_7.5.0.3.220.run"
    good = subprocess.run(["sh", str(firmware), "--check"], capture_output=True, text=True)
    assert good.returncode == 0 and "All good." in good.stdout
    data = bytearray(firmware.read_bytes())
    data[-40] ^= 0xFF
    firmware.write_bytes(bytes(data))
    bad = subprocess.run(["sh", str(firmware), "--check"], capture_output=True, text=True)
    assert bad.returncode == 1 and "Error in SHA256 checksums" in bad.stdout
    refused = subprocess.run(["sh", str(firmware), "--full", "--quiet"], capture_output=True, text=True)
    assert refused.returncode == 1 and "corrupt or truncated" in refused.stderr


# --- installer flags ---------------------------------------------------------------------------

@pytest.mark.parametrize("kind, argv, expected", [
    ("driver", ["--nox11", "--full", "--quiet", "--install-for-all"],
     installer.Options("full", quiet=True, install_for_all=True)),
    ("firmware", ["--nox11", "--upgrade", "--quiet"], installer.Options("upgrade", quiet=True)),
    ("toolkit", ["--install", "--quiet", "--install-for-all", "--install-path=/opt/Ascend/"],
     installer.Options("install", quiet=True, install_for_all=True, install_path="/opt/Ascend")),
    ("nnal", ["--uninstall"], installer.Options("uninstall")),
])
def test_real_flags_parse(kind, argv, expected):
    assert installer.parse_options(kind, argv) == expected


@pytest.mark.parametrize("kind, argv, message", [
    ("driver", ["--full", "--force"], "Unsupported parameter --force"),
    ("driver", ["--install"], "Unsupported parameter --install"),
    ("toolkit", ["--full"], "Unsupported parameter --full"),
    ("kernels", ["--install", "--upgrade"], "exactly one of"),
    ("firmware", ["--quiet"], "exactly one of"),
    ("toolkit", ["--install", "--install-path=opt"], "absolute directory"),
])
def test_flags_the_real_package_would_reject_are_errors(kind, argv, message):
    with pytest.raises(installer.InstallError, match=message):
        installer.parse_options(kind, argv)


# --- versions ------------------------------------------------------------------------------------

def test_versions_order_rcs_before_releases():
    assert sim.version_key("8.0.RC2") < sim.version_key("8.0.0") < sim.version_key("8.3.RC2")
    assert sim.version_key("7.5.0.3.220") < sim.version_key("7.5.0.10.1")


@pytest.mark.parametrize("version, inside", [
    ("7.5.0.3.220", True), ("7.5.99.1", True), ("7.4.9", False), ("7.6.0", False), ("8.0.0", False)])
def test_firmware_range_bounds_are_prefixes(version, inside):
    assert sim.in_range(version, "7.5.0", "7.5.99") is inside


@pytest.mark.parametrize("version, ops", [("8.3.RC2", False), ("8.2.RC1", False), ("8.5.0", True), ("9.1.0", True)])
def test_ops_era_starts_at_8_5(version, ops):
    assert sim.is_ops_era(version) is ops


# --- driver state and npu-smi on a node root ---------------------------------------------------------

BOOT = "11111111-2222-3333-4444-555555555555"


@pytest.fixture
def node(tmp_path):
    """A node root with a hardware file and a boot id, and OLD's driver and firmware installed."""
    root = tmp_path / "root"
    (root / "proc/sys/kernel/random").mkdir(parents=True)
    (root / "proc/sys/kernel/random/boot_id").write_text(BOOT + "\n")
    hardware = {"node": "worker1", "role": "worker", "chip": "910B3", "npu_count": 4, "hbm_mb": 65536,
                "npu_health": ["OK", "OK", "Alarm", "OK"], "ram_gb": 1024, "nvme": None}
    (root / "etc/ascend-lab").mkdir(parents=True)
    (root / "etc/ascend-lab/hardware.json").write_text(json.dumps(hardware))
    node = sim.Node(root)
    installer.write_driver_files(node, {"version": OLD.driver, "fw_range": OLD.driver_fw_compat},
                                 vendor.PAYLOAD_DIR, sim.DEFAULT_BASE, True, "an-earlier-boot")
    installer.write_firmware_files(node, OLD.firmware, sim.DEFAULT_BASE)
    return node


def load(node, boot_id=BOOT, firmware=OLD.firmware, fw_range=OLD.driver_fw_compat):
    """What ascend-sim-driver.service records at boot."""
    run_dir = node.path(sim.RUN_DIR)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "loaded.json").write_text(json.dumps({
        "boot_id": boot_id, "driver_version": OLD.driver, "fw_range": list(fw_range), "firmware_version": firmware}))


def test_installed_files_are_where_the_real_ones_go(node):
    assert node.installed_driver() == {"version": "24.1.0", "fw_range": ("7.5.0", "7.5.99")}
    assert node.installed_firmware() == "7.5.0.3.220"
    assert (node.path("/usr/local/Ascend/driver/tools/upgrade-tool")).is_file()
    assert os.readlink(node.path("/usr/local/sbin/npu-smi")) == "/usr/local/Ascend/driver/tools/npu-smi"
    unit = node.path("/etc/systemd/system/ascend-sim-driver.service").read_text()
    assert "ExecStart=/usr/bin/python3 /usr/local/Ascend/driver/tools/ascend_sim_activate.py" in unit
    assert node.path("/etc/systemd/system/sysinit.target.wants/ascend-sim-driver.service").is_symlink()


def test_dcmi_needs_a_driver_loaded_at_this_boot(node):
    assert not node.dcmi_initializes()  # never booted with it
    load(node, boot_id="a-previous-boot")
    assert not node.dcmi_initializes()
    load(node)
    assert node.dcmi_initializes()
    (node.path(sim.STATE_DIR) / "driver.boot_id").write_text(BOOT)  # reinstalled since this boot
    assert not node.dcmi_initializes()


def test_dcmi_fails_with_firmware_outside_the_drivers_range(node):
    load(node, firmware="7.7.0.6.236")
    assert not node.dcmi_initializes()
    output, code = npu_smi.run(node, ["info"])
    assert (output, code) == ("dcmi module initialize failed. ret is -8005\n", 1)


def test_npu_smi_info_table_has_the_real_layout(node):
    load(node)
    lines = npu_smi.render_info(npu_smi.snapshot(node, {})).splitlines()
    assert {len(line) for line in lines} == {98}
    assert lines[1].startswith("| npu-smi 24.1.0                   Version: 24.1.0 ")
    assert lines[3] == "| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|"
    assert lines[6].startswith("| 0     910B3               | OK            | ")
    assert lines[7] == "| 0                         | 0000:C1:00.0  | 0           0    / 0          3080 / 65536         |"
    assert lines[12].startswith("| 2     910B3               | Alarm         | ")
    assert "| No running processes found in NPU 3" in lines[-2]


def test_npu_smi_list_counts_the_hardware_files_npus(node):
    load(node)
    output, code = npu_smi.run(node, ["info", "-l"])
    assert code == 0
    assert output.splitlines()[0] == "        Total Count                    : 4"
    assert output.count("NPU ID") == 4


def test_hbm_use_counts_the_processes_holding_the_device(node):
    load(node)
    advert = node.hbm_advert_dir(1)
    advert.mkdir(parents=True)
    (advert / str(os.getpid())).write_text("40000\n")
    (advert / "999999").write_text("5000\n")  # not holding the device: ignored
    snap = npu_smi.snapshot(node, {1: [os.getpid()]})
    assert snap["npus"][1]["hbm_used"] == 3080 + 40000 and snap["npus"][0]["hbm_used"] == 3080
    usages = npu_smi.render_usages(snap, snap["npus"][1])
    assert "        HBM Capacity(MB)               : 65536\n" in usages
    assert "        HBM Usage Rate(%)              : 65\n" in usages
    table = npu_smi.render_info(snap)
    assert f"| 1       0                 | {os.getpid():<13} | " in table and "| 40000 " in table


def test_device_holders_come_from_open_file_descriptors(tmp_path):
    fd_dir = tmp_path / "4242" / "fd"
    fd_dir.mkdir(parents=True)
    (fd_dir / "3").symlink_to("/dev/davinci2")
    (fd_dir / "4").symlink_to("/dev/davinci_manager")
    (fd_dir / "5").symlink_to("/dev/davinci2")
    assert npu_smi.device_holders(tmp_path) == {2: [4242]}


def test_board_shows_running_versions(node):
    load(node)
    output, code = npu_smi.run(node, ["info", "-t", "board", "-i", "2"])
    assert code == 0
    assert "        Software Version               : 24.1.0\n" in output
    assert "        Firmware Version               : 7.5.0.3.220\n" in output
    assert "        Compatibility                  : OK\n" in output
    assert npu_smi.run(node, ["info", "-t", "board", "-i", "4"])[1] == 1
    assert npu_smi.run(node, ["info", "-t", "bogus", "-i", "0"])[1] == 1


@pytest.mark.skipif(os.geteuid() != 0, reason="chowns the account's home like useradd does")
def test_preinstall_driver_leaves_a_used_servers_install(tmp_path):
    lower, upper = tmp_path / "lower", tmp_path / "upper"
    (lower / "etc").mkdir(parents=True)
    for name, text in {"passwd": "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/sh\n",
                       "group": "root:x:0:\nuser:x:1000:\n", "shadow": "root:*:19000:0:99999:7:::\n",
                       "gshadow": "root:*::\n"}.items():
        (lower / "etc" / name).write_text(text)
    vendor.preinstall_driver(upper, "23.0.6", ("7.1.0", "7.1.99"), "7.1.0.11.220", accounts_from=lower)
    assert "HwHiAiUser:x:1001:1001::/home/HwHiAiUser:/bin/bash" in (upper / "etc/passwd").read_text()
    assert (upper / "etc/group").read_text().endswith("HwHiAiUser:x:1001:\n")
    node = sim.Node(upper)
    assert node.installed_driver() == {"version": "23.0.6", "fw_range": ("7.1.0", "7.1.99")}
    assert node.installed_firmware() == "7.1.0.11.220"
    assert node.driver_install_boot_id() == "preinstalled"
