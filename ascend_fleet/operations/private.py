"""Files that hold secrets on a node: root-owned, mode 0600 from the first byte, never shown."""

from __future__ import annotations

import hashlib
import posixpath
import shlex
from io import StringIO

from pyinfra import host
from pyinfra.api import FileUploadCommand, StringCommand, operation

from ascend_fleet.facts.files import FileState

# pyinfra's arguments that run commands as another user than the one SSH logged in as.
ESCALATIONS = ("_sudo", "_doas", "_dzdo", "_su_user")


@operation()
def private_file(dest: str, content: str | None):
    """
    Put a file only root can read (0600, root:root), or remove it. Unlike files.put, its
    text is never printed, not even with pyinfra --diff, and it is never readable by
    others: it is uploaded into a 0600 file beside dest, then renamed over it. Under sudo
    (or doas, su), where pyinfra uploads as the login user into its temp directory first,
    that temp file is created 0600 by the login user before the upload writes into it.

    + dest: path on the node, e.g. /etc/ascend-fleet/hub-tokens.env
    + content: the full text; None removes the file
    """
    current = host.get_fact(FileState, path=dest)
    if content is None:
        if current:
            yield f"rm -f {shlex.quote(dest)}"
        else:
            host.noop(f"no {dest}")
        return
    wanted = {"mode": 600, "user": "root", "group": "root", "sha256": hashlib.sha256(content.encode()).hexdigest()}
    if current and all(current[key] == value for key, value in wanted.items()):
        host.noop(f"{dest} is current")
        return
    staged = f"{dest}.new"
    yield f"mkdir -p {shlex.quote(posixpath.dirname(dest))}"
    yield f"install -m 600 -o root -g root /dev/null {shlex.quote(staged)}"
    temp = None
    if any((host.current_op_global_arguments or {}).get(name) for name in ESCALATIONS):
        temp = host.get_temp_filename()  # a random name; noclobber refuses one that already exists
        yield StringCommand(f"umask 077 && set -C && : > {shlex.quote(temp)}", **{name: False for name in ESCALATIONS})
    yield FileUploadCommand(StringIO(content), staged, remote_temp_filename=temp)
    yield f"mv {shlex.quote(staged)} {shlex.quote(dest)}"
