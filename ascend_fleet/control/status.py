"""`ascend-fleet status INVENTORY`: every instance of the fleet in one table.

Each host is read over SSH at the same time as the others (ascend_fleet/core/remote.py) with
the deploy's own facts: driver, firmware, CANN and the serving venv's packages against
the host's profile, npu-smi, each instance's unit, /health, /v1/models and /metrics
(asked on the node, so a firewall between this machine and the workers does not matter),
and each gateway's routes file and its route watcher's state, which say whether it routes to an
instance (drained, or taken out by the watcher) whatever the routing policy.
A host that cannot be read is a red row; nothing here raises for a node's state.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from functools import cached_property
from itertools import islice
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from pyinfra.api import Inventory
from pyinfra.facts.files import FileContents
from pyinfra.facts.server import Arch
from rich.console import Console
from rich.progress import MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from ascend_fleet.config.fleetstate import backend_key
from ascend_fleet.config.host_config import host_node_config
from ascend_fleet.config.hostdata import Instance, NodeConfig
from ascend_fleet.config.profile import Profile, load_profile
from ascend_fleet.core.command_options import above_zero
from ascend_fleet.core.node_layout import (
    ROUTE_WATCH_STATE,
    ROUTE_WATCH_UNIT,
    ROUTES_FILE,
    instance_env_file,
    instance_unit,
)
from ascend_fleet.core.remote import MAX_PARALLEL_HOSTS, FactQuery, HostFacts, read_fleet_facts
from ascend_fleet.facts.ascend import AscendDriver, AscendFirmware, CannPackages, NpuStatus, PipPackages
from ascend_fleet.facts.gateway import AddressHeld
from ascend_fleet.facts.hccn import NpuNicHealth
from ascend_fleet.facts.systemd import UnitState
from ascend_fleet.facts.weights import StagedModel
from ascend_fleet.fleet.multi_node import DataParallelRole
from ascend_fleet.fleet.plan import fleet_roles, limited_hosts, load_inventory
from ascend_fleet.fleet.probes import NO_ANSWER, READ_ONLY_ASKS, fact_key, instance_queries, judge_instance
from ascend_fleet.fleet.virtual_address import KEEPALIVED_SERVICE
from ascend_fleet.node.route_watch import isolated_keys
from ascend_fleet.node.stage_weights import deep_verify_of

HTTP_TIMEOUT_SECONDS = 5
VERSIONS = ("driver", "firmware", "cann", "torch_npu", "vllm_ascend")
GATEWAY_SERVICES = ("nginx", "prometheus", ROUTE_WATCH_UNIT.removesuffix(".service"))
# Off a terminal, how often a long read says how far it got (a log shows it is not stuck).
PROGRESS_SECONDS = 5


@dataclass
class Version:
    installed: str | None
    expected: str

    @property
    def drift(self) -> bool:
        return self.installed != self.expected


@dataclass
class InstanceStatus:
    name: str
    port: int
    npus: list[int]
    unit: dict[str, str] = field(default_factory=dict)
    npu_health: list[str] = field(default_factory=list)
    hbm_used_mb: int | None = None
    hbm_total_mb: int | None = None
    health: int | None = None  # /health status code, 0 when nothing answered
    model: str | None = None
    revision: str | None = None
    metrics: dict | None = None
    routed: str = "unknown"  # "yes", "drained", "isolated" (a gateway's route watcher took it out), "absent"
    # (by every gateway), "unknown" (no gateway read),
    # "via head" (a multi-node instance's headless member: the gateway reaches it through its head)
    multi_node: str | None = None  # "head of G" or "rank R of G (head H)"
    members: list[dict] = field(default_factory=list)  # a head's: each member host's unit and problems
    problems: list[str] = field(default_factory=list)  # red: it is not serving as it should
    warnings: list[str] = field(default_factory=list)  # yellow: serving, but not as the inventory says

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass
class HostStatus:
    host: str
    role: str  # worker, gateway, or "worker+gateway"
    profile: str
    error: str | None = None  # unreachable
    versions: dict[str, Version] = field(default_factory=dict)
    npu_smi_error: str | None = None
    services: dict[str, dict[str, str]] = field(default_factory=dict)  # gateway: nginx and prometheus units
    routes: list[dict] | None = None  # gateway: its backends [{"key", "drained"}]; None until its routes are read
    isolated: dict[str, dict] = field(default_factory=dict)  # gateway: {key: {"reason", "since"}} out of routing
    holds_vip: bool | None = None  # gateway with gateway_vip: whether the virtual address is on it now
    instances: list[InstanceStatus] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and self.error is None and all(i.ok for i in self.instances)

    @cached_property
    def routed(self) -> dict[str, bool]:
        """A gateway's routes by host/instance: whether it is drained. Looked up once per instance of the
        fleet: a list would cost the fleet's size squared."""
        return {route["key"]: route["drained"] for route in self.routes or ()}

    def to_dict(self) -> dict:
        data = asdict(self)
        data["versions"] = {k: {**asdict(v), "drift": v.drift} for k, v in self.versions.items()}
        data["instances"] = [{**asdict(i), "ok": i.ok} for i in self.instances]
        data["ok"] = self.ok
        return data


