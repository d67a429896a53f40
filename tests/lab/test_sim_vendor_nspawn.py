"""The simulated vendor packages on a real Debian userland, without the lab.

Each test gets a node: an overlay over the lab's cached Debian base (ascend_fleet.lab.base,
built once with debootstrap). Every `boot()` is one systemd-nspawn run,
which brings a fresh boot id, /dev and /run: a reboot as far as the packages can tell.
It starts the way systemd would, by running the enabled ascend-sim-driver.service.
"""

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from rich.console import Console

from ascend_fleet.core.node_layout import unit_file
from ascend_fleet.lab.base import base_image
from ascend_fleet.lab.sim.vendor import VendorVersions, preinstall_driver, publish_vendor_packages
from ascend_fleet.lab.spec import LabSpec

pytestmark = pytest.mark.lab

UNIT = "etc/systemd/system/ascend-sim-driver.service"
OLD = VendorVersions("24.1.0", ("7.5.0", "7.5.99"), "7.5.0.3.220", "8.3.RC2", "8.3.RC2")
NEW = VendorVersions("25.2.0", ("7.7.0", "7.7.99"), "7.7.0.6.236", "8.5.0", "8.5.0")
ARCH = os.uname().machine
DRIVER = {v: f"/root/pkgs/Ascend-hdk-910b-npu-driver_{v.driver}_linux-{ARCH}.run" for v in (OLD, NEW)}
FIRMWARE = {v: f"/root/pkgs/Ascend-hdk-910b-npu-firmware_{v.firmware}.run" for v in (OLD, NEW)}
TOOLKIT = {v: f"/root/pkgs/Ascend-cann-toolkit_{v.cann}_linux-{ARCH}.run" for v in (OLD, NEW)}
KERNELS = {OLD: f"/root/pkgs/Ascend-cann-kernels-910b_{OLD.cann}_linux-{ARCH}.run",
           NEW: f"/root/pkgs/Ascend-cann-910b-ops_{NEW.cann}_linux-{ARCH}.run"}
NNAL = {v: f"/root/pkgs/Ascend-cann-nnal_{v.nnal}_linux-{ARCH}.run" for v in (OLD, NEW)}
# What a deploy installs before the driver; lspci, ifconfig and kernel headers are stand-ins here.
USER = "groupadd HwHiAiUser && useradd -g HwHiAiUser -d /home/HwHiAiUser -m HwHiAiUser -s /bin/bash"
TOOLS = "for t in lspci ifconfig; do printf '#!/bin/sh\\n' > /usr/local/bin/$t; chmod +x /usr/local/bin/$t; done"
HEADERS = "mkdir -p /lib/modules/$(uname -r)/build"
PREREQS = f"{USER} && {TOOLS} && {HEADERS}"
HARDWARE = ('{"node": "worker1", "role": "worker", "chip": "910B3", "npu_count": 8, "hbm_mb": 65536, '
            '"npu_health": ["OK", "OK", "OK", "OK", "OK", "OK", "Critical", "OK"], "ram_gb": 1024, "nvme": null}')


@dataclass
class Result:
    returncode: int
    output: str


@pytest.fixture(scope="session")
def base_root():
    """The lab's own cached Debian base (built once with debootstrap), used read-only."""
    if os.geteuid() != 0 or not shutil.which("systemd-nspawn"):
        pytest.skip("needs root and systemd-nspawn")
    return base_image(LabSpec.model_fields["debian_upstream"].default, Console(stderr=True))


@pytest.fixture(scope="session")
def packages(tmp_path_factory):
    files = tmp_path_factory.mktemp("vendor-files")
    publish_vendor_packages([OLD, NEW], ARCH, files)
    return files


class Node:
    """An overlay node over the base root; its changes persist across boots in `upper`."""

    def __init__(self, base: Path, upper: Path, name: str):
        self.base, self.upper, self.name = base, upper, name

    def boot(self, *commands: str) -> list[Result]:
        """One boot: start the driver unit if enabled, then each command as root with stdin closed."""
        results = self.upper / "root/.results"
        shutil.rmtree(results, ignore_errors=True)
        script = [self._unit_start(), "mkdir -p /root/.results"]
        script += [f"( {command} ) >/root/.results/{i}.out 2>&1 </dev/null; echo $? >/root/.results/{i}.rc"
                   for i, command in enumerate(commands)]
        subprocess.run(["systemd-nspawn", "--quiet", "--register=no", "--keep-unit", "--console=pipe",
                        f"--machine={self.name}", f"--directory={self.base}",
                        f"--overlay={self.base}:{self.upper}:/", "/bin/sh", "-c", "\n".join(script)],
                       stdin=subprocess.DEVNULL, capture_output=True, check=True, timeout=600)
        return [Result(int((results / f"{i}.rc").read_text()), (results / f"{i}.out").read_text())
                for i in range(len(commands))]

    def _unit_start(self) -> str:
        """The ExecStart of ascend-sim-driver.service when it is enabled, as systemd would run it at boot."""
        if not (self.upper / "etc/systemd/system/sysinit.target.wants/ascend-sim-driver.service").is_symlink():
            return ":"
        unit = (self.upper / UNIT).read_text()
        return next(line.split("=", 1)[1] for line in unit.splitlines() if line.startswith("ExecStart="))


