"""`ascend-fleet plan --models-dir`: a directory the plan does not read is refused, not ignored."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from ascend_fleet import PROJECT_ROOT
from ascend_fleet.cli import build_app
from ascend_fleet.core.errors import FleetError

MODEL = PROJECT_ROOT / "tests" / "fixtures" / "models" / "qwen3.5-27b"  # group_data/prod.py's model
runner = CliRunner()


@pytest.mark.parametrize("args, message", [
    (["inventories/prod.py", "--models-dir", "/nonexistent"],
     "plan: --models-dir /nonexistent: no such directory; pass the directory holding "
     "<org>/<name>/<revision>/config.json, or leave the option out"),
    (["--models-dir", "{tmp}", "--model-config", str(MODEL)],
     "plan: --models-dir {tmp} is read only with an INVENTORY; pass one, or drop --models-dir"),
    (["inventories/prod.py", "--models-dir", "{tmp}", "--model-config", str(MODEL)],
     "plan: --models-dir {tmp} is not read when --model-config names the config; drop one of them"),
], ids=["no such directory", "without an inventory", "beside --model-config"])
def test_a_models_dir_the_plan_would_not_read_is_refused_in_one_line(tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(PROJECT_ROOT)
    result = runner.invoke(build_app(), ["plan", *(arg.format(tmp=tmp_path) for arg in args)])
    assert isinstance(result.exception, FleetError)  # the console entry prints it as one line, exit 1
    assert str(result.exception) == message.format(tmp=tmp_path)
    assert result.output == ""  # refused before any plan is printed


def test_a_models_dir_with_the_fleets_config_is_planned_from(tmp_path, monkeypatch):
    revision = tmp_path / "Eco-Tech" / "Qwen3.5-27B-w8a8-mtp" / "master"
    revision.mkdir(parents=True)
    (revision / "config.json").write_text((MODEL / "config.json").read_text())
    monkeypatch.chdir(PROJECT_ROOT)
    result = runner.invoke(build_app(), ["plan", "inventories/prod.py", "--models-dir", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
