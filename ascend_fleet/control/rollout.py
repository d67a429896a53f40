"""Staged rollouts and model swaps, with the gateway draining what is about to change.

A rollout is a list of steps. Each step drains some instances at the gateway (they are
marked `down` through the routes deploy, deploys/routes.py, which reads the drained set from the
fleet state, see fleetstate.py), waits until their `vllm:num_requests_running` is 0, runs a pyinfra
deploy limited to their hosts (`pyinfra -y INVENTORY DEPLOY --limit HOST ...`, the command
operators run), gates every instance it changed (/health, /v1/models, a completion, /metrics,
asked on the instance's own node over SSH: the instance firewall keeps the control machine
off the instance ports) and puts them back, then checks a completion through the gateway. The first step that fails
stops everything: its instances stay drained, the others keep serving, the record in the
fleet state says where `--resume` goes on.

`ascend-fleet rollout` makes one step per wave (inventory groups, split to respect
--max-unavailable: whole hosts while they fit, else one host's instances a few at a time, the
serve stage restarting only those (`serve_only`) and the driver stage refusing a reboot, which
would stop the others); `ascend-fleet swap-model` stages the new weights everywhere, then, when
the planner says each node can hold both models, makes one blue/green step per wave: the
node's other colour of instances (hostdata.colour_instances) starts on the new model beside
the serving one, is gated, the fleet state's colour flips and the routes deploy points the gateways
at it, and the old colour is drained and stopped by the serve stage. Otherwise it makes one
step per instance slot of each wave (`serve_only`), so a node never loses more than one
instance at a time. Either way a failure puts back the old model.

Nothing is drained before the inputs are checked: the deploy files the rollout runs, the
inventory and every host's data (as each deploy validates them, hostdata.node_config), and for
a swap the new model at its source. A stopped rollout is resumed, or abandoned: its drained
instances go back into the gateway once they pass their gates, and its record is closed.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import requests
from pydantic import BaseModel, Field, ValidationError
from pyinfra.api import Inventory

from ascend_fleet.config import fleetlease
from ascend_fleet.config.credentials import api_headers
from ascend_fleet.config.fleetstate import BLUE, GATEWAY_FILE, FleetState, backend_key, other_colour, split_backend_key
from ascend_fleet.config.host_config import host_node_config
from ascend_fleet.config.hostdata import Instance, Model, NodeConfig
from ascend_fleet.config.per_run import profile_of_the_run
from ascend_fleet.control.bench import BenchOptions, instance_target, measure, regressions
from ascend_fleet.core.errors import FleetError, InputError, describe_validation, visible
from ascend_fleet.core.node_layout import instance_env_file, revision_dir
from ascend_fleet.core.remote import read_fleet_facts
from ascend_fleet.fleet.multi_node import data_parallel_roles
from ascend_fleet.fleet.plan import MODELS_DIR, ModelConfigs, group_members, load_inventory, plan_node
from ascend_fleet.fleet.probes import (
    EVERY_ASK,
    HEALTH,
    METRICS,
    MODELS,
    InstanceVerdict,
    fact_key,
    gateway_chat,
    instance_queries,
    judge_gateway,
    judge_instance,
    prefix_cache_counts,
    running_requests,
)
from ascend_fleet.fleet.virtual_address import address_holders, client_url, gateway_url
from ascend_fleet.sizing.planner import check_blue_green, check_node_instances

ROUTES_DEPLOY = "deploys/routes.py"  # the drained set applied at every gateway, nothing else
MONITORING_DEPLOY = "deploys/monitoring.py"
WEIGHTS_DEPLOY = "deploys/weights.py"
SERVE_DEPLOY = "deploys/serve.py"
HTTP_TIMEOUT_SECONDS = 10  # requests from here: the gateway's, the mirror's
# An nginx reload takes effect asynchronously and a restarted instance may still be warming
# up: gates retry for this long before they fail.
GATE_SETTLE_SECONDS = 30
# Requests accepted by nginx workers that still had the old config need a moment to show up.
DRAIN_SETTLE_SECONDS = 2
POLL_SECONDS = 1


@dataclass(frozen=True)
class Backend:
    """One instance: where the gateway reaches it, and its root-only env file (its API key) on its node."""

    host: str
    instance: str
    address: str
    port: int
    env_file: str

    @property
    def key(self) -> str:
        return backend_key(self.host, self.instance)

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}"


class RolloutInventory:
    """An inventory as a rollout sees it: validated host data, instances, gateway and waves."""

    def __init__(self, inventory_path: Path, data: dict):
        self.inventory_path = inventory_path
        self.data = data
        self.inventory: Inventory = load_inventory(inventory_path, override_data=data)
        self.configs: dict[str, NodeConfig] = {host.name: host_node_config(host) for host in self.inventory}
        self.addresses = {host.name: host.data.get("ssh_hostname") or host.name for host in self.inventory}
        self.workers = [name for name, config in self.configs.items() if config.is_worker]
        self.gateways = [name for name, config in self.configs.items() if config.is_gateway]
        if not self.workers:
            raise FleetError(f"{inventory_path}: no host with NPUs (npu_count) to roll out to")
        if not self.gateways:
            raise FleetError(f"{inventory_path}: no gateway host (data `gateway`); a rollout drains instances there")
        self.roles = data_parallel_roles(group_members(self.inventory), list(self.configs.values()))
        first = self.configs[self.workers[0]]
        self.model_name = first.model.served_model_name
        self.state = FleetState(first.fleet_state_dir)

    def leased(self, what: str):
        """The fleet's lease on its first gateway (fleetlease.py) while the block changes the fleet, the
        fleet's records in the state meanwhile: a RolloutInventory made before it reads colours made again after."""
        gateway = self.gateways[0]
        return fleetlease.holding(gateway, self.inventory.get_host(gateway).data.dict(), self.state, what)

    def backend(self, host: str, instance: Instance) -> Backend:
        return Backend(host, instance.name, self.addresses[host], instance.port, instance_env_file(instance.name))

    def backends(self, host: str, only: list[str] | None = None) -> list[Backend]:
        """The host's instances the gateway routes to: none on a multi-node instance's headless member,
        whose instance is its head's."""
        if self.head_of(host) != host:
            return []
        return [self.backend(host, i) for i in self.configs[host].instances if only is None or i.name in only]

    def head_of(self, host: str) -> str:
        """The host whose instance this host serves: its multi-node instance's head, or itself."""
        return self.roles[host].head if host in self.roles else host

    def instance_hosts(self, host: str) -> list[str]:
        """Every host of the instance(s) this host heads: a multi-node instance's members, head first."""
        return list(self.roles[host].members) if host in self.roles else [host]

    def other_config(self, host: str) -> NodeConfig:
        """The host's data with the instances of the colour that does not serve."""
        return host_node_config(self.inventory.get_host(host), other_colour(self.configs[host].colour))

    def backends_in(self, host: str, colour: str) -> list[Backend]:
        config = host_node_config(self.inventory.get_host(host), colour)
        return [self.backend(host, i) for i in config.instances]

    def all_backends(self) -> list[Backend]:
        return [backend for host in self.workers for backend in self.backends(host)]

    def named_backends(self, target: str) -> list[Backend]:
        """The instances an operator names as HOST (all it serves) or HOST/INSTANCE, refused in one line
        when the inventory has no such instance or the host serves none itself (a multi-node member)."""
        host, name = split_backend_key(target, "TARGET")
        if host not in self.configs or not self.configs[host].is_worker:
            raise InputError(f"{visible(target)}: no worker {visible(host)} in {self.inventory_path}; workers: "
                             f"{', '.join(self.workers[:8])}{' ...' if len(self.workers) > 8 else ''}")
        if self.head_of(host) != host:
            raise InputError(f"{target}: {host} is a member of a multi-node instance; name its head, "
                             f"{self.head_of(host)}, which serves it")
        backends = self.backends(host, [name] if name else None)
        if not backends:
            names = ", ".join(i.name for i in self.configs[host].instances)
            raise InputError(f"{visible(target)}: {host} has no instance {visible(name)}; its instances: {names}")
        return backends

    def worker_groups(self) -> list[str]:
        """The inventory's groups that hold a worker, by name."""
        return sorted(name for name, hosts in self.inventory.groups.items()
                      if any(host.name in self.workers for host in hosts))

    def gateway_urls(self) -> list[str]:
        """Each gateway's own URL, then the virtual address's when the data gives one: each must serve."""
        own = [gateway_url(self.configs[host], self.addresses[host]) for host in self.gateways]
        return list(dict.fromkeys([*own, self.client_url()]))

    def unreachable_gateways(self) -> str | None:
        """One line naming each gateway this machine cannot reach over SSH now, or None."""
        facts = read_fleet_facts({name: (self.inventory.get_host(name).data.dict(), {}) for name in self.gateways})
        down = [f"{name}: {facts[name].error}" for name in self.gateways if facts[name].error]
        return ("; ".join(down) + "; every gateway takes each drain: bring it back (or take it out of the "
                "inventory)") if down else None

    def client_url(self) -> str:
        """Where clients reach the fleet: the gateways' virtual address, else the first gateway."""
        first = self.gateways[0]
        return client_url(self.configs[first], self.addresses[first])

    def client_url_described(self) -> str:
        """client_url, and for a virtual address which gateway holds it now."""
        if self.configs[self.gateways[0]].gateway_vip is None:
            return self.client_url()
        holders = address_holders([self.inventory.get_host(name) for name in self.gateways])
        return f"{self.client_url()} (the virtual address, held by {holders})"

    def waves(self, names: list[str] | None) -> list[tuple[str, list[str]]]:
        """(wave, workers) in rollout order: the given groups, else the data's rollout_waves, else
        canary then the rest. Workers the default waves leave out form a last wave, `rest`.
        Refuses a given group with no worker left for it, and a first default wave (the canary)
        with no worker: the change would go to a larger wave first, and nothing said so."""
        given = names is not None
        names = names if given else (self.configs[self.workers[0]].rollout_waves or ["canary"])
        waves, placed = [], set()
        for name in names:
            if given and name not in self.inventory.groups:
                raise InputError(f"--waves {visible(name)}: no such group in {self.inventory_path}; "
                                 f"groups: {', '.join(sorted(self.inventory.groups))}")
            workers = [host.name for host in self.inventory.groups.get(name, []) if host.name in self.workers]
            members = [host for host in workers if host not in placed]
            if given and not members:
                raise InputError(f"--waves {name}: " + (
                    f"its workers ({', '.join(workers)}) are in an earlier wave already; name each group once"
                    if workers else f"group {name} of {self.inventory_path} has no worker (npu_count) to roll out "
                                    f"to; groups with workers: {', '.join(self.worker_groups())}"))
            if not given and not waves and not members:
                raise FleetError(f"rollout_waves: the first wave, {name}, has no worker in {self.inventory_path}, so "
                                 f"the change would go to a larger wave first; put a worker in group {name} "
                                 "(your canary), or name the waves with --waves")
            placed.update(members)
            if members:
                waves.append((name, members))
        rest = [host for host in self.workers if host not in placed]
        if rest and not given:
            waves.append(("rest", rest))
        return waves