@dataclass
class FleetStatus:
    hosts: list[HostStatus]
    read_at: str  # when the reading started
    seconds: float

    @property
    def ok(self) -> bool:
        return all(host.ok for host in self.hosts)

    def to_dict(self) -> dict:
        return {"ok": self.ok, "read_at": self.read_at, "seconds": round(self.seconds, 2),
                "hosts": [host.to_dict() for host in self.hosts]}


# What to read on each host.

def worker_queries(config: NodeConfig, profile: Profile, role: DataParallelRole | None = None) -> dict[str, FactQuery]:
    queries = {"driver": FactQuery(AscendDriver), "firmware": FactQuery(AscendFirmware),
               "cann": FactQuery(CannPackages), "npus": FactQuery(NpuStatus),
               "pip": FactQuery(PipPackages, {"venv": profile.pip.venv}), "arch": FactQuery(Arch)}
    if config.npu_addresses:
        queries["npu_network"] = FactQuery(NpuNicHealth, {"npu_count": config.npu_count})
    model = config.model
    queries["weights"] = FactQuery(StagedModel, {"model_dir": config.model_dir, "model_id": model.id,
                                                 "revision": model.revision})
    for instance in config.instances:
        queries[fact_key("unit", instance.name)] = FactQuery(UnitState, {"unit": instance_unit(instance.name)})
        if role and not role.is_head:
            continue  # a headless member serves no HTTP
        asked = instance_queries(instance.port, instance_env_file(instance.name), config.model.served_model_name,
                                 READ_ONLY_ASKS, HTTP_TIMEOUT_SECONDS)
        queries |= {fact_key(ask, instance.name): query for ask, query in asked.items()}
    return queries


def gateway_services(config: NodeConfig) -> tuple[str, ...]:
    """The units a gateway runs: nginx, Prometheus, its route watcher, and keepalived where it carries the
    virtual address."""
    return (*GATEWAY_SERVICES, KEEPALIVED_SERVICE) if config.gateway_vip else GATEWAY_SERVICES


def gateway_queries(config: NodeConfig) -> dict[str, FactQuery]:
    vip = {"holds_vip": FactQuery(AddressHeld, {"address": str(config.gateway_vip.address.ip)})
           } if config.gateway_vip else {}
    return {"routes": FactQuery(FileContents, {"path": ROUTES_FILE}),
            "route_state": FactQuery(FileContents, {"path": ROUTE_WATCH_STATE}), **vip,
            **{f"service:{name}": FactQuery(UnitState, {"unit": f"{name}.service"})
               for name in gateway_services(config)}}


# What the facts mean.

def expected_versions(profile: Profile, arch: str | None) -> dict[str, str]:
    """What the profile puts on a node of arch (torch_npu: a build over its pin, where the profile has one)."""
    stack = profile.stack
    torch_npu = profile.node_version("torch-npu", arch) if arch else stack.torch_npu
    return {"driver": stack.driver, "firmware": stack.firmware, "cann": stack.cann,
            "torch_npu": torch_npu, "vllm_ascend": stack.vllm_ascend}


def installed_versions(facts: dict[str, Any]) -> dict[str, str | None]:
    cann, pip = facts.get("cann") or {}, facts.get("pip") or {}
    toolkit, kernels = cann.get("toolkit"), cann.get("kernels")
    return {
        "driver": (facts.get("driver") or {}).get("version"),
        "firmware": facts.get("firmware"),
        # Toolkit and kernels/ops come as one CANN version; a mismatch between them is drift too.
        "cann": toolkit if kernels in (None, toolkit) else f"{toolkit} (kernels {kernels})",
        "torch_npu": pip.get("torch-npu"),
        "vllm_ascend": pip.get("vllm-ascend"),
    }


