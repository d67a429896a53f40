"""The simulated Ascend platform on lab nodes, over SSH, with the packages the lab mirror publishes.

Uses the `lab` session fixture (tests/lab/conftest.py): `lab.workers`, `lab.run(node, cmd,
check=True, timeout=600)`, `lab.reboot(node)`, `lab.mirror_url`. Each test starts from a
worker with no Ascend software, no HwHiAiUser and no driver loaded, like a fresh OS.
"""

import base64
import re
import shlex
import urllib.request

import pytest

from ascend_fleet.lab.sim import vendor

pytestmark = pytest.mark.lab

sim = vendor.sim
PKGS = "/root/pkgs"
DCMI_FAILED = "dcmi module initialize failed. ret is -8005"
USER = "groupadd HwHiAiUser && useradd -g HwHiAiUser -d /home/HwHiAiUser -m HwHiAiUser -s /bin/bash"
# A node's apt lists are the base image's, not its mirror's: update once, as a deploy would.
APT_LISTS = "(apt-cache show pciutils >/dev/null 2>&1 || apt-get update -qq)"
TOOLS = f"{APT_LISTS} && DEBIAN_FRONTEND=noninteractive apt-get install -y -q pciutils net-tools >/dev/null"
# The driver accepts dkms or /lib/modules/<release>/build; dkms drags in a compiler, so the
# tests stand in the headers directory (the deploy under test installs dkms for real).
HEADERS = "mkdir -p /lib/modules/$(uname -r)/build"
RESET = ("rm -rf /usr/local/Ascend /etc/ascend_install.info /etc/Ascend /var/lib/ascend-sim /run/ascend-sim "
         "/usr/local/sbin/npu-smi /etc/systemd/system/ascend-sim-driver.service "
         "/etc/systemd/system/sysinit.target.wants/ascend-sim-driver.service /dev/davinci* /dev/devmm_svm "
         f"/dev/hisi_hdc /lib/modules/$(uname -r)/build {PKGS}; userdel -r HwHiAiUser 2>/dev/null; "
         f"groupdel HwHiAiUser 2>/dev/null; mkdir -p {PKGS}; "
         # An earlier deploy on the shared lab installs dkms, which would answer the headers question.
         "if dpkg -s dkms >/dev/null 2>&1; then apt-get remove -y -q dkms >/dev/null; fi")
HDK_FLAGS = "--nox11 --full --quiet"
# What RESET takes that the node had from `lab up` (lab/nodes.py write_kernel): the running kernel's headers tree,
# which a Debian lab node has as installed. A node a test reset gets it back, so a later deploy on the shared lab
# (which installs dkms, and DKMS builds against it) finds it as every node has it.
RESTORE_HEADERS = "mkdir -p /lib/modules/$(uname -r)/build/include"


class Mirror:
    """The vendor packages the lab published, by kind, for one architecture."""

    def __init__(self, url: str, arch: str):
        self.url = f"{url}/files"
        with urllib.request.urlopen(f"{self.url}/SHA256SUMS", timeout=30) as response:
            self.names = [line.split()[1] for line in response.read().decode().splitlines()]
        self.arch = arch

    def versions(self, pattern: str) -> list[str]:
        """Versions of the packages whose names match pattern (one group: the version), newest first."""
        found = [m[1] for m in map(re.compile(pattern.replace("{arch}", self.arch)).fullmatch, self.names) if m]
        return sorted(found, key=sim.version_key, reverse=True)

    def newest_driver(self) -> str:
        versions = self.versions(r"Ascend-hdk-910b-npu-driver_(.+)_linux-{arch}\.run")
        if not versions:
            pytest.skip(f"the mirror publishes no driver for {self.arch}")
        return versions[0]

    def firmware_in(self, low: str, high: str) -> str:
        inside = [v for v in self.versions(r"Ascend-hdk-910b-npu-firmware_(.+)\.run") if sim.in_range(v, low, high)]
        if not inside:
            pytest.skip(f"the mirror publishes no firmware in [{low},{high}]")
        return inside[0]

    def cann_with_kernels(self) -> str:
        toolkits = self.versions(r"Ascend-cann-toolkit_(.+)_linux-{arch}\.run")
        with_kernels = [v for v in toolkits if kernels_file(v, self.arch) in self.names]
        if not with_kernels:
            pytest.skip("the mirror publishes no CANN toolkit with its kernels/ops package")
        return with_kernels[0]


