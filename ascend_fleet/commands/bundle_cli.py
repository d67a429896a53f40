"""`ascend-fleet bundle INVENTORY --out DIR` and `ascend-fleet bundle verify DIR`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from ascend_fleet.control.rollout import parse_data
from ascend_fleet.fleet.bundle import build_bundle, verify_bundle

console = Console(highlight=False, soft_wrap=True, markup=False)  # lines quote paths and names: never markup
progress_console = Console(stderr=True, highlight=False, soft_wrap=True, markup=False)


def bundle(
    inventory: Annotated[str, typer.Argument(
        metavar="INVENTORY|verify", help="the inventory whose workers' stack to bundle, or `verify`")],
    directory: Annotated[Optional[Path], typer.Argument(metavar="[DIR]", help="with verify: the bundle")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", help="the bundle's folder (made, or completed)")] = None,
    arch: Annotated[Optional[list[str]], typer.Option(
        "--arch", help="x86_64 or aarch64, repeatable (default: every arch each profile lists)")] = None,
    model_dir: Annotated[Optional[list[Path]], typer.Option(
        "--model-dir", help="weights already on disk, repeatable: a folder with its ascend-fleet-manifest.json, "
                            "or the fleet's one model's files (default: each http model from its mirror)")] = None,
    os_release: Annotated[Optional[list[str]], typer.Option(
        "--os", help="a release the site's nodes run, repeatable: 'Debian 12' or 'Debian 12=ARCHIVE_URL' (default "
                     "archives: http://deb.debian.org/debian, https://repo.openeuler.org/openEuler-24.03-LTS): its "
                     "OS packages for every role, as a repository the nodes' apt or dnf installs from")] = None,
    kernel: Annotated[Optional[list[str]], typer.Option(
        "--kernel", help="a kernel the site's openEuler nodes run, repeatable, as `uname -r` prints it (e.g. "
                         "6.6.0-28.0.0.34.oe2403.aarch64): its kernel-devel and kernel-headers, which the NPU driver "
                         "builds against, go into that arch's OS packages")] = None,
    data: Annotated[Optional[list[str]], typer.Option(
        "--data", help="KEY=VALUE over every host's data, as pyinfra's --data (repeatable): the site's own inventory "
                       "with the indexes that answer where the bundle is made, e.g. pip_index_url=URL, "
                       "vendor_mirror_url=URL, model_mirror_url=URL")] = None,
) -> int:
    """Put what the inventory's hosts install (each profile's lock and its files, the builds over pins, the
    vendor .run files, the models they serve, the OS packages of each --os release) in one folder with a
    manifest of every file's sha256, to carry into a site without internet;
    `bundle verify DIR` checks every file against the manifest and names each that differs."""
    if inventory == "verify":
        if directory is None:
            raise typer.BadParameter("give the bundle's folder: ascend-fleet bundle verify DIR")
        problems = verify_bundle(directory)
        for line in problems:
            console.print(line, markup=False)
        if not problems:
            console.print(f"bundle {directory}: every file is as its manifest lists it", markup=False)
        return 1 if problems else 0
    if out is None or directory is not None:
        raise typer.BadParameter("ascend-fleet bundle INVENTORY --out DIR")
    build_bundle(Path(inventory), out, arch, lambda line: progress_console.print(line, markup=False),
                 override_data=parse_data(data or []), model_dirs=model_dir or [], os_releases=os_release or [],
                 kernels=kernel or [])
    return 0
