"""Everything the data alone can tell, checked before pyinfra connects to any host.

`fleet_problems()` lists every problem of an inventory and its data, one line each: each host's data
(hostdata.py), a host written twice in the inventory file, what the hosts' data must agree on
(multi-node instances, rollout waves, NPU and serving addresses), the capacity and stack plan of
every instance (plan.py), and the checksums of the vendor packages in files/. `ascend-fleet check`
prints them; every deploy runs the same check before connecting, from the inventory file's last line
(`check_before_connecting()`): pyinfra runs the inventory file before it connects, and nothing of
ours runs earlier in its CLI. Node-side checks (the system, the NPUs, the NVMe) stay in preflight.
"""

from __future__ import annotations

import ipaddress
import json
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import cache
from hashlib import sha256
from pathlib import Path
from typing import Annotated, Optional

import typer
from pyinfra.api import Inventory, State
from pyinfra.context import ctx_state

from ascend_fleet import FILES
from ascend_fleet.config.fleetlease import lease_of_deploy
from ascend_fleet.config.fleetstate import BLUE
from ascend_fleet.config.host_config import host_node_config
from ascend_fleet.config.hostdata import NodeConfig, host_ports, port_use_problems
from ascend_fleet.config.per_run import profile_of_the_run
from ascend_fleet.config.profile import Profile
from ascend_fleet.core.errors import FleetError, InputError, visible
from ascend_fleet.fleet import firewall
from ascend_fleet.fleet.firewall import SSH_PORT, host_address, sources, ssh_lockout_problems
from ascend_fleet.fleet.multi_node import DataParallelRole
from ascend_fleet.fleet.os_repository import MIRROR_GROUP
from ascend_fleet.fleet.plan import (
    MODELS_DIR,
    ModelConfigs,
    data_parallel_roles,
    fleet_data_problems,
    group_members,
    load_inventory,
    plan_configs,
)
from ascend_fleet.fleet.virtual_address import vrrp_address

# Set while this module loads an inventory file, which runs the file's own check_before_connecting().
_LOADING: ContextVar[bool] = ContextVar("ascend_fleet_check_loading", default=False)
# Past this many hosts, a problem shared by many names the first ones and how many more.
SHOWN_HOSTS = 3


def fleet_problems(inventory: Inventory, source: Path | None = None, model_config: Path | None = None,
                   models_dir: Path = MODELS_DIR) -> list[str]:
    """Every problem the data shows, one line each, hosts sharing one problem on one line. What the
    hosts' data must agree on is checked once every host's own data is valid."""
    problems = list(inventory_file_problems(source)) if source else []
    configs = []
    for host in inventory:
        try:
            configs.append(host_node_config(host))
        except FleetError as exc:
            problems.append(str(exc))
    if len(configs) == len(inventory):
        fleet = list(fleet_data_problems(inventory, configs))
        fleet += same_machine_problems(inventory)
        problems += fleet
        if not fleet:
            roles = data_parallel_roles(group_members(inventory), configs)
            problems += inventory_port_problems(inventory, configs, roles)
            problems += plan_configs(inventory, configs, roles, ModelConfigs(model_config, models_dir),
                                     problems).errors()
            problems += vendor_file_problems(inventory, configs)
            problems += bundle_problems(configs)
            problems += resolved_address_problems(inventory, configs)
            problems += firewall_source_problems(configs)
            problems += ssh_lockout_problems(inventory)
    # The firewall's sources and the SSH lockout check read the same sshd_allowed_sources: one line each.
    return merge_hosts(dict.fromkeys(problems), [host.name for host in inventory])


def same_machine_problems(inventory: Inventory) -> Iterator[str]:
    """A machine listed under two names (one address and SSH port): the deploy would place two sets of
    instances on its NPUs and ports, and count it twice."""
    seen: dict[tuple[str, object], str] = {}
    for member in inventory:
        address = host_address(member)
        port = member.data.get("ssh_port") or SSH_PORT
        owner = seen.setdefault((_canonical_address(address), port), member.name)
        if owner != member.name:
            yield (f"{member.name}: ssh_hostname: {address!r} (SSH port {port}) is how {owner} is reached too: one "
                   "machine under two names would get two sets of instances on the same NPUs and ports; list it once")


