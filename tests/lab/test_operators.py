"""Several operators on one fleet (issue 30): the fleet lease on the lab's gateway (fleetlease.py).

Two control machines are stood in for by two fleet_state_dirs on this machine (`--data
fleet_state_dir=...`, each its own copy of the records, as each machine has): they share nothing but
the fleet. Each rollout is of worker1 one instance at a time (`--limit worker1 --max-unavailable 1`:
two steps, whatever number of workers the lab has), with the data the fleet serves, so the tests leave
the lab as they found it. The module runs on the second lab after test_rollout (tests/conftest.py),
as it found it; alone, on a lab of one worker.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from ascend_fleet.core.node_layout import FLEET_LEASE_DIR, GATEWAY_CONFIG
from ascend_fleet.lab.lab import node_dir, ssh_argv
from ascend_fleet.lab.state import LabState
from tests.lab.conftest import BIN, PROJECT, Lab

pytestmark = pytest.mark.lab

ROLLOUT = ("rollout", "inventories/lab.py", "deploys/serve.py", "--limit", "worker1", "--max-unavailable", "1")
# The processes a node runs for an SSH client: in a login session's scope (logind), else in ssh.service.
SSH_CLIENT_PROCESSES = r"""me=$(ps -o sid= -p $$ | tr -d ' ')
for p in /proc/[0-9]*; do
  case "$(cat $p/cgroup 2>/dev/null)" in *session-*|*ssh.service*) ;; *) continue ;; esac
  [ "$(ps -o sid= -p ${p#/proc/} | tr -d ' ')" = "$me" ] && continue
  args=$(tr '\0' ' ' < $p/cmdline 2>/dev/null)
  case "$args" in sshd*|'') continue ;; esac
  echo "${p#/proc/} $args"
done"""


@pytest.fixture(scope="module")
def lab(second_lab):
    return second_lab if LabState.load(second_lab.lab_dir) else second_lab.with_workers(1)


@pytest.fixture(scope="module")
def serving(lab):
    lab.pyinfra("deploys/full.py", timeout=3600)
    return lab


def operator(tmp_path: Path, name: str) -> list[str]:
    """The --data of an operator's control machine: its own fleet state directory."""
    return ["--data", f"fleet_state_dir={tmp_path / name}"]