def check_deploy_files(*deploys: str) -> None:
    """Each deploy a rollout will run is a Python file where pyinfra runs (this directory), so a
    wrong name stops here rather than after a wave is drained."""
    for deploy in deploys:
        path = Path(deploy)
        if not path.is_file():
            raise FleetError(f"{deploy}: no such deploy file in {Path.cwd()}; pass one of deploys/*.py, "
                             "e.g. deploys/full.py, and run ascend-fleet where pyinfra runs")
        try:
            compile(path.read_bytes(), deploy, "exec")
        except SyntaxError as exc:
            raise FleetError(f"{deploy} line {exc.lineno}: {exc.msg}; fix the deploy file") from None


@dataclass(frozen=True)
class Batch:
    """Hosts a rollout step deploys together; `serve_only`: the instances of its one host that the
    step restarts (empty: every instance of its hosts)."""
    name: str
    hosts: list[str]
    serve_only: list[str]


def split_wave(name: str, hosts: list[str], instances: dict[str, list[str]], max_unavailable: int | None) -> list[Batch]:
    """A wave as batches of at most max_unavailable instances (None: one batch): whole hosts
    packed together while they fit, and a host that runs more in batches of its own instances."""
    if max_unavailable is None:
        return [Batch(name, hosts, [])]
    batches: list[Batch] = []
    for host in hosts:
        names = instances[host]
        if len(names) > max_unavailable:
            batches += [Batch(name, [host], names[i:i + max_unavailable]) for i in range(0, len(names), max_unavailable)]
        elif batches and not batches[-1].serve_only and \
                sum(len(instances[h]) for h in batches[-1].hosts) + len(names) <= max_unavailable:
            batches[-1] = replace(batches[-1], hosts=[*batches[-1].hosts, host])
        else:
            batches.append(Batch(name, [host], []))
    if len(batches) == 1:
        return batches
    return [Batch(f"{name} ({i}/{len(batches)})", b.hosts, b.serve_only) for i, b in enumerate(batches, start=1)]


