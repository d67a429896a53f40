"""Rollouts, model swaps and a node rebuilt from bare metal, on a serving lab under load.

A load generator streams chat completions through the gateway the whole time; every
request it sent is counted, and the rollouts, the swaps (instance by instance, and blue/green)
and the rebuild must fail none of them.
The tests run on the second lab (after test_full_deploy has left it converged, or from fresh nodes
when run alone), each from the configuration it needs (set with a plain serve deploy when the fleet
is not there), in any order, and leave it serving lab/Qwen3-Tiny v1 on the blue instances of the
lab's data.
"""

from __future__ import annotations

import json
import runpy
import time
from contextlib import contextmanager

import pytest

from ascend_fleet.control.loadgen import LoadGenerator
from ascend_fleet.core.node_layout import GATEWAY_CONFIG, instance_env_file, instance_unit, unit_file
from ascend_fleet.lab.lab import fleet_state_dir
from tests.lab.conftest import ALL_AT_ONCE, INSTANCES, PROJECT, Lab, down_windows

pytestmark = pytest.mark.lab

MODEL = "lab/Qwen3-Tiny"
NPU_ENV = runpy.run_path(str(PROJECT / "group_data" / "all.py"))["npu_env"]
FAULT_DROPIN = f"{unit_file(instance_unit('vllm-0'))}.d/fault.conf"
LOAD_RESULTS: dict[str, dict] = {}



@pytest.fixture(scope="module")
def lab(second_lab):
    """Beside the session lab's tests, not after them: the module is scripts/test's longest."""
    return second_lab.with_workers(3)


@pytest.fixture(scope="module")
def serving(lab):
    lab.pyinfra("deploys/full.py", timeout=3600)
    return f"http://{lab.address('gateway')}"


@contextmanager
def under_load(gateway: str, name: str):
    """Streaming chat through the gateway while the block runs; the report is kept under `name`."""
    generator = LoadGenerator(gateway, MODEL, concurrency=3, max_tokens=16).start()
    try:
        yield generator
    finally:
        report = generator.stop()
        LOAD_RESULTS[name] = report.summary()
        print(f"load during {name}: {json.dumps(LOAD_RESULTS[name])}")


def buffsize_data(size: int) -> str:
    return "npu_env=" + json.dumps({**{k: str(v) for k, v in NPU_ENV.items()}, "HCCL_BUFFSIZE": str(size)})


def instance_env(lab: Lab, node: str) -> str:
    return lab.run(node, f"cat {' '.join(map(instance_env_file, INSTANCES))}").stdout


def unit_starts(lab: Lab, node: str) -> str:
    units = " ".join(map(instance_unit, INSTANCES))
    return lab.run(node, f"systemctl show -P ActiveEnterTimestampMonotonic {units}").stdout


def gateway_config(lab: Lab) -> str:
    return lab.run("gateway", f"cat {GATEWAY_CONFIG}").stdout


def buffsizes(lab: Lab) -> list[str]:
    """The HCCL_BUFFSIZE each instance of each worker serves with."""
    return [line for node in lab.workers for line in instance_env(lab, node).splitlines()
            if line.startswith("HCCL_BUFFSIZE=")]


def serving_buffsize(lab: Lab, size: int | None) -> None:
    """Every instance serves with HCCL_BUFFSIZE=size (None: the lab's own data); a plain serve deploy,
    with no load running, puts the fleet there if it is not."""
    wanted = size if size is not None else NPU_ENV["HCCL_BUFFSIZE"]
    if buffsizes(lab) != [f"HCCL_BUFFSIZE={wanted}"] * len(INSTANCES) * len(lab.workers):
        lab.pyinfra("deploys/serve.py", *ALL_AT_ONCE, *(("--data", buffsize_data(size)) if size is not None else ()))


def rollout(lab: Lab, *args: str, check: bool = True):
    result = lab.cli("rollout", "inventories/lab.py", "deploys/serve.py", *args, check=check, timeout=3600)
    return result, json.loads(result.stdout) if "--json" in args and result.stdout.strip() else None


def break_health(lab: Lab, node: str) -> None:
    """The node's vllm-0 comes back from its next restart "started" but never loads (/health stays 503)."""
    lab.run(node, f"mkdir -p {FAULT_DROPIN.rsplit('/', 1)[0]} && printf '%s\\n' '[Service]' "
                  "'Environment=VLLM_SIM_LOAD_BASE_SECONDS=100000' 'ExecStartPost=' 'ExecStartPost=/bin/true' "
                  f"> {FAULT_DROPIN} && systemctl daemon-reload")


