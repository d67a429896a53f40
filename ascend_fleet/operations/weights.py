"""Model weights on a node's local NVMe: staged from a source, verified, published whole.

.. code:: python

    from ascend_fleet.operations import weights
"""

from __future__ import annotations

import io
import zipfile
from functools import cache
from pathlib import Path

from pyinfra import host
from pyinfra.api import StringCommand, operation
from pyinfra.api.command import QuoteString
from pyinfra.facts.server import Which
from pyinfra.operations import files

from ascend_fleet.core.errors import FleetError
from ascend_fleet.core.node_layout import WEIGHTS_STAGER, revision_dir
from ascend_fleet.facts.weights import StagedModel
from ascend_fleet.node import stage_weights
from ascend_fleet.node.stage_weights import SOURCES, deep_verify_of, marker_problems, model_path_parts

STAGER_PACKAGE = Path(stage_weights.__file__).parent
# The archive's own entry point: the package inside it runs as a top-level package there.
ARCHIVE_MAIN = "import sys\n\nfrom stage_weights.main import main\n\nsys.exit(main(sys.argv[1:]))\n"
# Room left after the weights for logs, caches and a second revision's partial files.
DEFAULT_MIN_FREE_MARGIN_BYTES = 2 * 1024**3


@operation()
def staged(
    model_id: str,
    revision: str,
    source: str,
    model_dir: str,
    url: str | None = None,
    peer: str | None = None,
    tokens_env_file: str | None = None,
    min_free_margin_bytes: int = DEFAULT_MIN_FREE_MARGIN_BYTES,
    peer_urls: list[str] | None = None,
    origin_start: float = 0.0,
    seeder_urls: list[str] | None = None,
    seeding: bool = False,
):
    """
    Stage one revision of a model on the node's NVMe, verified, at ``<model_dir>/<org>/<name>/<revision>/``.

    + model_id: ``<org>/<name>``, e.g. ``Qwen/Qwen3-8B``
    + revision: a tag or commit (a branch name works but is staged once, as it was then)
    + source: ``http`` (a mirror), ``modelscope``, ``hf`` or ``rsync`` (from a peer node)
    + model_dir: the models directory on the NVMe, e.g. ``/mnt/nvme/models``
    + url: ``http``: the mirror (``<url>/models/<org>/<name>/<revision>/``); ``modelscope``/``hf``:
      another hub endpoint than the public one
    + peer: ``rsync``: ``[user@]host`` of a node that already staged this revision (same model_dir)
    + tokens_env_file: path on the node of a root-only 0600 file with ``MODELSCOPE_API_TOKEN=`` /
      ``HF_TOKEN=`` lines; tokens never appear in a command line
    + min_free_margin_bytes: free space to leave on the NVMe beyond the weights
    + peer_urls: ``http://host:port`` of other nodes' weights servers (``ascend_fleet.stages.peers``):
      each file comes from one that serves a verified copy, the source being only the origin of
      what none holds yet
    + origin_start: with peer_urls, where in the file list (0 to 1) this node starts asking the origin
      when it must
    + seeder_urls: those of peer_urls that ask the origin for its files, each for its share; a node
      not seeding asks the origin only when no seeder progresses
    + seeding: this node asks the origin for its share (it is one of the seeders)

    Nothing to do when the revision's marker is there, names this id and revision,
    every file it lists has its size, and the last deep verify (``deep_verified``)
    found no file unlike the manifest; the files it found are fetched again (from
    peers or the source, verified) and each renamed over its bad copy. Otherwise the node fetches into
    ``<model_dir>/.partial/<org>/<name>/<revision>/`` (a rerun keeps verified files
    and resumes cut-off ones), after checking the NVMe has room for what is left
    plus the margin; checks every file's size and sha256 against the source's
    manifest and every safetensors shard's header (all those the index names
    must exist); writes the marker and renames the directory into place. Other
    revisions are never touched, and an existing directory for this revision
    that is not a verified stage is left for the operator, not replaced.

    Every failure is one line: host, model, file, what to do.

    **Example:**

    .. code:: python

        weights.staged(
            name="Stage Qwen3-8B",
            model_id="Qwen/Qwen3-8B",
            revision="v1",
            source="http",
            url="http://mirror.internal:8080",
            model_dir="/mnt/nvme/models",
        )
    """
    check_arguments(model_id, revision, source, url, peer)
    marker = host.get_fact(StagedModel, model_dir=model_dir, model_id=model_id, revision=revision)
    if marker and not marker_problems(marker, marker["sizes"], model_id, revision) \
            and not restages_due(model_dir, model_id, revision):
        host.noop(f"{model_id}@{revision} is staged at {revision_dir(model_dir, model_id, revision)}")
        return
    yield from stager_uploaded(model_id, revision)
    yield stager_command(host.name, model_id, revision, source, model_dir, url, peer, tokens_env_file,
                         min_free_margin_bytes, peer_urls or [], origin_start, seeder_urls or [], seeding)