def driver_file(version, arch):
    return f"Ascend-hdk-910b-npu-driver_{version}_linux-{arch}.run"


def firmware_file(version):
    return f"Ascend-hdk-910b-npu-firmware_{version}.run"


def kernels_file(cann, arch):
    name = "Ascend-cann-910b-ops" if sim.is_ops_era(cann) else "Ascend-cann-kernels-910b"
    return f"{name}_{cann}_linux-{arch}.run"


@pytest.fixture
def worker(lab):
    node = lab.workers[0]
    lab.run(node, RESET)
    yield node
    lab.run(node, RESTORE_HEADERS)


@pytest.fixture
def mirror(lab, worker):
    arch = lab.run(worker, "uname -m").stdout.strip()
    return Mirror(lab.mirror_url, arch)


def sh(lab, node, command):
    """Run command as root on node; (exit code, stdout and stderr together)."""
    result = lab.run(node, f"{command} 2>&1", check=False)
    return result.returncode, result.stdout


def fetch(lab, node, mirror, *names):
    """Download packages from the mirror and check them against its SHA256SUMS, as a deploy does."""
    urls = " ".join(f"-O {shlex.quote(f'{mirror.url}/{name}')}" for name in names)
    lab.run(node, f"cd {PKGS} && curl -fsS {urls} -O {mirror.url}/SHA256SUMS "
                  f"&& sha256sum --check --ignore-missing --quiet SHA256SUMS && chmod +x *.run")


def install_driver(lab, node, mirror):
    """Prerequisites, then the newest published driver; returns its firmware range."""
    driver = mirror.newest_driver()
    fetch(lab, node, mirror, driver_file(driver, mirror.arch))
    lab.run(node, f"{USER} && {TOOLS} && {HEADERS}")
    code, output = sh(lab, node, f"{PKGS}/{driver_file(driver, mirror.arch)} {HDK_FLAGS} --install-for-all")
    assert code in (0, 2), output
    version_info = lab.run(node, "cat /usr/local/Ascend/driver/version.info").stdout
    return sim.parse_range(re.search(r"^compatible_version_fw=(.*)$", version_info, re.M)[1])


def test_driver_then_firmware_take_effect_at_the_reboot(lab, worker, mirror):
    low, high = install_driver(lab, worker, mirror)
    firmware = mirror.firmware_in(low, high)
    fetch(lab, worker, mirror, firmware_file(firmware))
    code, output = sh(lab, worker, f"{PKGS}/{firmware_file(firmware)} {HDK_FLAGS}")
    assert code in (0, 2), output
    code, output = sh(lab, worker, "npu-smi info")
    assert code != 0 and DCMI_FAILED in output

    lab.reboot(worker)
    npus = int(lab.run(worker, "python3 -c \"import json; print(json.load(open('/etc/ascend-lab/hardware.json'))"
                               "['npu_count'])\"").stdout)
    listing = lab.run(worker, "npu-smi info -l").stdout
    assert f"Total Count                    : {npus}" in listing
    table = lab.run(worker, "npu-smi info").stdout
    for npu in range(npus):
        assert re.search(rf"^\| {npu:<6}\S+\s+\| (OK|Warning|Alarm|Critical) ", table, re.M), table
    board = lab.run(worker, "npu-smi info -t board -i 0").stdout
    assert f"Firmware Version               : {firmware}" in board


