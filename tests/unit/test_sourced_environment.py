"""The services' environment as sourcing the vendor's scripts sets it, run here for real: NNAL's
ATB set_env.sh is bash only (the lab's stand-in has its dialect), so the capture must not run it
under sh, which is dash on Debian and Ubuntu."""

from __future__ import annotations

import subprocess
from pathlib import Path

from ascend_fleet.facts.ascend import SourcedEnvironment
from ascend_fleet.lab.sim import vendor

ATB = "/usr/local/Ascend/nnal/atb"


def captured(scripts: list[str]) -> dict[str, str]:
    fact = SourcedEnvironment()
    output = subprocess.run(["sh", "-c", fact.command(scripts)], capture_output=True, text=True, timeout=60).stdout
    return fact.process(output.splitlines())


def test_the_atb_script_is_captured_although_it_is_bash_only(tmp_path):
    script = tmp_path / "set_env.sh"
    script.write_text(vendor.payload_module("ascend_sim_install").ATB_SET_ENV.format(version="8.5.0", atb=ATB))
    env = captured([str(script)])
    # No torch for the python3 of a clean PATH: the script takes the cxx11 ABI, as the real one does.
    assert env["ATB_HOME_PATH"] == f"{ATB}/latest/atb/cxx_abi_1"
    assert env["LD_LIBRARY_PATH"].startswith(f"{ATB}/latest/atb/cxx_abi_1/lib:")


def test_a_script_that_is_not_there_is_skipped(tmp_path):
    assert captured([str(tmp_path / "absent" / "set_env.sh")]) == {}


def test_the_sh_dialect_fails_on_the_atb_script_as_dash_does(tmp_path):
    """What the lab must reproduce: the script's own dialect refuses dash."""
    script = tmp_path / "set_env.sh"
    script.write_text(vendor.payload_module("ascend_sim_install").ATB_SET_ENV.format(version="8.5.0", atb=ATB))
    result = subprocess.run(["dash", "-c", f". {script} && echo sourced"], capture_output=True, text=True)
    assert "sourced" not in result.stdout and result.returncode != 0
