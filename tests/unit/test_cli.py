"""The `ascend-fleet` command answers a usage mistake as click does: a short usage, one error line, exit 2
(typer from 0.26 carries its own click, whose errors click's except clause does not catch)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

CLI = Path(sys.executable).with_name("ascend-fleet")


@pytest.mark.parametrize("args, error", [
    (["nosuch"], "Error: No such command 'nosuch'."),
    (["plan", "--bogus"], "Error: No such option: --bogus"),
    (["rollout", "inventories/prod.py", "deploys/full.py", "--max-unavailable", "0"],
     "Error: Invalid value for '--max-unavailable': Input should be greater than or equal to 1"),
    (["load", "inventories/prod.py", "--concurrency", "0"],
     "Error: Invalid value for '--concurrency': Input should be greater than or equal to 1"),
], ids=["unknown command", "unknown option", "max-unavailable 0", "concurrency 0"])
def test_a_usage_mistake_is_a_short_usage_and_one_line_exit_2(args, error):
    result = subprocess.run([str(CLI), *args], capture_output=True, text=True)
    lines = (result.stdout + result.stderr).strip().splitlines()
    assert (result.returncode, lines[-1]) == (2, error) and len(lines) <= 5, result.stdout + result.stderr


def test_version_prints_the_installed_version():
    from importlib.metadata import version
    result = subprocess.run([str(CLI), "--version"], capture_output=True, text=True)
    assert (result.returncode, result.stdout) == (0, f"ascend-fleet {version('ascend-fleet')}\n")


def test_a_plan_of_an_inventory_without_workers_says_there_is_nothing_to_plan_exit_2(tmp_path):
    """Before: exit 0 with an empty table."""
    from tests.loopback import FLEET_DATA
    (tmp_path / "group_data").mkdir()
    (tmp_path / "group_data" / "fleet.py").write_text(FLEET_DATA)
    (tmp_path / "fleet.py").write_text("gateway = [('gw', {'ssh_hostname': '127.0.0.1'})]\n")
    result = subprocess.run([str(CLI), "plan", "fleet.py"], capture_output=True, text=True, cwd=tmp_path)
    assert (result.returncode, result.stdout, result.stderr) == (2, "", (
        "error: plan: fleet.py has no worker (a host whose data sets npu_count): nothing to plan; give your NPU "
        "hosts npu_count, or plan one instance with --model-config\n"))


# Each a number that means nothing there (a negative pause crashed a rollout after its canary wave, time.sleep
# refusing it; `load --max-tokens 0` sent requests): refused where the option is declared, before the command runs.
MEANINGLESS_NUMBERS = [
    ("rollout", "--pause", "-5", "Input should be greater than or equal to 0"),
    ("rollout", "--drain-timeout", "-1", "Input should be greater than or equal to 0"),
    ("swap-model", "--drain-timeout", "-1", "Input should be greater than or equal to 0"),
    ("drain", "--drain-timeout", "-30", "Input should be greater than or equal to 0"),
    ("load", "--duration", "-10", "-10: expected a finite number above 0"),
    ("load", "--duration", "0", "0: expected a finite number above 0"),
    ("load", "--requests", "0", "Input should be greater than or equal to 1"),
    ("load", "--max-tokens", "0", "Input should be greater than or equal to 1"),
    ("plan", "--tp", "0", "Input should be greater than or equal to 1"),
    ("plan", "--dp", "-1", "Input should be greater than or equal to 1"),
    ("plan", "--max-model-len", "0", "Input should be greater than or equal to 1"),
    ("plan", "--gpu-memory-utilization", "0", "0: expected a finite number above 0"),
    ("plan", "--gpu-memory-utilization", "1.5", "Input should be less than or equal to 1"),
    ("plan", "--usable-hbm-gib", "-3", "-3: expected a finite number above 0"),
    ("bench", "--request-rate", "0", "0: expected a number above 0, or inf (all at once)"),
    ("tune", "--request-rate", "-2", "-2: expected a number above 0, or inf (all at once)"),
    ("tune", "--budget-minutes", "0", "0: expected a finite number above 0"),
    ("status", "--interval", "nan", "nan: expected a finite number above 0"),
    # inf: typer's min= lets it through (nan it refuses by its bound); a pause or timeout of inf never ends.
    ("rollout", "--pause", "nan", "Input should be greater than or equal to 0"),
    ("rollout", "--pause", "inf", "inf: expected a finite number"),
    ("swap-model", "--drain-timeout", "inf", "inf: expected a finite number"),
    ("drain", "--drain-timeout", "1e309", "inf: expected a finite number"),
    ("load", "--give-up-after", "inf", "inf: expected a finite number"),
    ("load", "--duration", "inf", "inf: expected a finite number above 0"),
    ("plan", "--usable-hbm-gib", "inf", "inf: expected a finite number above 0"),
    ("tune", "--budget-minutes", "1e309", "inf: expected a finite number above 0"),
    ("bench", "--request-rate", "nan", "nan: expected a number above 0, or inf (all at once)"),
    ("lab", "--size", "-0", "-0: expected a finite number above 0"),
    ("lab", "--shards", "0", "Input should be greater than or equal to 1"),
]
ARGUMENTS_BEFORE = {"rollout": ["inventories/prod.py", "deploys/serve.py"], "swap-model": ["inventories/prod.py"],
                    "drain": ["inventories/prod.py", "npu-01"], "load": ["inventories/prod.py"], "plan": [],
                    "bench": ["inventories/prod.py"], "tune": ["inventories/prod.py"],
                    "status": ["inventories/prod.py"], "lab": ["bench-weights"]}


@pytest.mark.parametrize("command, option, value, refusal", MEANINGLESS_NUMBERS,
                         ids=[f"{c} {o} {v}" for c, o, v, _ in MEANINGLESS_NUMBERS])
def test_a_number_that_means_nothing_there_is_refused_where_the_option_is_declared_exit_2(command, option, value,
                                                                                           refusal):
    from typer.testing import CliRunner

    from ascend_fleet.cli import build_app
    result = CliRunner().invoke(build_app(command), [command, *ARGUMENTS_BEFORE[command], option, value])
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{option}': {refusal}" in " ".join(result.output.replace("│", " ").split())


# `lab up --subnet` as typed: before, three of these ended in an ipaddress traceback and a public range brought a
# lab up on it (this machine's route to 8.8.8.0/24 then went into the lab bridge).
LAB_SUBNETS = [
    ("10.0.0.0/33", "lab up: --subnet 10.0.0.0/33: not an IPv4 network ('33' is not a valid netmask); give one as "
                    "ADDRESS/PREFIX, e.g. 10.213.0.0/24"),
    ("10.213.0.1/24", "lab up: --subnet 10.213.0.1/24: has host bits set; give the network itself, e.g. 10.213.0.0/24"),
    ("abc", "lab up: --subnet abc: not an IPv4 network (Expected 4 octets in 'abc')"),
    ("10.213.0.0/24 ", "lab up: --subnet '10.213.0.0/24 ' (a trailing blank): not an IPv4 network"),
    ("8.8.8.0/24", "lab up: --subnet 8.8.8.0/24: not a private range (RFC 1918: 10.0.0.0/8, 172.16.0.0/12, "
                   "192.168.0.0/16); the lab would route this machine's own traffic for those addresses into it"),
    ("127.0.0.0/24", "lab up: --subnet 127.0.0.0/24: not a private range"),
    ("192.168.7.0/24", "lab up: --subnet 192.168.7.0/24: its NPU parameter plane 192.169.7.0/24 (the subnet one up "
                       "in its second octet) is not a private range (RFC 1918)"),
    ("10.213.0.0/28", "lab up: --subnet 10.213.0.0/28: too small for 3 workers (the lab takes 19 addresses)"),
]


@pytest.mark.parametrize("subnet, refusal", LAB_SUBNETS, ids=[subnet for subnet, _ in LAB_SUBNETS])
def test_a_lab_subnet_that_is_no_private_network_is_one_line_exit_2_and_nothing_is_made(monkeypatch, tmp_path, subnet,
                                                                                         refusal):
    from typer.testing import CliRunner

    from ascend_fleet.cli import build_app
    from ascend_fleet.core.errors import InputError
    from ascend_fleet.lab import lab

    made = []
    monkeypatch.setattr(lab, "up", lambda spec, console: made.append(spec) or pytest.fail("lab.up ran"))
    result = CliRunner().invoke(build_app("lab"), ["lab", "up", "--subnet", subnet, "--lab-dir", str(tmp_path / "lab")])
    assert isinstance(result.exception, InputError), result.output
    assert str(result.exception).startswith(refusal) and "\n" not in str(result.exception)
    assert result.exception.exit_code == 2 and not made and not (tmp_path / "lab").exists()


def test_a_private_lab_subnet_is_taken():
    from ascend_fleet.lab.spec import LabSpec

    spec = LabSpec.build(1, subnet="172.20.3.0/24")
    assert (spec.host_address, str(spec.npu_network)) == ("172.20.3.1", "172.21.3.0/24")