def unit_problem(unit: dict[str, str], name: str) -> str | None:
    if unit.get("ActiveState") == "active":
        return None
    if unit.get("LoadState") not in (None, "", "loaded"):
        return f"unit {name} is {unit['LoadState'] or 'unknown'}"
    why = f", result {unit['Result']}" if unit.get("Result") not in (None, "", "success") else ""
    last = f": {unit['last_line']}" if unit.get("last_line") else ""
    return f"unit {unit.get('ActiveState') or 'unknown'}/{unit.get('SubState') or '?'}{why}{last}"


def npu_network_problems(config: NodeConfig, health: dict | None) -> list[str]:
    """Each NPU NIC off the checklist the NPU network stage holds it to (link, net health, TLS)."""
    if not config.npu_addresses:
        return []
    if not health:
        return ["NPU network: hccn_tool answered nothing (no NPU driver?)"]
    problems = []
    for npu, state in sorted(health.items()):
        if state["link"] != "UP":
            problems.append(f"NPU network: NPU {npu} link {state['link']}")
        elif config.npu_gateway and state["net_health"] != "Success":
            problems.append(f"NPU network: NPU {npu} net health {state['net_health']}")
        elif state["tls"] != int(config.npu_tls):
            problems.append(f"NPU network: NPU {npu} TLS switch {state['tls']}, the fleet's is {int(config.npu_tls)}")
    return problems


def deep_verify_problems(staged: dict | None) -> list[str]:
    """Each file the last deep verify of the served revision found unlike its manifest (until a deploy restages it)."""
    record = deep_verify_of(staged, staged.get("deep_verify")) if staged else {}
    when = datetime.fromtimestamp(record.get("checked_at", 0), timezone.utc).isoformat(timespec="seconds")
    return [f"weights: the deep verify of {when} found {name} {problem}; the next deploy restages it"
            for name, problem in sorted(record.get("mismatched", {}).items())]


def instance_status(config: NodeConfig, instance: Instance, facts: dict[str, Any],
                    role: DataParallelRole | None = None) -> InstanceStatus:
    status = InstanceStatus(instance.name, instance.port, list(instance.npus))
    if role:
        status.multi_node = (f"head of {role.group}" if role.is_head
                             else f"rank {role.start_rank} of {role.group} (head {role.head})")
    status.unit = facts.get(fact_key("unit", instance.name)) or {}
    problem = unit_problem(status.unit, instance_unit(instance.name))
    if problem:
        status.problems.append(problem)
    elif int(status.unit.get("NRestarts") or 0):
        last = f": {status.unit['last_exit']}" if status.unit.get("last_exit") else ""
        status.warnings.append(f"restarted by systemd {status.unit['NRestarts']} times since its deploy{last}")

    npu_smi = facts.get("npus") or {"ok": False, "error": "npu-smi output unreadable", "npus": []}
    by_id = {npu["id"]: npu for npu in npu_smi["npus"]}
    mine = [by_id[n] for n in instance.npus if n in by_id]
    status.npu_health = [npu["health"] for npu in mine]
    if mine and all("hbm_used_mb" in npu for npu in mine):
        status.hbm_used_mb = sum(npu["hbm_used_mb"] for npu in mine)
        status.hbm_total_mb = sum(npu["hbm_total_mb"] for npu in mine)
    if not npu_smi["ok"]:
        status.problems.append(f"npu-smi fails: {npu_smi['error']}")
    elif len(mine) != len(instance.npus):
        status.problems.append(f"npu-smi lists {len(mine)} of NPUs {','.join(map(str, instance.npus))}")
    unhealthy = [f"NPU {npu['id']} {npu['health']}" for npu in mine if npu["health"] != "OK"]
    if unhealthy:
        status.problems.append(f"unhealthy: {', '.join(unhealthy)}")

    if role and not role.is_head:
        status.routed = "via head"
        return status
    answers = {ask: facts.get(fact_key(ask, instance.name)) or NO_ANSWER for ask in READ_ONLY_ASKS}
    verdict = judge_instance(answers, config.model.served_model_name)
    status.health, status.model, status.revision = verdict.health, verdict.model, verdict.revision
    status.metrics = verdict.metrics.to_dict() if verdict.metrics else None
    if not verdict.ok:
        status.problems.append(verdict.detail)
    elif status.revision != config.model.revision:
        status.warnings.append(f"serves {status.model}@{status.revision}, the inventory says "
                               f"{config.model.served_model_name}@{config.model.revision}")
    return status


