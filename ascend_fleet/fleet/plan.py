"""The fleet as the planner sees it: every instance of every worker host of an inventory.

`plan_fleet()` validates each host's data (hostdata.py), reads the model's config.json
once per model and plans every instance with the host's chip, TP size and serving
options, adding the stack checks a profile implies. `check_fleet()` is what preflight
calls: the same plan, refused at the first error with one line naming host and instance.
"""

from __future__ import annotations

import json
import traceback
import warnings
from dataclasses import dataclass, replace
from fnmatch import fnmatch
from functools import cache, lru_cache
from pathlib import Path

import yaml
from pyinfra.api import Inventory, State
from pyinfra.api.exceptions import NoGroupError
from pyinfra.context import ctx_state

from ascend_fleet import FILES
from ascend_fleet.config.host_config import host_node_config
from ascend_fleet.config.hostdata import Instance, NodeConfig
from ascend_fleet.config.per_run import profile_of_the_run
from ascend_fleet.config.profile import Profile
from ascend_fleet.core.bundle_layout import model_dir
from ascend_fleet.core.errors import FleetError, visible
from ascend_fleet.fleet.multi_node import DataParallelRole, data_parallel_problems, data_parallel_roles
from ascend_fleet.fleet.virtual_address import virtual_address_problems
from ascend_fleet.fleet.vllm_serve import (
    check_data_parallel_start,
    check_extra_args,
    check_serving_rules,
    check_vllm_args,
    vllm_args,
)
from ascend_fleet.sizing.planner import (
    DEFAULT_POLICY,
    ERROR,
    MODELSLIM_DESCRIPTION,
    WARNING,
    ConfigError,
    Finding,
    InstancePlan,
    ModelShape,
    ModelSupport,
    check_block_size,
    check_model_support,
    check_vllm_use_v1,
    chip_by_name,
    judge,
    kv_cache_copies,
    modelslim_scheme,
    plan_instance,
    planned_quantization,
)

# The first releases that serve each model_type, with their sources.
MODEL_TYPES_FILE = Path(__file__).with_name("model_types.yaml")


@cache
def model_support() -> dict[str, ModelSupport]:
    return {name: ModelSupport(**fields) for name, fields in yaml.safe_load(MODEL_TYPES_FILE.read_text()).items()}


# A control-machine copy of model configs, laid out as the mirror publishes models:
# <org>/<name>/<revision>/config.json.
MODELS_DIR = FILES / "models"
HTTP_TIMEOUT_SECONDS = 10


def load_inventory(path: Path, cwd: Path | None = None, override_data: dict | None = None,
                   group_data: list[str] | None = None) -> Inventory:
    """Load an inventory file as the pyinfra CLI does (group_data/ from cwd and beside the file, `--data`
    as override_data, `--group-data` directories as group_data), offline."""
    if not path.is_file():
        raise FleetError(f"{path}: no such inventory file; pass e.g. inventories/prod.py")
    # pyinfra_cli patches the stdlib for gevent when imported; pyinfra itself warns that
    # this comes late in a process like ours, where nothing runs concurrently yet.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from pyinfra_cli.exceptions import UnexpectedExternalError
        from pyinfra_cli.inventory import make_inventory
    # The CLI executes inventory and group data files inside a pyinfra State.
    try:
        with ctx_state.use(State()):
            return make_inventory(str(path), override_data=override_data, cwd=str(cwd or Path.cwd()),
                                  group_data_directories=group_data)
    except (SyntaxError, UnexpectedExternalError) as exc:  # in the inventory or a group data file
        raise FleetError(_python_error(exc)) from None


def limited_hosts(inventory: Inventory, limit: list[str] | None, path: Path) -> set[str] | None:
    """The host names `--limit` picks, as pyinfra's own --limit reads it (a group's name, else a host name
    pattern as fnmatch takes it; each option may hold several, comma-separated), or None without one.
    Where pyinfra only warns, a pattern that picks no host is refused in one line: a typo must not read
    as a fleet with nothing to show."""
    if not limit:
        return None
    chosen: set[str] = set()
    for pattern in (part.strip() for option in limit for part in option.split(",") if part.strip()):
        try:
            hosts = [host.name for host in inventory.get_group(pattern)]
        except NoGroupError:
            hosts = [host.name for host in inventory if fnmatch(host.name, pattern)]
        if not hosts:
            error = FleetError(f"{path}: --limit {visible(pattern)}: no group or host of the inventory matches it; "
                               f"groups: {', '.join(sorted(inventory.groups))}")
            error.exit_code = 2  # asked for what the inventory does not have, as a usage mistake
            raise error
        chosen.update(hosts)
    return chosen