def _canonical_address(address: str) -> str:
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        return address.lower().rstrip(".")


def inventory_port_problems(inventory: Inventory, configs: list[NodeConfig],
                            roles: dict[str, DataParallelRole]) -> Iterator[str]:
    """The ports of a role only the inventory tells (the site mirror's on a host of group mirror, a
    multi-node head's DP RPC port) against every other port of the host (hostdata.host_ports); the rest
    node_config has checked."""
    mirror = set(group_members(inventory).get(MIRROR_GROUP, ()))
    for config in configs:
        role = roles.get(config.host)
        head_rpc_port = role.rpc_port if role and role.is_head else None
        if config.host not in mirror and head_rpc_port is None:
            continue
        member = inventory.get_host(config.host)
        uses = host_ports(config, host_node_config(member, BLUE).instances, not member.data.get("instances"),
                          mirror=config.host in mirror, head_rpc_port=head_rpc_port)
        yield from (f"{config.host}: {key}: {what}" for key, what in port_use_problems(uses))


def resolved_address_problems(inventory: Inventory, configs: list[NodeConfig]) -> Iterator[str]:
    """Each host address the deploy resolves on this machine that does not resolve: the gateways' for
    keepalived's VRRP peers (gateway.vrrp_address: an IPv4 address), and every worker's and gateway's when
    the instance firewall names them (firewall.py). The deploy would stop on it after connecting, with the
    fleet's lease taken and some hosts changed."""
    firewalled = [config for config in configs if config.instance_firewall and (config.is_worker or config.is_gateway)]
    named_by_firewall = {"worker": any(config.is_worker for config in firewalled), "gateway": bool(firewalled)}
    for member, config in zip(inventory, configs):
        if config.is_gateway and config.gateway_vip is not None:
            try:
                vrrp_address(member, member.name)
            except FleetError as exc:
                yield str(exc)
        elif config.is_worker and named_by_firewall["worker"] or config.is_gateway and named_by_firewall["gateway"]:
            address = host_address(member)
            try:
                firewall.resolve(address)
            except (OSError, UnicodeError) as exc:
                # Said without the name when it is the host's: hosts alike share one line (merge_hosts).
                given = "not given, and the host's name" if address == member.name else f"{address!r}"
                yield (f"{member.name}: ssh_hostname: {given} does not resolve on this machine ({exc}), and the "
                       "instance firewall names the host by its address; give the address as ssh_hostname, fix the "
                       "name, or set instance_firewall: false")


def firewall_source_problems(configs: list[NodeConfig]) -> Iterator[str]:
    """Each entry of the firewall's source lists that is not an address, a network or a name that resolves
    here (firewall.sources), on the hosts whose firewall uses them."""
    for config in configs:
        if not config.instance_firewall or not (config.is_worker or config.is_gateway):
            continue
        keys = ("instance_allowed_sources",) * config.is_worker + ("monitoring_allowed_sources",
                                                                    "sshd_allowed_sources")
        for key in keys:
            try:
                sources(getattr(config, key), config.host, key)
            except FleetError as exc:
                yield str(exc)


def inventory_problems(inventory: Path, cwd: Path | None = None, override_data: dict | None = None,
                       group_data: list[str] | None = None, model_config: Path | None = None,
                       models_dir: Path = MODELS_DIR) -> list[str]:
    """fleet_problems of an inventory file loaded as pyinfra loads it; a file that does not load (Python
    that does not compile or raises) is the one problem."""
    return loaded_problems(inventory, cwd, override_data, group_data, model_config, models_dir)[1]


def loaded_problems(inventory: Path, cwd: Path | None = None, override_data: dict | None = None,
                    group_data: list[str] | None = None, model_config: Path | None = None,
                    models_dir: Path = MODELS_DIR) -> tuple[Inventory | None, list[str]]:
    """The inventory as pyinfra loads it (None if it does not load) and its problems (inventory_problems)."""
    with _loading():
        try:
            loaded = load_inventory(inventory, cwd, override_data, group_data)
        except FleetError as exc:
            return None, [str(exc)]
        return loaded, fleet_problems(loaded, inventory, model_config, models_dir)