def gateway_routes(routes_lines: list[str] | None) -> list[dict] | None:
    """The gateway's backends, [{"key": "worker1/vllm-0", "drained": False}], from its routes file
    (gateway_routes.py); None when the file is missing or unreadable."""
    try:
        document = json.loads("\n".join(routes_lines)) if routes_lines is not None else None
    except ValueError:
        return None
    return [{"key": b["key"], "drained": b["drained"]} for b in document["backends"]] if document else None


def clock_time(epoch: float | None) -> str:
    """When, as the gateway's clock said it: HH:MM:SS UTC."""
    return datetime.fromtimestamp(epoch or 0, timezone.utc).strftime("%H:%M:%S UTC")


def isolated_backends(state_lines: list[str] | None) -> dict[str, dict]:
    """{host/instance: {"reason", "since"}} the gateway's route watcher has out of routing now."""
    return isolated_keys("\n".join(state_lines)) if state_lines else {}


def routing(key: str, gateways: list[HostStatus]) -> str:
    """yes: every gateway read routes to it; drained: one has it drained; isolated: one's route watcher
    took it out; absent: one lacks it."""
    read = [gw for gw in gateways if gw.routes is not None]
    if not read:
        return "unknown"
    states = []
    for gateway in read:
        drained = gateway.routed.get(key)
        states.append("absent" if drained is None else "drained" if drained else
                      "isolated" if key in gateway.isolated else "yes")
    for state in ("absent", "drained", "isolated"):
        if state in states:
            return state
    return "yes"


def host_status(config: NodeConfig, profile: Profile, facts: HostFacts,
                part: DataParallelRole | None = None) -> HostStatus:
    role = "+".join(r for r, on in (("worker", config.is_worker), ("gateway", config.is_gateway)) if on) or "other"
    status = HostStatus(config.host, role, config.profile, error=facts.error)
    if facts.error:
        status.instances = [InstanceStatus(i.name, i.port, list(i.npus), problems=[f"host: {facts.error}"])
                            for i in config.instances]
        return status
    values = facts.facts
    status.problems += [f"could not read {name}: {error}" for name, error in facts.fact_errors.items()]
    if config.is_worker:
        installed = installed_versions(values)
        status.versions = {key: Version(installed[key], expected)
                           for key, expected in expected_versions(profile, values.get("arch")).items()}
        npu_smi = values.get("npus") or {}
        status.npu_smi_error = None if npu_smi.get("ok") else npu_smi.get("error")
        status.instances = [instance_status(config, instance, values, part) for instance in config.instances]
        status.problems += npu_network_problems(config, values.get("npu_network"))
        status.problems += deep_verify_problems(values.get("weights"))
    if config.is_gateway:
        status.services = {name: values.get(f"service:{name}") or {} for name in gateway_services(config)}
        status.holds_vip = values.get("holds_vip") if config.gateway_vip else None
        for name, unit in status.services.items():
            problem = unit_problem(unit, f"{name}.service")
            # Prometheus belongs to the monitoring stage: absent is not a fault of the gateway.
            if problem and not (name == "prometheus" and unit.get("LoadState") == "not-found"):
                status.problems.append(f"{name}: {problem}")
        status.routes = gateway_routes(values.get("routes"))
        status.isolated = isolated_backends(values.get("route_state"))
        if status.routes is None:
            status.problems.append(f"no {ROUTES_FILE}: the gateway stage has not run")
    return status


def configs_read(inventory: Inventory, hosts_read: set[str] | None) -> list[NodeConfig]:
    """The configs of the hosts a reading covers: every host, or those of hosts_read and the gateways,
    which say what is routed."""
    return [config for config in map(host_node_config, inventory)
            if hosts_read is None or config.host in hosts_read or config.is_gateway]


