"""The vendor installers' shell command, run for real under the node's shells (dash is Debian's sh,
bash is what pyinfra's sudo and the vendor's own scripts use): a fake .run installer, the CANN
toolkit's set_env.sh present or not."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ascend_fleet.facts.ascend import VenvPython
from ascend_fleet.operations import vendor

KERNELS = "Ascend-cann-kernels-910b_8.5.0_linux-aarch64.run"


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
