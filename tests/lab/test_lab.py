"""The rehearsal lab itself: real nodes, reboots, reachability, groups, and a clean teardown."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from tests.lab.conftest import BIN, PROJECT, TEST_LAB_DIR, TEST_NET, Lab, require_root

pytestmark = pytest.mark.lab


def test_pyinfra_runs_a_command_on_every_node(lab):
    result = lab.pyinfra("exec", "--", "echo ran-on-$(hostname)")
    for node in ("gateway", "worker1", "worker2", "worker3"):
        assert f"[{node}] ran-on-{node}" in result.stdout
    # pyinfra's own summary: 4 hosts, 4 successes, no errors.
    assert re.search(r"Grand total\s+4\s+4\s+-", result.stdout), result.stdout


@pytest.mark.parametrize("group, members", [
    ("canary", {"worker1"}), ("wave1", {"worker2"}), ("wave2", {"worker3"}),
    ("workers", {"worker1", "worker2", "worker3"}), ("gateway", {"gateway"}),
])
def test_inventory_groups_follow_the_rollout_waves(lab, group, members):
    result = lab.pyinfra("exec", "--limit", group, "--", "echo in-group-$(hostname)")
    answered = {node for node in ("gateway", "worker1", "worker2", "worker3") if f"in-group-{node}" in result.stdout}
    assert answered == members


def test_reboot_brings_the_node_back_with_a_new_boot_id_and_its_files(lab):
    node = "worker2"
    lab.run(node, "echo written-before-reboot > /root/marker && sync")
    before = lab.boot_id(node)
    lab.pyinfra("server.reboot", "--limit", node)
    assert lab.boot_id(node) != before
    assert lab.run(node, "cat /root/marker").stdout.strip() == "written-before-reboot"
    assert lab.run(node, "systemctl is-system-running --wait").stdout.strip() in ("running", "degraded")
    assert lab.run(node, "findmnt -n -o FSTYPE /mnt/nvme").stdout.strip() == "ext4"
    # The node's own /proc views come back with it (they failed once at an early-boot cgroup race).
    assert lab.run(node, "systemctl is-active ascend-lab-proc").stdout.strip() == "active"
    assert float(lab.run(node, "cut -d' ' -f1 /proc/uptime").stdout) < 300


def test_nodes_reach_each_other_and_the_mirror_and_nothing_else(lab):
    status = lab.status()
    host = status["mirror"]["url"].split("//")[1].split(":")[0]
    lab.run("worker1", "ping -c1 -W2 worker2 && ping -c1 -W2 gateway")
    assert lab.run("worker1", f"curl -fsS -o /dev/null -w '%{{http_code}}' {status['mirror']['url']}/simple/").stdout == "200"
    # The host's other services (its sshd) are closed to the nodes; no route leads elsewhere.
    assert lab.run("worker1", f"curl -sS -m 3 http://{host}:22/", check=False).returncode != 0
    assert lab.run("worker1", "curl -sS -m 3 http://203.0.113.80/", check=False).returncode != 0
    # The Debian archive is reachable only through the mirror's proxy.
    lab.run("worker3", "apt-get update -q")


def test_the_status_and_ssh_commands_show_every_node_running_and_log_into_it(lab):
    # The other tests read the status and ssh in-process, through the functions these commands run.
    report = json.loads(lab.cli("lab", "status", "--json").stdout)
    assert {n["name"]: n["state"] for n in report["nodes"]} == dict.fromkeys(
        ("gateway", "worker1", "worker2", "worker3"), "running")
    assert report["mirror"]["running"]
    assert lab.cli("lab", "ssh", "worker2", "--", "hostname").stdout.strip() == "worker2"


def test_nodes_report_their_simulated_hardware(lab):
    hardware = json.loads(lab.run("worker1", "cat /etc/ascend-lab/hardware.json").stdout)
    assert hardware["npu_count"] == 8 and hardware["chip"] == "910B3"
    assert hardware["npu_health"] == ["OK"] * 8
    mem_total_kb = int(lab.run("worker1", "awk '/MemTotal/ {print $2}' /proc/meminfo").stdout)
    assert mem_total_kb == hardware["ram_gb"] * 1024 * 1024
    size = int(lab.run("worker1", "df --output=size -B1 /mnt/nvme | tail -1").stdout)
    assert 7 * 1024**3 < size <= 8 * 1024**3


def test_every_node_runs_in_cgroups_of_its_own(lab):
    """Nodes sharing one cgroup tree fail each other's units: a unit starting on one node while
    the same unit ends on another finds its cgroup removed (219/CGROUP, issue 17)."""
    trees = {}
    for node in lab.nodes:
        nspawn = (TEST_LAB_DIR / "nodes" / node / "nspawn.pid").read_text().strip()
        init = Path(f"/proc/{nspawn}/task/{nspawn}/children").read_text().split()[0]
        trees[node] = Path(f"/proc/{init}/cgroup").read_text()
        assert f"ascend-fleet-lab-t{TEST_NET}-{node}/" in trees[node], trees[node]
    assert len(set(trees.values())) == len(trees), trees


def lab_footprint(lab_dir: Path, name: str, pids: list[int]) -> list[str]:
    """What of a lab is on the host: links, mounts, firewall table, cgroups, processes."""
    leftovers = []
    mounts = Path("/proc/mounts").read_text()
    leftovers += [f"mount {line.split()[1]}" for line in mounts.splitlines() if str(lab_dir) in line]
    leftovers += [f"link {p.name}" for p in Path("/sys/class/net").iterdir() if p.name.startswith(f"af-{name}")]
    # Each lab process leads its own process group: nothing of those groups may be left (nginx workers).
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, _, pgrp = stat.read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError):
            continue
        if int(pgrp) in pids and state != "Z":
            leftovers.append(f"process {stat.parent.name} (group {pgrp})")
    nft = os.popen("nft list tables").read()
    leftovers += [f"nft table af_{name}"] if f"af_{name}" in nft else []
    leftovers += [f"cgroup {path}" for path in Path("/sys/fs/cgroup").glob(f"**/ascend-fleet-lab-{name}-*")]
    return leftovers


def one_worker_lab(suffix: str) -> Lab:
    """A lab of one worker and a gateway, of its own (subnet N+1), up anew."""
    require_root()
    lab = Lab(TEST_LAB_DIR.with_name(f"{TEST_LAB_DIR.name}-{suffix}"), f"d{TEST_NET}", f"10.213.{TEST_NET + 1}.0/24")
    lab.down()
    lab.up(1)
    return lab


def test_lab_down_leaves_nothing_behind_even_after_a_crash(tmp_path):
    lab = one_worker_lab("teardown")
    name = lab.name
    state = json.loads((lab.lab_dir / "state.json").read_text())
    pids = [r["pid"] for r in state["resources"] if r["kind"] == "process"]
    netns = [r["name"] for r in state["resources"] if r["kind"] == "netns"]
    assert pids and netns and lab_footprint(lab.lab_dir, name, pids)

    # A crash: every lab process killed at once, nothing told to clean up.
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    lab.down()
    assert lab_footprint(lab.lab_dir, name, pids) == []
    assert not any(Path("/run/netns", n).exists() for n in netns)
    assert not lab.lab_dir.exists()
    # Idempotent: a second down finds nothing to do.
    assert "nothing to remove" in lab.cli("lab", "down").stdout


def test_a_running_lab_grows_by_a_worker_and_a_failed_growth_removes_only_what_it_added(tmp_path):
    lab = one_worker_lab("grow")
    name = lab.name
    try:
        booted = lab.boot_id("worker1")
        # worker2's host key cannot be made: lab up fails in one line, after worker2's links were made.
        tools = tmp_path / "bin"
        tools.mkdir()
        (tools / "ssh-keygen").write_text("#!/bin/sh\necho 'ssh-keygen: no entropy' >&2\nexit 1\n")
        (tools / "ssh-keygen").chmod(0o755)
        failed = subprocess.run([str(BIN / "ascend-fleet"), "lab", "up", "--nodes", "2", "--name", name, "--subnet",
                                 lab.subnet], env={**lab.env, "PATH": f"{tools}:{os.environ['PATH']}"}, cwd=PROJECT,
                                capture_output=True, text=True, timeout=300)
        assert failed.returncode == 1 and "host key for worker2" in failed.stderr, failed.stdout + failed.stderr
        assert [n["name"] for n in lab.status()["nodes"]] == ["gateway", "worker1"]
        assert not [p.name for p in Path("/sys/class/net").iterdir()
                    if p.name == f"af-{name}-2" or p.name.startswith(f"n{name}-2-")]
        assert not Path(f"/run/netns/af-{name}-worker2").exists() and not (lab.lab_dir / "nodes/worker2").exists()
        assert lab.boot_id("worker1") == booted

        lab.up(2)
        assert [(n["name"], n["state"]) for n in lab.status()["nodes"]] == [
            ("gateway", "running"), ("worker1", "running"), ("worker2", "running")]
        assert lab.boot_id("worker1") == booted
        worker2 = lab.address("worker2")
        assert lab.run("worker1", "getent hosts worker2").stdout.split()[0] == worker2
        assert lab.run("worker2", "hostname").stdout.strip() == "worker2"
        # Anything else than more workers is another lab.
        refused = lab.cli("lab", "up", "--nodes", "1", "--name", name, "--subnet", lab.subnet, check=False)
        assert refused.returncode == 1 and "only grows" in refused.stderr, refused.stdout + refused.stderr
    finally:
        lab.down()
    assert not lab.lab_dir.exists()
    assert not [p.name for p in Path("/sys/class/net").iterdir() if p.name.startswith((f"af-{name}", f"n{name}-"))]