@operation()
def deep_verified(model_id: str, revision: str, model_dir: str):
    """
    Hash every file of a staged revision against the sha256 of the manifest it was staged from, on the
    node (python3's hashlib, several files at once: no byte of the weights crosses SSH), and record the
    files that differ beside its marker, so that the next ``staged`` of the revision restages them
    (``status`` shows them until then). It fails naming each such file, one line each.

    + model_id: ``<org>/<name>``, e.g. ``Qwen/Qwen3-8B``
    + revision: the staged revision to hash
    + model_dir: the models directory on the NVMe, e.g. ``/mnt/nvme/models``
    """
    try:
        model_path_parts(model_id, revision)
    except ValueError as error:
        raise FleetError(f"{host.name}: weights: {error}") from None
    yield from stager_uploaded(model_id, revision)
    yield StringCommand("python3", WEIGHTS_STAGER, "--host", QuoteString(host.name), "--model-id",
                        QuoteString(model_id), "--revision", QuoteString(revision), "--model-dir",
                        QuoteString(model_dir), "--deep-verify")


def restages_due(model_dir: str, model_id: str, revision: str) -> dict[str, str]:
    """The files of this host's staged revision that its last deep verify found unlike the manifest
    (name -> what it found): the next ``staged`` fetches them again."""
    return last_deep_verify(host, model_dir, model_id, revision).get("mismatched", {})


def last_deep_verify(worker, model_dir: str, model_id: str, revision: str) -> dict:
    """What the last deep verify of a host's staged revision recorded (stage_weights.deep_verify_of), {} if none."""
    marker = worker.get_fact(StagedModel, model_dir=model_dir, model_id=model_id, revision=revision)
    return deep_verify_of(marker, marker.get("deep_verify")) if marker else {}


def stager_uploaded(model_id: str, revision: str):
    """The stager archive on the node (python3 runs it), as an operation's commands."""
    if not host.get_fact(Which, command="python3"):
        raise FleetError(f"{host.name}: weights {model_id}@{revision}: python3 is missing on the node: "
                         "install it (the weights stager is a python3 script)")
    yield from files.put._inner(src=io.BytesIO(stager_archive()), dest=WEIGHTS_STAGER, mode="0755")


@cache
def stager_archive() -> bytes:
    """The stager package as one zip archive python3 runs (zipapp's layout), byte for byte the same
    from the same sources: fixed timestamps and order, no compression, so a rerun uploads nothing."""
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as zipped:
        members = {"__main__.py": ARCHIVE_MAIN.encode()}
        members |= {f"stage_weights/{path.name}": path.read_bytes() for path in STAGER_PACKAGE.glob("*.py")
                    if path.name != "__main__.py"}
        for name in sorted(members):
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            zipped.writestr(info, members[name])
    return archive.getvalue()


def check_arguments(model_id: str, revision: str, source: str, url: str | None, peer: str | None) -> None:
    """Refuse, in one line, what the stager would refuse on the node, before touching it."""
    prefix = f"{host.name}: weights {model_id}@{revision}"
    try:
        model_path_parts(model_id, revision)
    except ValueError as error:
        raise FleetError(f"{host.name}: weights: {error}") from None
    if source not in SOURCES:
        raise FleetError(f"{prefix}: unknown source {source!r}: use one of {', '.join(SOURCES)}")
    if source == "http" and not url:
        raise FleetError(f"{prefix}: source http needs url= (the mirror serving /models/)")
    if source == "rsync" and not peer:
        raise FleetError(f"{prefix}: source rsync needs peer= (a node that staged this revision)")


def stager_command(
    host_name: str,
    model_id: str,
    revision: str,
    source: str,
    model_dir: str,
    url: str | None,
    peer: str | None,
    tokens_env_file: str | None,
    min_free_margin_bytes: int,
    peer_urls: list[str] = (),
    origin_start: float = 0.0,
    seeder_urls: list[str] = (),
    seeding: bool = False,
) -> StringCommand:
    """The node-side stager's command line: paths and names only, never a token."""
    options = {
        "--host": host_name, "--model-id": model_id, "--revision": revision, "--model-dir": model_dir,
        "--source": source, "--url": url, "--peer": peer, "--tokens-env-file": tokens_env_file,
        "--min-free-margin-bytes": str(min_free_margin_bytes),
    }
    words = [word for flag, value in options.items() if value is not None for word in (flag, QuoteString(value))]
    words += [word for url in peer_urls for word in ("--peer-url", QuoteString(url))]
    if peer_urls:
        words += ["--origin-start", f"{origin_start:.6f}"]
        words += [word for url in seeder_urls for word in ("--seeder-url", QuoteString(url))]
        words += ["--seed"] if seeding else []
    return StringCommand("python3", WEIGHTS_STAGER, *words)