def read_status(inventory: Inventory, configs: list[NodeConfig], on_read: Callable[[str], None] | None = None,
                parallel: int = MAX_PARALLEL_HOSTS) -> FleetStatus:
    """The reading of these hosts (configs_read), judged; on_read(host) as each host's facts arrive; at most
    `parallel` hosts read at once."""
    started, read_at = time.monotonic(), datetime.now(timezone.utc).isoformat(timespec="milliseconds")
    profiles = {name: load_profile(name) for name in {config.profile for config in configs}}
    hosts = {host.name: host for host in inventory}
    roles = fleet_roles(inventory)
    plans = {}
    for config in configs:
        queries = {}
        if config.is_worker:
            queries |= worker_queries(config, profiles[config.profile], roles.get(config.host))
        if config.is_gateway:
            queries |= gateway_queries(config)
        plans[config.host] = (hosts[config.host].data.dict(), queries)
    facts = read_fleet_facts(plans, on_read, parallel)
    statuses = [host_status(config, profiles[config.profile], facts[config.host], roles.get(config.host))
                for config in configs]
    join_members(statuses, roles)
    gateways = [status for status, config in zip(statuses, configs) if config.is_gateway]
    judge_gateways(gateways, next((config.gateway_vip for config in configs if config.is_gateway), None))
    for status, config in zip(statuses, configs):
        for instance in status.instances:
            if instance.routed == "via head":
                continue
            key = backend_key(config.host, instance.name)
            instance.routed = routing(key, gateways)
            if instance.routed == "absent":
                instance.warnings.append("the gateway does not route to it (absent from its upstream)")
            elif instance.routed == "drained":
                instance.warnings.append("drained at the gateway")
            elif instance.routed == "isolated":
                instance.problems += [f"out of routing on {gateway.host} since {clock_time(out['since'])}: "
                                      f"{out['reason']}" for gateway in gateways
                                      if (out := gateway.isolated.get(key))]
    return FleetStatus(statuses, read_at, time.monotonic() - started)


def judge_gateways(gateways: list[HostStatus], vip) -> None:
    """What the gateways say together: a gateway whose routes differ from the first's (clients get a
    different fleet depending on where they land), and a virtual address on no gateway or on two."""
    read = [gateway for gateway in gateways if gateway.routes is not None]
    for gateway in read[1:]:
        if gateway.routed != read[0].routed:
            gateway.problems.append(f"routes differ from {read[0].host}'s ({describe_difference(gateway, read[0])}); "
                                    "rerun deploys/gateway.py on every gateway")
    if vip is None:
        return
    holders = [gateway.host for gateway in gateways if gateway.holds_vip]
    if not holders:
        for gateway in gateways:
            if gateway.error is None:
                gateway.problems.append(f"no gateway read holds the virtual address {vip.address.ip}: clients may "
                                        "reach nothing; see journalctl -u keepalived")
    elif len(holders) > 1:
        for gateway in gateways:
            if gateway.holds_vip:
                gateway.problems.append(f"{' and '.join(holders)} both hold the virtual address {vip.address.ip}: "
                                        "they do not hear each other's VRRP (firewall, router id, interface)")


def describe_difference(gateway: HostStatus, first: HostStatus) -> str:
    """The first backend the two gateways route differently, as `host/instance routed|drained|absent` on each."""
    def state(status: HostStatus, key: str) -> str:
        return {None: "absent", True: "drained", False: "routed"}[status.routed.get(key)]
    key = next(key for key in sorted({*gateway.routed, *first.routed})
               if gateway.routed.get(key) != first.routed.get(key))
    return f"{key} {state(gateway, key)} here, {state(first, key)} there"


def join_members(statuses: list[HostStatus], roles: dict[str, DataParallelRole]) -> None:
    """A multi-node instance is one unit: its head's row lists every member's unit and problems, and is
    red, naming the member, when one is (its head stops answering once an engine is gone)."""
    by_host = {status.host: status for status in statuses}
    for host, role in roles.items():
        if not role.is_head or not by_host[host].instances:
            continue
        head = by_host[host].instances[0]
        for member in role.members[1:]:
            other = by_host[member]
            problems = [*([f"host: {other.error}"] if other.error else []), *other.problems,
                        *(p for instance in other.instances for p in instance.problems)]
            unit = other.instances[0].unit if other.instances else {}
            head.members.append({"host": member, "rank": role.members.index(member) * role.size_local,
                                 "unit": unit.get("ActiveState"), "problems": problems})
            if problems:
                head.problems.append(f"member {member} of {role.group}: {problems[0]}")


# How it looks.

def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f}ms" if value < 10 else f"{value:.0f}s"


