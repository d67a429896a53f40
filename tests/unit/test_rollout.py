"""Rollout planning without a fleet: waves from the example inventory, splitting, refusals, state."""

from pathlib import Path

import pytest

from ascend_fleet.config.fleetstate import FleetState
from ascend_fleet.control import rollout
from ascend_fleet.control.loadgen import LoadReport, RequestResult, percentile
from ascend_fleet.control.rollout import (
    Record,
    RolloutInventory,
    Step,
    blue_green_problem,
    check_not_stopped,
    model_data,
    parse_data,
    plan_blue_green,
    plan_rollout,
    pyinfra_failure,
    rollback_record,
    split_wave,
)
from ascend_fleet.core.errors import FleetError
from ascend_fleet.core.node_layout import instance_unit
from ascend_fleet.fleet.plan import ModelConfigs

PROJECT = Path(__file__).resolve().parents[2]
PROD = PROJECT / "inventories" / "prod.py"
QWEN25_72B = PROJECT / "tests" / "fixtures" / "models" / "qwen2.5-72b-instruct"
# The example inventory's hosts as these tests picture them: Qwen2.5-72B at TP4, two instances a
# host (group_data/prod.py's own fleet serves Qwen3.5-27B at TP2, four a host).
TWO_PER_HOST = {
    "profile": "vllm-ascend-0.13.0",
    "tensor_parallel_size": 4,
    "model": {"id": "Qwen/Qwen2.5-72B-Instruct", "revision": "495f39366efef23836d0cfae4fbe635880d2be31",
              "source": "modelscope"},
    "serving": {"max_model_len": 32768, "gpu_memory_utilization": 0.9, "dtype": "float16", "max_num_seqs": 64},
}


@pytest.fixture
def prod(monkeypatch, tmp_path):
    monkeypatch.chdir(PROJECT)  # group_data/ is found where pyinfra runs
    return RolloutInventory(PROD, {**TWO_PER_HOST, "fleet_state_dir": str(tmp_path / "state")})


def test_waves_follow_the_datas_rollout_waves(prod):
    assert prod.waves(None) == [
        ("canary", ["npu-01.example.internal"]),
        ("wave1", ["npu-02.example.internal", "npu-03.example.internal"]),
        ("wave2", ["npu-04.example.internal", "npu-05.example.internal"]),
    ]
    assert prod.gateways == ["gw-01.example.internal", "gw-02.example.internal"]


def test_an_unknown_wave_is_refused_with_the_groups_there_are(prod):
    with pytest.raises(FleetError, match=r"--waves wave9: no such group in .*prod.py; groups: .*canary"):
        prod.waves(["canary", "wave9"])


def test_waves_larger_than_max_unavailable_are_split_by_whole_hosts(prod):
    record = plan_rollout(prod, "deploys/full.py", None, max_unavailable=2)
    assert [(s.name, len(s.instances)) for s in record.steps] == [
        ("canary", 2), ("wave1 (1/2)", 2), ("wave1 (2/2)", 2), ("wave2 (1/2)", 2), ("wave2 (2/2)", 2)]
    assert record.steps[1].instances == ["npu-02.example.internal/vllm-0", "npu-02.example.internal/vllm-1"]
    assert [s.name for s in plan_rollout(prod, "deploys/full.py", None, 4).steps] == ["canary", "wave1", "wave2"]


def test_max_unavailable_below_a_hosts_instances_takes_its_instances_a_few_at_a_time(prod):
    """Issue 17: --max-unavailable 1 was refused on hosts with two instances, the default layout."""
    record = plan_rollout(prod, "deploys/full.py", ["canary", "wave1"], max_unavailable=1)
    assert [(s.name, s.hosts, s.instances, s.data.get("serve_only")) for s in record.steps] == [
        ("canary (1/2)", ["npu-01.example.internal"], ["npu-01.example.internal/vllm-0"], ["vllm-0"]),
        ("canary (2/2)", ["npu-01.example.internal"], ["npu-01.example.internal/vllm-1"], ["vllm-1"]),
        *[(f"wave1 ({i}/4)", [host], [f"{host}/{name}"], [name])
          for i, (host, name) in enumerate([(h, n) for h in ("npu-02.example.internal", "npu-03.example.internal")
                                            for n in ("vllm-0", "vllm-1")], start=1)]]
    # A host that fits whole is not split, and is not packed with a split one.
    batches = split_wave("w", ["h1", "h2", "h3"], {"h1": ["a"], "h2": ["a", "b", "c"], "h3": ["a"]}, 2)
    assert [(b.hosts, b.serve_only) for b in batches] == [
        (["h1"], []), (["h2"], ["a", "b"]), (["h2"], ["c"]), (["h3"], [])]


