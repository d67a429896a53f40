#!/usr/bin/env python3
"""Stage one model revision on this node's NVMe: fetch, verify, publish atomically.

ascend_fleet.operations.weights.staged ships this file to the node and runs it as
root; the controller imports it too (layout, marker, parsers), so it stays
stdlib-only python3.

Layout under MODEL_DIR, all on one filesystem so that publishing is a rename:

    <org>/<name>/<revision>/                             published; never modified again
    <org>/<name>/<revision>/.ascend-fleet-staged.json    the marker: id, revision, manifest sha256, files
    .partial/<org>/<name>/<revision>/                    verified files of a revision still being staged
    .partial/<org>/<name>/<revision>/.incoming/          fetches in progress, kept across runs
    .partial/<org>/<name>/<revision>.lock                one stager per revision at a time

A file enters the partial directory only by a rename after its digest matched the
manifest, so what lies there (not hidden) is verified: the ``peers`` spread serves
exactly that directory and published revisions to the fleet (``--peer-url``).

Flow: read the source's manifest (size and digest of every file); check free
space for what is still to fetch plus a margin; fetch what the partial
directory lacks, resuming cut-off files; verify every file's digest and the
safetensors header of every shard the index names; write the marker; rename
the directory into place. Directories of other revisions are never touched.

A source is anything with ``manifest()`` (file -> size and digest) and
``fetch(names, incoming)``; the verification and publishing around it do not
depend on where bytes come from. With ``--peer-url`` the source is only the
origin: each file comes from a fleet node that holds a verified copy when one
does, from the origin when none does yet (class Spread).

Tokens (MODELSCOPE_API_TOKEN, HF_TOKEN) come from a root-only 0600 env file and
reach child processes through their environment, never their command line.

Errors: one line on stderr, ``<host>: weights <id>@<revision>: <what>; <what to do>``, exit 1.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import http.client
import json
import math
import os
import random
import shutil
import stat
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

MANIFEST_NAME = "ascend-fleet-manifest.json"  # the HTTP mirror's manifest (ascend_fleet.lab.sim.tinymodel)
INDEX_NAME = "model.safetensors.index.json"
MARKER_NAME = ".ascend-fleet-staged.json"
JOURNAL_NAME = ".ascend-fleet-verified.json"  # in the partial directory only: files verified so far
PARTIAL_DIR_NAME = ".partial"
INCOMING_DIR_NAME = ".incoming"  # in the partial directory: what is being fetched, not yet verified
# Where a node's nginx serves its weights to the fleet (templates/weights-peer-nginx.conf.j2):
# whole published revisions, and the verified files of revisions being staged.
PEER_PUBLISHED_PATH, PEER_STAGING_PATH = "published", "staging"
SOURCES = ("http", "modelscope", "hf", "rsync")
TOKEN_NAMES = ("MODELSCOPE_API_TOKEN", "HF_TOKEN")
MODELSCOPE_ENDPOINT = "https://www.modelscope.cn"
HF_ENDPOINT = "https://huggingface.co"
# Peers are other fleet nodes: never prompt, never hang on a dead one.
SSH_OPTIONS = ("-o", "BatchMode=yes", "-o", "ConnectTimeout=15", "-o", "ServerAliveInterval=15")
CHUNK_BYTES = 4 * 1024 * 1024
HTTP_TIMEOUT_SECONDS = 60
HTTP_ATTEMPTS = 3
# Spreading over the fleet (class Spread): files one node fetches at once, of which from the
# origin (its link is the scarce one: the fleet shares it), and how often peers are asked what
# they hold. A peer that failed is asked again after PEER_RETRY_SECONDS; one that sends nothing
# for PEER_TIMEOUT_SECONDS is given up for that file.
FETCHERS, ORIGIN_FETCHERS = 4, 1
PEER_POLL_SECONDS, PEER_RETRY_SECONDS, PEER_TIMEOUT_SECONDS = 0.3, 5, 30
IDLE_SECONDS = 0.2
# A safetensors header is JSON of tensor names and offsets; 100 MB is far beyond any real one.
MAX_SAFETENSORS_HEADER_BYTES = 100 * 1024 * 1024
SHA256_HEX_LEN, SHA1_HEX_LEN = 64, 40


class StageError(Exception):
    """A failure the operator can act on; str() is the whole one-line message."""


# ---------------------------------------------------------------- layout (shared with the controller)


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


# ---------------------------------------------------------------- manifests: file -> {"size", digest}
#
# A file entry carries "size" and either "sha256" or, for small files that the
# Hugging Face hub keeps in git rather than LFS, "git_sha1" (git's blob id).


def checked_file_name(name: object) -> str:
    """A manifest file name, refused when it could escape the revision directory or shadow ours."""
    if not isinstance(name, str) or not name or name.startswith("/") or "\\" in name:
        raise ValueError(f"manifest lists an unusable file name {name!r}")
    parts = PurePosixPath(name).parts
    if any(part in ("", ".", "..") for part in parts) or parts[0] in (MARKER_NAME, JOURNAL_NAME, INCOMING_DIR_NAME):
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


# ---------------------------------------------------------------- verification


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
        return "was not fetched"
    size = path.stat().st_size
    if size != entry["size"]:
        return f"is {size} bytes, the manifest says {entry['size']}"
    kind, got = file_digest(path, entry)
    if got != entry[kind]:
        return f"{kind} {got} does not match the manifest's {entry[kind]}"
    return None


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


# ---------------------------------------------------------------- the run


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


def read_tokens_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines (``export`` and quotes allowed) of a root-owned 0600 file; only the token names."""
    try:
        info = path.stat()
    except FileNotFoundError:
        raise FileNotFoundError(f"tokens file {path} does not exist: write it (root, mode 0600) before "
                                "staging from a hub that needs a token") from None
    if info.st_uid != 0 or stat.S_IMODE(info.st_mode) & 0o077:
        raise PermissionError(f"tokens file {path} must be owned by root with mode 0600 (it is uid "
                              f"{info.st_uid}, mode {stat.S_IMODE(info.st_mode):04o}): chown root and chmod 600 it")
    tokens = {}
    for line in path.read_text().splitlines():
        key, sep, value = line.strip().removeprefix("export ").partition("=")
        value = value.strip()
        if sep and key.strip() in TOKEN_NAMES:
            tokens[key.strip()] = value[1:-1] if value[:1] in "'\"" and value[-1:] == value[:1] else value
    return tokens