def _count(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _percentiles(metrics: dict | None, key: str) -> str:
    if not metrics:
        return "-"
    return f"{_seconds(metrics[key]['p50'])}/{_seconds(metrics[key]['p99'])}"


def _version_cell(version: Version) -> Text:
    if not version.drift:
        return Text(version.installed or "-")
    return Text(f"{version.installed or 'none'} ≠ {version.expected}", style="bold yellow")


def _service_state(unit: dict[str, str]) -> str:
    return "not installed" if unit.get("LoadState") == "not-found" else unit.get("ActiveState") or "?"


def _unit_cell(unit: dict[str, str]) -> Text:
    state = unit.get("ActiveState") or "?"
    result = unit.get("Result") if unit.get("Result") not in (None, "", "success") else ""
    text = state if state == "active" else f"{state}/{unit.get('SubState') or '?'} {result}".strip()
    return Text(text, style="green" if state == "active" else "bold red")


def render_table(status: FleetStatus) -> Table:
    table = Table(title=f"ascend-fleet status, {status.read_at} (read in {status.seconds:.1f}s)",
                  caption="TTFT and ITL p50/p99 since each instance started; versions against the host's profile",
                  header_style="bold", show_lines=False)
    for column in ("host", "instance", "driver", "firmware", "CANN", "torch_npu", "vllm-ascend", "NPUs", "HBM",
                   "unit", "model", "health", "run/wait", "KV", "TTFT", "ITL", "gateway"):
        table.add_column(column, overflow="fold")
    for host in status.hosts:
        versions = [_version_cell(host.versions[key]) if key in host.versions else "" for key in VERSIONS]
        if host.error:  # one row: its instances are not known, and a fleet of hundreds stays readable
            instances = f", {len(host.instances)} instances unknown" if host.instances else ""
            table.add_row(Text(host.host), f"unreachable{instances}", *[""] * 15, Text(host.error), style="bold red")
            continue
        if "gateway" in host.role:
            services = ", ".join(f"{name} {_service_state(unit)}" for name, unit in host.services.items())
            if host.holds_vip:
                services += ", holds the virtual address"
            table.add_row(Text(host.host), "gateway", *[""] * 7, Text(services), "", "", "", "", "", "",
                          Text("; ".join(host.problems) or f"{len(host.routes or [])} backends"),
                          style="bold red" if host.problems else None)
        for index, instance in enumerate(host.instances):
            metrics = instance.metrics or {}
            kv = metrics.get("kv_cache_usage")
            hbm = (f"{instance.hbm_used_mb / 1024:.0f}/{instance.hbm_total_mb / 1024:.0f}G"
                   if instance.hbm_total_mb else "-")
            health_word = ",".join(sorted(set(instance.npu_health))) or "-"
            model = f"{instance.model}@{instance.revision}" if instance.model else "-"
            gateway = Text(instance.routed, style="green" if instance.routed == "yes" else "yellow")
            table.add_row(
                Text(host.host if index == 0 else ""),
                Text(f"{instance.name}, {instance.multi_node}" if instance.multi_node else instance.name),
                *(versions if index == 0 else [""] * len(VERSIONS)),
                Text(health_word, style="green" if health_word == "OK" else "bold red"), hbm,
                _unit_cell(instance.unit), Text(model, style="yellow" if instance.warnings else ""),
                str(instance.health or "-"),
                f"{_count(metrics.get('running'))}/{_count(metrics.get('waiting'))}",
                f"{kv:.0%}" if kv is not None else "-",
                _percentiles(metrics, "ttft"), _percentiles(metrics, "inter_token_latency"), gateway,
                style="bold red" if instance.problems else None,
                end_section=index == len(host.instances) - 1,
            )
    return table


def render_problems(status: FleetStatus) -> list[Text]:
    """One line per problem (red) and warning (yellow), naming host and instance."""
    lines = []
    for host in status.hosts:
        if host.error:  # one line for the host: its instances' rows say the same
            lines.append(Text(f"{host.host}: {host.error}", style="red"))
            continue
        for problem in host.problems:
            lines.append(Text(f"{host.host}: {problem}", style="red"))
        for key, version in host.versions.items():
            if version.drift:
                lines.append(Text(f"{host.host}: {key} {version.installed or 'not installed'}, "
                                  f"profile {host.profile} says {version.expected}", style="yellow"))
        for instance in host.instances:
            lines += [Text(f"{host.host}/{instance.name}: {p}", style="red") for p in instance.problems]
            lines += [Text(f"{host.host}/{instance.name}: {w}", style="yellow") for w in instance.warnings]
    return lines


def show(status: FleetStatus, console: Console, as_json: bool) -> None:
    if as_json:
        # One line per reading, so --watch --json is a stream a program can follow.
        print(json.dumps(status.to_dict()), flush=True)
        return
    console.print(render_table(status))
    for line in render_problems(status):
        console.print(line)


@contextmanager
def reading_progress(hosts: list[str]):
    """While the hosts are read, on stderr: on a terminal a transient line, how many are read and which are
    still awaited; elsewhere (a log, a pipe) the same as a plain line every PROGRESS_SECONDS, none for a
    read that takes less. Yields the on_read callback for read_status."""
    console = Console(stderr=True)
    waiting = dict.fromkeys(hosts)
    started = time.monotonic()

    def awaited() -> str:
        names = list(islice(waiting, 3))
        more = f" and {len(waiting) - 3} more" if len(waiting) > 3 else ""
        return f"reading hosts over SSH, waiting for {', '.join(names)}{more}"

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True, disable=not console.is_terminal) as progress:
        task = progress.add_task(awaited(), total=len(hosts))
        done = threading.Event()

        def report() -> None:
            while not done.wait(PROGRESS_SECONDS) and waiting:
                print(f"status: {len(hosts) - len(waiting)} of {len(hosts)} hosts read in "
                      f"{time.monotonic() - started:.0f}s; {awaited()}", file=sys.stderr, flush=True)

        def on_read(host: str) -> None:
            waiting.pop(host, None)
            progress.update(task, advance=1, description=awaited())

        reporter = threading.Thread(target=report, daemon=True)
        if not console.is_terminal:
            reporter.start()
        try:
            yield on_read
        finally:
            done.set()
            if reporter.is_alive():
                reporter.join()


