"""A bundle (ascend_fleet/bundle.py) copied onto the host that serves it to the site."""

from __future__ import annotations

import json
from pathlib import Path

from pyinfra import host
from pyinfra.api import operation
from pyinfra.facts.files import Sha256File
from pyinfra.operations import files

from ascend_fleet.bundle import MANIFEST
from ascend_fleet.package_index import file_sha256


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
    for name in json.loads(manifest.read_text())["files"]:
        yield from files.put._inner(src=str(bundle / name), dest=f"{dest}/{name}", mode="0644")
    yield from files.put._inner(src=str(manifest), dest=f"{dest}/{MANIFEST}", mode="0644")
