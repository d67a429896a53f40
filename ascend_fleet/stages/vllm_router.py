"""Stage: the gateways' vllm-router (the vLLM project's router, docs/vllm-router.md), when the data says
gateway.routing.policy cache_aware: the profile's release in its own virtualenv with the gateway's system
Python, from its lock where there is one (the site's index, or the bundle's), run by a hardened unit on
loopback (fleet/vllm_router.py says why each setting). Its unit restarts only when the unit or the router changed:
the workers it starts with are in their own file, which the running router never reads again (the route
watcher keeps its workers through its API, with router_api.py, which this stage puts beside the watcher).
A gateway with another policy has no router running, and nothing else changes."""

from __future__ import annotations

from pathlib import Path

from pyinfra import host, inventory
from pyinfra.api import deploy
from pyinfra.operations import pip

from ascend_fleet import TEMPLATES
from ascend_fleet.config.fleetstate import FleetState
from ascend_fleet.config.host_config import host_node_config
from ascend_fleet.config.profile import PipStep, Router, from_one_index
from ascend_fleet.core.errors import FleetError
from ascend_fleet.core.node_layout import (
    ROUTER_API_PROGRAM,
    ROUTER_PROGRAM,
    ROUTER_UNIT,
    ROUTER_VENV,
    ROUTER_WORKERS_FILE,
    unit_file,
)
from ascend_fleet.core.templating import env_value, render
from ascend_fleet.facts.vllm_router import RouterWorkers
from ascend_fleet.fleet.bundle import router_coverage_refusal
from ascend_fleet.fleet.gateway_routes import fleet_backends
from ascend_fleet.fleet.profile_lock import router_lock
from ascend_fleet.fleet.vllm_router import (
    LOOPBACK,
    STARTUP_TIMEOUT_SECONDS,
    WORKERS_VARIABLE,
    router_arguments,
    router_worker_urls,
)
from ascend_fleet.node import router_api
from ascend_fleet.operations import gates, placed, python_stack, units, vllm_router
from ascend_fleet.stages.context import (
    data_parallel_roles,
    host_arch,
    host_os,
    node_profile,
    os_packages,
    pip_index_url,
)


def profile_router() -> Router:
    """The router release the host's profile pins; refuses a profile that pins none."""
    profile = node_profile()
    if profile.router is None:
        raise FleetError(f"{host.name}: gateway.routing.policy cache_aware, but profile {profile.name} pins no "
                         "vllm-router: add `router: {vllm_router: VERSION}` to it (docs/vllm-router.md)")
    return profile.router


def router_problem(port: int) -> str | None:
    """Why the router does not serve on loopback once started, or None."""
    answer = host.get_fact(RouterWorkers, port=port, wait_seconds=STARTUP_TIMEOUT_SECONDS + 5)
    if "problem" not in answer:
        return None
    return (f"vllm-router does not answer on {LOOPBACK}:{port} ({answer['problem']}): "
            f"journalctl -u {ROUTER_UNIT} says why")


@deploy("vllm-router")
def router_stage() -> None:
    gates.stage_begins(name="Stage: vllm-router", stage="router")
    config = host_node_config(host)
    if not config.is_gateway:
        return
    gateway = config.gateway
    if gateway.routing.policy != "cache_aware":
        vllm_router.stopped(name=f"No vllm-router (routing policy {gateway.routing.policy})", unit=ROUTER_UNIT)
        return
    # Made now, while the deploy is prepared: a profile without a router, or a bundle without its wheels for this
    # gateway, changes no host.
    pinned, profile, known, arch = profile_router(), node_profile(), host_os(), host_arch()
    python = known.system_python
    if config.bundle_dir:
        refusal = router_coverage_refusal(Path(config.bundle_dir), pinned.vllm_router, arch, python)
        if refusal:
            raise FleetError(f"{host.name}: {refusal}")
    arguments = router_arguments(gateway, [])
    workers = router_worker_urls(fleet_backends(inventory, data_parallel_roles(), FleetState(config.fleet_state_dir)))
    lock = router_lock(pinned, arch, python, config.pip_locks_path)
    steps = [lock or PipStep([pinned.requirement], [])]

    os_packages(f"Python {python} with venv for vllm-router", known.python_packages(python))
    pip.venv(name=f"Virtualenv {ROUTER_VENV}", path=ROUTER_VENV, python=f"python{python}")
    installed = python_stack.pinned(name=f"vllm-router {pinned.vllm_router}", venv=ROUTER_VENV,
                                    steps=from_one_index(steps) if config.bundle_dir else steps,
                                    index_url=pip_index_url(profile))
    placed.file(name="vllm-router's API for the route watcher", dest=ROUTER_API_PROGRAM, mode="644",
                content=Path(router_api.__file__).read_text())
    placed.file(name="vllm-router's workers at its start", dest=ROUTER_WORKERS_FILE, mode="644",
                content=f"{WORKERS_VARIABLE}={env_value(' '.join(workers))}\n")
    unit = placed.file(name=f"Unit {ROUTER_UNIT}", dest=unit_file(ROUTER_UNIT), mode="644",
                       content=render(TEMPLATES / "vllm-router.service.j2", version=pinned.vllm_router,
                                      program=ROUTER_PROGRAM, arguments=arguments, workers_file=ROUTER_WORKERS_FILE,
                                      workers_variable=WORKERS_VARIABLE))
    units.running(name="vllm-router running", unit=ROUTER_UNIT, restarted=unit.will_change or installed.will_change)
    gates.passed(name="vllm-router answers on loopback",
                 description=f"{LOOPBACK}:{gateway.routing.router_port}/list_workers answers",
                 find_problem=lambda: router_problem(gateway.routing.router_port))