@contextmanager
def ctrl_c_sets(event: threading.Event):
    """While the block runs, SIGINT sets the event instead of raising KeyboardInterrupt."""
    previous = signal.signal(signal.SIGINT, lambda *_: event.set())
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def read_with_progress(inventory: Inventory, hosts_read: set[str] | None, parallel: int) -> FleetStatus:
    configs = configs_read(inventory, hosts_read)
    with reading_progress([config.host for config in configs]) as on_read:
        return read_status(inventory, configs, on_read, parallel)


def status(
    inventory: Annotated[Path, typer.Argument(help="a pyinfra inventory, e.g. inventories/prod.py")],
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output (one JSON line per reading)")] = False,
    watch: Annotated[bool, typer.Option("--watch", help="read again every --interval seconds until Ctrl-C")] = False,
    interval: Annotated[float, typer.Option(
        "--interval", callback=above_zero, help="seconds between readings with --watch")] = 5.0,
    limit: Annotated[Optional[list[str]], typer.Option(
        "--limit", help="only these hosts (names, groups or patterns, as pyinfra's --limit); the gateways are "
                        "read too: they say what is routed")] = None,
    parallel: Annotated[int, typer.Option(
        "--parallel", min=1, help="hosts read at once (each a wait on the network, not work)")] = MAX_PARALLEL_HOSTS,
) -> int:
    """Every instance of the fleet: versions against the profile, NPUs, unit, /health, load,
    latency and whether the gateway routes to it. Exits 1 when anything is red."""
    # With --watch, Ctrl-C sets an event rather than raising: under pyinfra's gevent the KeyboardInterrupt would
    # land in whichever greenlet runs (a host being read), print gevent's report and leave the loop running. Set
    # before the inventory loads, as loading imports pyinfra's CLI, which patches for gevent: a Ctrl-C there
    # ended in a traceback or was lost, and the watch ran on.
    stopped = threading.Event()
    with ctrl_c_sets(stopped) if watch else nullcontext():
        loaded = load_inventory(inventory)
        hosts_read = limited_hosts(loaded, limit, inventory)
        console = Console(width=None if Console().is_terminal else 240)
        if not watch:
            reading = read_with_progress(loaded, hosts_read, parallel)
            show(reading, console, as_json)
            return 0 if reading.ok else 1
        while not stopped.is_set():
            reading = read_with_progress(loaded, hosts_read, parallel)
            if stopped.is_set():
                break
            if console.is_terminal and not as_json:
                console.clear()
            show(reading, console, as_json)
            stopped.wait(interval)
    return 0
