"""What the facts read of the vendor's files, run here for real against what the lab's simulated
packages write in the real forms: NNAL's ATB set_env.sh is bash only (the capture must not run it
under sh, which is dash on Debian and Ubuntu), and NNAL records its version as `Ascend-cann-atb : V`."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ascend_fleet.facts.ascend import CannPackages, SourcedEnvironment
from ascend_fleet.lab.sim import vendor
from ascend_fleet.lab.sim.wheels import standin_contents

ATB = "/usr/local/Ascend/nnal/atb"


def captured(scripts: list[str], venv: str | None = None) -> dict[str, str]:
    fact = SourcedEnvironment()
    output = subprocess.run(["sh", "-c", fact.command(scripts, venv)], capture_output=True, text=True,
                            timeout=60).stdout
    return fact.process(output.splitlines())


def atb_script(tmp_path) -> str:
    script = tmp_path / "set_env.sh"
    script.write_text(vendor.payload_module("ascend_sim_install").ATB_SET_ENV.format(version="8.5.0", atb=ATB))
    return str(script)


def serving_venv(tmp_path, torch_version: str) -> str:
    """A venv whose python3 imports the lab's torch stand-in at torch_version (its real C++ ABI answer)."""
    site = tmp_path / "site"
    for path, data in standin_contents("torch", torch_version).files().items():
        (site / path).parent.mkdir(parents=True, exist_ok=True)
        (site / path).write_bytes(data)
    python3 = tmp_path / "venv" / "bin" / "python3"
    python3.parent.mkdir(parents=True)
    python3.write_text(f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} "$@"\n')
    python3.chmod(0o755)
    return str(python3.parent.parent)


def test_the_atb_script_is_captured_although_it_is_bash_only(tmp_path):
    env = captured([atb_script(tmp_path)])
    # No torch for the python3 of a clean PATH: the script takes the cxx11 ABI, as the real one does.
    assert env["ATB_HOME_PATH"] == f"{ATB}/latest/atb/cxx_abi_1"
    assert env["LD_LIBRARY_PATH"].startswith(f"{ATB}/latest/atb/cxx_abi_1/lib:")


@pytest.mark.parametrize(("torch_version", "abi"), [("2.4.0", 0), ("2.5.1", 0), ("2.8.0", 1), ("2.9.0", 1)])
def test_atb_gets_the_cxx_abi_of_the_serving_venvs_torch(tmp_path, torch_version, abi):
    """The handbook's torch 2.4.0 was built with the old C++ ABI: ATB's cxx_abi_1 build beside it
    would not load. The script asks the python3 on PATH, so the capture puts the venv's first."""
    env = captured([atb_script(tmp_path)], venv=serving_venv(tmp_path, torch_version))
    assert env["ATB_HOME_PATH"] == f"{ATB}/latest/atb/cxx_abi_{abi}"


def test_a_script_that_is_not_there_is_skipped(tmp_path):
    assert captured([str(tmp_path / "absent" / "set_env.sh")]) == {}


def test_the_sh_dialect_fails_on_the_atb_script_as_dash_does(tmp_path):
    """What the lab must reproduce: the script's own dialect refuses dash."""
    script = atb_script(tmp_path)
    result = subprocess.run(["dash", "-c", f". {script} && echo sourced"], capture_output=True, text=True)
    assert "sourced" not in result.stdout and result.returncode != 0


def test_nnal_is_found_in_the_record_the_lab_writes_as_real_nodes_do(tmp_path, monkeypatch):
    installer = vendor.payload_module("ascend_sim_install")
    node_class = installer.sim.Node
    monkeypatch.setattr(installer.sim, "Node", lambda: node_class(tmp_path))
    monkeypatch.setattr(installer, "sourced_toolkit", lambda pkg, install_path: None)  # no toolkit needed here
    installer.install_nnal({"name": "Ascend-cann-nnal", "version": "8.5.0", "arch": "x86_64"},
                           installer.Options("install"))
    base = tmp_path / "usr" / "local" / "Ascend"
    assert (base / "nnal/atb/latest/version.info").read_text().startswith("    Ascend-cann-atb : 8.5.0\n")
    fact = CannPackages()
    output = subprocess.run(["sh", "-c", fact.command(str(base))], capture_output=True, text=True).stdout
    assert fact.process(output.splitlines())["nnal"] == "8.5.0"


def test_an_unindented_nnal_record_with_its_build_line_gives_the_release(tmp_path):
    # As a CANN 9.1.0 node shows it (nnal/atb/9.1.0/version.info): no indent, the build on its own line.
    record = tmp_path / "nnal" / "atb" / "latest" / "version.info"
    record.parent.mkdir(parents=True)
    record.write_text("Ascend-cann-atb : 9.1.0\nAscend-cann-atb Version : 9.1.0.B150\nbranch : br_release_cann_9.1.0\n")
    fact = CannPackages()
    output = subprocess.run(["sh", "-c", fact.command(str(tmp_path))], capture_output=True, text=True).stdout
    assert fact.process(output.splitlines())["nnal"] == "9.1.0"


def test_kernels_on_cann_8_3_are_found_in_the_opp_kernel_record_real_nodes_have(tmp_path, monkeypatch):
    """CANN <= 8.3 records the operator kernels in <toolkit>/opp_kernel/version.info (`Version=<build>`,
    `version_dir=<release>`, as a published 8.3.RC1 install prints it); the fact read a record of
    our own making, so on a real node every rerun would have installed the kernels again."""
    installer = vendor.payload_module("ascend_sim_install")
    node_class = installer.sim.Node
    monkeypatch.setattr(installer.sim, "Node", lambda: node_class(tmp_path))
    base = tmp_path / "usr" / "local" / "Ascend"
    home = base / "ascend-toolkit" / "8.3.RC2"
    home.mkdir(parents=True)
    (base / "ascend-toolkit" / "latest").symlink_to("8.3.RC2")
    monkeypatch.setattr(installer, "sourced_toolkit", lambda pkg, install_path: (home, "8.3.RC2"))
    installer.install_kernels({"name": "Ascend-cann-kernels-910b", "version": "8.3.RC2", "arch": "x86_64",
                               "kind": "kernels"}, installer.Options("install"))
    assert "version_dir=8.3.RC2\n" in (base / "ascend-toolkit/latest/opp_kernel/version.info").read_text()
    assert not list(home.glob("*-linux/ascend_kernels_install.info"))
    fact = CannPackages()
    output = subprocess.run(["sh", "-c", fact.command(str(base))], capture_output=True, text=True).stdout
    assert fact.process(output.splitlines())["kernels"] == "8.3.RC2"