class Step(BaseModel):
    """One step of a rollout or swap: drain `instances` at the gateway, run `deploy` with `data` on
    `hosts`, gate, undrain. A blue/green step (`colours` set) starts each host's other colour
    instead, switches the gateway to it and stops the old one."""

    name: str
    hosts: list[str]
    instances: list[str]  # backend keys, host/instance
    deploy: str
    data: dict
    status: Literal["pending", "running", "failed", "done"] = "pending"
    seconds: float | None = None
    detail: str = ""  # why it failed
    colours: dict[str, str] | None = None  # blue/green: the colour each host moves to
    data_done: dict | None = None  # blue/green: the data once switched (the new model)
    data_back: dict | None = None  # blue/green: the data that keeps the old colour's model
    bench_gate: bool = False  # measured against the record's baseline once back in the gateway

    @property
    def blue_green(self) -> bool:
        return self.colours is not None

    def mark(self, status: str, detail: str = "", started: float | None = None) -> None:
        self.status, self.detail = status, detail
        if started is not None:
            self.seconds = round(time.monotonic() - started, 1)


class BenchGate(BaseModel):
    """rollout --bench-gate: the canary wave's first step is benchmarked as the baseline was (its load,
    one of the step's instances directly) and stops the rollout when a metric regressed past the share."""

    baseline: str
    max_regression: float

    def check(self) -> tuple[dict, BenchOptions]:
        """The baseline's result and load; a refusal in one line if it is no bench result."""
        path = Path(self.baseline)
        try:
            result = json.loads(path.read_text())
        except (OSError, ValueError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            raise InputError(f"--bench-gate {visible(path)}: {exc}; give a result file of `ascend-fleet bench`") from None
        return result, BenchOptions.of_result(result, path)


class Record(BaseModel):
    """A rollout, swap or rollback as the fleet state keeps it (fleetstate.py): `--resume` goes on
    at its first step not done, `--abandon` closes it."""

    kind: Literal["rollout", "swap-model", "swap-model rollback"]
    inventory: str
    steps: list[Step]
    finished: bool = False
    deploy: str | None = None  # a rollout's deploy file
    data: dict = Field(default_factory=dict)  # a rollout's --data
    model: dict | None = None  # a swap's new model
    abandoned: dict | None = None  # when, and the instances it left out of the gateway
    bench_gate: BenchGate | None = None  # a rollout's --bench-gate

    def instances(self) -> set[str]:
        return {key for step in self.steps for key in step.instances}


def step_of(name: str, hosts: list[str], backends: list[Backend], deploy: str, data: dict) -> Step:
    return Step(name=name, hosts=hosts, instances=[b.key for b in backends], deploy=deploy, data=data)


# ------------------------------------------------------------------ checks over HTTP


def instance_answers(fleet: RolloutInventory, backends: list[Backend], asks: tuple[str, ...]) -> dict[str, dict[str, dict]]:
    """{backend key: {ask: answer}} (probes.instance_queries), asked on each instance's own node
    with its own key: one SSH session per host, the hosts at the same time."""
    plans = {}
    for host in dict.fromkeys(b.host for b in backends):
        queries = {fact_key(ask, b.instance): query for b in backends if b.host == host
                   for ask, query in instance_queries(b.port, b.env_file, fleet.model_name, asks).items()}
        plans[host] = (fleet.inventory.get_host(host).data.dict(), queries)
    read = read_fleet_facts(plans)
    unanswered = {host: {"status": 0, "body": facts.error or ""} for host, facts in read.items()}
    return {b.key: {ask: read[b.host].facts.get(fact_key(ask, b.instance)) or unanswered[b.host] for ask in asks}
            for b in backends}


def prefix_cache_totals(fleet: RolloutInventory) -> tuple[float, float] | None:
    """(tokens looked up, tokens found) in the prefix caches of every instance the gateway routes to, since
    each started; None when none reports them."""
    answers = instance_answers(fleet, fleet.all_backends(), (METRICS,))
    read = [counts for answer in answers.values() if (counts := prefix_cache_counts(answer[METRICS]))]
    return (sum(q for q, _ in read), sum(h for _, h in read)) if read else None


def failing_gates(fleet: RolloutInventory, backends: list[Backend], model_paths: dict[str, str | None] | None = None,
                  seconds: float | None = None) -> list[tuple[Backend, InstanceVerdict]]:
    """The instances that still fail their gates (probes.judge_instance) when the time is up, with
    their verdicts; empty once every one passed. model_paths: {backend key: the directory it must
    serve from} for a swap. Each poll asks only those that have not passed yet."""
    deadline = time.monotonic() + (GATE_SETTLE_SECONDS if seconds is None else seconds)
    failing = [(backend, None) for backend in backends]
    while failing:
        waiting = [backend for backend, _ in failing]
        answers = instance_answers(fleet, waiting, EVERY_ASK)
        verdicts = [(b, judge_instance(answers[b.key], fleet.model_name, (model_paths or {}).get(b.key)))
                    for b in waiting]
        failing = [(backend, verdict) for backend, verdict in verdicts if not verdict.ok]
        if failing and time.monotonic() >= deadline:
            break
        if failing:
            time.sleep(POLL_SECONDS)
    return failing


def gateway_answer(url: str, model_name: str) -> dict:
    """A gateway's answer to probes.gateway_chat, asked from here as a client would."""
    try:
        answer = requests.post(f"{url}/v1/chat/completions", timeout=HTTP_TIMEOUT_SECONDS, headers=api_headers(),
                               json=gateway_chat(model_name))
    except requests.RequestException as exc:
        return {"status": 0, "body": f"({type(exc).__name__})"}
    return {"status": answer.status_code, "body": answer.text}


def retried(check: Callable[[], object], seconds: float = GATE_SETTLE_SECONDS):
    """check() until it finds no problem or the time is up; the last problem, or None."""
    deadline = time.monotonic() + seconds
    while (problem := check()) is not None and time.monotonic() < deadline:
        time.sleep(POLL_SECONDS)
    return problem


# ------------------------------------------------------------------ running pyinfra


def pyinfra_failure(output: str, hosts: list[str]) -> str:
    """The line of pyinfra's output that says why: our gates' one-liners (`[host] host: ...`), else a
    host it could not connect to, else the first error pyinfra reported."""
    ours = re.compile(r"^\s*\[(\S+)\] (\1: .+)$")
    for line in output.splitlines():
        match = ours.match(line)
        if match and match[1] in hosts:
            return match[2]
    # pyinfra names a host it cannot reach, then stops with "No hosts remaining!", which says nothing.
    unreachable = re.compile(r"^\s*\[(\S+)\] (?:Could not connect|Could not resolve hostname|SSH error|EOF error) "
                             r"\((.*)\)\s*$")
    for line in output.splitlines():
        if match := unreachable.match(line):
            return f"{match[1]}: cannot connect over SSH ({match[2]}); check that it is up and reachable from here"
    for line in output.splitlines():
        if "pyinfra error" in line or re.search(r"\b(Error|error:|Failed)\b", line):
            return line.strip()
    return output.strip().splitlines()[-1] if output.strip() else "no output"


PR_SET_PDEATHSIG = 1  # prctl(2)


def child_of(parent: int) -> None:
    """Run in a rollout's child before it starts: in a process group of its own, which the rollout ends
    with it, and killed by the kernel when the rollout dies, `kill -9` included (its SSH sessions close)."""
    os.setpgid(0, 0)
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the rollout died before the line above
        os._exit(1)


def run_child(argv: list[str]) -> tuple[int, str]:
    """(exit code, output) of a pyinfra run of the rollout, under its fleet lease (fleetlease.LEASE_ENV):
    it ends with the rollout, whichever way the rollout ends."""
    lease = fleetlease.held()
    env = {**os.environ, fleetlease.LEASE_ENV: lease.token} if lease else None
    parent = os.getpid()
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                             preexec_fn=lambda: child_of(parent))
    try:
        output, _ = child.communicate()
    finally:
        if child.poll() is None:  # the rollout is ending (Ctrl-C, an error): so does its child's group
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    return child.returncode, output


