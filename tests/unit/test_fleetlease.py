"""The fleet lease's rules, with its scripts run on this machine in a temporary directory (conftest.py):
held by another run is refused naming it, stale or ended is taken over, a rollout's child runs under its
parent's lease, released hands the fleet's records to the next control machine."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ascend_fleet.config import fleetlease
from ascend_fleet.config.fleetlease import LEASE_ENV, STALE_SECONDS, FleetLease, Holder, lease_of_deploy
from ascend_fleet.config.fleetstate import FleetState
from ascend_fleet.control.rollout import pyinfra_failure
from ascend_fleet.core.errors import FleetError
from ascend_fleet.core.node_layout import FLEET_LEASE_DIR
from ascend_fleet.fleet.plan import load_inventory

PROJECT = Path(__file__).resolve().parents[2]
GATEWAY = "gw-01.example.internal"


def lease(tmp_path: Path, operator: str, what: str = "a rollout of deploys/serve.py") -> FleetLease:
    """A lease of the control machine whose fleet_state_dir is tmp_path/operator."""
    return FleetLease(GATEWAY, {}, FleetState(tmp_path / operator), what)


def test_a_lease_held_by_another_run_is_refused_naming_it_until_released(tmp_path):
    first, second = lease(tmp_path, "alice"), lease(tmp_path, "bob", "pyinfra deploys/full.py")
    first.take()
    with pytest.raises(FleetError) as refused:
        second.take()
    assert re.fullmatch(rf"the fleet is held by {re.escape(first.holder.who)}: a rollout of deploys/serve.py "
                        rf"\(pid {os.getpid()}\) since .+, last heartbeat [01]s ago \(lease on gateway {GATEWAY}\); "
                        rf"wait for it to end: a lease whose holder crashed is free {STALE_SECONDS}s after its last "
                        "heartbeat", str(refused.value)), refused.value
    first.release()
    second.take()


def test_the_drained_set_one_control_machine_recorded_is_the_next_ones(tmp_path):
    """Two control machines, two fleet_state_dirs: what one leaves on the fleet, the other takes up."""
    alice, bob = lease(tmp_path, "alice"), lease(tmp_path, "bob")
    alice.take()
    alice.state.set_drained({"w1/vllm-0"})
    alice.push()
    alice.state.set_drained({"w1/vllm-0", "w2/vllm-1"})
    alice.release()
    FleetState(tmp_path / "bob").set_drained(set())  # bob's own copy, stale
    bob.take()
    assert bob.state.drained() == {"w1/vllm-0", "w2/vllm-1"}


def test_a_record_is_withheld_from_the_fleet_while_it_is_not_so_yet(tmp_path):
    alice, bob = lease(tmp_path, "alice"), lease(tmp_path, "bob")
    alice.take()
    with alice.withheld("gateway.json"):
        alice.state.set_drained({"w1/vllm-0"})  # the routes deploy applying it fails, say
        alice.push()  # a heartbeat meanwhile
        alice.state.set_drained(set())
    alice.state.save_rollout({"steps": []})
    alice.release()
    bob.take()
    assert bob.state.drained() == set() and bob.state.rollout() == {"steps": []}


def beat_age(lease_host, seconds: int) -> None:
    """The lease's last heartbeat `seconds` ago, as if its holder stopped beating then."""
    path = lease_host.directory / "lease"
    token, beat, rest = re.match(r"(\S+) (\d+)\n(.*)", path.read_text(), re.S).groups()
    path.write_text(f"{token} {int(beat) - seconds}\n{rest}")


def test_a_lease_whose_heartbeat_stopped_goes_stale_and_its_holder_learns_it_lost_it(tmp_path, lease_host):
    """A crashed control machine (another machine: its process cannot be looked up) wedges nothing."""
    crashed, bob = lease(tmp_path, "alice"), lease(tmp_path, "bob")
    object.__setattr__(crashed.holder, "machine", "another-control-machine")
    crashed.take()
    beat_age(lease_host, STALE_SECONDS - 5)
    with pytest.raises(FleetError, match="the fleet is held by"):
        bob.take()
    beat_age(lease_host, 10)
    bob.take()
    with pytest.raises(FleetError, match=rf"the fleet lease on gateway {GATEWAY} was taken over by "
                                         rf"{re.escape(bob.holder.who)}: a rollout .*; this run stops changing"):
        crashed.push()