def http_get(url: str, headers: dict[str, str], timeout: float = HTTP_TIMEOUT_SECONDS):
    return urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout)


def http_json(job: Job, url: str, headers: dict[str, str] | None = None):
    """(document, Link header) of a JSON URL; one-line errors."""
    try:
        with http_get(url, headers or {}) as response:
            return json.load(response), response.headers.get("Link")
    except urllib.error.HTTPError as error:
        raise job.error(f"{url} answered HTTP {error.code}: check the model id, revision and token") from None
    except (urllib.error.URLError, OSError) as error:
        raise job.error(f"cannot read {url} ({error}): check the source URL and the node's network") from None
    except json.JSONDecodeError:
        raise job.error(f"{url} is not JSON: check the source URL") from None


def download_resuming(url: str, dest: Path, size: int, timeout: float = HTTP_TIMEOUT_SECONDS) -> None:
    """Fetch url into dest, continuing from dest's current length with an HTTP Range request."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    have = dest.stat().st_size if dest.exists() else 0
    if have >= size:
        return
    headers = {"Range": f"bytes={have}-"} if have else {}
    with http_get(url, headers, timeout) as response:
        if have and response.status != 206:  # the server ignored the range: start over
            have = 0
        say(f"fetching {dest.name}: {size - have} bytes" + (f" (resuming at {have})" if have else ""))
        with dest.open("ab" if have else "wb") as out:
            shutil.copyfileobj(response, out, CHUNK_BYTES)


def parsed_or_fail(job: Job, where: str, what_to_do: str, parse, *args):
    """parse(*args), or one line naming where the document came from and what to do."""
    try:
        return parse(*args)
    except (ValueError, AttributeError, TypeError) as error:
        raise job.error(f"{where}: {error}: {what_to_do}") from None


class Source:
    """Where a revision comes from: its manifest, and a way to fetch named files into a directory
    (``<directory>/<name>``, resuming what is there)."""

    def __init__(self, job: Job):
        self.job = job

    def describe(self) -> str:
        raise NotImplementedError

    def manifest(self) -> dict:
        raise NotImplementedError

    def fetch(self, names: list[str], incoming: Path) -> None:
        raise NotImplementedError

    def batches(self, names: list[str]) -> list[list[str]]:
        """Fetch groups; each is verified before the next starts. Tools with their own scheduling take all."""
        return [names]

    def fetch_all(self, files: dict, pending: list[str], journal: Journal) -> None:
        """Fetch and verify every pending file into the partial directory."""
        fetch_and_verify(self.job, self, files, pending, journal)


class HttpMirror(Source):
    """The mirror layout: ``<url>/models/<org>/<name>/<revision>/`` holds the manifest and every file."""

    def __init__(self, job: Job, url: str):
        super().__init__(job)
        parts = model_path_parts(job.model_id, job.revision)
        self.base = "/".join((url.rstrip("/"), "models", *map(urllib.parse.quote, parts), ""))
        self.files: dict = {}

    def describe(self) -> str:
        return self.base

    def manifest(self) -> dict:
        url = self.base + MANIFEST_NAME
        doc, _ = http_json(self.job, url)
        self.files = parsed_or_fail(self.job, url, "republish the model", files_from_mirror_manifest,
                                    doc, self.job.model_id, self.job.revision)
        return self.files

    def batches(self, names: list[str]) -> list[list[str]]:
        return [[name] for name in names]

    def fetch(self, names: list[str], incoming: Path) -> None:
        for name in names:
            self._fetch_one(name, incoming / name)

    def _fetch_one(self, name: str, dest: Path) -> None:
        url = self.base + urllib.parse.quote(name)
        for attempt in range(1, HTTP_ATTEMPTS + 1):
            try:
                download_resuming(url, dest, self.files[name]["size"])
                return
            except urllib.error.HTTPError as error:
                raise self.job.error(f"{name}: {url} answered HTTP {error.code}: is the revision "
                                     "complete on the mirror?") from None
            except (urllib.error.URLError, OSError) as error:
                if attempt == HTTP_ATTEMPTS:
                    raise self.job.error(f"{name}: fetching {url} failed {attempt} times ({error}): "
                                         "rerun to resume") from None
                time.sleep(attempt)


def modelscope_download_argv(model_id: str, revision: str, local_dir: Path, names: list[str]) -> list[str]:
    return ["modelscope", "download", "--model", model_id, "--revision", revision,
            "--local_dir", str(local_dir), *names]


def hf_download_argv(model_id: str, revision: str, local_dir: Path, names: list[str]) -> list[str]:
    return ["hf", "download", model_id, *names, "--local-dir", str(local_dir), "--revision", revision]


def ssh_cat_argv(peer: str, path: Path) -> list[str]:
    return ["ssh", *SSH_OPTIONS, peer, "cat", "--", str(path)]


def rsync_argv(peer: str, remote_dir: Path, local_dir: Path) -> list[str]:
    """Names come on stdin (--files-from=-, NUL-separated); --append-verify resumes cut-off files."""
    return ["rsync", "--files-from=-", "--from0", "--partial", "--append-verify", "--times",
            "-e", " ".join(("ssh", *SSH_OPTIONS)), f"{peer}:{remote_dir}/", f"{local_dir}/"]


def run_tool(job: Job, argv: list[str], env: dict[str, str] | None = None, stdin: bytes | None = None) -> bytes:
    """Run a fetch tool; tokens travel in env. Its stdout is returned; on failure, its last words are in the error."""
    try:
        result = subprocess.run(argv, input=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env={**os.environ, **(env or {})})
    except (FileNotFoundError, PermissionError) as exc:  # PermissionError: a PATH entry or the file not executable
        raise job.error(f"{argv[0]} is not installed on the node ({exc.strerror}): install it (or choose another "
                        "source)") from None
    if result.returncode != 0:
        last = (result.stderr.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        raise job.error(f"{argv[0]} exited {result.returncode} ({last[:300]}): fix that and rerun to resume")
    return result.stdout


class Hub(Source):
    """A model hub: its API lists every file with a digest, its CLI fetches them (and resumes)."""

    DEFAULT_ENDPOINT = ""
    TOKEN_NAME = ""

    def __init__(self, job: Job, endpoint: str | None):
        super().__init__(job)
        self.endpoint = (endpoint or self.DEFAULT_ENDPOINT).rstrip("/")

    def describe(self) -> str:
        return f"{self.endpoint} ({self.job.model_id})"

    def auth_headers(self) -> dict[str, str]:
        token = self.job.tokens.get(self.TOKEN_NAME)
        return {"Authorization": f"Bearer {token}"} if token else {}

    def listing_url(self) -> str:
        raise NotImplementedError

    def files_from_listing(self) -> dict:
        raise NotImplementedError

    def endpoint_env(self) -> dict[str, str]:
        """How the hub's CLI is pointed at an endpoint other than the public one."""
        raise NotImplementedError

    def download_argv(self, names: list[str], partial: Path) -> list[str]:
        raise NotImplementedError

    def manifest(self) -> dict:
        return parsed_or_fail(self.job, self.listing_url(), "check the model id and revision",
                              self.files_from_listing)

    def fetch(self, names: list[str], incoming: Path) -> None:
        env = {key: value for key, value in self.job.tokens.items() if key == self.TOKEN_NAME}
        if self.endpoint != self.DEFAULT_ENDPOINT:
            env.update(self.endpoint_env())
        run_tool(self.job, self.download_argv(names, incoming), env)