class Runner:
    """Runs the steps of one record: drain, wait, deploy, gate, undrain; progress told to `report`."""

    def __init__(self, fleet: RolloutInventory, record: Record | None, report: Callable[[Step, str], None], drain_timeout: float,
                 pause: float = 0):
        self.fleet, self.record, self.report = fleet, record, report
        self.drain_timeout, self.pause = drain_timeout, pause
        self.log_dir = fleet.state.directory / "logs"

    def save(self) -> None:
        self.fleet.state.save_rollout(self.record.model_dump())

    def begin(self, step: Step, what: str) -> None:
        step.mark("running")
        self.save()
        self.report(step, what)

    def end(self, step: Step, started: float, failure: str | None = None) -> bool:
        """The step done, or failed with `failure` saying why: recorded and told; True when done."""
        step.mark("failed" if failure else "done", failure or "", started)
        self.save()
        self.report(step, step.status)
        return failure is None

    def pyinfra(self, deploy: str, hosts: list[str], data: dict, label: str) -> str | None:
        """Run a deploy on hosts; None, or one line saying why it failed (full output in the log)."""
        argv = [str(Path(sys.executable).with_name("pyinfra")), "-y", str(self.fleet.inventory_path), deploy]
        for host in hosts:
            argv += ["--limit", host]
        for key, value in data.items():
            argv += ["--data", f"{key}={value if isinstance(value, str) else json.dumps(value)}"]
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_dir / f"{time.strftime('%Y%m%d-%H%M%S')}-{re.sub(r'[^a-z0-9]+', '-', label.lower())}.log"
        returncode, output = run_child(argv)
        log.write_text(f"$ {' '.join(argv)}\n{output}")
        if returncode == 0:
            return None
        return f"{pyinfra_failure(output, hosts)} (log: {log})"

    def set_gateway(self, drained: set[str], label: str) -> str | None:
        """Apply the drained set with the routes deploy (nginx -t, then reload) on every gateway. It is
        recorded, and pushed to the fleet's records, once the gateways have it: a deploy that failed (nginx -t
        refused it, a gateway did not answer) leaves the record as it was, as the gateways kept their config.
        Every gateway must answer first: a drain that reached some would leave them routing differently."""
        if (problem := self.fleet.unreachable_gateways()) is not None:
            return problem
        state, lease = self.fleet.state, fleetlease.held()
        before = state.drained()
        with lease.withheld(GATEWAY_FILE) if lease else nullcontext():
            state.set_drained(drained)  # the routes deploy renders it from here
            if (problem := self.pyinfra(ROUTES_DEPLOY, self.fleet.gateways, self.fleet.data, label)) is not None:
                state.set_drained(before)
                return problem
        if lease:
            lease.push()
        return None

    def wait_idle(self, backends: list[Backend], step: Step) -> str | None:
        time.sleep(DRAIN_SETTLE_SECONDS)
        deadline = time.monotonic() + self.drain_timeout
        while (running := self.running(backends)) and any(running.values()):
            busy = {key: n for key, n in running.items() if n}
            if time.monotonic() > deadline:
                return (f"{', '.join(f'{k} ({n})' for k, n in busy.items())} still running requests after "
                        f"{self.drain_timeout:.0f}s; wait, or raise --drain-timeout")
            self.report(step, f"draining: {sum(busy.values())} requests running")
            time.sleep(POLL_SECONDS)
        return None

    def running(self, backends: list[Backend]) -> dict[str, int]:
        answers = instance_answers(self.fleet, backends, (METRICS,))
        return {key: running_requests(answer[METRICS]) for key, answer in answers.items()}

    def expected_paths(self, step: Step, backends: list[Backend]) -> dict[str, str | None]:
        """Where each instance must serve its model from when the step sets the model (a swap)."""
        model = step.data.get("model")
        return {b.key: str(revision_dir(self.fleet.configs[b.host].model_dir, model["id"], model["revision"]))
                if model else None for b in backends}

    def gate(self, step: Step, backends: list[Backend]) -> tuple[str, str] | None:
        """(where, what) of the first instance of the step that fails its gates, or None."""
        if not (failing := failing_gates(self.fleet, backends, self.expected_paths(step, backends))):
            return None
        backend, verdict = failing[0]
        return f"{backend.host} {backend.instance} gate {verdict.gate}", verdict.detail

    def gateway_gate(self) -> tuple[str, str] | None:
        """(where, what) of the first gateway whose chat completion still fails, or None."""
        for url in self.fleet.gateway_urls():
            if (problem := retried(lambda u=url: judge_gateway(gateway_answer(u, self.fleet.model_name)))) is not None:
                return f"gateway {url} gate completion", problem
        return None

    def run_step(self, step: Step) -> bool:
        """One step; on failure the step's instances stay drained and step.detail says why."""
        if step.blue_green:
            return self.run_blue_green_step(step)
        started = time.monotonic()
        backends = [b for b in self.fleet.all_backends() if b.key in step.instances]

        def fail(where: str, detail: str) -> bool:
            return self.end(step, started, f"{where}: {detail}")

        self.begin(step, "draining at the gateway")
        drained = self.fleet.state.drained() | set(step.instances)
        if (problem := self.set_gateway(drained, f"drain {step.name}")) is not None:
            return fail("gateway", problem)
        if (problem := self.wait_idle(backends, step)) is not None:
            return fail("drain", problem)
        self.report(step, f"deploying {step.deploy}")
        if (problem := self.pyinfra(step.deploy, step.hosts, step.data, step.name)) is not None:
            return fail("deploy", problem)
        self.report(step, "gating")
        if (failed := self.gate(step, backends)) is not None:
            return fail(*failed)
        self.report(step, "back into the gateway")
        if (problem := self.set_gateway(self.fleet.state.drained() - set(step.instances),
                                        f"undrain {step.name}")) is not None:
            return fail("gateway", problem)
        if (failed := self.gateway_gate()) is not None:
            return fail(*failed)
        if step.bench_gate and (problem := self.bench_gate(step, backends)) is not None:
            self.set_gateway(self.fleet.state.drained() | set(step.instances), f"bench gate {step.name}")
            return fail(*problem)
        return self.end(step, started)

    def bench_gate(self, step: Step, backends: list[Backend]) -> tuple[str, str] | None:
        """(where, what) when the step's instance benchmarks worse than the record's baseline, or None.
        The baseline's own instance when the step changed it, else the step's first."""
        gate = self.record.bench_gate
        baseline, load = gate.check()
        named = (baseline.get("ascend_fleet") or {}).get("instance")
        backend = next((b for b in backends if b.key == named), backends[0])
        self.report(step, f"bench gate: vllm bench serve on {backend.key}")
        host = self.fleet.inventory.get_host(backend.host)
        out = self.fleet.state.directory / "bench-gate"
        out.mkdir(parents=True, exist_ok=True)
        try:
            with instance_target(self.fleet.inventory_path, host, self.fleet.configs[backend.host],
                                 backend.instance) as target:
                _, result = measure(target, load, out, f"{time.strftime('%Y%m%d-%H%M%S')}-{step.name}.json")
        except (FleetError, OSError) as exc:
            return f"{backend.key} bench gate", str(exc)
        if found := regressions(baseline, result, gate.max_regression):
            return f"{backend.key} bench gate against {gate.baseline}", "; ".join(found)
        return None

    def run_blue_green_step(self, step: Step) -> bool:
        """Start the other colour on the new model beside the serving one, gate it, flip the recorded
        colour and point the gateway at it, drain the old colour and stop it. Until the flip the old
        colour serves untouched; a failure before it stops the new colour again."""
        started = time.monotonic()
        state, hosts = self.fleet.state, step.hosts
        recorded = state.colours()
        old = {host: recorded.get(host, BLUE) for host in hosts}
        new_backends = [b for host in hosts for b in self.fleet.backends_in(host, step.colours[host])]
        old_backends = [b for host in hosts for b in self.fleet.backends_in(host, old[host])]

        def fail(where: str, detail: str, flipped: bool = False) -> bool:
            if flipped:
                state.set_colours(old)
                self.set_gateway(state.drained(), f"back to {step.name}")
            self.report(step, "stopping the new instances")
            self.pyinfra(SERVE_DEPLOY, hosts, step.data_back, f"stop new {step.name}")
            return self.end(step, started, f"{where}: {detail}")

        self.begin(step, "starting the new instances beside the serving ones")
        if (problem := self.pyinfra(SERVE_DEPLOY, hosts, step.data, f"start {step.name}")) is not None:
            return fail("deploy", problem)
        self.report(step, "gating the new instances")
        if (failed := self.gate(step, new_backends)) is not None:
            return fail(*failed)
        self.report(step, "switching the gateway")
        state.set_colours(step.colours)
        if (problem := self.set_gateway(state.drained(), f"switch {step.name}")) is not None:
            return fail("gateway", problem, flipped=True)
        if (failed := self.gateway_gate()) is not None:
            return fail(*failed, flipped=True)
        if (problem := self.wait_idle(old_backends, step)) is not None:
            return fail("drain", problem, flipped=True)
        self.report(step, "stopping the old instances")
        # Prometheus scrapes the instances that serve now, not the stopped ones.
        for deploy, hosts_of, what in ((SERVE_DEPLOY, hosts, "stopping the old instances"),
                                       (MONITORING_DEPLOY, self.fleet.gateways, "Prometheus targets")):
            if (problem := self.pyinfra(deploy, hosts_of, step.data_done, f"{what} {step.name}")) is not None:
                return self.end(step, started, f"the new model serves; {what} failed: {problem}")
        return self.end(step, started)

    def run(self) -> bool:
        """Every step not yet done, in order, pausing between them; False at the first failure."""
        pending = [step for step in self.record.steps if step.status != "done"]
        for index, step in enumerate(pending):
            if not self.run_step(step):
                return False
            if self.pause and index < len(pending) - 1:
                self.report(step, f"done; pausing {self.pause:g}s")
                time.sleep(self.pause)
        self.record.finished = True
        self.save()
        return True

    def abandon(self) -> dict[str, str]:
        """Put the instances the record's steps left drained back into the gateway, each only once
        it passes its gates, and close the record: {instance: why} for each that stays out (still
        drained; after a fix, another abandon of the closed record tries them again)."""
        state = self.fleet.state
        ours = state.drained() & self.record.instances()
        backends = {b.key: b for b in self.fleet.all_backends()}
        left_out = {}
        # An instance the data no longer lists is in no upstream: it only leaves the drained set.
        for backend, verdict in failing_gates(self.fleet, [backends[key] for key in sorted(ours & backends.keys())]):
            left_out[backend.key] = f"gate {verdict.gate}: {verdict.detail}"
        if back := ours - left_out.keys():
            # The gateway lists an instance only once it has served since it last started (fleetstate.py):
            # one whose deploy failed its gate, and has passed ours since, is in the record again.
            served = state.served()
            for backend in (backends[key] for key in sorted(back & backends.keys())):
                if backend.host in served:
                    served[backend.host].add(backend.instance)
                    state.set_served(backend.host, served[backend.host])
            if (problem := self.set_gateway(state.drained() - back, "abandon")) is not None:
                raise FleetError(f"the routes deploy failed, the drained set is as it was: {problem}; "
                                 "fix it and run --abandon again")
        self.record.finished = True
        self.record.abandoned = {"at": time.strftime("%Y-%m-%d %H:%M:%S"), "left_out": left_out}
        self.save()
        return left_out


