"""A site behind a bastion (issue 30), on a lab of its own brought up with `lab up --bastion`: a jump
node on the lab bridge, and no way from this machine (the control machine) to the gateway and the
worker but through it, except the gateway's serving port, which clients reach as they reach a site's
load balancer. The lab inventory reaches the nodes with an ssh config (ProxyJump bastion) given as
each host's `ssh_config_file`; the deploy, `status`, a rollout and `bench --instance` run as usual.

One worker: the proof is the path, which is the same for one worker as for many, and a rollout under
load still means something with one, as each of its two instances leaves the gateway while the other
serves. The module deploys once (its fixture) and runs its tests in file order: status, the
rollout, then the benchmark on the rolled-out fleet.
"""

from __future__ import annotations

import errno
import json
import socket
import subprocess
import time

import pytest

from ascend_fleet.lab.lab import ssh_dir
from tests.lab.conftest import INSTANCES, Lab, brought_up, module_lab, needs_bench_venv
from tests.lab.test_bench import BENCH_TIMEOUT_SECONDS, SMALL_RUN
from tests.lab.test_full_deploy import changed_operations, chat_through_gateway, totals
from tests.lab.test_rollout import LOAD_RESULTS, buffsize_data, instance_env, under_load

pytestmark = [pytest.mark.lab, pytest.mark.part("unit-sim")]  # placed to balance scripts/test's parts

WORKER = "worker1"
TIMINGS: dict[str, float] = {}


@pytest.fixture(scope="module")
def lab():
    """A bastion lab of one worker and a gateway, of its own (subnet N+7), up anew."""
    yield from brought_up(module_lab("bastion", "b", 7), 1, "--bastion")


@pytest.fixture(scope="module")
def deployed(lab):
    """The full deploy on fresh nodes, through the bastion, timed."""
    started = time.monotonic()
    first = lab.pyinfra("deploys/full.py", timeout=3600)
    TIMINGS["first"] = time.monotonic() - started
    return first.stdout


def address(lab: Lab, node: str) -> str:
    return next(n for n in lab.status()["nodes"] if n["name"] == node)["address"]


def test_this_machine_has_no_route_to_the_nodes_and_reaches_them_through_the_bastion(lab):
    worker = address(lab, WORKER)
    for node in (WORKER, "gateway"):
        with pytest.raises(OSError) as refused:
            socket.create_connection((address(lab, node), 22), timeout=10).close()
        assert refused.value.errno == errno.EHOSTUNREACH, (node, refused.value)
    keys = ssh_dir(lab.lab_dir)
    direct = subprocess.run(["ssh", "-i", str(keys / "id_ed25519"), "-o", f"UserKnownHostsFile={keys / 'known_hosts'}",
                             "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10",
                             f"root@{worker}", "true"], capture_output=True, text=True, timeout=60)
    assert direct.returncode == 255 and "No route to host" in direct.stderr, direct.stderr
    # `lab ssh`'s way (Lab.run): the worker sees the connection come from the bastion.
    seen_from = lab.run(WORKER, "echo $SSH_CONNECTION").stdout.split()[0]
    assert seen_from == address(lab, "bastion")


def test_the_first_deploy_through_the_bastion_serves_through_the_gateway(lab, deployed):
    assert totals(deployed)["errors"] == 0
    reply = chat_through_gateway(lab)
    assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"]


def test_a_rerun_through_the_bastion_changes_nothing(lab, deployed):
    started = time.monotonic()
    again = lab.pyinfra("deploys/full.py")
    TIMINGS["second"] = time.monotonic() - started
    counts = totals(again.stdout)
    assert counts["changed"] == 0 and counts["errors"] == 0, changed_operations(again.stdout)
    print(f"bastion lab full deploy: first run {TIMINGS['first']:.0f}s, second run {TIMINGS['second']:.0f}s")


def test_status_through_the_bastion_is_green(lab, deployed):
    result = lab.cli("status", lab.inventory, "--json", check=False)
    reading = json.loads(result.stdout)
    assert result.returncode == 0 and reading["ok"], result.stdout[-3000:] + result.stderr[-3000:]
    rows = [instance for host in reading["hosts"] for instance in host["instances"]]
    assert len(rows) == len(INSTANCES)
    assert all(row["health"] == 200 and row["routed"] == "yes" for row in rows), rows


def test_a_rollout_through_the_bastion_under_load_fails_no_request(lab, deployed):
    """A real change (HCCL_BUFFSIZE) to both instances, one at a time, under a bounded load through the
    gateway: the rollout's deploys, gates and drains reach the nodes through the bastion."""
    assert "HCCL_BUFFSIZE=256" not in instance_env(lab, WORKER)
    with under_load(f"http://{address(lab, 'gateway')}", "bastion rollout"):
        result = lab.cli("rollout", lab.inventory, "deploys/serve.py", "--data", buffsize_data(256),
                         "--max-unavailable", "1", "--json", check=False, timeout=3600)
    record = json.loads(result.stdout) if result.stdout.strip() else {}
    assert result.returncode == 0 and record.get("ok"), result.stdout[-3000:] + result.stderr[-3000:]
    assert [(s["instances"], s["status"]) for s in record["steps"]] == [
        ([f"{WORKER}/{instance}"], "done") for instance in INSTANCES]
    assert instance_env(lab, WORKER).count("HCCL_BUFFSIZE=256") == len(INSTANCES)
    summary = LOAD_RESULTS["bastion rollout"]
    assert summary["requests"] > 20 and summary["errors"] == 0, summary


@needs_bench_venv
def test_bench_of_one_instance_goes_through_a_tunnel_over_the_bastion(lab, deployed, tmp_path):
    result = lab.cli("bench", lab.inventory, "--instance", f"{WORKER}/vllm-0", *SMALL_RUN,
                     "--slo", "ttft_ms=600000,tpot_ms=60000", "--result-dir", str(tmp_path), check=False,
                     timeout=BENCH_TIMEOUT_SECONDS)
    saved = [json.loads(path.read_text()) for path in tmp_path.glob("*.json")]
    assert result.returncode == 0 and saved, result.stdout[-3000:] + result.stderr[-3000:]
    assert saved[0]["ascend_fleet"]["instance"] == f"{WORKER}/vllm-0"
    assert saved[0]["completed"] == 12 and saved[0]["failed"] == 0