def _python_error(exc: Exception) -> str:
    """What is wrong with an inventory or group data file, in one line: pyinfra wraps what one raises
    when it runs (UnexpectedExternalError), compile() raises a SyntaxError as is."""
    error = getattr(exc, "exception", exc)
    if isinstance(error, SyntaxError):
        return f"{error.filename}:{error.lineno}: {error.msg}; fix the file (it is Python)"
    # The last of the operator's own lines it ran (a group data file may run another, as lab_qwen35.py does).
    frames = [frame for frame in traceback.extract_tb(error.__traceback__)
              if not frame.filename.startswith("<") and "site-packages" not in frame.filename]
    where = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else exc.filename
    return f"{where}: {type(error).__name__}: {error}; fix the file (it is Python)"


def read_model_config(path: Path) -> dict:
    """config.json from a file, or from the model directory holding it."""
    config_file = path / "config.json" if path.is_dir() else path
    try:
        config = json.loads(config_file.read_text())
    except FileNotFoundError:
        raise FleetError(f"{visible(config_file)}: no such file; pass --model-config a config.json or the model "
                         "directory") from None
    except (OSError, ValueError) as exc:  # not JSON, not UTF-8 (UnicodeDecodeError), unreadable
        raise FleetError(f"{config_file}: cannot be read as JSON ({exc})") from None
    if not isinstance(config, dict):
        raise FleetError(f"{config_file}: a JSON {type(config).__name__}, not the object a model's config.json is; "
                         "pass the model's config.json or its directory")
    return config


@dataclass(frozen=True)
class InstanceReport:
    """The plan of one instance and every finding about it (capacity and stack)."""

    host: str
    instance: Instance
    plan: InstancePlan
    findings: list[Finding]
    hccl_ports: range  # the instance's HCCL range: hccl_base_port and the span of the profile's CANN
    members: tuple[str, ...] = ()  # a multi-node instance's hosts, its head (host) first

    @property
    def verdict(self) -> str:
        return judge(self.findings)

    def to_dict(self) -> dict:
        return {
            "host": self.host,
            "members": list(self.members),
            "instance": self.instance.model_dump(),
            "hccl_ports": [self.hccl_ports[0], self.hccl_ports[-1]],
            "verdict": self.verdict,
            "findings": [vars(finding) for finding in self.findings],
            "plan": self.plan.to_dict(),
        }


@dataclass(frozen=True)
class FleetPlan:
    instances: list[InstanceReport]

    @property
    def verdict(self) -> str:
        return judge([finding for report in self.instances for finding in report.findings])

    def errors(self) -> list[str]:
        """One line naming host and instance per refusal."""
        return [f"{report.host} instance {report.instance.name}: {finding.message}"
                for report in self.instances for finding in report.findings if finding.severity == ERROR]

    def first_error(self) -> str | None:
        """The first of errors(), or None."""
        return next(iter(self.errors()), None)

    def warnings(self) -> dict[str, list[str]]:
        """Each distinct warning and the hosts it concerns, so a fleet-wide one prints once."""
        hosts: dict[str, list[str]] = {}
        for report in self.instances:
            for finding in report.findings:
                if finding.severity == WARNING and report.host not in hosts.setdefault(finding.message, []):
                    hosts[finding.message].append(report.host)
        return hosts

    def to_dict(self) -> dict:
        return {"verdict": self.verdict, "instances": [report.to_dict() for report in self.instances]}