# ------------------------------------------------------------------ planning the steps


def parse_data(pairs: list[str]) -> dict:
    """`--data KEY=VALUE` as pyinfra reads it (JSON values allowed)."""
    with warnings.catch_warnings():  # importing pyinfra_cli patches the stdlib for gevent, late here
        warnings.simplefilter("ignore")
        from pyinfra_cli.util import parse_cli_arg

    data = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise FleetError(f"--data {pair}: expected KEY=VALUE")
        data[key] = parse_cli_arg(value)
    return data


def recorded(state: FleetState) -> Record | None:
    """The last rollout, swap or rollback the fleet state records."""
    record = state.rollout()
    try:
        return Record.model_validate(record) if record else None
    except ValidationError as exc:
        raise FleetError(f"{state.directory}: its rollout record is not one this ascend-fleet reads "
                         f"({describe_validation(exc, Record)}); finish it with the version that wrote it, "
                         "or move the file aside") from None


def check_not_stopped(state: FleetState, resume: bool) -> Record | None:
    """The unfinished record to resume, or None to start anew; refuses to start over a stopped one."""
    record = recorded(state)
    unfinished = record if record and not record.finished else None
    if resume and unfinished is None:
        raise FleetError(f"--resume: no stopped rollout is recorded in {state.directory}; run without --resume")
    if not resume and unfinished is not None:
        stopped = next((s for s in unfinished.steps if s.status != "done"), unfinished.steps[-1])
        raise FleetError(f"a {unfinished.kind} stopped at {stopped.name} ({stopped.detail or 'interrupted'}); "
                         "fix it and add --resume, or put back what it drained with `ascend-fleet rollout "
                         f"{unfinished.inventory} --abandon`")
    return unfinished