def inventory_file_problems(source: Path):
    """A host given data in two places of the inventory file: pyinfra keeps the last and says nothing."""
    from pyinfra_cli.inventory import _get_any_tuple_first, _get_groups_from_filename

    with _loading(), ctx_state.use(State()):
        groups = _get_groups_from_filename(str(source))
    seen: dict[str, str] = {}
    for group, hosts in groups.items():
        for entry in (hosts[0] if isinstance(hosts, tuple) else hosts):
            if not isinstance(entry, tuple):
                continue
            name = _get_any_tuple_first(entry)
            if name in seen:
                yield (f"{source}: host {name} is given data in {seen[name]} and in {group}; pyinfra would keep "
                       f"only the last; give its data once and list it by name elsewhere")
            seen.setdefault(name, group)


def bundle_problems(configs: list[NodeConfig]) -> list[str]:
    """Each file of a bundle the hosts name (bundle_dir) that is not as its manifest lists it, per host; each
    bundle read once. Which arch and Python a node is, preflight asks the node, then checks the bundle has it."""
    verified: dict[str, list[str]] = {}
    problems = []
    for config in configs:
        if config.bundle_dir:
            # Here, not at the top: the bundle's module and what it imports (the resolver, the locks) are
            # a tenth of every check's start, for the fleets that have a bundle.
            from ascend_fleet.fleet.bundle import verify_bundle

            if config.bundle_dir not in verified:
                try:
                    verified[config.bundle_dir] = verify_bundle(Path(config.bundle_dir))
                except FleetError as exc:
                    verified[config.bundle_dir] = [str(exc)]
            problems += [f"{config.host}: {line}" for line in verified[config.bundle_dir]]
    return problems


def vendor_file_problems(scope: object, configs: list[NodeConfig]) -> list[str]:
    """The workers' profiles (read once for the scope: per_run.profile_of_the_run) give the sha256 of every
    vendor package of at least one of their arches, and each package in files/ has its profile's. Which arch a
    node is, and so which packages it needs, preflight asks the node, then requires those."""
    problems = []
    for name in sorted({config.profile for config in configs if config.is_worker}):
        try:
            profile = profile_of_the_run(scope, name)
        except FleetError:
            continue  # the plan has said so, for each host naming it
        by_arch = {arch: list(profile.vendor_files(arch).values()) for arch in profile.arch}
        if not any(all(profile.has_sha256(file_name) for file_name in names) for names in by_arch.values()):
            missing = sorted({file_name for names in by_arch.values() for file_name in names
                              if not profile.has_sha256(file_name)})
            problems.append(f"profile {name}: no sha256 for {len(missing)} vendor packages ({missing[0]}, ...); add "
                            "those of your nodes' architecture under packages.files, from Huawei's download page "
                            "(copy the profile to profiles/ here first)")
        if profile.packages.source == "files":
            problems += [problem for file_name in dict.fromkeys(sum(by_arch.values(), []))
                         if profile.has_sha256(file_name) and (FILES / file_name).is_file()
                         and (problem := vendor_file_problem(profile, file_name))]
    return problems


def vendor_file_problem(profile: Profile, file_name: str) -> str | None:
    """A files/ copy whose sha256 is not the profile's, or None."""
    expected = profile.sha256_of(file_name)
    local = (FILES / file_name).absolute()
    actual = file_sha256(local)
    if actual != expected:
        return (f"{local} has sha256 {actual}, profile {profile.name} expects {expected}; replace the file or "
                "correct the profile")
    return None


def file_sha256(path: Path) -> str:
    """The sha256 of a file, hashed once per process while its size and mtime stay (vendor packages
    are gigabytes, and a run checks them for every host)."""
    stat = path.stat()
    return _sha256(path, stat.st_size, stat.st_mtime_ns)


