"""A lab test's failed deploy keeps the whole output of the run: the first failing operation of a
long deploy lies far above the end that the error message shows."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from ascend_fleet.core.errors import FleetError
from ascend_fleet.lab import mirror
from tests.lab import conftest
from tests.lab.conftest import FAILURE_TAIL, Lab


def test_a_failed_deploy_names_a_file_holding_its_whole_output(tmp_path, monkeypatch):
    monkeypatch.setattr(conftest, "TEST_LOGS", tmp_path / "test-logs")
    # pyinfra on this machine, as a lab fixture runs it: a first failure, then more output than the message keeps.
    lab = Lab(tmp_path / "lab", "failing", "10.213.99.0/24", inventory="@local")
    script = f"echo 'Error: the first failing operation'; seq 1 {FAILURE_TAIL}; exit 3"
    with pytest.raises(AssertionError) as failed:
        lab.pyinfra("exec", "--", script)
    message = str(failed.value)
    saved = re.search(r"its whole output: (\S+)", message)
    assert saved, message[:500]
    output = Path(saved.group(1)).read_text()
    assert output.startswith("$ pyinfra @local exec -- echo")
    assert output.index("Error: the first failing operation") < output.index("[@local] 1\n") < len(output) - 2000
    assert f"[@local] {FAILURE_TAIL}\n" in output
    # The message keeps the output's end, and the lines that say error however far up they are.
    assert f"[@local] {FAILURE_TAIL}\n" in message and "[@local] 1\n" not in message
    assert "Error: the first failing operation" in message


def test_a_lab_mirror_that_does_not_listen_is_refused_with_how_it_ended_and_its_logs_ends(tmp_path):
    """`lab up` removes the mirror's directory when it fails: the error says how its nginx ended and
    quotes its error.log and its output."""
    (tmp_path / "error.log").write_text("2026/12/06 16:00:00 [emerg] 1#1: bind() to 10.213.203.1:8080 failed "
                                        "(98: Address in use)\n")
    (tmp_path / "nginx.out").write_text("")
    failed = subprocess.Popen(["sh", "-c", "exit 1"])  # a child that exits at once, as nginx does on a bind error
    with pytest.raises(FleetError) as refused:
        mirror.wait_for_port("127.0.0.1", 9, failed.pid, tmp_path)
    assert str(refused.value) == ("lab: the mirror did not listen on 127.0.0.1:9 (its nginx exited with status 1); "
                                  "its error.log ends: 2026/12/06 16:00:00 [emerg] 1#1: bind() to 10.213.203.1:8080 "
                                  "failed (98: Address in use); its output: (empty log)")
    killed = subprocess.Popen(["sleep", "60"])
    killed.kill()
    with pytest.raises(FleetError, match=r"\(its nginx was killed by signal 9\)"):
        mirror.wait_for_port("127.0.0.1", 9, killed.pid, tmp_path)
