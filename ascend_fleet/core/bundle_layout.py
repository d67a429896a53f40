"""Where things are in a bundle (`ascend-fleet bundle`, bundle.py), one answer as node_layout.py is for a
node: the bundle's maker, the deploy's stages, the data check and the site mirror take their names here."""

from __future__ import annotations

import json
import re
from pathlib import Path

from pydantic import BaseModel

from ascend_fleet.core.errors import FleetError, describe_unreadable

MANIFEST = "bundle-manifest.json"  # every file with its sha256, and the platforms and releases it serves
LOCKS_DIR = "locks"  # the profiles' locks the nodes install from
VENDOR_DIR = "files"  # the vendor .run files
MODELS_DIR = "models"  # <org>/<name>/<revision>/ with the weights stager's manifest
OS_DIR = "os"  # <release>-<arch>/: each release's OS packages as a repository (os_repository.py)
CONTROL_DIR = "control"  # the control machine's own install


def model_dir(bundle: Path, model_id: str, revision: str) -> Path:
    return bundle / MODELS_DIR / model_id / revision


class PlatformEntry(BaseModel):
    """A profile's stack for one arch and Python: its lock in the bundle."""

    profile: str
    arch: str
    python: str
    lock: str


class RouterEntry(BaseModel):
    """A vllm-router for one arch and the gateways' system Python: its lock in the bundle."""

    vllm_router: str
    arch: str
    python: str
    lock: str


class OsEntry(BaseModel):
    """A release's OS packages for one arch, as a repository in the bundle."""

    distribution: str
    release: str
    arch: str
    repository: str
    # What the fleet's stages install there, as the bundle was made for its inventory (None: a bundle made
    # before the manifest listed them, whose coverage of the roles is not known).
    packages: list[str] | None = None


class Manifest(BaseModel):
    """MANIFEST as `ascend-fleet bundle` writes it (bundle.build_bundle)."""

    files: dict[str, str] = {}  # path in the bundle -> sha256
    platforms: list[PlatformEntry] = []
    routers: list[RouterEntry] = []
    os: list[OsEntry] = []


def read_bundle_manifest(bundle: Path) -> Manifest:
    """The bundle's manifest; one that cannot be read, is not JSON or not of the shape the bundle writes
    (a hand-edited or truncated one) is refused in one line naming the file and the key."""
    path = bundle / MANIFEST
    try:
        return Manifest.model_validate(json.loads(path.read_text()))
    except (OSError, ValueError) as exc:  # ValidationError and JSONDecodeError are ValueErrors
        why = describe_unreadable(exc, Manifest)
        raise FleetError(f"bundle {bundle}: cannot read {MANIFEST} ({why}); make it again with "
                         "`ascend-fleet bundle`") from None


def listed_sha256(bundle: Path, name: str) -> str:
    """A file's sha256 as the bundle's manifest lists it (preflight checked the file against it); it goes
    into the nodes' package sources, so anything but 64 hex digits is refused."""
    digest = read_bundle_manifest(bundle).files.get(name)
    if not re.fullmatch(r"[0-9a-f]{64}", str(digest)):
        raise FleetError(f"bundle {bundle}: {MANIFEST} lists {name} with {digest!r}, not a sha256; make the bundle "
                         "again with `ascend-fleet bundle`")
    return digest
