"""What a staged revision is: where it lies under the model directory, its marker and the
sources' manifests (file -> size and digest) as the stager reads them, how a file is checked, and
the Job that stages one. The controller reads these names too (ascend_fleet.core.node_layout)."""

from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

MANIFEST_NAME = "ascend-fleet-manifest.json"  # the HTTP mirror's manifest (ascend_fleet.lab.sim.tinymodel)
INDEX_NAME = "model.safetensors.index.json"
MARKER_NAME = ".ascend-fleet-staged.json"
# Beside the marker: what the last deep verify (every file hashed again) found, and how often files were restaged.
DEEP_VERIFY_NAME = ".ascend-fleet-deep-verify.json"
PARTIAL_DIR_NAME = ".partial"
INCOMING_DIR_NAME = ".incoming"  # in the partial directory: what is being fetched, not yet verified
# Where a node's nginx serves its weights to the fleet (templates/weights-peer-nginx.conf.j2):
# whole published revisions, the verified files of revisions being staged, and their files still
# arriving (INCOMING_DIR_NAME), as far as they have.
PEER_PUBLISHED_PATH, PEER_STAGING_PATH, PEER_RECEIVING_PATH = "published", "staging", "receiving"
SOURCES = ("http", "modelscope", "hf", "rsync")
CHUNK_BYTES = 4 * 1024 * 1024
# Files hashed at once: hashlib lets go of the GIL while it hashes a chunk, so threads use the node's cores
# (a 910B server has far more than this) and the NVMe's bandwidth.
HASH_THREADS = min(8, os.cpu_count() or 1)
# A safetensors header is JSON of tensor names and offsets; 100 MB is far beyond any real one.
MAX_SAFETENSORS_HEADER_BYTES = 100 * 1024 * 1024
SHA256_HEX_LEN, SHA1_HEX_LEN = 64, 40


class StageError(Exception):
    """A failure the operator can act on; str() is the whole one-line message."""


def model_path_parts(model_id: str, revision: str) -> tuple[str, str, str]:
    """(org, name, revision) of a model id ``<org>/<name>``, each safe as one path component."""
    org, _, name = model_id.partition("/")
    for part in (org, name, revision):
        if not part or "/" in part or part in (".", "..") or part.startswith("."):
            raise ValueError(f"model {model_id!r} revision {revision!r}: expected <org>/<name> and a "
                             "revision that are plain path names (no '/', not starting with '.')")
    return org, name, revision


def revision_dir(model_dir: str | Path, model_id: str, revision: str) -> Path:
    """Where a revision is published: ``<model_dir>/<org>/<name>/<revision>``."""
    return Path(model_dir).joinpath(*model_path_parts(model_id, revision))


def partial_dir(model_dir: str | Path, model_id: str, revision: str) -> Path:
    """Where a revision is fetched before publishing: ``<model_dir>/.partial/<org>/<name>/<revision>``."""
    return Path(model_dir, PARTIAL_DIR_NAME).joinpath(*model_path_parts(model_id, revision))


def marker_problems(marker: dict, sizes: dict[str, int], model_id: str, revision: str) -> list[str]:
    """What keeps a published directory from being this revision, staged and intact (empty: nothing).

    Sizes, not digests: hashing hundreds of GB on every run would make a converged
    fleet slow to check; the digests were verified before the marker was written.
    """
    if marker.get("model_id") != model_id or marker.get("revision") != revision:
        return [f"its marker is for {marker.get('model_id')}@{marker.get('revision')}"]
    problems = []
    for name, entry in sorted(marker.get("files", {}).items()):
        if name not in sizes:
            problems.append(f"{name} is missing")
        elif sizes[name] != entry.get("size"):
            problems.append(f"{name} is {sizes[name]} bytes, the marker says {entry.get('size')}")
    return problems


#
# A file entry carries "size" and either "sha256" or, for small files that the
# Hugging Face hub keeps in git rather than LFS, "git_sha1" (git's blob id).


def checked_file_name(name: object) -> str:
    """A manifest file name, refused when it could escape the revision directory or shadow ours."""
    if not isinstance(name, str) or not name or name.startswith("/") or "\\" in name:
        raise ValueError(f"manifest lists an unusable file name {name!r}")
    parts = PurePosixPath(name).parts
    if any(part in ("", ".", "..") for part in parts) or parts[0] in (MARKER_NAME, DEEP_VERIFY_NAME, INCOMING_DIR_NAME):
        raise ValueError(f"manifest lists an unusable file name {name!r}")
    return name