def test_a_lease_of_a_process_of_this_machine_that_ended_is_taken_at_once(tmp_path):
    """`--resume` right after a `kill -9` of the rollout need not wait for the lease to go stale."""
    killed = lease(tmp_path, "alice")
    ended = subprocess.Popen(["true"])
    ended.wait()
    object.__setattr__(killed.holder, "pid", ended.pid)
    killed.take()
    assert Holder(**vars(killed.holder)).ended()
    lease(tmp_path, "alice").take()


def test_a_rollouts_child_runs_under_its_lease_and_a_plain_deploy_takes_it(tmp_path, monkeypatch, lease_host):
    inventory = load_inventory(PROJECT / "inventories" / "prod.py",
                               override_data={"fleet_state_dir": str(tmp_path / "bob")})
    rollout = lease(tmp_path, "alice")
    rollout.take()
    monkeypatch.setenv(LEASE_ENV, rollout.token)
    assert lease_of_deploy(inventory, ("deploys/full.py",)) is None
    monkeypatch.delenv(LEASE_ENV)
    assert lease_of_deploy(inventory, ("deploys/verify.py",)) is None  # changes nothing that serves
    assert lease_host.ran_on == [GATEWAY]
    with pytest.raises(FleetError, match=r"the fleet is held by .*: a rollout of deploys/serve.py"):
        lease_of_deploy(inventory, ("deploys/full.py",))
    rollout.release()
    plain = lease_of_deploy(inventory, ("deploys/serve.py",))
    monkeypatch.setattr(fleetlease, "HEARTBEAT_SECONDS", 0.1)
    with pytest.raises(FleetError, match=r"held by .*: pyinfra deploys/serve.py \(pid"):
        rollout.take()
    plain.release()


def test_an_unreachable_gateway_is_named_with_why(tmp_path, monkeypatch):
    class Down:
        @staticmethod
        def run_script(host, data, script, timeout):
            raise FleetError(f"cannot connect over SSH to {host}:22: no answer within 10s; check that the host is up")

    monkeypatch.setattr(fleetlease, "remote", Down)
    with pytest.raises(FleetError) as refused:
        lease(tmp_path, "alice").take()
    assert str(refused.value) == (
        f"the fleet lease on gateway {GATEWAY} ({FLEET_LEASE_DIR}) cannot be taken: cannot connect over "
        f"SSH to {GATEWAY}:22: no answer within 10s; check that the host is up; every run that changes the fleet "
        "takes it there: bring the gateway back, then run again")


def test_pyinfra_failing_to_reach_a_host_is_said_instead_of_no_hosts_remaining():
    output = ("--> Connecting to hosts...\n    [gateway] Could not connect ([Errno 113] No route to host)\n"
              "--> pyinfra error: No hosts remaining!\n")
    assert pyinfra_failure(output, ["gateway"]) == ("gateway: cannot connect over SSH ([Errno 113] No route to host); "
                                                    "check that it is up and reachable from here")


CHILD_OF_ROLLOUT = """
import sys
from ascend_fleet.control.rollout import run_child
run_child([sys.executable, "-c", "import time; time.sleep(60)"])
"""


def running_children(pid: int) -> list[int]:
    """The processes whose parent is pid and that run the child's program (past the fork, not zombies)."""
    pids = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [int(child) for child in pids if b"sleep(60)" in read_proc(child, "cmdline")
            and read_proc(child, "stat").split()[2] != b"Z"]


def read_proc(pid: int | str, name: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/{name}").read_bytes()
    except OSError:
        return b""


def test_a_rollouts_child_dies_with_it_even_by_kill_9():
    rollout = subprocess.Popen([sys.executable, "-c", CHILD_OF_ROLLOUT], start_new_session=True)
    deadline = time.monotonic() + 20
    while not (children := running_children(rollout.pid)):
        assert time.monotonic() < deadline, "the rollout started no child"
        time.sleep(0.1)
    os.kill(rollout.pid, signal.SIGKILL)
    rollout.wait()
    time.sleep(1)
    try:
        assert not [pid for pid in children if b"sleep(60)" in read_proc(pid, "cmdline")]
    finally:
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
