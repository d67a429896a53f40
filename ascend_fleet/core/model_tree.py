"""A model's weights as a mirror serves them: <models>/<org>/<name>/<revision>/ with every file and the
manifest the weights stager reads first (node/stage_weights: ascend-fleet-manifest.json, each file's size
and sha256, the model id and revision). The lab's mirror and a bundle (bundle.py) both hold this tree."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from ascend_fleet.core.node_layout import MANIFEST_NAME
from ascend_fleet.core.package_index import file_sha256


def weights_manifest(model_dir: Path, model_id: str, revision: str, file_names: list[str] | None = None) -> dict:
    """The manifest of model_dir's files (all of them but the manifest, or file_names)."""
    names = file_names if file_names is not None else [
        path.relative_to(model_dir).as_posix() for path in sorted(model_dir.rglob("*"))
        if path.is_file() and path.name != MANIFEST_NAME and not path.name.startswith(".")]
    return {"model_id": model_id, "revision": revision,
            "files": {name: {"size": (model_dir / name).stat().st_size, "sha256": file_sha256(model_dir / name)}
                      for name in sorted(names)}}


def read_manifest(model_dir: Path) -> dict:
    return json.loads((Path(model_dir) / MANIFEST_NAME).read_text(encoding="utf-8"))


def write_manifest(model_dir: Path, manifest: dict) -> None:
    (model_dir / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n",
                                           encoding="utf-8")


def publish_model(model_dir: Path, models_root: Path) -> Path:
    """Copy a model with its manifest into the models tree and return where it landed.

    A model with id ``<org>/<name>`` at ``<revision>`` lands in ``<models_root>/<org>/<name>/<revision>/``
    and is reached over HTTP as ``<mirror-url>/models/<org>/<name>/<revision>/ascend-fleet-manifest.json``
    and ``.../<file>`` for every key of manifest["files"]. The weights stage fetches the manifest first,
    then each file it lists, and checks size and sha256 against it. The revision directory appears whole:
    it is filled beside its final place and renamed in, and an existing revision is replaced only by a
    complete new copy.
    """
    manifest = read_manifest(model_dir)
    org, _, repo = manifest["model_id"].partition("/")
    if not org or not repo or "/" in repo:
        raise ValueError(f"model id {manifest['model_id']!r} is not <org>/<name>")
    target = Path(models_root) / org / repo / manifest["revision"]
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    for file_name in [*manifest["files"], MANIFEST_NAME]:
        (staging / file_name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(Path(model_dir) / file_name, staging / file_name)
    staging.chmod(0o755)  # mkdtemp makes it 0700; the mirror's HTTP server must read it
    if target.exists():
        retired = target.with_name(f".{target.name}.retired")
        target.rename(retired)
        staging.rename(target)
        shutil.rmtree(retired)
    else:
        staging.rename(target)
    return target