def test_a_process_holding_an_npu_shows_its_hbm(lab, worker, mirror):
    low, high = install_driver(lab, worker, mirror)
    firmware = mirror.firmware_in(low, high)
    fetch(lab, worker, mirror, firmware_file(firmware))
    sh(lab, worker, f"{PKGS}/{firmware_file(firmware)} {HDK_FLAGS}")
    lab.reboot(worker)
    usages = lab.run(worker, "sleep 60 </dev/davinci0 >/dev/null 2>&1 & echo 30000 > /run/ascend-sim/hbm/0/$!; "
                             "sleep 0.5; npu-smi info -t usages -i 0; npu-smi info").stdout
    total = int(re.search(r"HBM Capacity\(MB\)\s+: (\d+)", usages)[1])
    rate = int(re.search(r"HBM Usage Rate\(%\)\s+: (\d+)", usages)[1])
    assert rate >= 100 * 30000 // total
    assert re.search(r"^\| 0       0 .*\| sleep\s+\| 30000 ", usages, re.M), usages


def test_firmware_outside_the_drivers_range_fails_like_the_real_one(lab, worker, mirror):
    low, high = install_driver(lab, worker, mirror)
    outside = f"{int(high.split('.')[0]) + 1}.0.0.1.100"  # a major release past the range
    stack = vendor.VendorVersions(mirror.newest_driver(), (low, high), outside, cann="8.3.RC2", nnal="8.3.RC2")
    package = next(p for p in vendor.vendor_packages(stack, mirror.arch) if p.kind == "firmware")
    encoded = base64.b64encode(vendor.build_run_file(package)).decode()
    lab.run(worker, f"echo {encoded} | base64 -d > {PKGS}/{package.file_name} && chmod +x {PKGS}/{package.file_name}")
    code, output = sh(lab, worker, f"{PKGS}/{package.file_name} {HDK_FLAGS}")
    assert code in (0, 2) and "outside the compatible range" in output
    lab.reboot(worker)
    code, output = sh(lab, worker, "npu-smi info")
    assert code != 0 and DCMI_FAILED in output


def test_kernels_fail_without_the_toolkit_environment(lab, worker, mirror):
    cann = mirror.cann_with_kernels()
    toolkit, kernels = f"Ascend-cann-toolkit_{cann}_linux-{mirror.arch}.run", kernels_file(cann, mirror.arch)
    fetch(lab, worker, mirror, toolkit, kernels)
    lab.run(worker, f"{PKGS}/{toolkit} --install --quiet --install-for-all")
    code, output = sh(lab, worker, f"{PKGS}/{kernels} --install --quiet")
    assert code == 1 and "ASCEND_HOME_PATH is not set" in output
    set_env = "/usr/local/Ascend/cann/set_env.sh" if sim.is_ops_era(cann) else \
        "/usr/local/Ascend/ascend-toolkit/set_env.sh"
    code, output = sh(lab, worker, f". {set_env} && {PKGS}/{kernels} --install --quiet")
    assert code == 0, output


def test_driver_fails_without_hwhiaiuser(lab, worker, mirror):
    driver = driver_file(mirror.newest_driver(), mirror.arch)
    fetch(lab, worker, mirror, driver)
    lab.run(worker, f"{TOOLS} && {HEADERS}")
    code, output = sh(lab, worker, f"{PKGS}/{driver} {HDK_FLAGS} --install-for-all")
    assert code == 1 and "user or group HwHiAiUser does not exist" in output


def test_driver_without_headers_fails_on_closed_stdin(lab, worker, mirror):
    driver = driver_file(mirror.newest_driver(), mirror.arch)
    fetch(lab, worker, mirror, driver)
    lab.run(worker, f"{USER} && {TOOLS}")
    code, output = sh(lab, worker, f"{PKGS}/{driver} {HDK_FLAGS} --install-for-all </dev/null")
    assert code == 1 and "Please input the kernel source path" in output and "no answer on the terminal" in output
