"""Where things are in a bundle (`ascend-fleet bundle`, bundle.py), one answer as node_layout.py is for a
node: the bundle's maker, the deploy's stages, the data check and the site mirror take their names here."""

from __future__ import annotations

import json
import re
from pathlib import Path

from ascend_fleet.errors import FleetError

MANIFEST = "bundle-manifest.json"  # every file with its sha256, and the platforms and releases it serves
LOCKS_DIR = "locks"  # the profiles' locks the nodes install from
VENDOR_DIR = "files"  # the vendor .run files
MODELS_DIR = "models"  # <org>/<name>/<revision>/ with the weights stager's manifest
OS_DIR = "os"  # <release>-<arch>/: each release's OS packages as a repository (os_repository.py)
CONTROL_DIR = "control"  # the control machine's own install


def model_dir(bundle: Path, model_id: str, revision: str) -> Path:
    return bundle / MODELS_DIR / model_id / revision


def listed_sha256(bundle: Path, name: str) -> str:
    """A file's sha256 as the bundle's manifest lists it (preflight checked the file against it); it goes
    into the nodes' package sources, so anything but 64 hex digits is refused."""
    digest = json.loads((bundle / MANIFEST).read_text())["files"][name]
    if not re.fullmatch(r"[0-9a-f]{64}", str(digest)):
        raise FleetError(f"bundle {bundle}: {MANIFEST} lists {name} with {digest!r}, not a sha256; make the bundle "
                         "again with `ascend-fleet bundle`")
    return digest
