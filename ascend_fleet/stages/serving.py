"""The weights, serve and gateway stages: weights on the NVMe, a systemd unit per vLLM instance, Nginx in front."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

from pyinfra import host, inventory
from pyinfra.api import deploy
from pyinfra.facts.files import File
from pyinfra.operations import files, systemd

from ascend_fleet import TEMPLATES
from ascend_fleet.config.credentials import API_KEY_NAME, api_key, env_lines, hub_tokens
from ascend_fleet.config.fleetstate import FleetState, backend_key, counts_as_served
from ascend_fleet.config.host_config import host_node_config
from ascend_fleet.config.hostdata import Instance, NodeConfig
from ascend_fleet.config.per_run import once_per_run
from ascend_fleet.config.profile import Profile
from ascend_fleet.core.node_layout import (
    GATEWAY_API_KEY_FILE,
    HUB_TOKENS_FILE,
    INSTANCE_ENV_DIR,
    INSTANCE_HELPER,
    LEAVING_TEXTFILE_PREFIX,
    MARKER_NAME,
    OUT_OF_ROUTING_DIR,
    ROUTE_WATCH_PROGRAM,
    ROUTE_WATCH_UNIT,
    ROUTES_FILE,
    SERVICE_ENV_FILE,
    SERVICE_HOME,
    TEXTFILE_DIR,
    instance_env_file,
    instance_home,
    instance_state_directory,
    instance_unit,
    out_of_routing_marker,
    revision_dir,
    unit_file,
)
from ascend_fleet.core.templating import render
from ascend_fleet.facts.systemd import InstanceDevices, InstanceEnvironments, UnitState
from ascend_fleet.fleet.gateway_routes import fleet_backends, leave_routing_seconds, routes_document
from ascend_fleet.fleet.multi_node import DataParallelRole
from ascend_fleet.fleet.probes import answers_in_deploy, instance_queries, judge_instance
from ascend_fleet.fleet.vllm_router import router_routes
from ascend_fleet.fleet.vllm_serve import SHUTDOWN_DRAIN_SECONDS, vllm_args
from ascend_fleet.node import route_watch
from ascend_fleet.operations import accounts, gates, gateway, placed, private, served, units, weights
from ascend_fleet.sizing.planner import MODELSLIM_DESCRIPTION
from ascend_fleet.stages.context import (
    data_parallel_role,
    data_parallel_roles,
    host_os,
    nginx_installed,
    node_profile,
    os_packages,
)
from ascend_fleet.stages.peers import fleet_spread, peer_server
from ascend_fleet.stages.platform import npu_problem
from ascend_fleet.stages.vllm_router import router_stage

# A 72B model takes about 8 minutes to load on 4 cards (field notes); leave room for bigger ones.
START_TIMEOUT_SECONDS = 1800
# Past vLLM's own drain (--shutdown-timeout, vllm_serve.py), systemd kills what is left.
STOP_TIMEOUT_SECONDS = SHUTDOWN_DRAIN_SECONDS + 10
START_LIMIT = {"start_limit_burst": 3, "start_limit_interval": 900}

def instance_problem(config: NodeConfig, instance: Instance) -> str | None:
    """An instance's gate, asked on its node: the one judgement of probes.judge_instance. A headless
    member of a multi-node instance serves no HTTP: its unit runs, and its head's gate judges the whole."""
    role = data_parallel_role(config.host)
    if role and not role.is_head:
        unit = instance_unit(instance.name)
        state = host.get_fact(UnitState, unit=unit)["ActiveState"]
        return None if state == "active" else (
            f"instance {unit} (headless member of {role.group}, head {role.head}) is {state}; see `journalctl -u {unit}`")
    model_name = config.model.served_model_name
    answers = answers_in_deploy(instance_queries(instance.port, instance_env_file(instance.name), model_name))
    verdict = judge_instance(answers, model_name)
    if verdict.ok:
        return None
    unit = instance_unit(instance.name)
    return f"instance {unit} (port {instance.port}) {verdict.detail}; see `journalctl -u {unit}`"


def members_left_out(role: DataParallelRole) -> str | None:
    """A multi-node instance restarts as a whole: a head restarted alone waits forever for members that
    said hello to the old one (docs/sim-fidelity.md, vLLM data parallelism), so no run may leave out
    some of its hosts."""
    missing = [member for member in role.members if not host.state.is_host_in_limit(inventory.get_host(member))]
    if not missing:
        return None
    return (f"this run leaves out {', '.join(missing)} of multi-node instance {role.group}, whose hosts serve and "
            "restart together; add them to --limit")


