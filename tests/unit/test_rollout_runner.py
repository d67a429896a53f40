"""Running rollouts without a fleet: the example inventory, its instances' gates and the pyinfra
runs faked, the fleet state real (in a temporary directory). What is asserted is what an operator
sees: the one line, which instances the gateway keeps out, which hosts a deploy touched."""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ascend_fleet.commands import rollout_cli
from ascend_fleet.commands.rollout_cli import rollout_app
from ascend_fleet.config.fleetlease import FleetLease
from ascend_fleet.config.fleetstate import FleetState
from ascend_fleet.control import rollout
from ascend_fleet.control.rollout import (
    ROUTES_DEPLOY,
    RolloutInventory,
    Runner,
    abandonable,
    check_not_stopped,
    model_data,
    plan_rollout,
)
from ascend_fleet.core.errors import FleetError
from ascend_fleet.core.remote import HostFacts
from ascend_fleet.fleet.plan import check_fleet

PROJECT = Path(__file__).resolve().parents[2]
PROD = PROJECT / "inventories" / "prod.py"
QWEN35_27B = PROJECT / "tests" / "fixtures" / "models" / "qwen3.5-27b"  # group_data/prod.py's model
GATEWAY = "gw-01.example.internal"
CANARY, W2, W3 = "npu-01.example.internal", "npu-02.example.internal", "npu-03.example.internal"
WAVE1 = {f"{host}/vllm-{i}" for host in (W2, W3) for i in range(4)}  # TP2: four instances a host
STOPPED_AT_WAVE1 = {f"{W2}/vllm-0"}  # its /health answers 503


CHAT_ANSWER = json.dumps({"choices": [{"text": "hello"}]})


class Nodes:
    """The fleet's side, faked: gates that fail where told, and a log of every pyinfra run with
    the drained set the routes deploy would have applied."""

    def __init__(self):
        self.failing_gates: set[str] = set()  # instances whose /health answers 503
        self.gateway_fails = False
        self.unreachable: set[str] = set()  # hosts that do not answer SSH
        self.runs: list[tuple[str, list[str], set[str]]] = []

    def pyinfra(self, runner: Runner, deploy: str, hosts: list[str], data: dict, label: str) -> str | None:
        self.runs.append((deploy, hosts, runner.fleet.state.drained()))
        if deploy == ROUTES_DEPLOY and self.gateway_fails:
            return "gw-01.example.internal: gateway config refused by nginx -t (log: x.log)"
        return None

    def instance_answers(self, fleet: RolloutInventory, backends: list, asks: tuple[str, ...]) -> dict[str, dict[str, dict]]:
        """What an idle instance serving the fleet's model answers, or a 503 /health where told."""
        healthy = {"health": {"status": 200, "body": ""}, "completion": {"status": 200, "body": CHAT_ANSWER},
                   "models": {"status": 200, "body": json.dumps({"data": [{"id": fleet.model_name, "root": "/m"}]})},
                   "metrics": {"status": 200, "body": "vllm:num_requests_running 0\n"}}
        return {b.key: {ask: {"status": 503, "body": ""} if ask == "health" and b.key in self.failing_gates
                        else healthy[ask] for ask in asks} for b in backends}

    def read_fleet_facts(self, hosts: dict, *_args) -> dict[str, HostFacts]:
        return {host: HostFacts(host, error=f"cannot connect over SSH to {host}:22: timed out")
                if host in self.unreachable else HostFacts(host) for host in hosts}

    def deploys(self) -> list[tuple[str, list[str]]]:
        return [(deploy, hosts) for deploy, hosts, _ in self.runs if deploy != ROUTES_DEPLOY]

    def gateway_drained(self) -> set[str]:
        """What the last routes deploy kept out of rotation."""
        return next(drained for deploy, _, drained in reversed(self.runs) if deploy == ROUTES_DEPLOY)