class ModelScope(Hub):
    """ModelScope: the manifest from its file-list API (Sha256 per file), bytes from ``modelscope download``."""

    DEFAULT_ENDPOINT = MODELSCOPE_ENDPOINT
    TOKEN_NAME = "MODELSCOPE_API_TOKEN"

    def listing_url(self) -> str:
        query = urllib.parse.urlencode({"Revision": self.job.revision, "Recursive": "true"})
        return f"{self.endpoint}/api/v1/models/{self.job.model_id}/repo/files?{query}"

    def files_from_listing(self) -> dict:
        doc, _ = http_json(self.job, self.listing_url(), self.auth_headers())
        return files_from_modelscope_listing(doc)

    def endpoint_env(self) -> dict[str, str]:
        return {"MODELSCOPE_DOMAIN": urllib.parse.urlsplit(self.endpoint).netloc}

    def download_argv(self, names: list[str], partial: Path) -> list[str]:
        return modelscope_download_argv(self.job.model_id, self.job.revision, partial, names)


class HuggingFace(Hub):
    """The Hugging Face hub: the manifest from its tree API (LFS sha256), bytes from ``hf download``."""

    DEFAULT_ENDPOINT = HF_ENDPOINT
    TOKEN_NAME = "HF_TOKEN"

    def listing_url(self) -> str:
        revision = urllib.parse.quote(self.job.revision, safe="")
        return f"{self.endpoint}/api/models/{self.job.model_id}/tree/{revision}?recursive=true"

    def files_from_listing(self) -> dict:
        entries, url = [], self.listing_url()
        while url:  # the tree API pages its answer
            page, link = http_json(self.job, url, self.auth_headers())
            entries += page if isinstance(page, list) else []
            url = hf_next_page(link)
        return files_from_hf_tree(entries)

    def endpoint_env(self) -> dict[str, str]:
        return {"HF_ENDPOINT": self.endpoint}

    def download_argv(self, names: list[str], partial: Path) -> list[str]:
        return hf_download_argv(self.job.model_id, self.job.revision, partial, names)