def still_serving(config: NodeConfig, recorded: set[str] | None) -> set[str]:
    """Of the instances the record has for this host (all it lists, where it has none yet), those
    whose unit is active now: one that stopped or failed since leaves the gateway."""
    names = recorded if recorded is not None else {instance.name for instance in config.instances}
    return {name for name in names if host.get_fact(UnitState, unit=instance_unit(name))["ActiveState"] == "active"}


def all_but(name: str) -> Callable[[set[str] | None], set[str]]:
    """For served.instances_out_of_service: the host's record without this instance."""
    return lambda recorded: (recorded or set()) - {name}


def stack_fingerprint(profile: Profile) -> str:
    """Changes whenever any version of the stack does, so the instances restart onto it."""
    return f"{profile.name}-{hashlib.sha256(profile.stack.model_dump_json().encode()).hexdigest()[:12]}"


def stages_in_this_run() -> set[str]:
    """The stages of this pyinfra run's deploy that add themselves here as pyinfra prepares them (for
    every host, the first host's stages before any of the second's)."""
    return once_per_run(host.state, "stages in this run", set)


def weights_restages(config: NodeConfig) -> int:
    """How often files of the host's served revision were restaged after a deep verify, the restage
    this run's weights stage makes included. Each instance's environment carries it: vLLM reads its
    weights only when it starts, so an instance restarts onto restaged weights. The hosts of a
    multi-node instance count their restages together: they restart together (members_left_out)."""
    role = data_parallel_role(config.host)
    return sum(host_restages(worker) for worker in ([inventory.get_host(m) for m in role.members] if role else [host]))


def host_restages(worker) -> int:
    """weights_restages of one host."""
    model, model_dir = host_node_config(worker).model, host_node_config(worker).model_dir
    record = weights.last_deep_verify(worker, model_dir, model.id, model.revision)
    return record.get("restages", 0) + ("weights" in stages_in_this_run() and bool(record.get("mismatched")))


@deploy("Weights")
def weights_stage() -> None:
    gates.stage_begins(name="Stage: weights", stage="weights")
    stages_in_this_run().add("weights")
    config = host_node_config(host)
    if not config.is_worker:
        return
    model, tokens = config.model, hub_tokens()
    private.private_file(name="Hub tokens (root only)", dest=HUB_TOKENS_FILE,
                         content=env_lines(tokens) if tokens else None)
    spread = fleet_spread(config)
    if spread:
        peer_server(config)
    weights.staged(name=f"Stage {model.id}@{model.revision}", model_id=model.id, revision=model.revision,
                  source=model.source, model_dir=config.model_dir, url=model.url, peer=model.peer,
                  tokens_env_file=HUB_TOKENS_FILE if tokens else None,
                  peer_urls=spread.peer_urls if spread else None, origin_start=spread.origin_start if spread else 0.0,
                  seeder_urls=spread.seeder_urls if spread else None, seeding=bool(spread and spread.seeding))


def instance_unit_file(config: NodeConfig, instance: Instance, profile: Profile, leave_seconds: int,
                       role: DataParallelRole | None = None) -> str:
    """The systemd unit that runs one instance from the profile's serving virtualenv; a multi-node
    instance's headless member is started once it runs (it serves no /health to wait for). Before it
    stops, it waits leave_seconds for the gateways to take it out of routing."""
    model = config.model
    model_path = str(revision_dir(config.model_dir, model.id, model.revision))
    return render(TEMPLATES / "vllm-instance.service.j2", instance=instance, model_id=model.id,
                  revision=model.revision, service_user=config.service_user, helper=INSTANCE_HELPER,
                  venv=profile.pip.venv, service_env_file=SERVICE_ENV_FILE, env_file=instance_env_file(instance.name),
                  home=instance_home(instance.name), state_directory=instance_state_directory(instance.name),
                  weights_marker=f"{model_path}/{MARKER_NAME}",
                  args=vllm_args(config, instance, model_path, profile.stack.vllm, role),
                  serves_http=not role or role.is_head,
                  leave_seconds=leave_seconds,
                  start_timeout=START_TIMEOUT_SECONDS, stop_timeout=STOP_TIMEOUT_SECONDS, **START_LIMIT)


def quantization_problem(config: NodeConfig) -> str | None:
    """`--quantization ascend` loads msModelSlim's description from the model directory, and vllm-ascend
    refuses to start without it (v0.18.0 modelslim_config.py maybe_update_config: "ModelSlim Quantization
    Config Not Found"): weights that lack it are not quantized."""
    description = revision_dir(config.model_dir, config.model.id, config.model.revision) / MODELSLIM_DESCRIPTION
    if host.get_fact(File, path=str(description)) is None:
        return (f"serving.quantization ascend, but {description} is missing: these weights are not msModelSlim's "
                "and vllm-ascend would refuse to start; drop quantization and quantization_scheme, or serve the "
                "quantized weights")
    return None


