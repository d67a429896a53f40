"""The stager's run and command line: check space, fetch what is missing, verify, publish."""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import select
import shutil
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from .revision import (
    DEEP_VERIFY_NAME,
    INCOMING_DIR_NAME,
    INDEX_NAME,
    MARKER_NAME,
    SOURCES,
    Job,
    StageError,
    deep_verify_of,
    digest_problems,
    manifest_sha256,
    marker_problems,
    model_path_parts,
    safetensors_problem,
    say,
    shards_to_check,
)
from .sources import HttpMirror, HuggingFace, ModelScope, Peer, Source, read_tokens_env_file
from .spread import Spread
from .verified import write_json_atomically


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


def read_json(path: Path) -> dict | None:
    """A JSON document the stager wrote, None if it is not there; OSError or ValueError if unreadable."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None


def published_problems(job: Job) -> list[str] | None:
    """None if the target holds no marker; else what is wrong with it (empty: staged and intact)."""
    try:
        marker = read_json(job.target / MARKER_NAME)
    except (OSError, ValueError):
        return [f"{MARKER_NAME} is unreadable"]
    if marker is None:
        return None
    sizes = {p.relative_to(job.target).as_posix(): p.stat().st_size for p in job.target.rglob("*") if p.is_file()}
    return marker_problems(marker, sizes, job.model_id, job.revision)


def last_deep_verify(job: Job, marker: dict) -> dict:
    """The record of the last deep verify of this staging (revision.deep_verify_of), {} if none."""
    try:
        return deep_verify_of(marker, read_json(job.target / DEEP_VERIFY_NAME))
    except (OSError, ValueError):
        return {}


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


def verify_present(job: Job, files: dict) -> list[str]:
    """Hash the files an interrupted staging left in the partial directory (whatever their size and mtime
    say: a crash can leave a file of the right size whose last blocks never reached the disk); return the
    names still to fetch. A bad copy is removed; a short one goes back to incoming to resume."""
    whole = [name for name, entry in files.items()
             if (job.partial / name).is_file() and (job.partial / name).stat().st_size == entry["size"]]
    bad = digest_problems(job.partial, files, whole)
    pending = []
    for name, entry in files.items():
        path = job.partial / name
        if name in whole and name not in bad:
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
    """Drop what fetch tools leave beside the files (caches, temp dirs)."""
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
        marker = read_json(job.target / MARKER_NAME) if problems == [] else None
        record = last_deep_verify(job, marker) if marker else {}
        if record.get("mismatched"):
            restage(job, source, marker, record, margin)
            return
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
        pending = verify_present(job, files)
        say(f"{len(files) - len(pending)} of {len(files)} files already verified")
        source.fetch_all(files, pending)
        check_shards(job, files)
        publish(job, source, files)
        say(f"published {job.target} in {time.monotonic() - started:.1f}s")


def restage(job: Job, source: Source, marker: dict, record: dict, margin: int) -> None:
    """Fetch again (from peers or the origin, verified as any fetch) each file the last deep verify found
    unlike the manifest, and rename it over the bad copy in the published directory. A process that has
    the bad file open keeps its own copy: vLLM reads its weights when it starts, so the serve stage
    restarts the instances (the restage count in their environment changes)."""
    names = sorted(record["mismatched"])
    files = source.manifest()
    moved = [name for name in names if files.get(name) != marker["files"].get(name)]
    if moved:
        raise job.error(f"{source.describe()} now lists {moved[0]} otherwise than when {job.target} was staged: "
                        "stage the model under a new revision and serve that")
    wanted = {name: files[name] for name in names}
    job.partial.mkdir(parents=True, exist_ok=True)
    check_space(job, wanted, margin)
    source.fetch_all(files, verify_present(job, wanted))
    for name in names:
        (job.partial / name).chmod(0o644)
        os.replace(job.partial / name, job.target / name)
        say(f"restaged {name} in {job.target} (the deep verify found: {record['mismatched'][name]})")
    os.sync()
    write_json_atomically(job.target / DEEP_VERIFY_NAME,
                          {**record, "mismatched": {}, "restages": record.get("restages", 0) + 1})
    (job.target / DEEP_VERIFY_NAME).chmod(0o644)
    shutil.rmtree(job.partial)


def deep_verify(job: Job) -> int:
    """Hash every file of the published revision against the manifest its marker keeps, record what
    differs beside the marker (the next stage restages it), and name each such file on stderr."""
    started = time.monotonic()
    with revision_lock(job):
        try:
            marker = read_json(job.target / MARKER_NAME)
        except (OSError, ValueError):
            marker = None
        if not isinstance(marker, dict) or (marker.get("model_id"), marker.get("revision")) != (
                job.model_id, job.revision) or not isinstance(marker.get("files"), dict):
            raise job.error(f"{job.target} holds no readable marker of this revision ({MARKER_NAME}): stage it "
                            "(the weights stage) before a deep verify")
        files = marker["files"]
        mismatched = digest_problems(job.target, files, sorted(files))
        seconds = time.monotonic() - started
        record = {"manifest_sha256": marker["manifest_sha256"], "checked_at": int(time.time()),
                  "seconds": round(seconds, 1), "bytes": sum(entry["size"] for entry in files.values()),
                  "mismatched": mismatched, "restages": last_deep_verify(job, marker).get("restages", 0)}
        write_json_atomically(job.target / DEEP_VERIFY_NAME, record)
        (job.target / DEEP_VERIFY_NAME).chmod(0o644)
    say(f"deep verify: {len(files)} files, {record['bytes']} bytes hashed in {seconds:.1f}s, "
        f"{len(mismatched)} unlike the manifest")
    for name, problem in mismatched.items():
        print(job.error(f"{name} {problem}; the next deploy's weights stage restages it and its serve stage "
                        "restarts the instances"), file=sys.stderr)
    return 1 if mismatched else 0


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
    if not args.peer_url:
        return origin
    return Spread(job, origin, args.peer_url, args.origin_start, args.seeder_url, args.seed)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", required=True, help="the inventory name, for messages")
    parser.add_argument("--model-id", required=True)
    parser.add_argument("--revision", required=True)
    parser.add_argument("--model-dir", required=True, type=Path)
    parser.add_argument("--source", choices=SOURCES, help="where the revision comes from (not with --deep-verify)")
    parser.add_argument("--deep-verify", action="store_true",
                        help="hash the published revision's files against its manifest instead of staging it")
    parser.add_argument("--url", help="http: the mirror; modelscope/hf: another hub endpoint")
    parser.add_argument("--peer", help="rsync: [user@]host of a node that staged this revision")
    parser.add_argument("--peer-url", action="append", default=[],
                        help="http://host:port of a fleet node's weights server (repeatable): fetch from peers, "
                             "the source being the origin")
    parser.add_argument("--origin-start", type=float, default=0.0,
                        help="with --peer-url: where in the file list (0 to 1) this node starts asking the origin")
    parser.add_argument("--seeder-url", action="append", default=[],
                        help="with --peer-url: one of them that asks the origin (repeatable); the others ask it "
                             "only when no seeder progresses")
    parser.add_argument("--seed", action="store_true", help="with --peer-url: this node is a seeder")
    parser.add_argument("--tokens-env-file", type=Path)
    parser.add_argument("--min-free-margin-bytes", type=int, default=0)
    args = parser.parse_args(argv)
    if not args.source and not args.deep_verify:
        parser.error("--source is required (or --deep-verify)")
    if args.source == "http" and not args.url:
        parser.error("--source http needs --url")
    if args.source == "rsync" and not args.peer:
        parser.error("--source rsync needs --peer")
    if args.source == "rsync" and args.peer_url:
        parser.error("--peer-url spreads what an origin (http, modelscope, hf) serves, not --source rsync")
    if set(args.seeder_url) - set(args.peer_url):
        parser.error("every --seeder-url must be a --peer-url as well")
    if not 0 <= args.origin_start < 1:
        parser.error("--origin-start must be at least 0 and below 1")
    return args


# How often a stager looks whether its output still has a reader, and how it exits when not.
SESSION_POLL_MILLISECONDS = 500
SESSION_GONE_EXIT = 75


def end_with_the_session() -> None:
    """Exit once nobody reads this stager's output: the SSH session that ran it dropped. Left running, it
    would hold the revision's lock, and the rerun after the drop would find it taken and stop; what it
    fetched stays in the partial directory for that rerun to resume. A pipe whose reader is gone polls as
    POLLERR, a socket as POLLHUP; both come whatever events are asked for."""
    output = select.poll()
    output.register(sys.stdout.fileno(), 0)
    while not output.poll(SESSION_POLL_MILLISECONDS):
        pass
    os._exit(SESSION_GONE_EXIT)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    job = Job(args.host, args.model_id, args.revision, args.model_dir)
    threading.Thread(target=end_with_the_session, daemon=True, name="session").start()
    try:
        model_path_parts(job.model_id, job.revision)
        if args.deep_verify:
            return deep_verify(job)
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