class Peer(Source):
    """Another node that published this revision: its marker is the manifest, rsync over SSH the transport."""

    def __init__(self, job: Job, peer: str):
        super().__init__(job)
        self.peer = peer
        self.remote_dir = job.target  # fleet nodes share one layout

    def describe(self) -> str:
        return f"{self.peer}:{self.remote_dir}"

    def manifest(self) -> dict:
        raw = run_tool(self.job, ssh_cat_argv(self.peer, self.remote_dir / MARKER_NAME))
        return parsed_or_fail(self.job, self.describe(), "stage it there first",
                              lambda: files_from_marker(json.loads(raw), self.job.model_id, self.job.revision))

    def fetch(self, names: list[str], incoming: Path) -> None:
        incoming.mkdir(parents=True, exist_ok=True)
        run_tool(self.job, rsync_argv(self.peer, self.remote_dir, incoming), stdin="\0".join(names).encode())


WAIT = "wait"


class Spread(Source):
    """The origin and the fleet: each file comes from a peer that serves a verified copy of it when
    one does, else from the origin, so the origin sends each file about once and a file spreads
    as soon as one node has verified it.

    A peer is another node's nginx (templates/weights-peer-nginx.conf.j2): ``/published/`` its
    published revisions, ``/staging/`` the verified files of revisions it is still staging; its
    JSON listings say what it holds. Every copy is verified against the origin's manifest here,
    whoever sent it: a copy that does not match is deleted and never served on, and that peer is
    not asked for that file again. A peer that fails is skipped; the file resumes from another.
    The origin is kept busy with one file at a time that no peer holds: first this node's share
    of the list (it starts at origin_start, 0 to 1, a different place on each node; a share is
    the list over the fleet's size), then from the far end of the list backwards, so a node done
    with its share meets the node still on the next share instead of following it. Beside it,
    the rarest file that peers hold, from the least busy holder.
    """

    def __init__(self, job: Job, origin: Source, peer_urls: list[str], origin_start: float):
        super().__init__(job)
        self.origin, self.origin_start = origin, origin_start
        self.peers = [url.rstrip("/") for url in peer_urls]
        self.lock = threading.Lock()
        self.holdings: dict[str, dict[str, str]] = {peer: {} for peer in self.peers}  # peer -> name -> URL
        self.polled = {peer: threading.Event() for peer in self.peers}
        self.avoided: dict[str, set[str]] = {}  # name -> peers not asked for it again (bad or cut-off copy)
        self.busy: dict[str, str | None] = {}  # name -> the peer (None: the origin) it is being fetched from
        self.load: Counter = Counter()  # peer -> files being fetched from it
        self.counts: Counter = Counter()  # "origin", each peer, "refused"
        self.done = threading.Event()
        self.failure: StageError | None = None
        self.files: dict = {}
        self.waiting: list[str] = []  # the files not yet verified, in the order this node asks the origin
        self.own_share: set[str] = set()
        self.journal: Journal | None = None

    def describe(self) -> str:
        return f"{self.origin.describe()} spread over {len(self.peers)} peers"

    def manifest(self) -> dict:
        return self.origin.manifest()  # the digests always come from the origin, never from a peer

    def revision_url(self, peer: str, where: str) -> str:
        parts = model_path_parts(self.job.model_id, self.job.revision)
        return "/".join((peer, where, *map(urllib.parse.quote, parts), ""))

    def listing(self, peer: str) -> dict[str, str]:
        """name -> URL of each file of the revision that the peer serves at the manifest's size."""
        for where in (PEER_STAGING_PATH, PEER_PUBLISHED_PATH):
            try:
                return self.walk(self.revision_url(peer, where), "")
            except urllib.error.HTTPError as error:
                if error.code != 404:
                    raise
        return {}

    def walk(self, base: str, prefix: str) -> dict[str, str]:
        with http_get(base + urllib.parse.quote(prefix), {}, PEER_RETRY_SECONDS) as response:
            entries = json.load(response)
        found = {}
        for entry in entries:
            name = prefix + entry["name"]
            if entry["type"] == "directory" and any(known.startswith(name + "/") for known in self.files):
                found.update(self.walk(base, name + "/"))
            elif entry["type"] == "file" and self.files.get(name, {}).get("size") == entry["size"]:
                found[name] = base + urllib.parse.quote(name)
        return found

    def poll(self, peer: str) -> None:
        while not self.done.is_set():
            try:
                held, pause = self.listing(peer), PEER_POLL_SECONDS
            except (OSError, ValueError, TypeError, KeyError, http.client.HTTPException):
                held, pause = {}, PEER_RETRY_SECONDS  # down, or not serving: skipped until it answers
            with self.lock:
                self.holdings[peer] = held
            self.polled[peer].set()
            self.done.wait(pause)

    def fetch_all(self, files: dict, pending: list[str], journal: Journal) -> None:
        self.files, self.journal = files, journal
        start = int(self.origin_start * len(pending)) % max(len(pending), 1)
        self.waiting = sorted(pending)[start:] + sorted(pending)[:start]
        self.own_share = set(self.waiting[:math.ceil(len(pending) / (len(self.peers) + 1))])
        pollers = [threading.Thread(target=self.poll, args=(peer,), daemon=True) for peer in self.peers]
        for thread in pollers:
            thread.start()
        for event in self.polled.values():  # what peers hold before anything is asked of the origin
            event.wait(2 * PEER_RETRY_SECONDS)
        fetchers = [threading.Thread(target=self.fetcher, daemon=True) for _ in range(FETCHERS)]
        for thread in fetchers:
            thread.start()
        for thread in fetchers:
            thread.join()
        self.done.set()
        for thread in pollers:
            thread.join()
        if self.failure:
            raise self.failure
        by_peer = ", ".join(f"{peer} {self.counts[peer]}" for peer in self.peers if self.counts[peer])
        say(f"fetched {len(pending)} files: {self.counts['origin']} from the origin, "
            f"{sum(self.counts[peer] for peer in self.peers)} from peers ({by_peer or 'none'}); "
            f"refused {self.counts['refused']} bad copies from peers")

    def fetcher(self) -> None:
        while True:
            with self.lock:
                task = None if self.failure else self.next_task()
            if task is None:
                return
            if task == WAIT:
                time.sleep(IDLE_SECONDS)
                continue
            name, peer = task
            try:
                self.fetch_one(name, peer)
            except StageError as error:
                with self.lock:
                    self.failure = self.failure or error
            finally:
                with self.lock:
                    del self.busy[name]
                    self.load[peer] -= 1

    def next_task(self) -> tuple[str, str | None] | str | None:
        """(name, peer or None for the origin), WAIT, or None when every file left is being fetched."""
        left = [name for name in self.waiting if name not in self.busy]
        if not left:
            return None
        offered = {name: [peer for peer in self.peers if name in self.holdings[peer]
                          and peer not in self.avoided.get(name, ())] for name in left}
        unheld = [name for name in left if not offered[name]]
        if unheld and list(self.busy.values()).count(None) < ORIGIN_FETCHERS:  # keep the origin busy
            own = [name for name in unheld if name in self.own_share]
            name, peer = own[0] if own else unheld[-1], None
        elif len(unheld) < len(left):
            name = min(left, key=lambda n: (len(offered[n]) or len(self.peers) + 1, random.random()))
            peer = min(offered[name], key=lambda p: (self.load[p], random.random()))
        else:
            return WAIT
        self.busy[name] = peer
        self.load[peer] += 1
        return name, peer

    def fetch_one(self, name: str, peer: str | None) -> None:
        entry, incoming = self.files[name], self.job.incoming / name
        resumed = incoming.is_file() and incoming.stat().st_size > 0
        if peer is None:
            self.origin.fetch([name], self.job.incoming)
        else:
            try:
                download_resuming(self.holdings[peer][name], incoming, entry["size"], PEER_TIMEOUT_SECONDS)
            except (OSError, KeyError, http.client.HTTPException) as error:
                say(f"{name}: {peer} failed ({str(error) or type(error).__name__}); fetching the rest elsewhere")
                with self.lock:
                    self.holdings[peer] = {}  # until it answers a listing again
                return
        problem, short = check_fetched(self.job, name, entry)
        with self.lock:
            if problem is None:
                admit(self.job, name, self.journal)
                self.waiting.remove(name)
                self.counts[peer or "origin"] += 1
                say(f"verified {name} from {peer or 'the origin'}")
            elif peer is not None and short:  # the peer hung up (it died?): the bytes so far are kept
                self.avoided.setdefault(name, set()).add(peer)
                say(f"{name}: {peer} stopped sending at {incoming.stat().st_size} of {entry['size']} bytes; "
                    "resuming it from another holder")
            elif peer is not None:
                self.avoided.setdefault(name, set()).add(peer)
                self.counts["refused"] += 1
                say(f"refused {name} from {peer}: it {problem}; fetching it elsewhere")
            elif not (short or resumed):  # the origin's own whole copy is wrong: nothing to fall back on
                raise self.job.error(f"{name} {problem}; nothing was published: rerun (and if it fails "
                                     f"again, fix the copy at {self.origin.describe()})")