def heal(lab: Lab, node: str) -> None:
    """The operator's fix: remove the fault and restart the instance."""
    lab.run(node, f"rm -r {FAULT_DROPIN.rsplit('/', 1)[0]} && systemctl daemon-reload && "
                  f"systemctl restart {instance_unit('vllm-0')}")


def fleet_state(lab: Lab) -> dict[str, str]:
    """The control machine's record of the lab (drained set, colours, rollout) and its pyinfra logs."""
    directory = fleet_state_dir(lab.lab_dir)
    return {path.name: path.read_text() if path.is_file() else str(sorted(p.name for p in path.iterdir()))
            for path in (directory.iterdir() if directory.exists() else [])}


def test_a_config_change_rolls_out_one_instance_at_a_time_without_failing_a_request(lab, serving):
    """Issue 17: --max-unavailable 1 was refused on hosts with two instances, the default layout."""
    if "HCCL_BUFFSIZE=256" in buffsizes(lab):  # the rollout must change every instance
        serving_buffsize(lab, None)
    with under_load(serving, "config rollout"):
        result, record = rollout(lab, "--data", buffsize_data(256), "--max-unavailable", "1", "--json")
    assert record["ok"], result.stderr
    instances = [f"{node}/vllm-{i}" for node in ("worker1", "worker2", "worker3") for i in (0, 1)]
    assert [(s["hosts"], s["instances"], s["status"]) for s in record["steps"]] == [
        ([name.split("/")[0]], [name], "done") for name in instances]
    assert [s["name"] for s in record["steps"]] == ["canary (1/2)", "canary (2/2)", "wave1 (1/2)", "wave1 (2/2)",
                                                    "wave2 (1/2)", "wave2 (2/2)"]
    for node in lab.workers:
        assert instance_env(lab, node).count("HCCL_BUFFSIZE=256") == 2
    # Each instance stopped and served again before the next one stopped, in the steps' order.
    spans = sorted((stopped, active, name) for name, (stopped, active) in down_windows(lab).items())
    assert [name for _, _, name in spans] == instances, spans
    assert all(active < next_stop for (_, active, _), (next_stop, _, _) in zip(spans, spans[1:])), spans
    summary = LOAD_RESULTS["config rollout"]
    assert summary["requests"] > 20 and summary["errors"] == 0, summary
    assert " down;" not in gateway_config(lab)


def test_a_rollout_of_a_deploy_file_that_does_not_exist_changes_nothing(lab, serving):
    before = gateway_config(lab), fleet_state(lab), [unit_starts(lab, node) for node in lab.workers]
    result = lab.cli("rollout", "inventories/lab.py", "deploys/nosuch.py", check=False)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"error: rollout changed nothing: deploys/nosuch.py: no such deploy file in {PROJECT}; pass one of "
        "deploys/*.py, e.g. deploys/full.py, and run ascend-fleet where pyinfra runs"]
    # Nothing drained, nothing recorded, no pyinfra run (its log would be in the state), no restart.
    assert (gateway_config(lab), fleet_state(lab), [unit_starts(lab, node) for node in lab.workers]) == before
    resumed, _ = rollout(lab, "--resume", check=False)
    assert "--resume: no stopped rollout is recorded" in resumed.stderr


def test_a_node_failing_its_health_gate_stops_the_rollout_and_resume_completes_it(lab, serving):
    serving_buffsize(lab, 256)  # where the config rollout leaves the fleet: wave2 must still be there after
    break_health(lab, "worker2")
    wave2_before = unit_starts(lab, "worker3")
    with under_load(serving, "stopped rollout"):
        result, record = rollout(lab, "--data", buffsize_data(512), "--json", check=False)
        assert result.returncode != 0
        assert [s["status"] for s in record["steps"]] == ["done", "failed", "pending"]
        line = result.stderr.strip().splitlines()[-1]
        # The serve stage's gate right after the start, or the rollout's: not listening yet, or 503.
        assert "rollout stopped at wave1" in line and "worker2" in line and "/health answers" in line
        assert "--resume" in line
        # The canary keeps the new config, wave2 is untouched, worker2 is out of the gateway.
        assert instance_env(lab, "worker1").count("HCCL_BUFFSIZE=512") == 2
        assert instance_env(lab, "worker3").count("HCCL_BUFFSIZE=256") == 2
        assert unit_starts(lab, "worker3") == wave2_before
        config = gateway_config(lab)
        worker2 = lab.address("worker2")
        assert f"{worker2}:8000 max_fails=2 fail_timeout=3s;" not in config  # it gets no requests
        assert f"{lab.address('worker3')}:8000 max_fails=2 fail_timeout=3s;" in config
        # A fresh rollout is refused while this one is stopped.
        refused, _ = rollout(lab, "--data", buffsize_data(512), check=False)
        assert "add --resume" in refused.stderr
        heal(lab, "worker2")
        resumed, record = rollout(lab, "--resume", "--json")
    assert record["ok"], resumed.stderr
    assert [s["status"] for s in record["steps"]] == ["done", "done", "done"]
    assert instance_env(lab, "worker3").count("HCCL_BUFFSIZE=512") == 2
    assert " down;" not in gateway_config(lab)
    summary = LOAD_RESULTS["stopped rollout"]
    assert summary["requests"] > 20 and summary["errors"] == 0, summary


