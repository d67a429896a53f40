"""The serving virtualenv's pinned packages."""

from __future__ import annotations

import shlex
from io import StringIO
from pathlib import Path
from urllib.parse import urlsplit

from packaging.requirements import Requirement
from packaging.version import Version
from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation
from pyinfra.operations import files

from ascend_fleet.config.profile import NodeStep, PipBuild, PipLocked, PipRemoval, PipStep
from ascend_fleet.core.node_layout import PIP_LOCK_DIR, WHEEL_DIR, WHEELS_HELPER
from ascend_fleet.facts.ascend import PipPackages
from ascend_fleet.node import peer_wheels
from ascend_fleet.node.peer_wheels import INCOMING_DIR_NAME, normalize

# Verified wheels, which a worker's peer server offers the fleet (templates/weights-peer-nginx.conf.j2).
WHEELS_HELPER_SOURCE = Path(peer_wheels.__file__)


def satisfies(installed: dict[str, str], requirement: str) -> bool:
    """Whether the installed distributions meet one requirement as pip reads it: `torch==2.8.0` takes
    2.8.0+cpu, `vllm==0.32.0+cpu` takes only that build."""
    wanted = Requirement(requirement)
    version = installed.get(normalize(wanted.name), "")
    return bool(version) and wanted.specifier.contains(version, prereleases=True)


def index_options(index_url: str, extra_index_urls: list[str]) -> str:
    options = [f"--index-url {shlex.quote(index_url)}"]
    options += [f"--extra-index-url {shlex.quote(url)}" for url in extra_index_urls]
    # pip ignores a plain-http index (an internal mirror, the lab's) unless its host is trusted.
    options += [f"--trusted-host {shlex.quote(urlsplit(url).hostname or url)}" for url in [index_url, *extra_index_urls]
                if url.startswith("http://")]
    return " ".join(options)


def build_installed(installed: dict[str, str], build: PipBuild) -> bool:
    version = installed.get(normalize(build.name))
    return version is not None and Version(version) == Version(build.version)


def step_met(installed: dict[str, str], step: NodeStep, builds: list[PipBuild]) -> bool:
    """Whether one step's outcome is in place: an install's requirements met (one on a distribution a build
    replaces later is met by that build), an uninstall's distributions absent, a build installed."""
    if isinstance(step, PipRemoval):
        return not any(normalize(name) in installed for name in step.packages)
    if isinstance(step, PipBuild):
        return build_installed(installed, step)
    if isinstance(step, PipLocked):
        return all(satisfies(installed, f"{name}=={version}") for name, version in step.pins.items())
    replaced = {normalize(build.name): build for build in builds}

    def met(requirement: str) -> bool:
        build = replaced.get(normalize(Requirement(requirement).name))
        return satisfies(installed, requirement) or (build is not None and build_installed(installed, build))
    return all(met(requirement) for requirement in step.requirements)


def installed_by(step: NodeStep) -> set[str]:
    """The distributions an install, a lock or a build puts in the virtualenv."""
    if isinstance(step, PipBuild):
        return {normalize(step.name)}
    if isinstance(step, PipLocked):
        return {normalize(name) for name in step.pins}
    if isinstance(step, PipStep):
        return {normalize(Requirement(requirement).name) for requirement in step.requirements}
    return set()


def installed_again(steps: list[NodeStep], index: int) -> set[str]:
    """The distributions a step after steps[index] installs (again, when that step uninstalls them)."""
    return set().union(*(installed_by(step) for step in steps[index + 1:]))


def without_reinstalled(installed: dict[str, str], steps: list[NodeStep], index: int) -> dict[str, str]:
    """What an uninstall at steps[index] is judged against: the virtualenv less what a later step installs
    again (upstream's image uninstalls triton and triton-ascend, then installs triton-ascend alone), whose
    own step judges it."""
    if not isinstance(steps[index], PipRemoval):
        return installed
    again = installed_again(steps, index)
    return {name: version for name, version in installed.items() if name not in again}