def test_a_step_that_would_drain_the_whole_fleet_is_refused(prod):
    with pytest.raises(FleetError, match="step workers would drain every instance the gateway has"):
        plan_rollout(prod, "deploys/full.py", ["workers"], None)


def test_a_stopped_rollout_must_be_resumed_or_abandoned(tmp_path):
    state = FleetState(tmp_path)
    assert check_not_stopped(state, resume=False) is None
    with pytest.raises(FleetError, match="--resume: no stopped rollout"):
        check_not_stopped(state, resume=True)
    steps = [Step(name=name, hosts=[host], instances=[f"{host}/vllm-0"], deploy="deploys/full.py", data={})
             for name, host in (("canary", "worker1"), ("wave1", "worker2"))]
    steps[0].mark("done")
    steps[1].mark("failed", "worker2 vllm-0 gate health: /health answers 503")
    state.save_rollout(Record(kind="rollout", inventory="inventories/lab.py", steps=steps).model_dump())
    with pytest.raises(FleetError, match=r"rollout stopped at wave1 \(worker2 vllm-0 gate health.*add --resume, "
                       r"or put back what it drained with `ascend-fleet rollout inventories/lab.py --abandon`"):
        check_not_stopped(state, resume=False)
    assert check_not_stopped(state, resume=True).steps[1].name == "wave1"


def test_a_rollout_record_this_version_cannot_read_is_refused_in_one_line(tmp_path):
    state = FleetState(tmp_path)
    state.save_rollout({"kind": "rollout", "inventory": "inventories/lab.py", "steps": [{"name": "canary"}]})
    with pytest.raises(FleetError, match=rf"^{tmp_path}: its rollout record is not one this ascend-fleet reads "
                                         r"\(steps.0.hosts: .*\); .*or move the file aside$"):
        check_not_stopped(state, resume=True)


def test_drained_instances_survive_in_the_state_file(tmp_path):
    FleetState(tmp_path).set_drained({"w2/vllm-1", "w2/vllm-0"})
    assert FleetState(tmp_path).drained() == {"w2/vllm-0", "w2/vllm-1"}


def test_data_is_parsed_as_pyinfra_parses_it():
    assert parse_data(['npu_env={"HCCL_BUFFSIZE": "256"}', "tensor_parallel_size=4", "profile=lab"]) == {
        "npu_env": {"HCCL_BUFFSIZE": "256"}, "tensor_parallel_size": 4, "profile": "lab"}
    with pytest.raises(FleetError, match="--data oops: expected KEY=VALUE"):
        parse_data(["oops"])


def test_a_failed_deploy_is_told_by_the_gates_own_line():
    unit = instance_unit("vllm-0")
    output = ("--> Starting operation: Verify | Instance vllm-0 healthy\n"
              "    [worker1] No changes\n"
              f"    [worker2] worker2: instance {unit} (port 8000) /health answers 503; see journalctl\n"
              "    [worker2] Error: executed 0/1 commands\n")
    assert pyinfra_failure(output, ["worker2"]).startswith(f"worker2: instance {unit}")
    assert pyinfra_failure("--> pyinfra error: No hosts remaining!\n", ["worker2"]) == "--> pyinfra error: No hosts remaining!"


def test_load_report_counts_errors_and_p99_of_the_successful():
    results = [RequestResult(i, latency=0.1 * (i + 1), ttft=0.01, ok=True) for i in range(99)]
    results.append(RequestResult(99, latency=0.05, ttft=None, ok=False, error="HTTP 502: bad gateway"))
    summary = LoadReport("http://gw", 4, 10.0, results).summary()
    assert (summary["requests"], summary["errors"]) == (100, 1)
    assert summary["p99_latency_s"] == pytest.approx(9.9)  # nearest rank: the 99th of 99
    assert summary["first_errors"] == ["99.0s: HTTP 502: bad gateway"]
    assert percentile([], 0.99) is None and percentile([3.0], 0.99) == 3.0


