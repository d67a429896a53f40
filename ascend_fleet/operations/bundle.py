"""A bundle (ascend_fleet/fleet/bundle.py) copied onto the host that serves it to the site."""

from __future__ import annotations

import hashlib
from io import StringIO
from pathlib import Path

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation
from pyinfra.facts.files import Sha256File
from pyinfra.facts.rpm import RpmPackages
from pyinfra.operations import files

from ascend_fleet.core.bundle_layout import MANIFEST, read_bundle_manifest
from ascend_fleet.core.package_index import file_sha256


@operation()
def served(bundle: Path, dest: str):
    """
    Copy a bundle to the host, each file that differs, its manifest last: a copy whose manifest is the
    bundle's is complete, and a rerun finds it so without looking at another file.

    + bundle: the bundle on the control machine (checked against its manifest before the run)
    + dest: the folder on the host the site mirror serves
    """
    manifest = bundle / MANIFEST
    if host.get_fact(Sha256File, path=f"{dest}/{MANIFEST}") == file_sha256(manifest):
        host.noop(f"the bundle of {manifest} is served from {dest}")
        return
    for name in read_bundle_manifest(bundle).files:
        yield from files.put._inner(src=str(bundle / name), dest=f"{dest}/{name}", mode="0644")
    yield from files.put._inner(src=str(manifest), dest=f"{dest}/{MANIFEST}", mode="0644")


@operation()
def apt_repository(source: str, path: str):
    """
    The bundle's OS repository in the host's apt sources, its lists read when the source is new or changed
    (a new bundle changes the Release digest the source carries). The lists are read from the source alone
    (an offline site's other sources do not answer) before it goes in place, so a failed read leaves nothing
    that a rerun would take for done.

    + source: the sources.list lines (templates/bundle-apt-source.list.j2)
    + path: where they go (node_layout.BUNDLE_APT_SOURCE)
    """
    if host.get_fact(Sha256File, path=path) == hashlib.sha256(source.encode()).hexdigest():
        host.noop(f"{path} is the bundle's and its lists are read")
        return
    staged = f"{path}.new"
    yield from files.put._inner(src=StringIO(source), dest=staged, mode="0644")
    yield StringCommand("apt-get", "-q", "update", *only_source(staged))
    yield StringCommand("mv", "-f", QuoteString(staged), QuoteString(path))


def only_source(path: str) -> list[str]:
    """apt options that read this sources file and no other."""
    return [f"-oDir::Etc::sourcelist={path}", "-oDir::Etc::sourceparts=-", "-oAPT::Get::List-Cleanup=0"]


@operation()
def dnf_packages(packages: list[str], repository: str):
    """
    Install packages with dnf from one repository alone (the bundle's), asking the host's other repositories
    nothing: on a site without internet they do not answer, and dnf waits on each (pyinfra's dnf.packages
    asks every repository what provides each package first).

    + packages: the package names
    + repository: the id of the repository they come from
    """
    installed = host.get_fact(RpmPackages)
    missing = [package for package in packages if package not in installed]
    if not missing:
        host.noop(f"{', '.join(packages)} installed")
        return
    yield StringCommand("dnf", "install", "-y", QuoteString("--disablerepo=*"), f"--enablerepo={repository}",
                        *map(QuoteString, missing))