def in_place(steps: list[NodeStep]) -> str:
    """What a converged virtualenv holds, as the no-op says it."""
    said = []
    for index, step in enumerate(steps):
        if isinstance(step, PipRemoval):
            again = installed_again(steps, index)
            if absent := [name for name in step.packages if normalize(name) not in again]:
                said.append(f"{', '.join(absent)} absent")
        elif isinstance(step, PipBuild):
            said.append(f"{step.name} {step.version} over its pin")
        elif isinstance(step, PipLocked):
            said.append(f"the {len(step.pins)} packages of {step.name}")
        else:
            said += step.requirements
    return ", ".join(said)


def from_verified_wheels(local: str, download: str, helper: str) -> str:
    """pip installs from the verified wheels alone; when they do not hold what it needs (a seeder, a new pin),
    `download` fetches it from the index into the incoming folder, the helper checks each file against the
    index's digest and admits it, and the same install runs."""
    return f"{local} 2>/dev/null || {{ {download} && {helper} --admit && {local}; }}"


def build_command(pip: str, index_url: str, build: PipBuild, helper: str | None = None) -> StringCommand:
    """pip installs the build alone (--no-deps) over its pin, checked against the profile's sha256: from its
    URL, whose #sha256= fragment pip checks, or from the index as a hashed requirement. With the wheel
    peers (helper), a build from the index goes through the verified wheels as an install's do."""
    if not build.from_index:
        return StringCommand(pip, "install", "--no-deps", QuoteString(build.url))
    requirement = f"{build.name}=={build.version} --hash=sha256:{build.sha256}"
    indexes = index_options(index_url, build.extra_index_urls)
    if helper is None:
        return StringCommand("printf '%s\\n'", QuoteString(requirement), "|", pip, "install", "--no-deps",
                             "--require-hashes", indexes, "-r", "/dev/stdin")
    local = (f"printf '%s\\n' {shlex.quote(requirement)} | {pip} install --no-deps --require-hashes --no-index "
             f"--find-links {WHEEL_DIR} -r /dev/stdin")
    download = (f"{pip} download --no-deps --dest {WHEEL_DIR}/{INCOMING_DIR_NAME} {indexes} "
                f"{shlex.quote(f'{build.name}=={build.version}')}")
    return StringCommand(from_verified_wheels(local, download, helper))


def locked_install(pip: str, index_url: str, lock: PipLocked, helper: str | None):
    """The lock on the node, and pip installing exactly it: every file checked against the lock's sha256,
    nothing resolved (--no-deps). With the wheel peers (helper), through the verified wheels."""
    path = f"{PIP_LOCK_DIR}/{lock.name}"
    yield from files.put._inner(src=StringIO(lock.text), dest=path, mode="0644")
    indexes = index_options(index_url, lock.extra_index_urls)
    exact = f"--no-deps --require-hashes -r {shlex.quote(path)}"
    if helper is None:
        yield f"{pip} install {indexes} {exact}"
        return
    yield from_verified_wheels(f"{pip} install --no-index --find-links {WHEEL_DIR} {exact}",
                               f"{pip} download --dest {WHEEL_DIR}/{INCOMING_DIR_NAME} {indexes} {exact}", helper)


