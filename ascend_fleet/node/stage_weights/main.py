"""The stager's run and command line: check space, fetch what is missing, verify, publish."""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from .revision import (
    INCOMING_DIR_NAME,
    INDEX_NAME,
    MARKER_NAME,
    SOURCES,
    Job,
    StageError,
    file_problem,
    manifest_sha256,
    marker_problems,
    model_path_parts,
    safetensors_problem,
    say,
    shards_to_check,
)
from .sources import HttpMirror, HuggingFace, ModelScope, Peer, Source, read_tokens_env_file
from .spread import Spread
from .verified import Journal, write_json_atomically


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