def abandonable(state: FleetState) -> Record:
    """The record --abandon closes: a stopped one, or one abandoned with instances left out."""
    record = recorded(state)
    if record and not record.finished:
        return record
    if record and record.abandoned and state.drained() & record.instances():
        return record
    raise FleetError(f"--abandon: no stopped rollout is recorded in {state.directory}, and no instance an "
                     "abandoned one left out is still drained; nothing to abandon")


def describe_stopped(record: Record, drained: set[str]) -> str:
    """What a stopped record would go on with, and what it keeps out of the gateway, in one line:
    `rollout of DEPLOY with --data ...: wave1 (hosts; why it stopped), then wave2 (hosts); drained: ...`."""
    what = record.kind + (f" of {record.deploy}" if record.deploy else "")
    if record.data:
        what += " with --data " + " ".join(f"{k}={v if isinstance(v, str) else json.dumps(v)}"
                                          for k, v in record.data.items())
    steps = [f"{s.name} ({', '.join(s.hosts)}{'; ' + s.detail if s.detail else ''})"
             for s in record.steps if s.status != "done"]
    ours = sorted(drained & record.instances())
    return f"{what}: {', then '.join(steps) or 'no step left'}; drained: {', '.join(ours) or 'none'}"


def check_capacity(fleet: RolloutInventory, steps: list[Step]) -> None:
    """No step may take every instance out of the gateway."""
    in_rotation = {b.key for b in fleet.all_backends()} - fleet.state.drained()
    for step in steps:
        if not in_rotation - set(step.instances):
            raise FleetError(f"step {step.name} would drain every instance the gateway has; "
                             "a rollout needs at least two waves (or --max-unavailable below the fleet's size)")