@pytest.fixture
def nodes(monkeypatch):
    monkeypatch.chdir(PROJECT)  # group_data/ and deploys/ are found where pyinfra runs
    fake = Nodes()
    monkeypatch.setattr(Runner, "pyinfra", lambda runner, *args: fake.pyinfra(runner, *args))
    monkeypatch.setattr(rollout, "instance_answers", fake.instance_answers)
    monkeypatch.setattr(rollout, "read_fleet_facts", fake.read_fleet_facts)
    monkeypatch.setattr(rollout, "gateway_answer", lambda url, model: {"status": 200, "body": CHAT_ANSWER})
    monkeypatch.setattr(rollout, "GATE_SETTLE_SECONDS", 0)
    monkeypatch.setattr(rollout, "retried", lambda check, seconds=0: check())
    monkeypatch.setattr(rollout, "DRAIN_SETTLE_SECONDS", 0)
    # The prod model's config.json, as an operator puts it in files/models/ for preflight's plan.
    monkeypatch.setattr(rollout_cli, "check_fleet", partial(check_fleet, model_config=QWEN35_27B))
    return fake


@pytest.fixture
def state_dir(tmp_path) -> Path:
    return tmp_path / "state"


def cli(state_dir: Path, *args: str):
    """`ascend-fleet ARGS --data fleet_state_dir=...`; (FleetError line or None, stdout, stderr)."""
    result = CliRunner().invoke(rollout_app, [*args, "--data", f"fleet_state_dir={state_dir}"])
    if result.exception is not None and not isinstance(result.exception, FleetError):
        raise result.exception
    return (str(result.exception) if result.exception else None), result.stdout, result.stderr


def stopped_at_wave1(nodes: Nodes, state_dir: Path) -> tuple[RolloutInventory, dict]:
    fleet = RolloutInventory(PROD, {"fleet_state_dir": str(state_dir)})
    record = plan_rollout(fleet, "deploys/serve.py", None, None)
    nodes.failing_gates = set(STOPPED_AT_WAVE1)
    assert not Runner(fleet, record, lambda *_: None, 0).run()
    return fleet, record


def test_a_failing_gate_stops_the_rollout_with_its_wave_drained_and_the_next_untouched(nodes, state_dir):
    fleet, record = stopped_at_wave1(nodes, state_dir)
    assert [(s.name, s.status) for s in record.steps] == [
        ("canary", "done"), ("wave1", "failed"), ("wave2", "pending")]
    assert record.steps[1].detail == f"{W2} vllm-0 gate health: /health answers 503"
    assert nodes.deploys() == [("deploys/serve.py", [CANARY]), ("deploys/serve.py", [W2, W3])]
    assert fleet.state.drained() == nodes.gateway_drained() == WAVE1
    assert fleet.state.rollout() == record.model_dump()  # what --resume reads back


def test_a_gateway_that_does_not_answer_stops_the_rollout_before_any_drain_or_deploy(nodes, state_dir):
    fleet = RolloutInventory(PROD, {"fleet_state_dir": str(state_dir)})
    record = plan_rollout(fleet, "deploys/serve.py", None, None)
    nodes.unreachable = {"gw-02.example.internal"}
    assert not Runner(fleet, record, lambda *_: None, 0).run()
    assert [(s.name, s.status) for s in record.steps][0] == ("canary", "failed")
    assert record.steps[0].detail == (
        "gateway: gw-02.example.internal: cannot connect over SSH to gw-02.example.internal:22: timed out; every "
        "gateway takes each drain: bring it back (or take it out of the inventory)")
    assert nodes.runs == [] and fleet.state.drained() == set()  # no gateway was told anything, nothing restarted


def test_abandon_puts_back_what_passes_its_gates_and_names_what_does_not(nodes, state_dir):
    fleet, record = stopped_at_wave1(nodes, state_dir)
    others = {"vllm-1", "vllm-2", "vllm-3"}
    fleet.state.set_served(W2, others)  # as the deploy left it: vllm-0 failed the serve stage's gate
    deploys_before = nodes.deploys()
    left_out = Runner(fleet, record, lambda *_: None, 0).abandon()
    assert left_out == {f"{W2}/vllm-0": "gate health: /health answers 503"}
    assert fleet.state.drained() == nodes.gateway_drained() == {f"{W2}/vllm-0"}
    assert fleet.state.served()[W2] == others
    assert nodes.deploys() == deploys_before  # nothing is deployed: wave1 keeps what it had
    # The rollout is over: a new one may start, --resume has nothing to go on with.
    assert check_not_stopped(fleet.state, resume=False) is None
    # Fixed, the instance comes back with another abandon of the same record.
    nodes.failing_gates = set()
    assert Runner(fleet, abandonable(fleet.state), lambda *_: None, 0).abandon() == {}
    assert fleet.state.drained() == nodes.gateway_drained() == set()
    assert fleet.state.served()[W2] == {"vllm-0", *others}  # so the gateway lists it again
    assert W3 not in fleet.state.served()  # a host with no record yet counts whole, as before
    with pytest.raises(FleetError, match="--abandon: no stopped rollout is recorded in .*; nothing to abandon"):
        abandonable(fleet.state)