def test_the_gateway_marks_drained_instances_down_and_closes_idle_upstreams_first():
    from ascend_fleet.config.hostdata import Gateway
    from ascend_fleet.fleet.gateway_routes import render_gateway_config

    backends = [{"host": "w1", "instance": "vllm-0", "address": "10.0.0.11", "port": 8000, "drained": False},
                {"host": "w2", "instance": "vllm-0", "address": "10.0.0.12", "port": 8000, "drained": True}]
    config = render_gateway_config(backends, Gateway(), fail_timeout=10)
    assert "server 10.0.0.11:8000 max_fails=2 fail_timeout=10s;  # w1/vllm-0" in config
    assert "server 10.0.0.12:8000 max_fails=2 fail_timeout=10s down;  # w2/vllm-0" in config
    # vLLM's uvicorn drops idle keepalive connections after 5 s: nginx must let go first.
    assert "keepalive_timeout 4s;" in config


def test_limit_plans_only_those_workers_in_their_wave(prod):
    record = plan_rollout(prod, "deploys/full.py", None, None, limit=["npu-04.example.internal"])
    assert [(s.name, s.hosts) for s in record.steps] == [("wave2", ["npu-04.example.internal"])]
    with pytest.raises(FleetError, match="--limit gw-01.example.internal: not a worker of .*prod.py; workers: npu-01"):
        plan_rollout(prod, "deploys/full.py", None, None, limit=["gw-01.example.internal"])


ONE_INSTANCE = [{"name": "vllm-0", "npus": [0, 1, 2, 3], "port": 8000, "hccl_base_port": 60000, "vllm_port": 51000}]


@pytest.fixture
def staged_configs(monkeypatch, tmp_path):
    """The 72B's config.json where the planner looks, for the served revision and the next."""
    for revision in ("495f39366efef23836d0cfae4fbe635880d2be31", "next"):
        directory = tmp_path / "models" / "Qwen" / "Qwen2.5-72B-Instruct" / revision
        directory.mkdir(parents=True)
        (directory / "config.json").write_text((QWEN25_72B / "config.json").read_text())
    monkeypatch.setattr(rollout, "ModelConfigs", lambda: ModelConfigs(models_dir=tmp_path / "models"))


def test_blue_green_is_refused_when_both_models_would_share_npus_without_the_hbm(prod, staged_configs):
    new = model_data(prod, "Qwen/Qwen2.5-72B-Instruct", "next")
    assert "npu-01.example.internal vllm-0: blue/green keeps both models resident" in blue_green_problem(prod, new)


def test_blue_green_fits_when_the_node_has_npus_free_beside_the_serving_ones(monkeypatch, tmp_path, staged_configs):
    monkeypatch.chdir(PROJECT)
    fleet = RolloutInventory(PROD, {**TWO_PER_HOST, "fleet_state_dir": str(tmp_path / "state"), "instances": ONE_INSTANCE})
    assert blue_green_problem(fleet, model_data(fleet, "Qwen/Qwen2.5-72B-Instruct", "next")) is None


def test_a_blue_green_swap_moves_each_wave_to_its_other_colour_and_back_on_failure(monkeypatch, tmp_path):
    monkeypatch.chdir(PROJECT)
    fleet = RolloutInventory(PROD, {**TWO_PER_HOST, "fleet_state_dir": str(tmp_path / "state"), "instances": ONE_INSTANCE})
    old = fleet.configs["npu-01.example.internal"].model
    served = f"/mnt/nvme/models/{old.id}/{old.revision}"
    monkeypatch.setattr(rollout, "served_path", lambda fleet, backend: served)
    new = model_data(fleet, old.id, "next")
    record = plan_blue_green(fleet, new, None)
    canary = record.steps[0]
    assert [s.name for s in record.steps] == ["canary", "wave1", "wave2"]
    assert canary.colours == {"npu-01.example.internal": "green"}
    assert canary.instances == ["npu-01.example.internal/vllm-0-green"]
    assert (canary.data["colour"], canary.data["serve_only"], canary.data["model"]["revision"]) == (
        "green", ["vllm-0-green"], "next")
    assert canary.data_back["model"]["revision"] == old.revision
    assert canary.data["model"]["served_model_name"] == old.served_model_name
    # The canary switched, wave1 failed: the canary goes back to blue on the old model.
    canary.status, record.steps[1].status = "done", "failed"
    fleet.state.set_colours(canary.colours)
    back = rollback_record(record, {}, fleet)
    assert [(s.name, s.colours, s.data["model"]["revision"]) for s in back.steps] == [
        ("back: canary", {"npu-01.example.internal": "blue"}, old.revision)]
