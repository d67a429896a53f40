"""Nginx on the gateway: a new config replaces the serving one only if `nginx -t` accepts it."""

from __future__ import annotations

import hashlib
import shlex
from io import StringIO

from pyinfra import host
from pyinfra.api import operation
from pyinfra.facts.files import Sha256File
from pyinfra.operations import files


@operation()
def nginx_config(dest: str, content: str):
    """
    Put an nginx config in place and reload nginx, keeping the old one serving if the new one fails.

    + dest: the config file (e.g. /etc/nginx/conf.d/ascend-fleet.conf)
    + content: its full text
    """
    if host.get_fact(Sha256File, path=dest) == hashlib.sha256(content.encode()).hexdigest():
        host.noop(f"{dest} is current")
        return
    staged, backup = f"{dest}.new", f"{dest}.previous"
    yield from files.put._inner(src=StringIO(content), dest=staged, mode="644")
    target = shlex.quote(dest)
    # Swap in, test the whole nginx config, and swap back on failure: nginx never reloads a bad config.
    yield (f"if [ -f {target} ]; then cp -p {target} {shlex.quote(backup)}; else rm -f {shlex.quote(backup)}; fi; "
           f"mv {shlex.quote(staged)} {target}; "
           f"if ! out=$(nginx -t 2>&1); then "
           f"  if [ -f {shlex.quote(backup)} ]; then mv {shlex.quote(backup)} {target}; else rm -f {target}; fi; "
           f"  echo \"new gateway config rejected by nginx -t, the previous one keeps serving: "
           f"$(echo \"$out\" | grep -m1 emerg)\" >&2; exit 1; fi; "
           f"rm -f {shlex.quote(backup)}; "
           f"if systemctl is-active --quiet nginx; then systemctl reload nginx; else systemctl start nginx; fi")
