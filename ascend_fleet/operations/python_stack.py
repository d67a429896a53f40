"""The serving virtualenv's pinned packages."""

from __future__ import annotations

import re
import shlex
from urllib.parse import urlsplit

from packaging.specifiers import SpecifierSet
from pyinfra import host
from pyinfra.api import operation

from ascend_fleet.facts.ascend import PipPackages


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def satisfies(installed: str, pin: str) -> bool:
    """Whether an installed version meets `==pin` as pip reads it: pin 2.13.0 takes 2.13.0+cpu,
    pin 0.32.0+cpu takes only that build."""
    return bool(installed) and SpecifierSet(f"=={pin}").contains(installed, prereleases=True)


@operation()
def pinned(venv: str, pins: dict[str, str], extra_requirements: list[str], index_url: str,
           extra_index_urls: list[str] | None = None):
    """
    Install the profile's pinned packages into the virtualenv, all in one resolver run.

    + venv: the virtualenv's path
    + pins: distribution -> exact version (torch, torch-npu, vllm, vllm-ascend, transformers)
    + extra_requirements: further requirements (CANN's Python dependencies), present is enough
    + index_url: the package index to install from
    + extra_index_urls: further indexes (e.g. a torch_npu index)
    """
    installed = host.get_fact(PipPackages, venv=venv)
    wrong = {name: version for name, version in pins.items()
             if not satisfies(installed.get(normalize(name), ""), version)}
    missing = [req for req in extra_requirements if normalize(re.split(r"[<>=!~ ;\[]", req)[0]) not in installed]
    if not wrong and not missing:
        host.noop(f"{', '.join(f'{n} {v}' for n, v in pins.items())} installed")
        return
    requirements = [f"{name}=={version}" for name, version in pins.items()] + extra_requirements
    indexes = [f"--index-url {shlex.quote(index_url)}"]
    indexes += [f"--extra-index-url {shlex.quote(url)}" for url in extra_index_urls or []]
    # pip ignores a plain-http index (an internal mirror, the lab's) unless its host is trusted.
    indexes += [f"--trusted-host {urlsplit(url).hostname}" for url in [index_url, *(extra_index_urls or [])]
                if url.startswith("http://")]
    yield (f"{venv}/bin/python -m pip install --quiet --disable-pip-version-check {' '.join(indexes)} "
           f"{' '.join(shlex.quote(r) for r in requirements)}")


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
