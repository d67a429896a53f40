"""Nginx on the gateway: a new config replaces the serving one only if `nginx -t` accepts it."""

from __future__ import annotations

from collections.abc import Callable

from pyinfra.api import operation

from ascend_fleet.operations.config import checked_config


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
