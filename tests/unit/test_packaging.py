"""ascend-fleet as an operator installs it beside a fleet repository of their own: the project
installed non-editable into a fresh virtualenv, run from a folder holding only inventories/,
group_data/ and deploys/ (no templates, profiles or source tree there). It plans the example fleet
and renders an instance's unit from its package data."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ascend_fleet import PROJECT_ROOT
from ascend_fleet.fleet.profile_check import pip_environment

pytestmark = pytest.mark.network  # pip installs the project and its dependencies

QWEN35_27B = PROJECT_ROOT / "tests" / "fixtures" / "models" / "qwen3.5-27b"  # group_data/prod.py's model
UNIT_OF_FIRST_WORKER = textwrap.dedent("""
    import ascend_fleet
    from ascend_fleet.fleet.plan import fleet_node_configs, load_inventory
    from ascend_fleet.config.profile import load_profile
    from ascend_fleet.stages.serving import instance_unit_file
    config = next(c for c in fleet_node_configs(load_inventory(__import__("pathlib").Path("inventories/prod.py")))
                  if c.is_worker)
    print(ascend_fleet.__file__)
    print(instance_unit_file(config, config.instances[0], load_profile(config.profile), leave_seconds=4))
""")


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path]:
    """(the fresh virtualenv's bin, the fleet folder)."""
    root = tmp_path_factory.mktemp("operator")
    # Built from a copy: setuptools builds in the source tree (build/, *.egg-info), and not in this checkout.
    source = root / "source"
    shutil.copytree(PROJECT_ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "*.egg-info", "__pycache__", "state", "bench-results", "files"))
    subprocess.run([sys.executable, "-m", "venv", str(root / "venv")], check=True)
    pip = subprocess.run([str(root / "venv" / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check",
                          str(source)], capture_output=True, text=True, timeout=900,
                         env=pip_environment(dict(os.environ)))
    assert pip.returncode == 0, pip.stderr[-3000:]
    fleet = root / "fleet"
    for folder in ("inventories", "group_data", "deploys"):
        shutil.copytree(PROJECT_ROOT / folder, fleet / folder)
    return root / "venv" / "bin", fleet


def run(installed: tuple[Path, Path], *argv: str) -> subprocess.CompletedProcess:
    bin_dir, fleet = installed
    return subprocess.run([str(bin_dir / argv[0]), *argv[1:]], cwd=fleet, capture_output=True, text=True, timeout=300,
                          env={key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")})


def test_the_installed_package_plans_the_example_fleet_from_a_fleet_folder(installed):
    result = run(installed, "ascend-fleet", "plan", "inventories/prod.py", "--model-config", str(QWEN35_27B), "--json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["verdict"] == "fits" and plan["instances"], plan


def test_the_installed_package_renders_an_instance_unit_from_its_own_templates(installed):
    result = run(installed, "python", "-c", UNIT_OF_FIRST_WORKER)
    assert result.returncode == 0, result.stderr
    package, unit = result.stdout.split("\n", 1)
    assert package.startswith(str(installed[0].parent)) and "site-packages" in package  # not this checkout
    assert "ExecStart=/opt/ascend-fleet/venv/bin/vllm serve /" in unit
    assert "--quantization ascend" in unit and "--no-enable-prefix-caching" in unit
