"""The serving virtualenv: the profile's Python, then its pip installs in the order of the release's upstream guide."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import pip

from ascend_fleet.config.host_config import host_node_config
from ascend_fleet.config.profile import Profile, from_one_index
from ascend_fleet.facts.ascend import PipCheck, VenvPython
from ascend_fleet.fleet.profile_lock import node_lock
from ascend_fleet.operations import gates, python_stack
from ascend_fleet.operations.vendor import toolkit_env_scripts
from ascend_fleet.stages.context import (
    host_arch,
    host_os,
    node_profile,
    os_packages,
    pip_index_url,
    python_packages,
    runs_npus,
)
from ascend_fleet.stages.peers import peer_server, spread_of_package, wheels_of

TORCH_NPU_PROBE = "import torch, torch_npu; print(torch.npu.is_available(), torch.npu.device_count())"


def pip_check_problem(venv: str, profile: Profile) -> str | None:
    """A `pip check` complaint of the virtualenv that the profile's steps do not accept, or None."""
    unexpected = profile.unaccepted_complaints(host.get_fact(PipCheck, venv=venv))
    if not unexpected:
        return None
    more = f" (and {len(unexpected) - 1} more)" if len(unexpected) > 1 else ""
    return (f"`pip check` in {venv}: {unexpected[0]}{more}; profile {profile.name} accepts only its steps' "
            "`accepts` lines: fix the step, or name the complaint there if upstream accepts it")


def torch_npu_problem(venv: str, expected: int) -> str | None:
    """Why torch_npu cannot use every NPU from the serving virtualenv (CANN environment sourced), or None."""
    result = host.get_fact(VenvPython, venv=venv, code=TORCH_NPU_PROBE, env_scripts=toolkit_env_scripts())
    if not result["ok"]:
        return f"`import torch, torch_npu` fails in {venv}: {result['output']}"
    if result["output"] != f"True {expected}":
        return (f"torch.npu reports (available, devices) = {result['output']}, the inventory says npu_count={expected}; "
                "check the driver stage and ASCEND_RT_VISIBLE_DEVICES")
    return None


@deploy("Python stack")
def python_stage() -> None:
    gates.stage_begins(name="Stage: Python stack", stage="Python stack")
    if not runs_npus():
        return
    profile = node_profile()
    python = f"python{profile.stack.python}"
    known = host_os()
    # Preflight refused a release where neither the release nor the profile gives the profile's Python.
    os_packages(f"{python} with venv", python_packages(profile, known) or [])
    libraries = profile.pip.system_packages.get(known.package_manager, [])
    if libraries:
        os_packages("OS packages the stack needs", libraries)
    venv = profile.pip.venv
    pip.venv(name=f"Virtualenv {venv}", path=venv, python=python)
    arch = host_arch()
    config = host_node_config(host)
    steps = profile.node_steps(arch, lock=node_lock(profile, arch, profile.stack.python, config.pip_locks_path))
    stack = {"venv": venv, "steps": from_one_index(steps) if config.bundle_dir else steps,
             "index_url": pip_index_url(profile)}
    spread = spread_of_package(host.name, wheels_of(profile.name, arch))
    if spread:
        peer_server(config)
        python_stack.pinned_seeded(name=f"Pinned serving stack on {spread.seeder} for the fleet",
                                   seeder=spread.seeder, peer_urls=spread.peer_urls, **stack)
    python_stack.pinned(name="Pinned serving stack", peer_urls=spread.peer_urls if spread else None, **stack)
    if profile.pip.remove:
        python_stack.absent(name="Packages the stack must not have", venv=venv, packages=profile.pip.remove)
    # Every profile: one whose steps accept nothing must leave `pip check` with nothing to say.
    gates.passed(name="pip check: only the complaints upstream accepts",
                 description=f"`pip check` names only what profile {profile.name} accepts",
                 find_problem=lambda: pip_check_problem(venv, profile))
    expected = config.npu_count
    gates.passed(name="torch_npu sees every NPU", description=f"torch.npu.is_available(), {expected} devices",
                 find_problem=lambda: torch_npu_problem(venv, expected))
