"""Where a revision's files come from: the HTTP mirror, ModelScope, Hugging Face, a peer over
rsync; each a Source with ``manifest()`` (file -> size and digest) and ``fetch(names, incoming)``."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from .revision import (
    CHUNK_BYTES,
    MANIFEST_NAME,
    MARKER_NAME,
    Job,
    files_from_hf_tree,
    files_from_marker,
    files_from_mirror_manifest,
    files_from_modelscope_listing,
    hf_next_page,
    model_path_parts,
    say,
)
from .verified import fetch_and_verify

TOKEN_NAMES = ("MODELSCOPE_API_TOKEN", "HF_TOKEN")
MODELSCOPE_ENDPOINT = "https://www.modelscope.cn"
HF_ENDPOINT = "https://huggingface.co"
# Peers are other fleet nodes: never prompt, never hang on a dead one.
SSH_OPTIONS = ("-o", "BatchMode=yes", "-o", "ConnectTimeout=15", "-o", "ServerAliveInterval=15")
HTTP_TIMEOUT_SECONDS = 60
HTTP_ATTEMPTS = 3


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


def write_as_it_arrives(response, out) -> None:
    """The response's body into out, each block as it arrives: peers follow this copy as it grows
    (spread.py), where reading CHUNK_BYTES at a time wrote a 4.5 MB shard in two writes, the first
    once 4 MiB had arrived."""
    while block := response.read1(CHUNK_BYTES):
        out.write(block)


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
            write_as_it_arrives(response, out)


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

    def fetch_all(self, files: dict, pending: list[str]) -> None:
        """Fetch and verify every pending file into the partial directory."""
        fetch_and_verify(self.job, self, files, pending)


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
        result = subprocess.run(argv, input=stdin, capture_output=True, env={**os.environ, **(env or {})})
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