@deploy("Serve")
def serve_stage() -> None:
    """One unit per instance; an instance restarts only when its unit, environment, stack or weights changed."""
    gates.stage_begins(name="Stage: serve", stage="serve")
    config = host_node_config(host)
    if not config.is_worker:
        return
    # Read when the stage runs: an NPU that failed since preflight gets no instance (re)started on it.
    gates.passed(name="Every NPU listed and healthy before serving", description=f"{config.npu_count} NPUs healthy",
                 find_problem=lambda: npu_problem(config.npu_count))
    role = data_parallel_role(config.host)
    if role:
        gates.passed(name=f"Every host of multi-node instance {role.group} in this run",
                     description=f"{', '.join(role.members)} serve and restart together",
                     find_problem=lambda: members_left_out(role))
    if config.serving.quantization == "ascend":
        gates.passed(name="The weights are msModelSlim's", description=f"{MODELSLIM_DESCRIPTION} beside the weights",
                     find_problem=lambda: quantization_problem(config))
    profile, model = node_profile(), config.model
    user = config.service_user
    accounts.user(name=f"Service user {user}", user=user, system=True, groups=["HwHiAiUser"],
                  home=SERVICE_HOME, shell="/usr/sbin/nologin")
    placed.file(name="Instance start checks", dest=INSTANCE_HELPER, mode="755",
                content=render(TEMPLATES / "ascend-fleet-instance.sh.j2", textfile_dir=TEXTFILE_DIR,
                               metric=route_watch.LEAVING_METRIC, file_prefix=LEAVING_TEXTFILE_PREFIX,
                               out_of_routing_dir=OUT_OF_ROUTING_DIR))
    files.directory(name="Instance environments", path=INSTANCE_ENV_DIR, mode="755")
    if not config.serve_only:
        retire_instances(config)
    leave_seconds = once_per_run(host.state, "leave routing", lambda: leave_routing_seconds(inventory))
    serving = [i for i in config.instances if not config.serve_only or i.name in config.serve_only]
    held = host.get_fact(InstanceDevices, directory=INSTANCE_ENV_DIR)
    for position, instance in enumerate(serving):
        unit = placed.file(
            name=f"Unit {instance_unit(instance.name)}", dest=unit_file(instance_unit(instance.name)), mode="644",
            content=instance_unit_file(config, instance, profile, leave_seconds,
                                       data_parallel_role(config.host)))
        environment = private.private_file(
            name=f"Environment of {instance.name} (root only)", dest=instance_env_file(instance.name),
            content=render(TEMPLATES / "vllm-instance.env.j2", instance=instance, home=instance_home(instance.name),
                           settings=config.instance_env(instance), stack_fingerprint=stack_fingerprint(profile),
                           model_id=model.id, revision=model.revision, restages=weights_restages(config),
                           api_key=api_key()))
        changed = unit.will_change or environment.will_change
        # One that the gateway routes to restarts at most max_unavailable at a time across the fleet
        # (pyinfra's _parallel: hosts in batches, each back on /health and out of nginx's failure
        # memory before the next batch); the others all at once.
        # A multi-node instance's members restart together (its head waits for every engine to join).
        through_gateway = changed and serving_through_gateway(config, instance)
        routed = through_gateway and not config.data_parallel
        if changed:
            served.instances_out_of_service(name=f"Instance {instance.name} out of the gateway's record to restart",
                                            why="restarting", fleet_state_dir=config.fleet_state_dir,
                                            still_serving=all_but(instance.name))
            for holder in holders_of_its_npus(instance, serving[position + 1:], held):
                served.instances_out_of_service(name=f"Instance {holder} out of the gateway's record: "
                                                     f"{instance.name} takes its NPUs", why="restarting",
                                                fleet_state_dir=config.fleet_state_dir, still_serving=all_but(holder))
                systemd.service(name=f"Instance {holder} stopped until its turn: {instance.name} takes its NPUs",
                                service=instance_unit(holder), running=False)
        units.failure_cleared(name=f"Instance {instance.name} not left failed", unit=instance_unit(instance.name))
        if routed:
            units.restarted_while_routed(
                name=f"Instance {instance.name} restarted, {config.max_unavailable} at a time while the others serve",
                unit=instance_unit(instance.name), gateway_memory_seconds=config.gateway_fail_timeout,
                _parallel=config.max_unavailable)
        units.running(name=f"Instance {instance.name} serving", unit=instance_unit(instance.name),
                      restarted=changed and not routed,
                      unrouted_marker=None if through_gateway else out_of_routing_marker(instance.name))
        served.instance_served(name=f"Instance {instance.name} in the gateway's record once healthy",
                               fleet_state_dir=config.fleet_state_dir, instance=instance.name,
                               find_problem=lambda i=instance: instance_problem(config, i))


