"""A config file that replaces the serving one only if the service's own checker accepts it."""

from __future__ import annotations

import hashlib
import shlex
from io import StringIO

from pyinfra import host
from pyinfra.api import operation
from pyinfra.facts.files import Sha256File
from pyinfra.operations import files


@operation()
def checked_config(dest: str, content: str, check: str, service: str, what: str):
    """
    Put a config file in place, check it, and reload the service; a rejected file is swapped
    back out, so the service never reloads a bad config and the old one keeps serving.

    + dest: the config file (e.g. /etc/nginx/conf.d/ascend-fleet.conf)
    + content: its full text
    + check: a shell command that exits non-zero on a bad config with dest in place (e.g. `nginx -t`)
    + service: the systemd service that reads it (reloaded if running, else started)
    + what: what the file is, for the error line (e.g. "gateway config")
    """
    if host.get_fact(Sha256File, path=dest) == hashlib.sha256(content.encode()).hexdigest():
        host.noop(f"{dest} is current")
        return
    staged, backup = f"{dest}.new", f"{dest}.previous"
    yield from files.put._inner(src=StringIO(content), dest=staged, mode="644")
    target, previous, unit = shlex.quote(dest), shlex.quote(backup), shlex.quote(service)
    yield (f"if [ -f {target} ]; then cp -p {target} {previous}; else rm -f {previous}; fi; "
           f"mv {shlex.quote(staged)} {target}; "
           f"if ! out=$({check} 2>&1); then "
           f"  if [ -f {previous} ]; then mv {previous} {target}; else rm -f {target}; fi; "
           f"  echo \"new {what} rejected by {check}, the previous one keeps serving: "
           # The checker's first error line, else its first line (keepalived: "Unknown keyword ...").
           f"$(printf '%s\\n' \"$out\" | grep -m1 -i -E 'emerg|failed|error' || printf '%s\\n' \"$out\" | head -n1)"
           f"\" >&2; exit 1; fi; "
           f"rm -f {previous}; "
           f"if systemctl is-active --quiet {unit}; then systemctl reload {unit}; else systemctl start {unit}; fi")