def check_rollout_arguments(fleet: RolloutInventory, waves: list[str] | None, limit: list[str] | None,
                            bench_gate: BenchGate | None) -> None:
    """What plan_rollout refuses of the operator's --waves, --limit and --bench-gate, from the inventory and
    the baseline alone: the command asks it before it takes the fleet's lease, so a typo writes nothing on
    the first gateway."""
    for host in limit or []:
        if host not in fleet.workers:
            raise InputError(f"--limit {visible(host)}: not a worker of {fleet.inventory_path}; "
                             f"workers: {', '.join(fleet.workers)}")
    fleet.waves(waves)
    if bench_gate:
        bench_gate.check()


def plan_rollout(fleet: RolloutInventory, deploy: str, waves: list[str] | None, max_unavailable: int | None,
                 limit: list[str] | None = None, bench_gate: BenchGate | None = None) -> Record:
    """One step per wave (split by max_unavailable); with `limit`, only those workers, in their waves;
    with `bench_gate`, the first step (the canary wave's) is benchmarked against its baseline."""
    check_rollout_arguments(fleet, waves, limit, bench_gate)
    # A multi-node instance is one unit: it goes with its head's wave, its members in the same step,
    # and counts as one instance against max_unavailable.
    limited = {fleet.head_of(host) for host in limit or []}
    steps = []
    for name, members in fleet.waves(waves):
        hosts = [host for host in members if fleet.head_of(host) == host and (not limit or host in limited)]
        if not hosts:
            continue
        instances = {host: [i.name for i in fleet.configs[host].instances] for host in hosts}
        for batch in split_wave(name, hosts, instances, max_unavailable):
            backends = [b for host in batch.hosts for b in fleet.backends(host, batch.serve_only or None)]
            data = {**fleet.data, "serve_only": batch.serve_only} if batch.serve_only else fleet.data
            hosts_of_batch = [member for host in batch.hosts for member in fleet.instance_hosts(host)]
            steps.append(step_of(batch.name, hosts_of_batch, backends, deploy, data))
    check_capacity(fleet, steps)
    if bench_gate and steps:
        steps[0].bench_gate = True
    return Record(kind="rollout", inventory=str(fleet.inventory_path), deploy=deploy, data=fleet.data, steps=steps,
                  bench_gate=bench_gate)


def new_model_problem(model: dict) -> str | None:
    """Why the swap cannot read the new model's config.json where the planner looks for it (the
    local models tree, else the HTTP mirror), or None when it can."""
    staged = MODELS_DIR / model["id"] / model["revision"] / "config.json"
    if staged.is_file():
        return None
    named = visible(f"{model['id']}@{model['revision']}")  # a lookalike or a stray blank shows
    if not model.get("url"):
        return (f"no config.json of {named} on this machine to plan the swap with (source {model['source']} is "
                f"read by the nodes only); put it at {visible(staged.absolute())}")
    url = f"{model['url'].rstrip('/')}/models/{model['id']}/{model['revision']}/config.json"
    try:
        answer = requests.get(url, timeout=HTTP_TIMEOUT_SECONDS)
    except requests.RequestException as exc:
        return f"the mirror does not answer {url} ({type(exc).__name__}); is it up? (model.url of your data)"
    if answer.status_code == 404:
        return (f"{visible(url)} answers HTTP 404: the mirror has no model {visible(model['id'])} at revision "
                f"{visible(model['revision'])}; check --model and --revision")
    if answer.status_code != 200:
        return f"{url} answers HTTP {answer.status_code}; check the mirror (model.url of your data)"
    return None


def model_data(fleet: RolloutInventory, model_id: str, revision: str | None) -> dict:
    """The data's model with another id and revision; clients keep the served name. Refused in one line as
    host data would refuse it (an id that is not <org>/<name>, a revision that is no revision)."""
    current = fleet.configs[fleet.workers[0]].model
    model = {**current.model_dump(exclude_none=True), "id": model_id, "revision": revision or current.revision,
             "served_model_name": current.served_model_name}
    try:
        Model(**model)
    except ValidationError as exc:
        raise InputError(f"--model {visible(model_id)} --revision {visible(model['revision'])}: "
                         f"{describe_validation(exc, Model)}") from None
    return model