class Journal:
    """Files of the partial directory already verified, by size and mtime, so a rerun need not hash them again."""

    def __init__(self, partial: Path):
        self.path = partial / JOURNAL_NAME
        try:
            self.entries = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self.entries = {}

    @staticmethod
    def _stamp(path: Path) -> list[int]:
        info = path.stat()
        return [info.st_size, info.st_mtime_ns]

    def trusts(self, name: str, path: Path) -> bool:
        return path.is_file() and self.entries.get(name) == self._stamp(path)

    def record(self, name: str, path: Path) -> None:
        self.entries[name] = self._stamp(path)
        write_json_atomically(self.path, self.entries)


def write_json_atomically(path: Path, doc: dict) -> None:
    temp = path.with_name(path.name + ".tmp")
    with temp.open("w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    temp.replace(path)


def existing_ancestor(path: Path) -> Path:
    while not path.exists():
        path = path.parent
    return path


def bytes_still_to_fetch(files: dict, partial: Path) -> int:
    """Bytes the partial directory lacks, verified or incoming; a file longer than expected counts
    whole (it is fetched again)."""
    missing = 0
    for name, entry in files.items():
        have = max((path.stat().st_size for path in (partial / name, partial / INCOMING_DIR_NAME / name)
                    if path.is_file()), default=0)
        missing += entry["size"] - have if have <= entry["size"] else entry["size"]
    return missing


def check_space(job: Job, files: dict, margin: int) -> None:
    to_fetch = bytes_still_to_fetch(files, job.partial)
    where = existing_ancestor(job.model_dir)
    info = os.statvfs(where)
    free = info.f_bavail * info.f_frsize
    needed = to_fetch + margin
    if needed > free:
        raise job.error(f"needs {needed} bytes on {where} ({to_fetch} to fetch + {margin} margin) but only "
                        f"{free} are free: free space there or use a larger NVMe; nothing was fetched")
    say(f"space: {to_fetch} bytes to fetch + {margin} margin, {free} free on {where}")


def published_problems(job: Job) -> list[str] | None:
    """None if the target holds no marker; else what is wrong with it (empty: staged and intact)."""
    try:
        marker = json.loads((job.target / MARKER_NAME).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return [f"{MARKER_NAME} is unreadable"]
    sizes = {p.relative_to(job.target).as_posix(): p.stat().st_size for p in job.target.rglob("*") if p.is_file()}
    return marker_problems(marker, sizes, job.model_id, job.revision)


@contextmanager
def revision_lock(job: Job):
    """One stager per revision on a node: a second pyinfra run waits for nothing and says so."""
    lock_path = job.partial.with_name(job.partial.name + ".lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise job.error(f"another staging of this revision holds {lock_path}: let it finish") from None
        yield


def verify_present(job: Job, files: dict, journal: Journal) -> list[str]:
    """Verify files an earlier run completed; return the names still to fetch. A bad copy is removed;
    a short one (left by a stager without the incoming directory) goes back to incoming to resume."""
    pending = []
    for name, entry in files.items():
        path = job.partial / name
        if journal.trusts(name, path):
            continue
        if path.is_file() and path.stat().st_size == entry["size"] and file_problem(path, entry) is None:
            journal.record(name, path)
            continue
        if path.is_file() and path.stat().st_size < entry["size"] and not (job.incoming / name).exists():
            (job.incoming / name).parent.mkdir(parents=True, exist_ok=True)
            path.rename(job.incoming / name)
        path.unlink(missing_ok=True)
        pending.append(name)
    return pending


def admit(job: Job, name: str, journal: Journal) -> None:
    """A fetched file whose digest matched moves from incoming into the partial directory (and is
    from then on served to peers), in one rename."""
    path = job.partial / name
    path.parent.mkdir(parents=True, exist_ok=True)
    os.rename(job.incoming / name, path)
    journal.record(name, path)


def check_fetched(job: Job, name: str, entry: dict) -> tuple[str | None, bool]:
    """(problem, short) of a fetched file in incoming; a wrong copy, unlike a short one, is removed
    at once, so no rerun resumes or trusts it."""
    path = job.incoming / name
    problem = file_problem(path, entry)
    short = problem is not None and path.is_file() and path.stat().st_size < entry["size"]
    if problem is not None and not short:
        path.unlink(missing_ok=True)
    return problem, short


def fetch_and_verify(job: Job, source: Source, files: dict, pending: list[str], journal: Journal) -> None:
    for batch in source.batches(pending):
        source.fetch(batch, job.incoming)
        for name in batch:
            problem, short = check_fetched(job, name, files[name])
            if problem is None:
                admit(job, name, journal)
                say(f"verified {name}")
                continue
            raise job.error(f"{name} {problem}; nothing was published: rerun "
                            + ("to resume" if short else f"(and if it fails again, fix the copy at {source.describe()})"))


def check_shards(job: Job, files: dict) -> None:
    index_path = job.partial / INDEX_NAME
    try:
        index = json.loads(index_path.read_text()) if INDEX_NAME in files else None
        shards, unlisted = shards_to_check(index, files)
    except ValueError as error:
        raise job.error(f"{INDEX_NAME}: {error}; nothing was published: fix the model at its source") from None
    if unlisted:
        raise job.error(f"{INDEX_NAME} names {unlisted[0]}, which the source does not list; nothing was "
                        "published: fix the model at its source")
    for shard in shards:
        problem = safetensors_problem(job.partial / shard)
        if problem:
            raise job.error(f"{shard} {problem}; nothing was published: fix the model at its source")


def keep_only(partial: Path, names: set[str]) -> None:
    """Drop what fetch tools leave beside the files (caches, temp dirs) and our journal."""
    for path in sorted(partial.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if path.is_dir() and not path.is_symlink():
            if not any(path.iterdir()):
                path.rmdir()
        elif path.relative_to(partial).as_posix() not in names:
            path.unlink()


def make_readable(root: Path) -> None:
    """The serving user is not root: directories 0755, files 0644."""
    root.chmod(0o755)
    for path in root.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)


def publish(job: Job, source: Source, files: dict) -> None:
    """Marker in, then one rename: the revision directory appears whole or not at all."""
    keep_only(job.partial, set(files))
    make_readable(job.partial)
    marker = {"model_id": job.model_id, "revision": job.revision, "source": source.describe(),
              "manifest_sha256": manifest_sha256(job.model_id, job.revision, files), "files": files}
    write_json_atomically(job.partial / MARKER_NAME, marker)
    (job.partial / MARKER_NAME).chmod(0o644)
    os.sync()  # the data must be on disk before the rename makes it visible
    job.target.parent.mkdir(parents=True, exist_ok=True)
    if job.target.exists():
        raise job.error(f"{job.target} appeared while staging: move it aside once no instance serves it, then rerun")
    os.rename(job.partial, job.target)
    dir_fd = os.open(job.target.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def stage(job: Job, source: Source, margin: int) -> None:
    started = time.monotonic()
    with revision_lock(job):
        problems = published_problems(job)
        if problems == []:
            say(f"{job.target} is already staged")
            return
        if problems is not None or job.target.exists():  # never replace what an instance may be serving
            detail = "; ".join(problems or ["it has no marker"])
            raise job.error(f"{job.target} exists but is not a verified stage ({detail}): move it aside "
                            "once no instance serves it, then rerun")
        job.partial.mkdir(parents=True, exist_ok=True)
        files = source.manifest()
        check_space(job, files, margin)
        journal = Journal(job.partial)
        pending = verify_present(job, files, journal)
        say(f"{len(files) - len(pending)} of {len(files)} files already verified")
        source.fetch_all(files, pending, journal)
        check_shards(job, files)
        publish(job, source, files)
        say(f"published {job.target} in {time.monotonic() - started:.1f}s")


def make_source(job: Job, args: argparse.Namespace) -> Source:
    if args.source == "http":
        return HttpMirror(job, args.url)
    if args.source == "modelscope":
        return ModelScope(job, args.url)
    if args.source == "hf":
        return HuggingFace(job, args.url)
    return Peer(job, args.peer)


def make_spread_source(job: Job, args: argparse.Namespace) -> Source:
    """The origin alone, or spread over the fleet when peers are given."""
    origin = make_source(job, args)
    return Spread(job, origin, args.peer_url, args.origin_start) if args.peer_url else origin


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", required=True, help="the inventory name, for messages")
    parser.add_argument("--model-id", required=True)
    parser.add_argument("--revision", required=True)
    parser.add_argument("--model-dir", required=True, type=Path)
    parser.add_argument("--source", required=True, choices=SOURCES)
    parser.add_argument("--url", help="http: the mirror; modelscope/hf: another hub endpoint")
    parser.add_argument("--peer", help="rsync: [user@]host of a node that staged this revision")
    parser.add_argument("--peer-url", action="append", default=[],
                        help="http://host:port of a fleet node's weights server (repeatable): fetch from peers, "
                             "the source being the origin")
    parser.add_argument("--origin-start", type=float, default=0.0,
                        help="with --peer-url: where in the file list (0 to 1) this node starts asking the origin")
    parser.add_argument("--tokens-env-file", type=Path)
    parser.add_argument("--min-free-margin-bytes", type=int, default=0)
    args = parser.parse_args(argv)
    if args.source == "http" and not args.url:
        parser.error("--source http needs --url")
    if args.source == "rsync" and not args.peer:
        parser.error("--source rsync needs --peer")
    if args.source == "rsync" and args.peer_url:
        parser.error("--peer-url spreads what an origin (http, modelscope, hf) serves, not --source rsync")
    if not 0 <= args.origin_start < 1:
        parser.error("--origin-start must be at least 0 and below 1")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    job = Job(args.host, args.model_id, args.revision, args.model_dir)
    try:
        model_path_parts(job.model_id, job.revision)
        if args.tokens_env_file:
            job.tokens = read_tokens_env_file(args.tokens_env_file)
        stage(job, make_spread_source(job, args), args.min_free_margin_bytes)
    except StageError as error:
        print(error, file=sys.stderr)
        return 1
    except (ValueError, OSError) as error:
        print(job.error(str(error)), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