def read_modelslim_description(path: Path) -> dict | None:
    """The msModelSlim description beside a config.json (or in the model directory), None without one."""
    description = (path if path.is_dir() else path.parent) / MODELSLIM_DESCRIPTION
    try:
        return json.loads(description.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise FleetError(f"{description}: cannot be read as JSON ({exc})") from None


def model_shape(config: dict, description: dict | None) -> ModelShape:
    """The planner's shape of a model: its config.json, and the scheme its msModelSlim description names."""
    return replace(ModelShape.from_config(config),
                   checkpoint_quantization=modelslim_scheme(description) if description is not None else None)


class ModelConfigs:
    """config.json (and msModelSlim's description, where the weights have one) of each model a
    fleet serves, read once: a local path given by the operator, else the local models tree, else
    the model's http URL (e.g. the lab mirror)."""

    def __init__(self, local: Path | None = None, models_dir: Path = MODELS_DIR):
        self.local = local
        self.models_dir = models_dir
        self._shapes: dict[tuple, ModelShape] = {}

    def shape(self, config: NodeConfig) -> ModelShape:
        model = config.model
        key = (model.id, model.revision, model.url)
        if key not in self._shapes:
            try:
                self._shapes[key] = model_shape(*self._read(config))
            except ConfigError as exc:
                raise FleetError(f"{config.host}: model {model.id}@{model.revision}: {exc}") from None
        return self._shapes[key]

    def _read(self, config: NodeConfig) -> tuple[dict, dict | None]:
        if self.local:
            return read_model_config(self.local), read_modelslim_description(self.local)
        model = config.model
        staged = self.models_dir / model.id / model.revision / "config.json"
        if staged.is_file():
            return read_model_config(staged), read_modelslim_description(staged)
        # A site's bundle carries the model: its mirror may not serve yet (the first deploy starts it).
        if config.bundle_dir:
            carried = model_dir(Path(config.bundle_dir), model.id, model.revision) / "config.json"
            if carried.is_file():
                return read_model_config(carried), read_modelslim_description(carried)
        if model.url:
            base = f"{model.url}/models/{model.id}/{model.revision}"
            return (_fetch_json(f"{base}/config.json", config.host),
                    _fetch_json(f"{base}/{MODELSLIM_DESCRIPTION}", config.host, missing_ok=True))
        raise FleetError(f"{config.host}: model {visible(f'{model.id}@{model.revision}')}: no config.json to plan "
                         f"with; pass --model-config, or put it at {visible(staged)}")


def _fetch_json(url: str, host: str, missing_ok: bool = False) -> dict | None:
    """The JSON document at url; None for a 404 when missing_ok (a file the model may not have)."""
    import requests  # here: only a fleet whose models are on a mirror needs it, and check and plan start faster

    try:
        response = requests.get(url, timeout=HTTP_TIMEOUT_SECONDS)
        if missing_ok and response.status_code == 404:
            return None
        response.raise_for_status()
        return response.json()
    except (requests.RequestException, ValueError) as exc:
        raise FleetError(f"{host}: cannot read {url} ({type(exc).__name__}); is the mirror up? "
                         "Or pass --model-config") from None


def fleet_node_configs(inventory: Inventory) -> list[NodeConfig]:
    """Every host's validated data; refuses the first of fleet_data_problems in one line."""
    configs = [host_node_config(host) for host in inventory]
    problem = next(fleet_data_problems(inventory, configs), None)
    if problem:
        raise FleetError(problem)
    return configs


def fleet_data_problems(inventory: Inventory, configs: list[NodeConfig]):
    """One line per way the hosts' data cannot work together: multi-node instances, a worker that no
    rollout wave includes (a multi-node instance's member goes with its head), the NPU network, two
    hosts with one serving address, gateways that disagree on their virtual address."""
    groups = group_members(inventory)
    data_parallel = list(data_parallel_problems(groups, configs))
    yield from data_parallel
    roles = {} if data_parallel else data_parallel_roles(groups, configs)
    for config in configs:
        role = roles.get(config.host)
        if role is None or role.is_head:
            yield from _rollout_wave_problems(inventory, config, role)
    peer_problems = list(npu_peer_problems(groups, configs))
    yield from peer_problems
    if not peer_problems:
        yield from npu_network_problems(configs, npu_peers(inventory, configs))
    owners: dict = {}
    for config in configs:
        if config.serving_address is not None:
            owner = owners.setdefault(config.serving_address, config.host)
            if owner != config.host:
                yield (f"{config.host}: serving_address: {config.serving_address} is {owner}'s too; expected each "
                       "host's own address on the serving network")
    yield from virtual_address_problems(inventory, configs)


def group_members(inventory: Inventory) -> dict[str, list[str]]:
    """Every inventory group's host names, in inventory order."""
    return {group: [host.name for host in hosts] for group, hosts in inventory.groups.items()}


def fleet_roles(inventory: Inventory) -> dict[str, DataParallelRole]:
    """Each multi-node instance member's role (multi_node.py), from the whole inventory."""
    return data_parallel_roles(group_members(inventory), [host_node_config(host) for host in inventory])


def _rollout_wave_problems(inventory: Inventory, config: NodeConfig, role: DataParallelRole | None):
    # pyinfra drops empty groups, so a wave with no group is an empty wave (a small lab has no wave2).
    host = inventory.get_host(config.host)
    in_waves = any(host in inventory.groups.get(wave, ()) for wave in config.rollout_waves)
    if not config.is_worker or not config.rollout_waves or in_waves:
        return
    waves = ", ".join(config.rollout_waves)
    if role:
        yield (f"{config.host}: rollout_waves: the head of multi-node instance {role.group} (its first host in "
               f"inventory order; its members move with it) is in none of {waves}; add it to one of those groups")
    else:
        yield f"{config.host}: rollout_waves: the host is in none of {waves}; add it to one of those groups"


def npu_peer_group(config: NodeConfig) -> str | None:
    """The group whose NPUs this host's must reach: npu_peer_group, else its multi-node instance's hosts."""
    return config.npu_peer_group or (config.data_parallel.group if config.data_parallel else None)


def npu_peer_problems(groups: dict[str, list[str]], configs: list[NodeConfig]):
    """A host whose NPU peer group is not an inventory group holding it."""
    for config in configs:
        group = npu_peer_group(config)
        if group is not None and config.host not in groups.get(group, []):
            yield (f"{config.host}: npu_peer_group: {group} is not an inventory group holding this host; add the "
                   "host to that group or name its group")


def npu_peers(inventory: Inventory, configs: list[NodeConfig]) -> dict[str, list[str]]:
    """Host -> the other members of its NPU peer group, in inventory order; refuses the first of
    npu_peer_problems."""
    groups = group_members(inventory)
    problem = next(npu_peer_problems(groups, configs), None)
    if problem:
        raise FleetError(problem)
    return {config.host: [member for member in groups[group] if member != config.host]
            for config in configs if (group := npu_peer_group(config)) is not None}


def npu_network_problems(configs: list[NodeConfig], peers: dict[str, list[str]]):
    """One line per way the fleet's NPU network plan cannot work: an NPU address used twice, NPUs that
    disagree on TLS (HCCL links between them fail), a peer that has no NPU network or that its NPUs
    cannot reach (another subnet and no gateway)."""
    planned = [config for config in configs if config.npu_addresses]
    owners: dict = {}
    for config in planned:
        for npu, address in enumerate(config.npu_addresses):
            if address in owners:
                host, other = owners[address]
                yield (f"{config.host}: npu_addresses: NPU {npu}'s {address} is {host}'s NPU {other} too; "
                       "expected each NPU address once in the fleet")
            owners.setdefault(address, (config.host, npu))
    for config in planned[1:]:
        if config.npu_tls != planned[0].npu_tls:
            yield (f"{config.host}: npu_tls: {config.npu_tls} but {planned[0].host}'s is {planned[0].npu_tls}; every "
                   "NPU of the fleet must have the same TLS switch")
    by_host = {config.host: config for config in configs}
    for host, members in peers.items():
        config = by_host[host]
        for member in members:
            other = by_host[member]
            if not other.npu_addresses:
                yield (f"{host}: npu_peer_group {npu_peer_group(config)}: {member} has no npu_addresses; plan its "
                       "NPU network too (the hosts of a multi-node instance reach each other over it)")
            elif other.npu_subnet != config.npu_subnet and config.npu_gateway is None:
                yield (f"{host}: npu_peer_group {npu_peer_group(config)}: {member}'s NPUs are in {other.npu_subnet}, "
                       f"outside {config.npu_subnet}, and npu_gateway is not set; its NPUs could not reach them")


def stack_findings(config: NodeConfig, profile: Profile, shape: ModelShape,
                   role: DataParallelRole | None = None) -> list[Finding]:
    """What the profile and serving options imply beyond capacity (field notes, section 3)."""
    serving = config.serving
    findings = [
        *check_model_support(config.model.id, shape.model_type, profile.name, profile.stack.model_dump(),
                             model_support()),
        *check_block_size(serving.block_size, serving.enable_prefix_caching, serving.enable_chunked_prefill, shape.is_hybrid),
        *check_vllm_use_v1(config.npu_env, profile.stack.vllm),
        # The options differ per instance only in values (ports, TP size): the first stands for all.
        *check_vllm_args(args := vllm_args(config, config.instances[0], "MODEL", profile.stack.vllm, role),
                         profile.stack.vllm),
        *check_extra_args(args[:len(args) - len(serving.extra_args)], serving.extra_args, profile.stack.vllm),
        *check_serving_rules(serving, profile.stack.vllm),
        *(check_data_parallel_start(profile.stack.vllm) if role else []),
    ]
    if profile.upstream.vllm_ascend_row is None:
        findings.append(Finding(WARNING, "profile-no-upstream-row",
                                f"profile {profile.name} matches no upstream vllm-ascend row: {profile.upstream.note}"))
    return findings


def plan_node(config: NodeConfig, profile: Profile, shape: ModelShape,
              role: DataParallelRole | None = None) -> list[InstanceReport]:
    """Plan every instance of one worker with its chip, TP size, serving options and HCCL buffers; a
    multi-node instance once, at its head, over all its DP ranks (its members report nothing)."""
    if role and not role.is_head:
        return []
    serving = config.serving
    # HCCL reserves its buffers outside vLLM's budget: plan with the size the node really sets.
    buffsize = int(config.npu_env.get("HCCL_BUFFSIZE", DEFAULT_POLICY.hccl_buffsize_mib))
    policy = replace(DEFAULT_POLICY, hccl_buffsize_mib=buffsize)
    stack = stack_findings(config, profile, shape, role)
    quantization, quantization_findings = planned_quantization(shape, serving.quantization_scheme,
                                                               serving.quantization == "ascend")
    # A worker's instances differ in name and ports only: one plan holds for each.
    plan = planned_instance(shape, chip_by_name(config.chip), tp=config.tensor_parallel_size,
                            dp=role.size if role else 1,
                            max_model_len=serving.max_model_len,
                            gpu_memory_utilization=serving.gpu_memory_utilization,
                            dtype=serving.dtype, quantization=quantization,
                            ep=bool(serving.enable_expert_parallel), mtp=serving.speculates_with_mtp,
                            policy=policy, kv_copies=kv_cache_copies(shape, profile.hybrid_kv_cache_allocation))
    # a release that cannot serve the model at all is the first thing to say (as plan_cli says it)
    findings = [*stack, *plan.findings, *quantization_findings]
    return [InstanceReport(config.host, instance, plan, list(findings), record.hccl_range.ports,
                           role.members if role else ())
            for instance, record in zip(config.instances, config.instance_records())]


# A fleet's workers mostly share chip, model and options (every argument is a frozen dataclass or a value):
# each alike instance planned once per process, not once per host.
planned_instance = lru_cache(maxsize=256)(plan_instance)


def plan_fleet(inventory: Inventory, model_config: Path | None = None, models_dir: Path = MODELS_DIR) -> FleetPlan:
    """Plan every instance of every worker; nothing is refused here (see check_fleet)."""
    configs = fleet_node_configs(inventory)
    return plan_configs(inventory, configs, data_parallel_roles(group_members(inventory), configs),
                        ModelConfigs(model_config, models_dir))


def plan_configs(scope: object, configs: list[NodeConfig], roles: dict[str, DataParallelRole], shapes: ModelConfigs,
                 problems: list[str] | None = None) -> FleetPlan:
    """Plan the instances of these hosts, their profiles read once for the scope (per_run.profile_of_the_run:
    the run, or the loaded inventory). A host whose profile or model config cannot be read raises
    FleetError; with `problems`, its line is added there and the host left out."""
    reports = []
    for config in configs:
        if not config.is_worker:
            continue
        try:
            reports.extend(plan_node(config, _profile(scope, config), shapes.shape(config), roles.get(config.host)))
        except FleetError as exc:
            if problems is None:
                raise
            problems.append(str(exc))
    return FleetPlan(reports)


def _profile(scope: object, config: NodeConfig) -> Profile:
    try:
        return profile_of_the_run(scope, config.profile)
    except FleetError as exc:
        raise FleetError(f"{config.host}: {exc}") from None


def check_fleet(inventory: Inventory, model_config: Path | None = None, models_dir: Path = MODELS_DIR) -> FleetPlan:
    """Preflight's capacity and stack gate: the fleet plan, or a FleetError naming host and instance."""
    plan = plan_fleet(inventory, model_config, models_dir)
    error = plan.first_error()
    if error:
        raise FleetError(error)
    return plan