@operation()
def pinned(venv: str, steps: list[NodeStep], index_url: str, peer_urls: list[str] | None = None):
    """
    Install the profile's Python stack into the virtualenv, one pip run per step of the release's
    upstream guide (`pip install vllm==V`, then `pip install vllm-ascend==V`, which moves torch to
    vllm-ascend's pin: no single resolver run satisfies both wheels' pins), with the uninstalls and
    the builds over a pin where upstream's image runs them.

    + venv: the virtualenv's path
    + steps: in order, installs (requirements, with the stack's pins, and extra indexes) or the lock they are
      as one set (PipLocked, installed exactly, each file checked against its sha256), uninstalls
      (PipRemoval) and builds over a pin (PipBuild); the stack is in place when every step's outcome
      is, and a rerun starts at the first step whose outcome is not (a later step may move what an
      earlier one installed, never the reverse)
    + index_url: the package index to install from
    + peer_urls: other workers' peer servers: spread the wheels of the installs over the fleet
      (WHEEL_DIR), each checked against the digest the index gives; pip downloads from the index only
      what no peer has. Builds from the index spread the same way; builds from a URL come from it.
    """
    installed = host.get_fact(PipPackages, venv=venv)
    builds = [step for step in steps if isinstance(step, PipBuild)]
    unmet = [index for index, step in enumerate(steps)
             if not step_met(without_reinstalled(installed, steps, index), step, builds)]
    if not unmet:
        host.noop(f"{in_place(steps)} installed")
        return
    pip = f"{venv}/bin/python -m pip --quiet --disable-pip-version-check"
    to_run = steps[unmet[0]:]
    installs = [step for step in steps if isinstance(step, (PipStep, PipLocked))]
    if peer_urls is not None:
        origin_urls = list(dict.fromkeys(url for step in [*installs, *builds]
                                         for url in [index_url, *step.extra_index_urls]))
        yield from files.put._inner(src=str(WHEELS_HELPER_SOURCE), dest=WHEELS_HELPER, mode="0755")
        helper = f"{venv}/bin/python {WHEELS_HELPER} --wheel-dir {WHEEL_DIR} " + " ".join(
            f"--index-url {shlex.quote(url)}" for url in origin_urls)
        if peer_urls:
            yield f"{helper} " + " ".join(f"--peer {shlex.quote(url)}" for url in peer_urls)
    for step in to_run:
        if isinstance(step, PipRemoval):
            yield StringCommand(pip, "uninstall", "--yes", *map(QuoteString, step.packages))
            continue
        if isinstance(step, PipBuild):
            yield build_command(pip, index_url, step, helper if peer_urls is not None else None)
            continue
        if isinstance(step, PipLocked):
            yield from locked_install(pip, index_url, step, helper if peer_urls is not None else None)
            continue
        requirements = " ".join(shlex.quote(r) for r in step.requirements)
        indexes = index_options(index_url, step.extra_index_urls)
        if peer_urls is None:
            yield f"{pip} install {indexes} {requirements}"
            continue
        yield from_verified_wheels(f"{pip} install --no-index --find-links {WHEEL_DIR} {requirements}",
                                   f"{pip} download --dest {WHEEL_DIR}/{INCOMING_DIR_NAME} {indexes} {requirements}",
                                   helper)


@operation()
def pinned_seeded(seeder: str, venv: str, steps: list[NodeStep], index_url: str, peer_urls: list[str] | None = None):
    """
    Install the pinned stack on the wheels' seeder before the rest of the fleet asks the peers for
    its wheels (pyinfra runs an operation on every host before the next), so the index sends each
    wheel once.

    + seeder: the worker that installs now; on the others this does nothing
    + venv, steps, index_url, peer_urls: as pinned
    """
    if host.name != seeder:
        host.noop(f"{seeder} fetches the stack's wheels for the fleet; this worker takes them from a peer next")
        return
    yield from pinned._inner(venv=venv, steps=steps, index_url=index_url, peer_urls=peer_urls)


@operation()
def absent(venv: str, packages: list[str]):
    """
    Uninstall distributions from the virtualenv (builds a pinned package pulled in that break the stack).

    + venv: the virtualenv's path
    + packages: distribution names; those not installed are skipped
    """
    installed = host.get_fact(PipPackages, venv=venv)
    present = [name for name in packages if normalize(name) in installed]
    if not present:
        host.noop(f"{', '.join(packages)} not installed")
        return
    yield (f"{venv}/bin/python -m pip uninstall --yes --quiet --disable-pip-version-check "
           f"{' '.join(shlex.quote(name) for name in present)}")
