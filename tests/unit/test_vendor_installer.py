"""The vendor installers: which one runs for the versions a node has, and their shell command, run for
real under the node's shells (dash is Debian's sh, bash is what pyinfra's sudo and the vendor's own
scripts use): a fake .run installer, the CANN toolkit's set_env.sh present or not."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ascend_fleet.facts.ascend import AscendDriver, AscendFirmware, CannPackages, VenvPython
from ascend_fleet.operations import vendor
from tests.fakehost import FakeHost, commands

KERNELS = "Ascend-cann-kernels-910b_8.5.0_linux-aarch64.run"
DRIVER = "Ascend-hdk-910b-npu-driver_25.2.0_linux-aarch64.run"


@pytest.fixture
def node(tmp_path, monkeypatch):
    """A package directory with an installer that records the environment it ran in, and an install log."""
    packages = tmp_path / "packages"
    packages.mkdir()
    installer = packages / KERNELS
    installer.write_text(f"#!/bin/sh\necho \"ASCEND_TOOLKIT_HOME=$ASCEND_TOOLKIT_HOME\" > {tmp_path}/ran\n")
    installer.chmod(0o755)
    monkeypatch.setattr(vendor, "PACKAGE_DIR", str(packages))
    monkeypatch.setattr(vendor, "INSTALL_LOG", str(tmp_path / "install.log"))
    return tmp_path


def run(command: str, shell: str) -> subprocess.CompletedProcess:
    return subprocess.run([shell, "-c", command], capture_output=True, text=True)


@pytest.mark.parametrize("shell", ["sh", "bash"])
def test_kernels_install_with_the_toolkits_environment_sourced(node, shell):
    (node / "cann").mkdir()
    (node / "cann" / "set_env.sh").write_text(f"export ASCEND_TOOLKIT_HOME={node}/cann\n")
    result = run(vendor.installer_command(KERNELS, "--install --quiet", env_scripts=vendor.toolkit_env_scripts(str(node))),
                 shell)
    assert result.returncode == 0, result.stderr
    assert (node / "ran").read_text() == f"ASCEND_TOOLKIT_HOME={node}/cann\n"


@pytest.mark.parametrize("shell", ["sh", "bash"])
def test_no_toolkit_environment_to_source_fails_in_one_line_and_runs_no_installer(node, shell):
    """Issue 13: the probe found no set_env.sh and left `. ` with no file, which exits 2, an exit
    code the installer check takes for success."""
    result = run(vendor.installer_command(KERNELS, "--install --quiet", env_scripts=vendor.toolkit_env_scripts(str(node))),
                 shell)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"{KERNELS}: no CANN toolkit environment to install it with: neither {node}/cann/set_env.sh nor "
        f"{node}/ascend-toolkit/set_env.sh exists; install the CANN toolkit first"]
    assert not (node / "ran").exists()


@pytest.mark.parametrize("shell", ["sh", "bash"])
def test_the_venv_probe_runs_with_the_first_toolkit_environment_that_exists(tmp_path, shell):
    (tmp_path / "ascend-toolkit").mkdir()
    (tmp_path / "ascend-toolkit" / "set_env.sh").write_text("export ASCEND_TOOLKIT_HOME=/from/8.3\n")
    fact = VenvPython()
    code = "import os; print(os.environ.get('ASCEND_TOOLKIT_HOME'))"
    venv = str(Path(sys.executable).parents[1])
    found = run(fact.command(venv=venv, code=code, env_scripts=vendor.toolkit_env_scripts(str(tmp_path))), shell)
    assert fact.process(found.stdout.splitlines()) == {"ok": True, "output": "/from/8.3"}
    none = run(fact.command(venv=venv, code=code, env_scripts=vendor.toolkit_env_scripts(str(tmp_path / "no"))), shell)
    assert fact.process(none.stdout.splitlines()) == {"ok": True, "output": "None"}


@pytest.mark.parametrize("installed, flags", [
    ({"version": "25.2.0", "complete": True}, None),
    ({"version": "24.1.0", "complete": True}, "--nox11 --upgrade --quiet"),
    ({"version": "25.2.0", "complete": False}, "--nox11 --upgrade --quiet"),  # upgrade-tool missing: broken
    (None, "--nox11 --full --quiet --install-for-all"),
], ids=["current", "other version", "incomplete", "fresh"])
def test_the_driver_installer_runs_only_when_the_installed_driver_is_not_the_profiles(installed, flags):
    fake = FakeHost({AscendDriver: installed})
    steps = commands(vendor.driver, fake, version="25.2.0", package=DRIVER)
    assert [f"{DRIVER} {flags} </dev/null" in step for step in steps] == ([True] if flags else [])
    assert fake.noops == ([] if flags else ["NPU driver 25.2.0 is installed"])


@pytest.mark.parametrize("installed, flags", [
    ("7.7.0.6.236", None), ("7.5.0.3.220", "--nox11 --upgrade --quiet"), (None, "--nox11 --full --quiet")])
def test_the_firmware_installer_runs_only_when_the_installed_firmware_is_not_the_profiles(installed, flags):
    steps = commands(vendor.firmware, FakeHost({AscendFirmware: installed}), version="7.7.0.6.236", package="fw.run")
    assert [f"fw.run {flags} </dev/null" in step for step in steps] == ([True] if flags else [])


@pytest.mark.parametrize("part, installed, flags", [
    ("toolkit", {"toolkit": "8.5.0"}, None),
    ("toolkit", {"toolkit": "8.3.0"}, "--upgrade --quiet --install-for-all"),
    ("kernels", {"toolkit": "8.5.0"}, "--install --quiet"),
    ("nnal", {"toolkit": "8.5.0", "nnal": "8.3.0"}, "--upgrade --quiet"),
])
def test_a_cann_part_installs_when_missing_upgrades_when_older_and_only_the_toolkit_without_its_environment(
        part, installed, flags):
    steps = commands(vendor.cann_part, FakeHost({CannPackages: installed}), part=part, version="8.5.0",
                     package=KERNELS)
    assert [f"{KERNELS} {flags} </dev/null" in step for step in steps] == ([True] if flags else [])
    assert all(("set_env.sh" in step) is (part != "toolkit") for step in steps)


@pytest.mark.parametrize("exit_code, ok", [(0, True), (2, True), (1, False)],
                         ids=["done", "done at the next reboot", "failed"])
def test_an_installer_passes_on_exit_0_or_2_and_fails_in_one_line_with_its_last_words(node, exit_code, ok):
    installer = node / "packages" / DRIVER
    installer.write_text(f"#!/bin/sh\necho 'step 1'\necho 'reboot to take effect'\nexit {exit_code}\n")
    installer.chmod(0o755)
    (step,) = commands(vendor.driver, FakeHost({AscendDriver: None}), version="25.2.0", package=DRIVER)
    result = run(step, "sh")
    assert (result.returncode == 0) is ok
    assert result.stderr.splitlines() == ([] if ok else [
        f"{DRIVER} --nox11 --full --quiet --install-for-all failed (exit 1): step 1 reboot to take effect "
        f"(full log: {node}/install.log)"])