def test_abandon_keeps_the_drained_set_and_the_stopped_rollout_when_the_gateway_refuses(nodes, state_dir):
    fleet, record = stopped_at_wave1(nodes, state_dir)
    nodes.failing_gates, nodes.gateway_fails = set(), True
    with pytest.raises(FleetError, match="the routes deploy failed, the drained set is as it was: gw-01.*nginx -t"):
        Runner(fleet, record, lambda *_: None, 0).abandon()
    assert fleet.state.drained() == WAVE1
    assert check_not_stopped(fleet.state, resume=True).steps[1].status == "failed"


def test_a_drain_the_gateway_did_not_apply_is_not_recorded(nodes, state_dir):
    """Issue 30: with the gateway unreachable, instances were recorded drained that never were."""
    fleet = RolloutInventory(PROD, {"fleet_state_dir": str(state_dir)})
    record = plan_rollout(fleet, "deploys/serve.py", None, None)
    nodes.gateway_fails = True
    assert not Runner(fleet, record, lambda *_: None, 0).run()
    assert record.steps[0].status == "failed" and record.steps[0].detail.startswith("gateway: gw-01")
    assert fleet.state.drained() == set() and nodes.deploys() == []


def test_a_rollout_of_a_deploy_file_that_does_not_exist_changes_nothing(nodes, state_dir):
    error, _, _ = cli(state_dir, "rollout", str(PROD), "deploys/nosuch.py")
    assert error == (f"rollout changed nothing: deploys/nosuch.py: no such deploy file in {PROJECT}; pass one "
                     "of deploys/*.py, e.g. deploys/full.py, and run ascend-fleet where pyinfra runs")
    assert nodes.runs == [] and not state_dir.exists()


