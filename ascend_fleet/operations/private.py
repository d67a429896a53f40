"""Files that hold secrets on a node: root-owned, mode 0600 from the first byte, never shown."""

from __future__ import annotations

import hashlib
import posixpath
import shlex
from io import StringIO

from pyinfra import host
from pyinfra.api import FileUploadCommand, operation
from pyinfra.facts.files import File, Sha256File


@operation()
def private_file(dest: str, content: str | None):
    """
    Put a file only root can read (0600, root:root), or remove it. Unlike files.put, its
    text is never printed, not even with pyinfra --diff, and it is never readable by
    others: it is uploaded into a 0600 file beside dest, then renamed over it.

    + dest: path on the node, e.g. /etc/ascend-fleet/hub-tokens.env
    + content: the full text; None removes the file
    """
    current = host.get_fact(File, path=dest)
    if content is None:
        if current:
            yield f"rm -f {shlex.quote(dest)}"
        else:
            host.noop(f"no {dest}")
        return
    private = bool(current) and current["mode"] == 600 and current["user"] == "root" and current["group"] == "root"
    if private and host.get_fact(Sha256File, path=dest) == hashlib.sha256(content.encode()).hexdigest():
        host.noop(f"{dest} is current")
        return
    staged = f"{dest}.new"
    yield f"mkdir -p {shlex.quote(posixpath.dirname(dest))}"
    yield f"install -m 600 -o root -g root /dev/null {shlex.quote(staged)}"
    yield FileUploadCommand(StringIO(content), staged)
    yield f"mv {shlex.quote(staged)} {shlex.quote(dest)}"