@pytest.fixture
def node(base_root, packages, tmp_path, request):
    upper = tmp_path / "upper"
    (upper / "root/pkgs").mkdir(parents=True)
    (upper / "etc/ascend-lab").mkdir(parents=True)
    (upper / "etc/ascend-lab/hardware.json").write_text(HARDWARE)
    for package in packages.iterdir():
        shutil.copy2(package, upper / "root/pkgs" / package.name)
    machine = f"simv-{request.node.name[5:40]}".replace("_", "-").rstrip("-")  # a valid host name
    return Node(base_root, upper, machine)


def install(package: str, *flags: str) -> str:
    return " ".join([package, *flags])


def hdk(package: str) -> str:
    return install(package, "--nox11", "--full", "--quiet", "--install-for-all" if "driver" in package else "")


# --- driver and firmware -------------------------------------------------------------------------------

def test_fresh_node_driver_then_firmware_works_after_the_reboot(node):
    driver, firmware, before = node.boot(PREREQS + " && " + hdk(DRIVER[OLD]), hdk(FIRMWARE[OLD]), "npu-smi info")
    assert driver.returncode == 2 and "Reboot needed" in driver.output
    assert firmware.returncode == 2
    assert before.returncode != 0 and before.output == "dcmi module initialize failed. ret is -8005\n"
    info, listing, board, devices = node.boot("npu-smi info", "npu-smi info -l", "npu-smi info -t board -i 6",
                                              "ls /dev")
    assert info.returncode == 0
    assert sum(line.startswith("| 6     910B3               | Critical") for line in info.output.splitlines()) == 1
    assert "Total Count                    : 8" in listing.output
    assert "Software Version               : 24.1.0" in board.output
    assert "Firmware Version               : 7.5.0.3.220" in board.output
    assert {f"davinci{n}" for n in range(8)} | {"davinci_manager"} <= set(devices.output.split())


def test_firmware_outside_the_drivers_range_fails_npu_smi_after_reboot(node):
    driver, firmware = node.boot(PREREQS + " && " + hdk(DRIVER[OLD]), hdk(FIRMWARE[NEW]))
    assert driver.returncode == 2
    assert firmware.returncode == 2 and "outside the compatible range [7.5.0,7.5.99]" in firmware.output
    info, board = node.boot("npu-smi info", "npu-smi info -t board -i 0")
    assert info.returncode != 0 and "dcmi module initialize failed. ret is -8005" in info.output
    assert board.returncode != 0


def test_firmware_first_on_a_fresh_node_fails(node):
    (firmware,) = node.boot(PREREQS + " && " + hdk(FIRMWARE[OLD]))
    assert firmware.returncode == 1 and "install the driver package first" in firmware.output


def test_upgrade_goes_firmware_then_driver(node):
    node.boot(PREREQS + " && " + hdk(DRIVER[OLD]), hdk(FIRMWARE[OLD]))
    warning, wrong_order = node.boot(install(DRIVER[NEW], "--nox11", "--upgrade", "--quiet"),
                                     install(FIRMWARE[NEW], "--nox11", "--upgrade", "--quiet"))
    assert warning.returncode == 2 and "[WARNING]installed firmware 7.5.0.3.220 is outside" in warning.output
    assert wrong_order.returncode == 1 and "reboot first (upgrade firmware before the driver)" in wrong_order.output
    (mismatch,) = node.boot("npu-smi info")  # new driver running with the old firmware
    assert "ret is -8005" in mismatch.output

    # Recovery: the installed driver is the running one again, so the firmware can be flashed.
    firmware, pending = node.boot(install(FIRMWARE[NEW], "--nox11", "--upgrade", "--quiet"), "npu-smi info")
    assert firmware.returncode == 2 and "ret is -8005" in pending.output
    (board,) = node.boot("npu-smi info -t board -i 0")
    assert "Software Version               : 25.2.0" in board.output
    assert "Firmware Version               : 7.7.0.6.236" in board.output


