"""The serving virtualenv's pinned packages."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from urllib.parse import urlsplit

from packaging.specifiers import SpecifierSet
from pyinfra import host
from pyinfra.api import operation
from pyinfra.operations import files

from ascend_fleet.facts.ascend import PipPackages
from ascend_fleet.operations.files import peer_wheels
from ascend_fleet.operations.files.peer_wheels import INCOMING_DIR_NAME, normalize

# Verified wheels, which a worker's peer server offers the fleet (templates/weights-peer-nginx.conf.j2).
WHEEL_DIR = "/var/cache/ascend-fleet/wheels"
WHEELS_HELPER_SOURCE = Path(peer_wheels.__file__)
WHEELS_HELPER_ON_NODE = "/usr/local/lib/ascend-fleet/peer_wheels.py"


def satisfies(installed: str, pin: str) -> bool:
    """Whether an installed version meets `==pin` as pip reads it: pin 2.13.0 takes 2.13.0+cpu,
    pin 0.32.0+cpu takes only that build."""
    return bool(installed) and SpecifierSet(f"=={pin}").contains(installed, prereleases=True)


@operation()
def pinned(venv: str, pins: dict[str, str], extra_requirements: list[str], index_url: str,
           extra_index_urls: list[str] | None = None, peer_urls: list[str] | None = None):
    """
    Install the profile's pinned packages into the virtualenv, all in one resolver run.

    + venv: the virtualenv's path
    + pins: distribution -> exact version (torch, torch-npu, vllm, vllm-ascend, transformers)
    + extra_requirements: further requirements (CANN's Python dependencies), present is enough
    + index_url: the package index to install from
    + extra_index_urls: further indexes (e.g. a torch_npu index)
    + peer_urls: other workers' peer servers: spread the wheels over the fleet (WHEEL_DIR), each
      checked against the digest the index gives; pip downloads from the index only what no peer has
    """
    installed = host.get_fact(PipPackages, venv=venv)
    wrong = {name: version for name, version in pins.items()
             if not satisfies(installed.get(normalize(name), ""), version)}
    missing = [req for req in extra_requirements if normalize(re.split(r"[<>=!~ ;\[]", req)[0]) not in installed]
    if not wrong and not missing:
        host.noop(f"{', '.join(f'{n} {v}' for n, v in pins.items())} installed")
        return
    requirements = " ".join(shlex.quote(r) for r in
                            [f"{name}=={version}" for name, version in pins.items()] + extra_requirements)
    index_urls = [index_url, *(extra_index_urls or [])]
    indexes = [f"--index-url {shlex.quote(index_url)}"]
    indexes += [f"--extra-index-url {shlex.quote(url)}" for url in extra_index_urls or []]
    # pip ignores a plain-http index (an internal mirror, the lab's) unless its host is trusted.
    indexes += [f"--trusted-host {urlsplit(url).hostname}" for url in index_urls if url.startswith("http://")]
    pip = f"{venv}/bin/python -m pip --quiet --disable-pip-version-check"
    if peer_urls is None:
        yield f"{pip} install {' '.join(indexes)} {requirements}"
        return
    yield from files.put._inner(src=str(WHEELS_HELPER_SOURCE), dest=WHEELS_HELPER_ON_NODE, mode="0755")
    helper = f"{venv}/bin/python {WHEELS_HELPER_ON_NODE} --wheel-dir {WHEEL_DIR} " + " ".join(
        f"--index-url {shlex.quote(url)}" for url in index_urls)
    if peer_urls:
        yield f"{helper} " + " ".join(f"--peer {shlex.quote(url)}" for url in peer_urls)
    # pip resolves the pins from the verified wheels alone; when they do not hold the whole stack
    # (a seeder, a new pin), it downloads the stack from the index, the helper checks each file.
    local = f"{pip} install --no-index --find-links {WHEEL_DIR} {requirements}"
    yield (f"{local} 2>/dev/null || {{ {pip} download --dest {WHEEL_DIR}/{INCOMING_DIR_NAME} {' '.join(indexes)} "
           f"{requirements} && {helper} --admit && {local}; }}")


@operation()
def pinned_seeded(seeder: str, venv: str, pins: dict[str, str], extra_requirements: list[str], index_url: str,
                  extra_index_urls: list[str] | None = None, peer_urls: list[str] | None = None):
    """
    Install the pinned stack on the wheels' seeder before the rest of the fleet asks the peers for
    its wheels (pyinfra runs an operation on every host before the next), so the index sends each
    wheel once.

    + seeder: the worker that installs now; on the others this does nothing
    + venv, pins, extra_requirements, index_url, extra_index_urls, peer_urls: as pinned
    """
    if host.name != seeder:
        host.noop(f"{seeder} fetches the stack's wheels for the fleet; this worker takes them from a peer next")
        return
    yield from pinned._inner(venv=venv, pins=pins, extra_requirements=extra_requirements, index_url=index_url,
                             extra_index_urls=extra_index_urls, peer_urls=peer_urls)


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