def test_a_stopped_rollout_can_be_abandoned_and_the_fleet_is_whole_again(lab, serving):
    break_health(lab, "worker2")
    worker2 = lab.address("worker2")
    with under_load(serving, "abandoned rollout"):
        result, record = rollout(lab, "--data", buffsize_data(1024), "--json", check=False)
        assert [s["status"] for s in record["steps"]] == ["done", "failed", "pending"], result.stderr
        # worker2's vllm-0 still fails its gate: it stays out, named; vllm-1 passes and goes back.
        abandoned = lab.cli("rollout", "inventories/lab.py", "--abandon", check=False)
        assert abandoned.returncode == 1
        assert abandoned.stderr.strip().splitlines()[-1] == (
            "error: rollout abandoned, but worker2/vllm-0 (gate health: /health answers 503) stays out of the "
            "gateway: fix it, then run ascend-fleet rollout inventories/lab.py --abandon again to put it back")
        config = gateway_config(lab)  # vllm-0 gets no requests, vllm-1 does
        assert f"{worker2}:8000 max_fails=2 fail_timeout=3s;" not in config
        assert f"{worker2}:8001 max_fails=2 fail_timeout=3s;" in config
        # The rollout is over: nothing to resume.
        assert "--resume: no stopped rollout is recorded" in rollout(lab, "--resume", check=False)[0].stderr
        heal(lab, "worker2")
        again = lab.cli("rollout", "inventories/lab.py", "--abandon")
    assert again.stdout.strip() == ("abandoned; every instance it drained is back in the gateway. Its change is on "
                                    "canary, maybe on wave1 (where it stopped), not on wave2.")
    config = gateway_config(lab)
    assert " down;" not in config
    for node in lab.workers:
        for port in (8000, 8001):
            assert f"{lab.address(node)}:{port} max_fails=2 fail_timeout=3s;" in config
    summary = LOAD_RESULTS["abandoned rollout"]
    assert summary["requests"] > 20 and summary["errors"] == 0, summary


def instance_get(lab: Lab, node: str, port: int, path: str) -> str:
    """An instance's answer, asked on its node: the instance firewall keeps this machine off its port."""
    return lab.run(node, f"curl -fsS -m 10 http://127.0.0.1:{port}{path}").stdout


def served_roots(lab: Lab) -> set[str]:
    roots = set()
    for node in lab.workers:
        for port in (8000, 8001):
            roots.add(json.loads(instance_get(lab, node, port, "/v1/models"))["data"][0]["root"])
    return roots


def test_a_model_swap_under_load_fails_no_request_and_keeps_the_served_name(lab, serving):
    with under_load(serving, "model swap to v2"):
        result = lab.cli("swap-model", "inventories/lab.py", "--model", MODEL, "--revision", "v2", "--json",
                         timeout=3600)
    record = json.loads(result.stdout)
    # Both instance sets would share NPUs and HBM cannot hold two models at 0.9: one instance at a time.
    assert record["strategy"].startswith("one instance per node at a time (blue/green refused"), record["strategy"]
    assert record["ok"] and len(record["steps"]) == 6  # one step per instance slot of each wave
    assert served_roots(lab) == {f"/mnt/nvme/models/{MODEL}/v2"}
    # v1 is still staged beside v2: swapping back needs no download.
    assert lab.run("worker1", f"ls /mnt/nvme/models/{MODEL}").stdout.split() == ["v1", "v2"]
    summary = LOAD_RESULTS["model swap to v2"]
    assert summary["requests"] > 20 and summary["errors"] == 0, summary
    # The data still names v1: a plain deploy serves it again, as the swap warns (the lab's state for
    # the next test; a swap back under load would be this test once more).
    lab.pyinfra("deploys/serve.py", *ALL_AT_ONCE)
    assert served_roots(lab) == {f"/mnt/nvme/models/{MODEL}/v1"}