def test_right_order_on_a_used_server(node):
    node.boot(PREREQS + " && " + hdk(DRIVER[OLD]), hdk(FIRMWARE[OLD]))
    firmware, driver, pending = node.boot(install(FIRMWARE[NEW], "--nox11", "--upgrade", "--quiet"),
                                          install(DRIVER[NEW], "--nox11", "--upgrade", "--quiet"),
                                          "npu-smi info")
    assert (firmware.returncode, driver.returncode) == (2, 2) and "WARNING" not in driver.output
    assert "ret is -8005" in pending.output
    (info,) = node.boot("npu-smi info")
    assert info.returncode == 0 and "npu-smi 25.2.0" in info.output


def test_reinstalling_the_running_driver_needs_no_reboot(node):
    node.boot(PREREQS + " && " + hdk(DRIVER[OLD]), hdk(FIRMWARE[OLD]))
    driver, firmware, info = node.boot(hdk(DRIVER[OLD]), hdk(FIRMWARE[OLD]), "npu-smi info -l")
    assert (driver.returncode, firmware.returncode, info.returncode) == (0, 0, 0)


def test_driver_needs_hwhiaiuser(node):
    (driver,) = node.boot(f"{TOOLS} && {HEADERS} && " + hdk(DRIVER[OLD]))
    assert driver.returncode == 1 and "user or group HwHiAiUser does not exist" in driver.output


def test_driver_needs_lspci_and_ifconfig(node):
    (driver,) = node.boot(f"{USER} && {HEADERS} && " + hdk(DRIVER[OLD]))
    assert driver.returncode == 1 and "lspci not found; install pciutils" in driver.output


def test_driver_without_headers_or_dkms_fails_on_closed_stdin(node):
    dkms = "printf '#!/bin/sh\\n' > /usr/local/bin/dkms && chmod +x /usr/local/bin/dkms && "
    (driver, with_dkms, with_headers) = node.boot(
        f"{USER} && {TOOLS} && " + hdk(DRIVER[OLD]), dkms + hdk(DRIVER[OLD]),
        "mkdir -p /lib/modules/$(uname -r)/build/include && " + hdk(DRIVER[OLD]))
    assert driver.returncode == 1
    assert "Please input the kernel source path:" in driver.output and "no answer on the terminal" in driver.output
    # dkms builds the module against the running kernel's headers: without them it fails (dkms's own words).
    assert with_dkms.returncode == 1 and "Your kernel headers for kernel" in with_dkms.output, with_dkms.output
    assert with_headers.returncode == 2, with_headers.output


def test_unattended_install_without_quiet_fails_at_the_eula(node):
    (driver,) = node.boot(PREREQS + " && " + install(DRIVER[OLD], "--nox11", "--full"))
    assert driver.returncode == 1 and "EULA" in driver.output


def test_packages_refuse_non_root_and_unknown_flags(node):
    non_root, unknown = node.boot(f"{USER} && su HwHiAiUser -c '{hdk(DRIVER[OLD])}'",
                                  install(TOOLKIT[OLD], "--install", "--quiet", "--force"))
    assert non_root.returncode == 1 and "root only" in non_root.output
    assert unknown.returncode == 1 and "Unsupported parameter --force" in unknown.output


def test_processes_holding_a_device_show_up_with_their_hbm(node):
    node.boot(PREREQS + " && " + hdk(DRIVER[OLD]), hdk(FIRMWARE[OLD]))
    (holding, usages) = node.boot(
        "sleep 30 </dev/davinci2 & echo 20000 > /run/ascend-sim/hbm/2/$! && sleep 0.5 && npu-smi info",
        "npu-smi info -t usages -i 2")
    assert "| 2       0                 | " in holding.output and "| sleep                    | 20000" in holding.output
    assert "| 0                         | 0000:41:00.0  | 0           0    / 0          23080/ 65536" in holding.output


# --- CANN -----------------------------------------------------------------------------------------------