def blue_green_problem(fleet: RolloutInventory, model: dict) -> str | None:
    """Why some node cannot run its other colour of instances on the new model beside the serving
    ones: they would share a port, or share NPUs whose HBM cannot hold both models (the planner's
    check_blue_green); None when every node can."""
    heads = sorted({role.head for role in fleet.roles.values()})
    if heads:
        return (f"{heads[0]}: its multi-node instance ({fleet.roles[heads[0]].group}) has no second colour to start "
                "beside it; swap the model without --blue-green (one instance at a time)")
    configs = ModelConfigs()
    for host in fleet.workers:
        config = fleet.configs[host]
        profile = profile_of_the_run(fleet.inventory, config.profile)
        replacement = fleet.other_config(host).model_copy(update={"model": Model(**model)})
        records = [*config.instance_records(), *replacement.instance_records()]
        for finding in check_node_instances(records):
            if finding.code != "shared-npu":
                return f"{host}: {finding.message}"
        pairs = zip(plan_node(config, profile, configs.shape(config)),
                    plan_node(replacement, profile, configs.shape(replacement)))
        for current, new in pairs:
            if set(current.instance.npus) & set(new.instance.npus):
                for finding in check_blue_green(current.plan, new.plan):
                    return f"{host} {current.instance.name}: {finding.message}"
    return None


def model_path(fleet: RolloutInventory, host: str, model: dict) -> str:
    """Where the host keeps `model`'s revision: the directory an instance serving it serves from."""
    return str(revision_dir(fleet.configs[host].model_dir, model["id"], model["revision"]))


def served_path(fleet: RolloutInventory, backend: Backend) -> str | None:
    """The model directory an instance serves (vLLM's /v1/models `root`), or None if it does not answer."""
    return judge_instance(instance_answers(fleet, [backend], (HEALTH, MODELS))[backend.key], fleet.model_name).root


def plan_swap(fleet: RolloutInventory, model: dict, waves: list[str] | None) -> Record:
    """Weights first (staged beside the old, nothing restarts), then per wave one step per instance
    slot: each node loses at most one instance at a time. Instances already on the model are skipped."""
    steps = []
    for name, hosts in fleet.waves(waves):
        slots: dict[str, list[Backend]] = {}
        for host in hosts:
            for backend in fleet.backends(host):
                if served_path(fleet, backend) != model_path(fleet, host, model):
                    slots.setdefault(backend.instance, []).append(backend)
        for instance, backends in slots.items():
            data = {**fleet.data, "model": model, "serve_only": [instance]}
            hosts_of_step = sorted({member for b in backends for member in fleet.instance_hosts(b.host)})
            steps.append(step_of(f"{name} {instance}", hosts_of_step, backends, SERVE_DEPLOY, data))
    check_capacity(fleet, steps)
    return Record(kind="swap-model", inventory=str(fleet.inventory_path), model=model, steps=steps)


def blue_green_step(fleet: RolloutInventory, name: str, hosts: list[str], model: dict, previous: dict) -> Step:
    """A step that moves hosts to their other colour on `model`; `previous` is the model the
    serving colour keeps if the step fails."""
    recorded = fleet.state.colours()
    colours = {host: other_colour(recorded.get(host, BLUE)) for host in hosts}
    new = [b for host in hosts for b in fleet.backends_in(host, colours[host])]
    data = {**fleet.data, "model": model, "colour": next(iter(colours.values())),
            "serve_only": sorted({b.instance for b in new})}
    step = step_of(name, hosts, new, SERVE_DEPLOY, data)
    # After the flip the recorded colour serves `model`; before it the old colour keeps `previous`.
    return step.model_copy(update={"colours": colours, "data_done": {**fleet.data, "model": model},
                                   "data_back": {**fleet.data, "model": previous}})


def plan_blue_green(fleet: RolloutInventory, model: dict, waves: list[str] | None) -> Record:
    """One blue/green step per wave, for the hosts not yet serving the model everywhere."""
    steps = []
    for name, hosts in fleet.waves(waves):
        paths = {host: {served_path(fleet, b) for b in fleet.backends(host)} for host in hosts}
        by_colour: dict[str, list[str]] = {}  # a step flips hosts of one colour
        recorded = fleet.state.colours()
        for host in hosts:
            if paths[host] != {model_path(fleet, host, model)}:
                by_colour.setdefault(recorded.get(host, BLUE), []).append(host)
        for colour, moving in by_colour.items():
            served = next((p for p in paths[moving[0]] if p), None)
            previous = model_of_path(fleet, moving[0], served) if served else fleet.configs[moving[0]].model.model_dump(
                exclude_none=True)
            step_name = name if len(by_colour) == 1 else f"{name} ({colour})"
            steps.append(blue_green_step(fleet, step_name, moving, model, previous))
    return Record(kind="swap-model", inventory=str(fleet.inventory_path), model=model, steps=steps)


def rollback_record(swap: Record, previous: dict[str, str], fleet: RolloutInventory) -> Record:
    """Steps that put each instance a failed swap touched back on the model it served before: a
    blue/green step back for each wave that switched, an instance step for each instance swapped."""
    steps = []
    for step in swap.steps:
        if step.blue_green:
            if step.status == "done":
                steps.append(blue_green_step(fleet, f"back: {step.name}", step.hosts,
                                             step.data_back["model"], step.data_done["model"]))
            continue
        if step.status == "pending":
            continue
        by_model: dict[str, list[Backend]] = {}
        for backend in fleet.all_backends():
            if backend.key in step.instances and previous.get(backend.key):
                by_model.setdefault(previous[backend.key], []).append(backend)
        for path, backends in by_model.items():
            model = model_of_path(fleet, backends[0].host, path)
            data = {**fleet.data, "model": model, "serve_only": sorted({b.instance for b in backends})}
            steps.append(step_of(f"back: {step.name}", sorted({b.host for b in backends}), backends,
                                 SERVE_DEPLOY, data))
    return Record(kind="swap-model rollback", inventory=swap.inventory, steps=steps)


def model_of_path(fleet: RolloutInventory, host: str, path: str) -> dict:
    """The model data that serves `path` (<model_dir>/<org>/<name>/<revision>)."""
    config = fleet.configs[host]
    org, name, revision = Path(path).relative_to(config.model_dir).parts
    current = config.model
    return {**current.model_dump(exclude_none=True), "id": f"{org}/{name}", "revision": revision,
            "served_model_name": current.served_model_name}