@cache
def _sha256(path: Path, size: int, mtime_ns: int) -> str:
    del size, mtime_ns  # the cache key: a changed file is hashed again
    digest = sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def merge_hosts(problems: Iterable[str], hosts: list[str]) -> list[str]:
    """`host: problem` (or `host instance name: problem`) lines that differ only in the host as one line
    naming them (group data is shared: a typo there is every host's), in the order each first appears."""
    known = set(hosts)
    merged: dict[str, list[str]] = {}
    for line in problems:
        where, _, rest = line.partition(": ")
        if where.split(" instance ")[0] in known:
            merged.setdefault(rest, []).append(where)
        else:
            merged.setdefault(line, [])
    lines = []
    for rest, names in merged.items():
        if not names:
            lines.append(rest)
            continue
        more = f" and {len(names) - SHOWN_HOSTS} more" if len(names) > SHOWN_HOSTS else ""
        lines.append(f"{', '.join(names[:SHOWN_HOSTS])}{more}: {rest}")
    return lines


@contextmanager
def _loading():
    token = _LOADING.set(True)
    try:
        yield
    finally:
        _LOADING.reset(token)


def check_before_connecting() -> None:
    """Called on an inventory file's last line: when pyinfra's CLI runs deploy files, checks the inventory
    and data it is loading (its --data and --group-data included) and stops the run before it connects,
    with every problem, one line each, exit code 2; then takes the fleet's lease for a deploy that changes
    what serves (fleetlease.lease_of_deploy), or stops the run naming who holds it. Elsewhere (pyinfra's
    own commands; ours, which load inventories too) it does nothing."""
    import pyinfra

    if not pyinfra.is_cli or _LOADING.get():
        return
    import click

    context = click.get_current_context(silent=True)
    params = context.params if context else {}
    deploy_files = params.get("operations") or ()
    # Deploy files only: pyinfra's own commands (debug-inventory, exec, fact) need none of the data.
    if "inventory" not in params or not deploy_files or not all(op.endswith(".py") for op in deploy_files):
        return
    override = dict(arg.split("=", 1) for arg in params.get("data") or ())
    inventory, problems = loaded_problems(Path(params["inventory"]), Path.cwd(), _parsed(override),
                                          list(params.get("group_data") or ()))
    if problems:
        error = FleetError(problems_message(problems))
        error.exit_code = 2  # pyinfra's CliError is a click exception: its exit code is ours to set
        raise error
    # A deploy that changes what serves holds the fleet's lease until it exits, as a rollout does; a dry
    # run changes nothing.
    if not params.get("dry"):
        lease_of_deploy(inventory, deploy_files)


def _parsed(override: dict[str, str]) -> dict:
    from pyinfra_cli.util import parse_cli_arg

    return {key: parse_cli_arg(value) for key, value in override.items()}


def problems_message(problems: list[str]) -> str:
    """The problems as the deploy and `check` print them: one alone as its line, several under a count."""
    if len(problems) == 1:
        return problems[0]
    return f"{len(problems)} problems, nothing was changed:\n" + "\n".join(f"  {line}" for line in problems)


def check(
    inventory: Annotated[Path, typer.Argument(help="a pyinfra inventory file, e.g. inventories/prod.py")],
    model_config: Annotated[Optional[Path], typer.Option(
        "--model-config", help="config.json, or the model directory holding it (as for `plan`)")] = None,
    models_dir: Annotated[Optional[Path], typer.Option(
        "--models-dir", help=f"local model configs as <org>/<name>/<revision>/config.json [default: {MODELS_DIR}]")]
    = None,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable: {\"problems\": [...]}")] = False,
) -> None:
    """Check an inventory and its data as every deploy does before it connects; connects to nothing.

    Lists every problem, one line each, and exits 2 if there is any.
    """
    if not inventory.is_file():
        raise InputError(f"{visible(inventory)}: no such inventory file; pass e.g. inventories/prod.py")
    problems = inventory_problems(inventory, model_config=model_config, models_dir=models_dir or MODELS_DIR)
    if as_json:
        print(json.dumps({"inventory": str(inventory), "problems": problems}, indent=2))
    elif problems:
        for line in problems:
            print(f"error: {line}", file=sys.stderr)
    else:
        print(f"{inventory}: no problem found")
    if problems:
        raise typer.Exit(2)