# One TP4 instance per worker leaves NPUs 4-7 free: the new model can start beside the old.
ONE_INSTANCE = "instances=" + json.dumps([{"name": "vllm-0", "npus": [0, 1, 2, 3], "port": 8000,
                                           "hccl_base_port": 60000, "vllm_port": 51000}])


def units(lab: Lab, node: str) -> list[str]:
    return lab.run(node, f"systemctl list-units --state=active --no-legend --plain '{instance_unit('vllm*')}' | "
                         "cut -d' ' -f1").stdout.split()


def test_a_blue_green_swap_starts_the_new_model_beside_the_old_and_fails_no_request(lab, serving):
    lab.pyinfra("deploys/serve.py", "--data", ONE_INSTANCE, *ALL_AT_ONCE)  # no load yet
    for node in lab.workers:  # the serve stage stopped the instance the data no longer lists
        assert units(lab, node) == [instance_unit("vllm-0")]
    with under_load(serving, "blue/green swap to v2"):
        result = lab.cli("swap-model", "inventories/lab.py", "--model", MODEL, "--revision", "v2",
                         "--data", ONE_INSTANCE, "--json", timeout=3600)
    record = json.loads(result.stdout)
    assert record["ok"] and record["strategy"] == "blue/green per wave", result.stderr
    assert [s["status"] for s in record["steps"]] == ["done", "done", "done"]
    for node in lab.workers:
        assert units(lab, node) == [instance_unit("vllm-0-green")]
        cards = json.loads(instance_get(lab, node, 8001, "/v1/models"))["data"]
        assert (cards[0]["id"], cards[0]["root"]) == (MODEL, f"/mnt/nvme/models/{MODEL}/v2")
        assert "ASCEND_RT_VISIBLE_DEVICES=4,5,6,7" in lab.run(
            node, f"cat {instance_env_file('vllm-0-green')}").stdout
    config = gateway_config(lab)
    assert ":8001 max_fails" in config and ":8000 max_fails" not in config
    summary = LOAD_RESULTS["blue/green swap to v2"]
    assert summary["requests"] > 20 and summary["errors"] == 0, summary
    with under_load(serving, "blue/green swap back to v1"):
        lab.cli("swap-model", "inventories/lab.py", "--model", MODEL, "--revision", "v1", "--data", ONE_INSTANCE,
                timeout=3600)
    for node in lab.workers:
        assert units(lab, node) == [instance_unit("vllm-0")]
    assert LOAD_RESULTS["blue/green swap back to v1"]["errors"] == 0, LOAD_RESULTS["blue/green swap back to v1"]
    lab.pyinfra("deploys/serve.py", *ALL_AT_ONCE)  # the lab's own data again: two blue instances per worker
    assert served_roots(lab) == {f"/mnt/nvme/models/{MODEL}/v1"}


def requests_served(lab: Lab, node: str) -> float:
    """Prompt tokens an instance has processed: grows only when the gateway sends it requests."""
    total = 0.0
    for port in (8000, 8001):
        text = instance_get(lab, node, port, "/metrics")
        total += sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith("vllm:prompt_tokens_total"))
    return total


def test_a_node_rebuilt_from_bare_metal_comes_back_into_the_gateway_without_failing_a_request(lab, serving):
    with under_load(serving, "reset of worker3"):
        lab.cli("lab", "reset", "worker3")
    assert lab.run("worker3", "test -e /opt/ascend-fleet/venv || test -e /mnt/nvme/models",
                   check=False).returncode != 0, "worker3 kept its stack or its weights"
    with under_load(serving, "rebuild of worker3"):
        result = lab.cli("rollout", "inventories/lab.py", "deploys/full.py", "--limit", "worker3", "--json",
                         timeout=3600)
        record = json.loads(result.stdout)
        # Back in the gateway: it serves requests sent through it.
        before = requests_served(lab, "worker3")
        deadline = time.monotonic() + 60
        while requests_served(lab, "worker3") == before and time.monotonic() < deadline:
            time.sleep(2)
        back_in_gateway = requests_served(lab, "worker3") > before
    assert record["ok"] and [(s["name"], s["hosts"]) for s in record["steps"]] == [("wave2", ["worker3"])]
    assert back_in_gateway, "the gateway sends worker3 no requests after its rebuild"
    boots = {n["name"]: n["boots"] for n in lab.status()["nodes"]}
    assert boots["worker3"] >= 2
    summary = LOAD_RESULTS["rebuild of worker3"]
    assert summary["requests"] > 20 and summary["errors"] == 0, summary
