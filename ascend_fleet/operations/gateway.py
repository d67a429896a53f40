"""Nginx on the gateway: a new config replaces the serving one only if `nginx -t` accepts it."""

from __future__ import annotations

from pyinfra.api import operation

from ascend_fleet.operations.config import checked_config


@operation()
def nginx_config(dest: str, content: str):
    """
    Put an nginx config in place and reload nginx, keeping the old one serving if the new one fails.

    + dest: the config file (e.g. /etc/nginx/conf.d/ascend-fleet.conf)
    + content: its full text
    """
    yield from checked_config._inner(dest=dest, content=content, check="nginx -t", service="nginx",
                                     what="gateway config")