def test_cann_8_3_kernels_need_the_toolkit_environment(node):
    toolkit, bare, sourced, nnal, files = node.boot(
        install(TOOLKIT[OLD], "--install", "--quiet", "--install-for-all"),
        install(KERNELS[OLD], "--install", "--quiet"),
        ". /usr/local/Ascend/ascend-toolkit/set_env.sh && " + install(KERNELS[OLD], "--install", "--quiet"),
        ". /usr/local/Ascend/ascend-toolkit/set_env.sh && " + install(NNAL[OLD], "--install", "--quiet"),
        "cat /usr/local/Ascend/ascend-toolkit/latest/*-linux/ascend_toolkit_install.info "
        "/etc/Ascend/ascend_cann_install.info && ls /usr/local/Ascend/nnal/atb/set_env.sh")
    assert toolkit.returncode == 0
    assert bare.returncode == 1 and "ASCEND_HOME_PATH is not set" in bare.output
    assert sourced.returncode == 0 and nnal.returncode == 0
    assert "version=8.3.RC2" in files.output and "Install_Path=/usr/local/Ascend" in files.output


def test_cann_8_5_lives_under_cann_and_needs_upgrade_over_8_3(node):
    node.boot(install(TOOLKIT[OLD], "--install", "--quiet"))
    refused, upgraded, stale, ops, env = node.boot(
        install(TOOLKIT[NEW], "--install", "--quiet"),
        install(TOOLKIT[NEW], "--upgrade", "--quiet"),
        "ls /usr/local/Ascend/ascend-toolkit/set_env.sh",
        ". /usr/local/Ascend/cann/set_env.sh && " + install(KERNELS[NEW], "--install", "--quiet"),
        "export LD_LIBRARY_PATH=/usr/local/cuda/lib64 PATH=/usr/local/cuda/bin:$PATH && "
        ". /usr/local/Ascend/cann/set_env.sh && env")
    assert refused.returncode == 1 and "needs --upgrade" in refused.output
    assert upgraded.returncode == 0 and ops.returncode == 0
    assert stale.returncode != 0  # the upgrade leaves no old environment script to probe
    assert "ASCEND_HOME_PATH=/usr/local/Ascend/cann\n" in env.output
    assert "ASCEND_TOOLKIT_HOME=/usr/local/Ascend/cann\n" in env.output
    ld_path = next(line for line in env.output.splitlines() if line.startswith("LD_LIBRARY_PATH="))
    assert ld_path.startswith("LD_LIBRARY_PATH=/usr/local/Ascend/cann/tools/aml/lib64")
    assert ld_path.endswith(":/usr/local/cuda/lib64")  # CUDA stays on the path unless the deploy strips it
    assert "PATH=/usr/local/Ascend/cann/bin:" in env.output and ":/usr/local/cuda/bin:" in env.output


def test_ops_need_the_matching_toolkit_version(node):
    node.boot(install(TOOLKIT[OLD], "--install", "--quiet"))
    (mismatch,) = node.boot(". /usr/local/Ascend/ascend-toolkit/set_env.sh && "
                            + install(KERNELS[NEW], "--install", "--quiet"))
    assert mismatch.returncode == 1 and "needs CANN toolkit 8.5.0" in mismatch.output


# --- the lab's pre-installed driver ------------------------------------------------------------------

def test_preinstalled_driver_is_running_from_the_first_boot(node):
    preinstall_driver(node.upper, OLD.driver, OLD.driver_fw_compat, OLD.firmware, accounts_from=node.base)
    info, user = node.boot("npu-smi info -t board -i 0", "id HwHiAiUser")
    assert info.returncode == 0 and "Software Version               : 24.1.0" in info.output
    assert user.returncode == 0


def test_driver_unit_runs_at_a_real_boot(node):
    """The one test that boots systemd: the unit is ordered before sysinit and creates the devices."""
    preinstall_driver(node.upper, OLD.driver, OLD.driver_fw_compat, OLD.firmware, accounts_from=node.base)
    probe = node.upper / unit_file("simv-probe.service").lstrip("/")  # a unit of the test's own
    probe.write_text("[Unit]\nAfter=multi-user.target\n[Service]\nType=oneshot\n"
                     "ExecStart=/bin/sh -c 'npu-smi info -l > /root/probe.out 2>&1; ls /dev >> /root/probe.out'\n"
                     "ExecStartPost=/bin/systemctl poweroff --no-block\n"
                     "[Install]\nWantedBy=multi-user.target\n")
    wants = probe.parent / "multi-user.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    (wants / "simv-probe.service").symlink_to(unit_file("simv-probe.service"))
    subprocess.run(["systemd-nspawn", "--quiet", "--register=no", "--keep-unit", "--console=pipe", "--boot",
                    f"--machine={node.name}", f"--directory={node.base}", f"--overlay={node.base}:{node.upper}:/"],
                   stdin=subprocess.DEVNULL, capture_output=True, timeout=300)
    output = (node.upper / "root/probe.out").read_text()
    assert "Total Count                    : 8" in output and "davinci7" in output