def _hex(value: object, length: int, what: str) -> str:
    text = str(value or "").lower()
    if len(text) != length or any(c not in "0123456789abcdef" for c in text):
        raise ValueError(f"{what} is not a {length}-digit hex digest: {value!r}")
    return text


def file_entry(name: object, size: object, sha256: object = None, git_sha1: object = None) -> tuple[str, dict]:
    """One validated manifest entry."""
    name = checked_file_name(name)
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ValueError(f"manifest gives {name} the size {size!r}")
    if sha256:
        return name, {"size": size, "sha256": _hex(sha256, SHA256_HEX_LEN, f"{name}'s sha256")}
    if git_sha1:
        return name, {"size": size, "git_sha1": _hex(git_sha1, SHA1_HEX_LEN, f"{name}'s git blob id")}
    raise ValueError(f"manifest gives no digest for {name}")


def _nonempty(files: dict) -> dict:
    if not files:
        raise ValueError("manifest lists no files")
    return dict(sorted(files.items()))


def files_from_mirror_manifest(doc: dict, model_id: str, revision: str) -> dict:
    """The HTTP mirror's ``ascend-fleet-manifest.json``: {model_id, revision, files: {name: {size, sha256}}}."""
    if doc.get("model_id") != model_id or doc.get("revision") != revision:
        raise ValueError(f"manifest is for {doc.get('model_id')}@{doc.get('revision')}")
    return _nonempty(dict(file_entry(name, e.get("size"), sha256=e.get("sha256"))
                          for name, e in doc.get("files", {}).items()))


def files_from_modelscope_listing(doc: dict) -> dict:
    """ModelScope's ``GET /api/v1/models/<id>/repo/files?Revision=<rev>&Recursive=true``.

    Answer: {"Code": 200, "Data": {"Files": [{"Path", "Type": "blob"|"tree", "Size", "Sha256", ...}]}};
    directories ("tree") carry no content and are skipped. The same Sha256 is what
    ``modelscope download`` checks its files against.
    """
    if doc.get("Code") not in (200, None) or not isinstance((doc.get("Data") or {}).get("Files"), list):
        raise ValueError(f"ModelScope answered without a file list: {str(doc.get('Message') or doc)[:200]}")
    return _nonempty(dict(file_entry(f.get("Path") or f.get("Name"), f.get("Size"), sha256=f.get("Sha256"))
                          for f in doc["Data"]["Files"] if f.get("Type") != "tree"))


def files_from_hf_tree(entries: list) -> dict:
    """The Hugging Face hub's ``GET /api/models/<repo>/tree/<rev>?recursive=true`` (all pages, joined).

    Each entry: {"type": "file"|"directory", "path", "size", "oid", "lfs": {"oid", "size"}}.
    LFS files (the weights) have their sha256 in lfs.oid; small files kept in git
    have only oid, git's sha1 blob id, which verifies them just as well.
    """
    files = {}
    for entry in entries:
        if entry.get("type") != "file":
            continue
        lfs = entry.get("lfs") or {}
        name, parsed = (file_entry(entry.get("path"), lfs.get("size"), sha256=lfs.get("oid")) if lfs
                        else file_entry(entry.get("path"), entry.get("size"), git_sha1=entry.get("oid")))
        files[name] = parsed
    return _nonempty(files)


def files_from_marker(marker: dict, model_id: str, revision: str) -> dict:
    """A peer's marker lists the files it verified, in manifest form."""
    if marker.get("model_id") != model_id or marker.get("revision") != revision:
        raise ValueError(f"the peer's marker is for {marker.get('model_id')}@{marker.get('revision')}")
    return _nonempty(dict(file_entry(name, e.get("size"), sha256=e.get("sha256"), git_sha1=e.get("git_sha1"))
                          for name, e in marker.get("files", {}).items()))


