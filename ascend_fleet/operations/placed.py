"""Files the deploy writes whole (units, config and environment files, scripts), read in one round trip."""

from __future__ import annotations

import hashlib
from io import BytesIO

from pyinfra import host
from pyinfra.api import operation
from pyinfra.operations import files

from ascend_fleet.facts.files import FileState


@operation()
def file(dest: str, content: str | bytes, mode: str, user: str | None = None, group: str | None = None):
    """
    Put a file in place with this content and mode (and owner, when given), as pyinfra's files.put.

    + dest: path on the node; its directory is made when missing
    + content: the file's whole text (or bytes)
    + mode: its octal mode, e.g. "644"
    + user: its owner; None leaves the owner as it is
    + group: its group; None leaves the group as it is

    A file already as wanted is read with one command (FileState), where files.put asks three
    (the directory, the file's stat, its sha1): a rerun of the full deploy reads about twenty such
    files on each node, most of them twice (once more where the deploy asks whether they change,
    to restart or reload what reads them), each a round trip, which a bastion makes longer.
    """
    data = content.encode() if isinstance(content, str) else content
    now = host.get_fact(FileState, path=dest)
    wanted = {"sha256": hashlib.sha256(data).hexdigest(), "mode": int(mode), "user": user, "group": group}
    if now and all(value is None or now[key] == value for key, value in wanted.items()):
        host.noop(f"{dest} is current")
        return
    yield from files.put._inner(src=BytesIO(data), dest=dest, mode=mode, user=user, group=group)