def test_a_deploy_file_that_is_not_python_changes_nothing(nodes, state_dir, tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("from ascend_fleet.stages.full import full_deploy\nfull_deploy(\n")
    error, _, _ = cli(state_dir, "rollout", str(PROD), str(broken))
    assert error == f"rollout changed nothing: {broken} line 2: '(' was never closed; fix the deploy file"
    assert nodes.runs == [] and not state_dir.exists()


def test_bad_host_data_changes_nothing(nodes, state_dir):
    error, _, _ = cli(state_dir, "rollout", str(PROD), "deploys/serve.py", "--data", "tensor_parallel_size=3")
    assert error.startswith(f"rollout changed nothing: {CANARY}: tensor_parallel_size: 3 does not divide")
    assert nodes.runs == [] and not state_dir.exists()


def test_data_whose_plan_does_not_fit_changes_nothing(nodes, state_dir):
    """The capacity plan preflight refuses is refused before a wave is drained for it."""
    serving = json.dumps({"max_model_len": 10_000_000, "gpu_memory_utilization": 0.9, "dtype": "bfloat16"})
    error, _, _ = cli(state_dir, "rollout", str(PROD), "deploys/serve.py", "--data", f"serving={serving}")
    assert re.match(rf"rollout changed nothing: {CANARY} instance vllm-0: ", error), error
    assert nodes.runs == [] and not state_dir.exists()


def test_an_exception_in_group_data_is_one_line_naming_file_and_line(nodes, state_dir, tmp_path, monkeypatch):
    (tmp_path / "group_data").mkdir()
    (tmp_path / "group_data" / "all.py").write_text('profile = "lab"\nmodel = undefined_model\n')
    (tmp_path / "fleet.py").write_text('workers = ["node1"]\n')
    monkeypatch.chdir(tmp_path)  # group_data/ of where pyinfra runs
    error, _, _ = cli(state_dir, "rollout", "fleet.py", "deploys/serve.py")
    assert error == (f"rollout changed nothing: {tmp_path}/group_data/all.py:2: NameError: name "
                     "'undefined_model' is not defined; fix the file (it is Python)")
    assert nodes.runs == []


def test_resume_says_what_it_resumes_and_a_stopped_rollout_is_abandoned_from_the_cli(nodes, state_dir):
    nodes.failing_gates = set(STOPPED_AT_WAVE1)
    error, _, _ = cli(state_dir, "rollout", str(PROD), "deploys/serve.py")
    assert error.startswith(f"rollout stopped at wave1: {W2} vllm-0 gate health: /health answers 503; ")
    assert error.endswith(f"--resume (or give it up: ascend-fleet rollout {PROD} --abandon)")
    # Resumed with another deploy: refused, naming both ways out.
    error, _, _ = cli(state_dir, "rollout", str(PROD), "deploys/full.py", "--resume")
    assert error.startswith(f"rollout changed nothing: --resume: the stopped rollout of deploys/serve.py with --data "
                            f"fleet_state_dir={state_dir}: wave1 ({W2}, {W3}; {W2} vllm-0 gate health")
    assert error.endswith(f"resume it with `ascend-fleet rollout {PROD} deploys/serve.py --resume` (no --data), "
                          f"or put back what it drained with `ascend-fleet rollout {PROD} --abandon`")
    # Still broken: the abandon puts back what passes and names what does not.
    error, stdout, stderr = cli(state_dir, "rollout", str(PROD), "--abandon")
    assert f"abandoning the rollout of deploys/serve.py with --data fleet_state_dir={state_dir}: wave1 " in stderr
    assert error == (f"rollout abandoned, but {W2}/vllm-0 (gate health: /health answers 503) stays out of the "
                     f"gateway: fix it, then run ascend-fleet rollout {PROD} --abandon again to put it back")
    assert nodes.gateway_drained() == {f"{W2}/vllm-0"}
    nodes.failing_gates = set()
    error, stdout, _ = cli(state_dir, "rollout", str(PROD), "--abandon")
    assert error is None and nodes.gateway_drained() == set()
    assert stdout == ("abandoned; every instance it drained is back in the gateway. Its change is on canary, "
                      "maybe on wave1 (where it stopped), not on wave2.\n")
    deploys = len(nodes.deploys())
    error, stdout, _ = cli(state_dir, "rollout", str(PROD), "deploys/serve.py")
    assert error is None and len(nodes.deploys()) == deploys + 3  # a new rollout runs every wave


def test_resume_prints_the_stopped_rollouts_remaining_waves_and_drained_instances_first(nodes, state_dir):
    nodes.failing_gates = set(STOPPED_AT_WAVE1)
    cli(state_dir, "rollout", str(PROD), "deploys/serve.py")
    nodes.failing_gates = set()
    error, stdout, stderr = cli(state_dir, "rollout", str(PROD), "deploys/serve.py", "--resume")
    assert error is None
    drained = ", ".join(sorted(WAVE1))
    assert (f"resuming the rollout of deploys/serve.py with --data fleet_state_dir={state_dir}: wave1 ({W2}, {W3}; "
            f"{W2} vllm-0 gate health: /health answers 503), then wave2 (npu-04.example.internal, "
            f"npu-05.example.internal); drained: {drained}\n") in stderr
    assert nodes.deploys()[-2:] == [("deploys/serve.py", [W2, W3]),
                                    ("deploys/serve.py", ["npu-04.example.internal", "npu-05.example.internal"])]


def test_the_rollout_the_old_tool_left_stuck_on_a_missing_deploy_file_is_abandoned(nodes, state_dir):
    """What a rollout of deploys/nosuch.py recorded before the deploy file was checked: the canary
    drained, its deploy failed, --resume with the right file refused."""
    fleet = RolloutInventory(PROD, {"fleet_state_dir": str(state_dir)})
    record = plan_rollout(fleet, "deploys/nosuch.py", None, None)
    record.steps[0].mark("failed", "deploy: --> pyinfra error: No such file: deploys/nosuch.py")
    fleet.state.save_rollout(record.model_dump())
    fleet.state.set_drained(set(record.steps[0].instances))
    error, _, _ = cli(state_dir, "rollout", str(PROD), "deploys/full.py", "--resume")
    assert "the stopped rollout of deploys/nosuch.py" in error and f"`ascend-fleet rollout {PROD} --abandon`" in error
    error, _, _ = cli(state_dir, "rollout", str(PROD), "deploys/full.py", "--abandon")
    assert error is None and fleet.state.drained() == set() == nodes.gateway_drained()
    assert check_not_stopped(fleet.state, resume=False) is None


def test_a_second_rollout_beside_a_running_one_is_refused(nodes, state_dir, lease_host):
    """The lease is on the fleet's first gateway (here: the lease scripts run on this machine)."""
    running = FleetLease(GATEWAY, {}, FleetState(state_dir), "a rollout of deploys/full.py")
    running.take()
    for args in (["deploys/serve.py"], ["--abandon"]):
        error, _, _ = cli(state_dir, "rollout", str(PROD), *args)
        assert re.search(rf"the fleet is held by {running.holder.who}: a rollout of deploys/full.py "
                         rf"\(pid {os.getpid()}\) since .*, last heartbeat \d+s ago \(lease on gateway {GATEWAY}\); "
                         "wait for it to end: a lease whose holder crashed is free 60s after its last heartbeat$",
                         error), error
    assert nodes.runs == [] and set(lease_host.ran_on) == {GATEWAY}
    running.release()
    error, _, _ = cli(state_dir, "rollout", str(PROD), "deploys/serve.py")
    assert error is None


@pytest.fixture
def mirror(tmp_path):
    """An HTTP mirror with one model revision, laid out as the lab's: models/<org>/<name>/<revision>/."""
    revision = tmp_path / "mirror" / "models" / "Qwen" / "Qwen2.5-72B-Instruct" / "v1"
    revision.mkdir(parents=True)
    (revision / "config.json").write_text((PROJECT / "tests" / "fixtures" / "models" / "qwen2.5-72b-instruct" /
                                           "config.json").read_text())
    handler = partial(SimpleHTTPRequestHandler, directory=str(tmp_path / "mirror"))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


def http_model(url: str) -> str:
    return "model=" + json.dumps({"id": "Qwen/Qwen2.5-72B-Instruct", "revision": "v1", "source": "http", "url": url})


def test_a_swap_to_a_model_the_mirror_does_not_have_says_404_and_changes_nothing(nodes, state_dir, mirror):
    for model, revision in (("Qwen/Nosuch", "v1"), ("Qwen/Qwen2.5-72B-Instruct", "v9")):
        error, _, _ = cli(state_dir, "swap-model", str(PROD), "--model", model, "--revision", revision,
                          "--data", http_model(mirror))
        assert error == (f"swap-model changed nothing: {mirror}/models/{model}/{revision}/config.json answers HTTP "
                         f"404: the mirror has no model {model} at revision {revision}; check --model and --revision")
    assert nodes.runs == []


def test_a_swap_with_the_mirror_down_or_nothing_to_plan_with_says_so_and_suggests_only_what_exists(nodes, state_dir,
                                                                                                   mirror):
    down = "http://127.0.0.1:9"  # discard: nothing listens
    error, _, _ = cli(state_dir, "swap-model", str(PROD), "--model", "Qwen/Qwen3-8B", "--data", http_model(down))
    assert error.startswith(f"swap-model changed nothing: the mirror does not answer {down}/models/Qwen/Qwen3-8B/v1/"
                            "config.json (ConnectionError); is it up?")
    # The example fleet's model comes from ModelScope, which only the nodes read.
    fleet = RolloutInventory(PROD, {"fleet_state_dir": str(state_dir)})
    problem = rollout.new_model_problem(model_data(fleet, "Qwen/Qwen3-8B", "main"))
    assert problem == ("no config.json of Qwen/Qwen3-8B@main on this machine to plan the swap with (source modelscope "
                       f"is read by the nodes only); put it at {PROJECT}/files/models/Qwen/Qwen3-8B/main/config.json")
    assert "--model-config" not in error + problem
    assert rollout.new_model_problem(model_data(RolloutInventory(PROD, {"model": json.loads(http_model(mirror)[6:])}),
                                                "Qwen/Qwen2.5-72B-Instruct", "v1")) is None
    assert nodes.runs == []


def test_a_bench_gate_stops_after_the_canary_wave_when_its_instance_measures_worse(nodes, state_dir, tmp_path,
                                                                                   monkeypatch):
    baseline = tmp_path / "baseline.json"
    baseline.write_text(json.dumps({"failed": 0, "output_throughput": 400.0, "p99_tpot_ms": 20.0, "ascend_fleet": {
        "instance": f"{CANARY}/vllm-1", "bench": {"num_prompts": 24, "max_concurrency": 8, "request_rate": "inf"}}}))
    measured: list[tuple[str, object]] = []
    monkeypatch.setattr(rollout, "instance_target", lambda path, host, config, instance: contextlib.nullcontext(
        f"{host.name}/{instance}"))

    def measure(target, load, out, name):
        measured.append((target, load))
        return [], {"failed": 0, "output_throughput": throughput, "p99_tpot_ms": 21.0}

    monkeypatch.setattr(rollout, "measure", measure)
    fleet = RolloutInventory(PROD, {"fleet_state_dir": str(state_dir)})
    throughput = 190.0  # half the seats: half the tokens
    record = plan_rollout(fleet, "deploys/serve.py", None, None, bench_gate=rollout.BenchGate(
        baseline=str(baseline), max_regression=0.05))
    assert not Runner(fleet, record, lambda *_: None, 0).run()
    assert [(s.name, s.status) for s in record.steps] == [("canary", "failed"), ("wave1", "pending"), ("wave2", "pending")]
    assert record.steps[0].detail == (f"{CANARY}/vllm-1 bench gate against {baseline}: output_throughput 400 -> 190 "
                                      "(-52.5%, past the 5% allowed)")
    assert measured[0][0] == f"{CANARY}/vllm-1" and measured[0][1].max_concurrency == 8  # the baseline's instance and load
    assert fleet.state.drained() == nodes.gateway_drained() == {f"{CANARY}/vllm-{i}" for i in range(4)}
    assert nodes.deploys() == [("deploys/serve.py", [CANARY])]  # the other waves untouched
    throughput = 398.0  # fixed: --resume measures again and goes on
    assert Runner(fleet, check_not_stopped(fleet.state, resume=True), lambda *_: None, 0).run()
    assert fleet.state.drained() == set() and len(measured) == 2


# --- commands that would do nothing say so ---


def test_waves_given_with_spaces_after_the_commas_roll_out_those_groups(nodes, state_dir):
    """Before: `--waves 'canary, wave1'` was refused: '--waves  wave1: no such group'."""
    error, _, _ = cli(state_dir, "rollout", str(PROD), "deploys/serve.py", "--waves", "canary, wave1")
    assert error is None and nodes.deploys() == [("deploys/serve.py", [CANARY]), ("deploys/serve.py", [W2, W3])]


@pytest.mark.parametrize("waves, refusal", [
    ("gateway", f"--waves gateway: group gateway of {PROD} has no worker (npu_count) to roll out to; groups with "
                "workers: canary, prod, wave1, wave2, workers"),
    ("canary,wave1,canary", f"--waves canary: its workers ({CANARY}) are in an earlier wave already; name each group "
                            "once"),
    (" , ", "--waves ' , ': no group named; pass groups in order, e.g. --waves canary,wave1"),
], ids=["a group without workers", "a group twice", "no group"])
def test_waves_that_would_roll_out_nothing_are_refused_in_one_line(nodes, state_dir, waves, refusal):
    """Before: `--waves gateway` ran no step and exited 0."""
    error, stdout, _ = cli(state_dir, "rollout", str(PROD), "deploys/serve.py", "--waves", waves)
    assert error == f"rollout changed nothing: {refusal}"
    assert nodes.runs == [] and stdout == ""


def test_an_empty_canary_group_is_refused_rather_than_skipped(nodes, state_dir, tmp_path):
    """Before: the rollout began with wave1, saying nothing (pyinfra drops an empty group)."""
    inventory = tmp_path / "prod.py"  # group_data/prod.py still applies
    inventory.write_text(PROD.read_text().replace('canary = ["npu-01.example.internal"]', "canary = []").replace(
        'wave1 = ["npu-02.example.internal"', 'wave1 = ["npu-01.example.internal", "npu-02.example.internal"'))
    error, _, _ = cli(state_dir, "rollout", str(inventory), "deploys/serve.py")
    assert error == (f"rollout changed nothing: rollout_waves: the first wave, canary, has no worker in {inventory}, "
                     "so the change would go to a larger wave first; put a worker in group canary (your canary), or "
                     "name the waves with --waves")
    assert nodes.runs == []


def test_a_swap_to_the_model_already_served_everywhere_says_so_and_changes_nothing(nodes, state_dir, monkeypatch):
    """Before: it staged the weights again on every worker and ran an empty swap."""
    current = model_data(RolloutInventory(PROD, {"fleet_state_dir": str(state_dir)}), "Eco-Tech/Qwen3.5-27B-w8a8-mtp", None)
    monkeypatch.setattr(rollout_cli, "served_path", lambda fleet, b: rollout.model_path(fleet, b.host, current))
    error, stdout, _ = cli(state_dir, "swap-model", str(PROD), "--model", "Eco-Tech/Qwen3.5-27B-w8a8-mtp")
    assert (error, stdout) == (None, "already serving Eco-Tech/Qwen3.5-27B-w8a8-mtp@master on every instance; "
                                     "nothing to do\n")
    assert nodes.runs == []


# --- an argument's typo is refused before the fleet's lease is written on the first gateway ---

BEFORE_THE_LEASE = [
    (["rollout", "deploys/serve.py", "--waves", "canary,wave9"],
     f"--waves wave9: no such group in {PROD}; groups: "),
    (["rollout", "deploys/serve.py", "--waves", "canary,gateway"], "--waves gateway: group gateway of "),
    (["rollout", "deploys/serve.py", "--limit", "npu-09.example.internal"],
     f"--limit npu-09.example.internal: not a worker of {PROD}; workers: "),
    (["rollout", "deploys/serve.py", "--limit", f"{CANARY} "],
     f"--limit '{CANARY} ' (a trailing blank): not a worker of {PROD}; workers: "),
    (["rollout", "deploys/serve.py", "--bench-gate", "no-such-baseline.json"],
     "--bench-gate no-such-baseline.json: [Errno 2] No such file or directory: 'no-such-baseline.json'; give a "
     "result file of `ascend-fleet bench`"),
    (["rollout", "deploys/serve.py", "--bench-gate", "pyproject.toml"], "--bench-gate pyproject.toml: Expecting value"),
    (["rollout", "deploys/serve.py", "--bench-gate", "baseline.json", "--max-regression", "50"],
     "--max-regression '50': expected a share such as 5% or 0.05"),
    (["swap-model", "--model", "Qwen/Qwen3-8B", "--waves", "canary,wave9"], "--waves wave9: no such group in "),
    (["swap-model", "--model", "Qwen/Qwen3-8B "],
     "--model 'Qwen/Qwen3-8B ' (a trailing blank) --revision master: id: String should match pattern "),
    (["swap-model", "--model", "Qwen3-8B"], "--model Qwen3-8B --revision master: id: String should match pattern "),
]


@pytest.mark.parametrize("args, refusal", BEFORE_THE_LEASE, ids=[" ".join(a[2:]) for a, _ in BEFORE_THE_LEASE])
def test_an_argument_typo_is_refused_before_the_fleet_lease_is_taken_exit_2(nodes, state_dir, lease_host, args,
                                                                           refusal):
    """Before: each was refused only after the lease (and the fleet's records) had been written on the first
    gateway; the lease host's scripts are the test's record of it."""
    result = CliRunner().invoke(rollout_app, [args[0], str(PROD), *args[1:], "--data",
                                              f"fleet_state_dir={state_dir}"])
    assert isinstance(result.exception, FleetError), result.output
    assert str(result.exception).startswith(f"{args[0]} changed nothing: {refusal}"), str(result.exception)
    assert result.exception.exit_code == 2
    assert lease_host.ran_on == [] and nodes.runs == []


@pytest.mark.parametrize("target", [f"{CANARY}/", "/vllm-0", f"{CANARY}/vllm-0/x", "/"])
def test_drain_of_an_instance_named_without_both_parts_is_refused_exit_2(nodes, state_dir, lease_host, target):
    """Before: `drain HOST/` drained every instance of the host (an empty instance name read as none given)."""
    from ascend_fleet.commands.drain_cli import drain_app
    for command in ("drain", "undrain"):
        result = CliRunner().invoke(drain_app, [command, str(PROD), target, "--data", f"fleet_state_dir={state_dir}"])
        assert str(result.exception) == (f"{command} {target} changed nothing: TARGET {target}: expected HOST (every "
                                         "instance it serves) or HOST/INSTANCE, both parts given, e.g. worker2/vllm-1")
        assert result.exception.exit_code == 2
    assert lease_host.ran_on == [] and nodes.runs == []