def start_rollout(lab: Lab, tmp_path: Path, name: str) -> subprocess.Popen:
    return subprocess.Popen([str(BIN / "ascend-fleet"), *ROLLOUT, *operator(tmp_path, name)], env=lab.env,
                            cwd=PROJECT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def children(pid: int) -> list[int]:
    return [int(child) for child in subprocess.run(["pgrep", "-P", str(pid)], capture_output=True,
                                                   text=True).stdout.split()]


def running_deploy(rollout: subprocess.Popen, deploy: str, timeout: float = 600) -> list[int]:
    """The rollout's pyinfra children once one runs `deploy`."""
    deadline = time.monotonic() + timeout
    while True:
        found = [pid for pid in children(rollout.pid) if deploy in command_line(pid)]
        if found:
            return found
        assert rollout.poll() is None and time.monotonic() < deadline, (rollout.communicate()[0] or "")[-4000:]
        time.sleep(0.2)


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def lease_holder(lab: Lab) -> str:
    return lab.run("gateway", f"cat {FLEET_LEASE_DIR}/lease 2>/dev/null || true").stdout


def ssh_client_processes(lab: Lab, node: str) -> str:
    """`PID ARGS` of each process the node runs for an SSH client other than this check."""
    return lab.run(node, SSH_CLIENT_PROCESSES).stdout


def test_a_command_an_ssh_client_runs_on_a_node_is_seen(serving):
    """The check the kill test relies on sees a command run over SSH (here: one the client left behind)."""
    lab = serving
    client = subprocess.Popen([*ssh_argv(lab.lab_dir, LabState.require(lab.lab_dir).spec.node("worker1")),
                               "sleep 3.5"], env=lab.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while "sleep 3.5" not in ssh_client_processes(lab, "worker1"):
            assert time.monotonic() < deadline and client.poll() is None, "the check did not see `sleep 3.5`"
            time.sleep(0.2)
    finally:
        client.kill()
    time.sleep(4)  # ended on the node too
    assert ssh_client_processes(lab, "worker1") == ""


def drained(state_dir: Path) -> list[str] | None:
    try:
        return json.loads((state_dir / "gateway.json").read_text()).get("drained")
    except FileNotFoundError:
        return None


def test_a_plain_deploy_from_a_second_control_machine_is_refused_while_a_rollout_runs(serving, tmp_path):
    lab = serving
    rollout = start_rollout(lab, tmp_path, "alice")
    try:
        running_deploy(rollout, "deploys/routes.py")  # it holds the lease and drains
        plain = lab.pyinfra("deploys/full.py", *operator(tmp_path, "bob"), check=False, timeout=300)
        output = rollout.communicate(timeout=1800)[0]
    finally:
        with contextlib.suppress(ProcessLookupError):
            rollout.kill()
    assert plain.returncode != 0
    refusal = next(line for line in plain.stdout.splitlines() if "the fleet is held by" in line)
    print(f"second operator: {refusal.strip()}")
    assert f": a rollout of deploys/serve.py (pid {rollout.pid}) since " in refusal, refusal
    assert "(lease on gateway gateway); wait for it to end" in refusal, refusal
    assert "Connected" not in plain.stdout  # refused before it connected to any host
    assert rollout.returncode == 0, output[-4000:]
    assert lease_holder(lab) == ""  # released
    # The second control machine takes up the fleet's records, the rollout's among them.
    lab.pyinfra("deploys/gateway.py", *operator(tmp_path, "bob"))
    assert json.loads((tmp_path / "bob" / "rollout.json").read_text())["finished"]
    assert drained(tmp_path / "bob") == drained(tmp_path / "alice") == []


def test_a_rollout_killed_with_kill_9_leaves_no_pyinfra_running_here_or_on_a_node(serving, tmp_path):
    lab = serving
    rollout = start_rollout(lab, tmp_path, "alice")
    try:
        pyinfra = running_deploy(rollout, "deploys/serve.py")
        time.sleep(2)  # connected, and at work on worker1
        os.kill(rollout.pid, signal.SIGKILL)
        rollout.wait()
    finally:
        with contextlib.suppress(ProcessLookupError):
            rollout.kill()
    time.sleep(5)
    assert not [pid for pid in pyinfra if command_line(pid)], "the rollout's pyinfra outlived it"
    mine = subprocess.run(["pgrep", "-af", f"fleet_state_dir={tmp_path / 'alice'}"], capture_output=True, text=True)
    assert mine.stdout == ""
    for node in lab.nodes:
        assert ssh_client_processes(lab, node) == "", node
    # The killed rollout's lease is free at once from its own control machine: --abandon puts back
    # what it drained.
    abandon = lab.cli("rollout", "inventories/lab.py", "--abandon", *operator(tmp_path, "alice"), check=False)
    assert abandon.returncode == 0, abandon.stdout + abandon.stderr
    assert drained(tmp_path / "alice") == []
    assert " down;" not in lab.run("gateway", f"cat {GATEWAY_CONFIG}").stdout


def test_with_the_gateway_down_the_rollout_stops_saying_so_and_records_nothing_drained(serving, tmp_path):
    lab = serving
    hold = node_dir(lab.lab_dir, "gateway") / "hold"
    hold.touch()
    try:
        lab.run("gateway", "systemctl reboot --force --force", check=False, timeout=30)
        deadline = time.monotonic() + 60
        while lab.run("gateway", "true", check=False, timeout=30).returncode == 0:
            assert time.monotonic() < deadline, "the gateway did not go down"
            time.sleep(0.5)
        started = time.monotonic()
        result = lab.cli(*ROLLOUT, *operator(tmp_path, "alice"), check=False, timeout=300)
        elapsed = time.monotonic() - started
    finally:
        hold.unlink(missing_ok=True)
    assert result.returncode != 0
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("error: rollout changed nothing: the fleet lease on gateway gateway "), line
    assert "cannot connect" in line and "bring the gateway back" in line, line
    assert drained(tmp_path / "alice") is None and not (tmp_path / "alice" / "rollout.json").exists()
    print(f"gateway down: refused in {elapsed:.1f}s: {line}")
    lab.wait_running("gateway", timeout=180)
    deadline = time.monotonic() + 120
    while lab.run("gateway", "true", check=False).returncode != 0:
        assert time.monotonic() < deadline, "the gateway's sshd did not answer"
        time.sleep(1)