def holders_of_its_npus(instance: Instance, later: list[Instance], held: dict[str, tuple[int, ...]]) -> list[str]:
    """The instances later in the serve order whose present environment holds an NPU the instance's new one
    takes (a layout changed in place, TP2 to TP4): stopped before it starts, as a second claimant of an NPU
    fails, and started again in their own turn, on their new NPUs."""
    return [other.name for other in later if set(held.get(other.name, ())) & set(instance.npus)]


def serving_through_gateway(config: NodeConfig, instance: Instance) -> bool:
    """The instance runs now and the gateway routes to it (served, not drained): restarting it
    takes capacity from clients."""
    state = FleetState(config.fleet_state_dir)
    routed = counts_as_served(state.served(), config.host, instance.name) and \
        backend_key(config.host, instance.name) not in state.drained()
    return routed and host.get_fact(UnitState, unit=instance_unit(instance.name))["ActiveState"] == "active"


def retire_instances(config: NodeConfig) -> None:
    """Stop and remove every instance the node runs but its data no longer lists: the other colour
    once a blue/green swap switched the gateway away from it (and drained it), a new colour that
    failed its gate, an instance dropped from the data."""
    listed = {instance.name for instance in config.instances}
    for name in host.get_fact(InstanceEnvironments, directory=INSTANCE_ENV_DIR):
        if name in listed:
            continue
        unit = instance_unit(name)
        served.instances_out_of_service(name=f"Instance {name} out of the gateway's record", why="retired",
                                        fleet_state_dir=config.fleet_state_dir,
                                        still_serving=all_but(name))
        systemd.service(name=f"Instance {name} stopped (not in the data)", service=unit, running=False, enabled=False)
        files.file(name=f"No unit {unit}", path=unit_file(unit), present=False)
        files.file(name=f"No environment of {name}", path=instance_env_file(name), present=False)
        systemd.daemon_reload(name=f"Units without {name}")


def routes_text(config: NodeConfig) -> str:
    """The gateway's routes file (fleet/gateway_routes.py) over the instances that have served, as the fleet state has them now."""
    backends = fleet_backends(inventory, data_parallel_roles(), FleetState(config.fleet_state_dir))
    document = routes_document(config, backends, router=router_routes(config.gateway.routing))
    return json.dumps(document, indent=1) + "\n"


def routed_by_watcher(config: NodeConfig) -> None:
    """The gateway's routes file, applied by its route watcher, which runs this release's program."""
    program = placed.file(name="Route watcher program", content=Path(route_watch.__file__).read_text(),
                          dest=ROUTE_WATCH_PROGRAM, mode="755")
    # Made when the operation runs: the instances this run's serve stage found serving, and no others.
    gateway.routes_applied(name="Routes (nginx -t, then reload)", dest=ROUTES_FILE, program=ROUTE_WATCH_PROGRAM,
                           content=lambda: routes_text(config))
    unit = placed.file(name=f"Unit {ROUTE_WATCH_UNIT}", dest=unit_file(ROUTE_WATCH_UNIT), mode="644",
                       content=render(TEMPLATES / "route-watch.service.j2", program=ROUTE_WATCH_PROGRAM,
                                      routes=ROUTES_FILE))
    changed = program.will_change or unit.will_change
    systemd.service(name="Route watcher running", service=ROUTE_WATCH_UNIT, running=True, enabled=True,
                    restarted=changed, daemon_reload=changed)


@deploy("Routes")
def routes_stage() -> None:
    """What `deploys/routes.py` runs for each change of the drained set (a rollout's, a drain's): the routes
    alone, on a gateway the gateway stage set up; nothing else of the gateway is read or changed."""
    gates.stage_begins(name="Stage: routes", stage="routes")
    config = host_node_config(host)
    if config.is_gateway:
        routed_by_watcher(config)


@deploy("Gateway")
def gateway_stage() -> None:
    """Nginx with one upstream over every instance; the config must pass nginx -t before it serves."""
    gates.stage_begins(name="Stage: gateway", stage="gateway")
    config = host_node_config(host)
    if not config.is_gateway:
        return
    nginx_installed()
    router_stage()  # cache_aware: the router up before nginx routes to it; else none running
    known = host_os()
    os_packages("Python for the route watcher", [known.gateway_python])
    files.directory(name="node_exporter's textfile directory", path=TEXTFILE_DIR, mode="755")
    routed_by_watcher(config)
    key = api_key()
    private.private_file(name="API key for the gateway checks (root only)", dest=GATEWAY_API_KEY_FILE,
                         content=env_lines({API_KEY_NAME: key}) if key else None)
