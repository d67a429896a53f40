"""`ascend-fleet status` on the lab after a full deploy: every instance healthy at the profile's
versions; a stopped instance turns red at the next reading of `--watch`; an unreachable host is a
red row, not a crash."""

from __future__ import annotations

import json
import platform
import subprocess
import time
from datetime import datetime, timezone

import pytest

from ascend_fleet.config.profile import load_profile
from ascend_fleet.core.node_layout import instance_unit
from tests.lab.conftest import BIN, PROJECT, TEST_NET, Lab
from tests.lab.test_monitoring import wait_for

pytestmark = pytest.mark.lab

WATCH_INTERVAL_SECONDS = 2


@pytest.fixture(scope="module")
def fleet(lab: Lab) -> Lab:
    """A converged fleet (the full deploy is a no-op if another module already ran it)."""
    lab.pyinfra("deploys/full.py", timeout=3600)
    return lab


def status(lab: Lab, *args: str) -> tuple[dict, subprocess.CompletedProcess]:
    result = lab.cli("status", "inventories/lab.py", "--json", *args, check=False)
    return json.loads(result.stdout), result


def instances(reading: dict) -> dict[str, dict]:
    return {f"{host['host']}/{i['name']}": i for host in reading["hosts"] for i in host["instances"]}


def test_every_instance_is_healthy_at_the_profiles_versions(fleet):
    started = time.monotonic()
    reading, result = status(fleet)
    elapsed = time.monotonic() - started
    assert result.returncode == 0 and reading["ok"], result.stdout[-3000:]
    profile = load_profile("lab")
    stack = profile.stack
    # torch_npu: the build the profile puts over the wheel's pin, for the lab's arch (this machine's)
    expected = {"driver": stack.driver, "firmware": stack.firmware, "cann": stack.cann,
                "torch_npu": profile.node_version("torch-npu", platform.machine()), "vllm_ascend": stack.vllm_ascend}
    workers = [host for host in reading["hosts"] if host["role"] == "worker"]
    assert [host["host"] for host in workers] == fleet.workers
    for host in workers:
        assert {k: v["installed"] for k, v in host["versions"].items()} == expected
        assert not any(v["drift"] for v in host["versions"].values())
    rows = instances(reading)
    assert len(rows) == 2 * len(workers)
    for row in rows.values():
        assert row["unit"]["ActiveState"] == "active" and row["health"] == 200
        assert (row["model"], row["revision"], row["routed"]) == ("lab/Qwen3-Tiny", "v1", "yes")
        assert row["npu_health"] == ["OK"] * 4 and row["hbm_used_mb"] > 0
        assert row["metrics"]["kv_cache_usage"] is not None and row["metrics"]["waiting"] == 0
    gateway = next(host for host in reading["hosts"] if host["role"] == "gateway")
    assert gateway["services"]["nginx"]["ActiveState"] == "active" and len(gateway["routes"]) == len(rows)
    table = fleet.cli("status", "inventories/lab.py").stdout
    assert "≠" not in table and table.count("lab/Qwen3-Tiny@v1") == len(rows)
    print(f"status: {len(reading['hosts'])} hosts, {len(rows)} instances read in {reading['seconds']}s "
          f"({elapsed:.1f}s with start-up)")


def test_a_stopped_instance_turns_red_at_the_next_reading(fleet):
    watch = subprocess.Popen([str(BIN / "ascend-fleet"), "status", "inventories/lab.py", "--watch", "--json",
                              "--interval", str(WATCH_INTERVAL_SECONDS)],
                             env=fleet.env, cwd=PROJECT, stdout=subprocess.PIPE, text=True)
    try:
        assert json.loads(watch.stdout.readline())["ok"]
        fleet.run("worker2", f"systemctl stop {instance_unit('vllm-1')}")  # returns once the unit has stopped
        stopped_at = datetime.now(timezone.utc)
        # The first reading started after the stop must show it (one in flight may not).
        while True:
            reading = json.loads(watch.stdout.readline())
            if datetime.fromisoformat(reading["read_at"]) >= stopped_at:
                break
    finally:
        watch.terminate()
        watch.wait(timeout=30)
        fleet.run("worker2", f"systemctl start {instance_unit('vllm-1')}")
    assert not reading["ok"]
    row = instances(reading)["worker2/vllm-1"]
    assert row["unit"]["ActiveState"] in ("inactive", "deactivating")
    assert row["problems"][0].startswith("unit ") and "/health answers nothing" in row["problems"]
    assert all(r["ok"] for name, r in instances(reading).items() if name != "worker2/vllm-1")
    # Without --watch, a red row is exit code 1; back to 0 once the unit runs again and the gateway's route
    # watcher has seen it pass (isolation.passes checks, a second apart: "isolated" until then).
    wait_for("status exit code 0 after the start", lambda: status(fleet)[1].returncode == 0, timeout=30)


def test_an_unreachable_host_is_a_red_row_and_the_rest_still_reads(fleet):
    address = fleet.address("worker3")
    # Refuse SSH to worker3 from this machine: the node keeps serving, nobody can log in.
    table = f"ascend_fleet_test_{TEST_NET}"
    subprocess.run(["nft", "-f", "-"], check=True, text=True, input=(
        f"table inet {table} {{\n chain out {{\n type filter hook output priority 0;\n"
        f" ip daddr {address} tcp dport 22 reject with tcp reset\n }}\n}}\n"))
    try:
        reading, result = status(fleet)
    finally:
        subprocess.run(["nft", "delete", "table", "inet", table], check=True)
    assert result.returncode == 1
    worker3 = next(host for host in reading["hosts"] if host["host"] == "worker3")
    assert worker3["error"].startswith("cannot connect over SSH")
    assert all(not i["ok"] for i in worker3["instances"])
    assert all(i["ok"] for name, i in instances(reading).items() if not name.startswith("worker3/"))