def manifest_sha256(model_id: str, revision: str, files: dict) -> str:
    """One digest for the whole manifest: two stages agree on it iff they staged the same bytes."""
    canonical = json.dumps({"model_id": model_id, "revision": revision, "files": files},
                           sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def hf_next_page(link_header: str | None) -> str | None:
    """The rel="next" URL of an HTTP Link header (how the hub paginates tree listings)."""
    for part in (link_header or "").split(","):
        url, _, params = part.partition(";")
        if 'rel="next"' in params.replace(" ", ""):
            return url.strip().strip("<>")
    return None


def file_digest(path: Path, entry: dict) -> tuple[str, str]:
    """(kind, hex digest) of a file, of the kind its manifest entry carries."""
    if "sha256" in entry:
        digest, kind = hashlib.sha256(), "sha256"
    else:  # git hashes a blob as "blob <size>\0" + content
        digest, kind = hashlib.sha1(f"blob {path.stat().st_size}\0".encode()), "git_sha1"
    with path.open("rb") as f:
        for block in iter(lambda: f.read(CHUNK_BYTES), b""):
            digest.update(block)
    return kind, digest.hexdigest()


def file_problem(path: Path, entry: dict) -> str | None:
    """Why a fetched file is not the manifest's, or None."""
    if not path.is_file():
        return "is missing"
    size = path.stat().st_size
    if size != entry["size"]:
        return f"is {size} bytes, the manifest says {entry['size']}"
    kind, got = file_digest(path, entry)
    if got != entry[kind]:
        return f"{kind} {got} does not match the manifest's {entry[kind]}"
    return None


def digest_problems(directory: Path, files: dict, names: list[str]) -> dict[str, str]:
    """name -> why the file under directory is not the manifest's (file_problem), for those of names that
    are not; hashed HASH_THREADS at a time."""
    with ThreadPoolExecutor(HASH_THREADS) as pool:
        found = pool.map(lambda name: (name, file_problem(directory / name, files[name])), names)
        return {name: problem for name, problem in found if problem is not None}


def deep_verify_of(marker: dict, record: object) -> dict:
    """The record a deep verify wrote beside a published revision's marker (DEEP_VERIFY_NAME), if it is
    of this staging (same manifest), else {}: {"manifest_sha256", "checked_at" (epoch seconds),
    "seconds", "bytes", "mismatched": {name: what it found; a rerun restages these}, "restages": how
    often files of this staging were restaged}."""
    if not isinstance(record, dict) or record.get("manifest_sha256") != marker.get("manifest_sha256"):
        return {}
    return record


def read_safetensors_header(f, file_size: int) -> dict:
    """A safetensors header: 8-byte little-endian length, then that much JSON; tensors must fit the file."""
    prefix = f.read(8)
    if len(prefix) < 8:
        raise ValueError("is too short for a safetensors header")
    length = int.from_bytes(prefix, "little")
    if length > min(file_size - 8, MAX_SAFETENSORS_HEADER_BYTES):
        raise ValueError(f"declares a {length}-byte safetensors header in a {file_size}-byte file")
    try:
        header = json.loads(f.read(length))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"safetensors header is not JSON ({error})") from None
    if not isinstance(header, dict):
        raise ValueError("safetensors header is not a JSON object")
    data_bytes = file_size - 8 - length
    for tensor, info in header.items():
        if tensor == "__metadata__":
            continue
        begin, end = (info.get("data_offsets") or (None, None)) if isinstance(info, dict) else (None, None)
        if not (isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end <= data_bytes):
            raise ValueError(f"safetensors tensor {tensor} lies outside the file's {data_bytes} data bytes")
    return header


def safetensors_problem(path: Path) -> str | None:
    try:
        with path.open("rb") as f:
            read_safetensors_header(f, path.stat().st_size)
    except (OSError, ValueError) as error:
        return str(error)
    return None


def shards_to_check(index: dict | None, files: dict) -> tuple[list[str], list[str]]:
    """(shards whose headers must parse, shards the index names but the manifest lacks)."""
    named = set()
    if index is not None:
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise ValueError(f"{INDEX_NAME} has no weight_map of tensor -> shard")
        named = set(weight_map.values())
    listed = {name for name in files if name.endswith(".safetensors")}
    return sorted(named | listed), sorted(named - set(files))


@dataclass
class Job:
    """One model revision to stage on this host, and how to say what went wrong."""

    host: str
    model_id: str
    revision: str
    model_dir: Path
    tokens: dict[str, str] = field(default_factory=dict)

    def error(self, what: str) -> StageError:
        return StageError(f"{self.host}: weights {self.model_id}@{self.revision}: {what}")

    @property
    def target(self) -> Path:
        return revision_dir(self.model_dir, self.model_id, self.revision)

    @property
    def partial(self) -> Path:
        return partial_dir(self.model_dir, self.model_id, self.revision)

    @property
    def incoming(self) -> Path:
        return self.partial / INCOMING_DIR_NAME


def say(message: str) -> None:
    print(message, flush=True)
