"""Admitting fetched files into the partial directory: a file enters it only by a rename after
its digest matched the manifest. A rerun after an interrupted staging hashes what it finds there
again (main.verify_present): size and mtime say nothing of blocks a crash kept from the disk."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from .revision import Job, file_problem, say

if TYPE_CHECKING:  # named in annotations only: sources imports this module
    from .sources import Source


def write_json_atomically(path: Path, doc: dict) -> None:
    temp = path.with_name(path.name + ".tmp")
    with temp.open("w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    temp.replace(path)


def admit(job: Job, name: str) -> None:
    """A fetched file whose digest matched moves from incoming into the partial directory (and is
    from then on served to peers), in one rename."""
    path = job.partial / name
    path.parent.mkdir(parents=True, exist_ok=True)
    os.rename(job.incoming / name, path)


def check_fetched(job: Job, name: str, entry: dict) -> tuple[str | None, bool]:
    """(problem, short) of a fetched file in incoming; a wrong copy, unlike a short one, is removed
    at once, so no rerun resumes or trusts it."""
    path = job.incoming / name
    problem = file_problem(path, entry)
    short = problem is not None and path.is_file() and path.stat().st_size < entry["size"]
    if problem is not None and not short:
        path.unlink(missing_ok=True)
    return problem, short


def fetch_and_verify(job: Job, source: Source, files: dict, pending: list[str]) -> None:
    for batch in source.batches(pending):
        source.fetch(batch, job.incoming)
        for name in batch:
            problem, short = check_fetched(job, name, files[name])
            if problem is None:
                admit(job, name)
                say(f"verified {name}")
                continue
            raise job.error(f"{name} {problem}; nothing was published: rerun "
                            + ("to resume" if short else f"(and if it fails again, fix the copy at {source.describe()})"))
