"""Nginx on the gateway: a new config replaces the serving one only if `nginx -t` accepts it."""

from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Callable
from io import StringIO

from pyinfra import host
from pyinfra.api import operation
from pyinfra.facts.files import FileContents, Sha256File
from pyinfra.operations import files

from ascend_fleet.node.route_watch import Routes, isolated_keys, nginx_text
from ascend_fleet.operations.config import checked_config


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@operation()
def nginx_config(dest: str, content: str | Callable[[], str]):
    """
    Put an nginx config in place and reload nginx, keeping the old one serving if the new one fails.

    + dest: the config file (e.g. /etc/nginx/conf.d/ascend-fleet.conf)
    + content: its full text, or a function that makes it when the operation runs (so it sees
      what the run's earlier operations recorded)
    """
    text = content() if callable(content) else content
    yield from checked_config._inner(dest=dest, content=text, check="nginx -t", service="nginx",
                                     what="gateway config")


@operation()
def routes_applied(dest: str, program: str, content: str | Callable[[], str]):
    """
    Put the gateway's routes file in place and route by it at once, through the route watcher's own
    `apply` (nginx -t, then a reload; those the watcher took out stay out). A routes file the gateway
    refuses is swapped back out, so the old routing keeps serving.

    + dest: the routes file (node_layout.ROUTES_FILE; routes.py writes it)
    + program: the route watcher on the gateway (node/route_watch.py)
    + content: its full text, or a function that makes it when the operation runs (so it sees what the
      run's serve stage recorded)
    """
    text = content() if callable(content) else content
    routes = Routes(json.loads(text))
    # What nginx must read now: these routes, those the watcher has out kept out. A config edited by hand
    # (or one an older release wrote) is routed again even when the routes file is current.
    state = host.get_fact(FileContents, path=routes.document["state_file"])
    out = set(isolated_keys("\n".join(state))) if state else set()
    nginx = nginx_text(routes, out & {b["key"] for b in routes.checked})
    if (host.get_fact(Sha256File, path=dest) == sha256(text)
            and host.get_fact(Sha256File, path=routes.document["nginx"]["config"]) == sha256(nginx)):
        host.noop(f"{dest} is current")
        return
    staged, backup = f"{dest}.new", f"{dest}.previous"
    yield from files.put._inner(src=StringIO(text), dest=staged, mode="644")
    target, previous = shlex.quote(dest), shlex.quote(backup)
    yield (f"if [ -f {target} ]; then cp -p {target} {previous}; else rm -f {previous}; fi; "
           f"mv {shlex.quote(staged)} {target}; "
           f"if ! python3 {shlex.quote(program)} apply {target}; then "
           f"  if [ -f {previous} ]; then mv {previous} {target}; else rm -f {target}; fi; exit 1; fi; "
           f"rm -f {previous}")
