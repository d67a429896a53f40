"""A PEP 503 index over a folder of wheels and sdists, with each file's sha256 in its link: what the lab's
mirror and a bundle (bundle.py) serve, and what pip, uv and the wheel peers (node/peer_wheels.py) read."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from ascend_fleet import TEMPLATES
from ascend_fleet.core.templating import render
from ascend_fleet.node.peer_wheels import project_of

PACKAGES_DIR = "packages"  # the files, beside the index (the pages link ../../packages/<file>)
SIMPLE_DIR = "simple"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while block := stream.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def write_simple_index(root: Path) -> None:
    """(Re)write root/simple/ for every file in root/packages/."""
    by_project: dict[str, list[dict]] = {}
    for package in sorted((root / PACKAGES_DIR).iterdir()):
        by_project.setdefault(project_of(package.name), []).append({"name": package.name,
                                                                      "sha256": file_sha256(package)})
    simple = root / SIMPLE_DIR
    shutil.rmtree(simple, ignore_errors=True)
    simple.mkdir()
    (simple / "index.html").write_text(render(TEMPLATES / "simple-root.html.j2", projects=sorted(by_project)))
    for project, files in by_project.items():
        (simple / project).mkdir()
        (simple / project / "index.html").write_text(
            render(TEMPLATES / "simple-project.html.j2", project=project, files=files))
