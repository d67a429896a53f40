"""The vLLM project's vllm-router on a gateway (gateway.routing.policy cache_aware): its command line and what
the route watcher needs to keep its workers. Each setting was tried on the real router (docs/vllm-router.md,
tests/sim/test_vllm_router.py); the router listens on the gateway's loopback only, behind nginx.

Its workers are the instances the gateway routes to: the unit starts it with those routable when the deploy
ran (ROUTER_WORKERS_FILE), then the route watcher keeps them equal to those routable and not isolated through
the router's own API (node/router_api.py), without restarting it.
"""

from __future__ import annotations

import math
import re

from ascend_fleet.config.hostdata import Gateway, Routing
from ascend_fleet.core.errors import FleetError
from ascend_fleet.core.service_ports import ROUTER_METRICS_PORT as METRICS_PORT
from ascend_fleet.fleet.gateway_routes import GATEWAY_UPSTREAM, worker_url

LOOPBACK = "127.0.0.1"
# The variable of ROUTER_WORKERS_FILE the unit's command line ends with: systemd splits an unbraced $VAR
# into words, one URL each, and none when it is empty.
WORKERS_VARIABLE = "VLLM_ROUTER_WORKERS"
# How long /add_worker waits for a worker's /health (and, at start, for one of the workers given): the
# watcher adds only instances that just passed its own check, so a longer wait only holds its cycle.
STARTUP_TIMEOUT_SECONDS = 10
# A worker URL as the router is given it and lists it back: http, a host name or address, a port.
WORKER_URL = re.compile(r"^http://(?:[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\]):"
                        r"(?:[1-9][0-9]{0,4})$")


def checked_worker_urls(urls: list[str]) -> list[str]:
    """The URLs, each refused unless it is http://HOST:PORT: one plain word on the router's command line."""
    for url in urls:
        if not WORKER_URL.match(url) or int(url.rsplit(":", 1)[1]) > 65535:
            raise FleetError(f"vllm-router worker {url!r} is not http://HOST:PORT")
    return urls


def router_worker_urls(backends: list[dict]) -> list[str]:
    """The URLs of the backends the gateway routes to (routes.fleet_backends' dicts): every one not drained."""
    return checked_worker_urls([worker_url(b["address"], b["port"]) for b in backends if not b["drained"]])


def router_arguments(gateway: Gateway, worker_urls: list[str]) -> list[str]:
    """vllm-router's arguments (after the program) for this gateway, its workers last. Refuses a port or a
    worker URL the command line could not carry as one plain word."""
    routing, isolation = gateway.routing, gateway.isolation
    port = routing.router_port
    if not isinstance(port, int) or not 0 < port < 65536 or port == METRICS_PORT:
        raise FleetError(f"gateway.routing.router_port {port!r}: a port other than {METRICS_PORT}, where vllm-router "
                         "serves its metrics")
    return [
        "--host", LOOPBACK, "--port", str(port),
        "--policy", "cache_aware",
        # Attempts, not retries: a request is tried at most this often, each attempt picking a worker again
        # among those available (healthy, circuit closed).
        "--retry-max-retries", "5",
        # Fewer failures than attempts: a dead worker's circuit opens within one request's attempts and its
        # next attempt goes to another worker, so no new request fails (the default 10 failed 2 in a row).
        "--cb-failure-threshold", "3",
        # The router judges /health as the route watcher does (gateway.isolation), in whole seconds: its own
        # check is what keeps a hung instance out while the watcher is not running.
        "--health-check-endpoint", "/health",
        "--health-check-interval-secs", str(max(1, round(isolation.interval_seconds))),
        "--health-check-timeout-secs", str(math.ceil(isolation.health_timeout_seconds)),
        "--health-failure-threshold", str(isolation.fails),
        "--health-success-threshold", str(isolation.passes),
        "--worker-startup-timeout-secs", str(STARTUP_TIMEOUT_SECONDS),
        "--worker-startup-check-interval", "1",
        # A whole request, stream included (its HTTP client's timeout): nginx's read timeout, not the default 1800.
        "--request-timeout-secs", str(GATEWAY_UPSTREAM["read_timeout"]),
        "--prometheus-host", LOOPBACK, "--prometheus-port", str(METRICS_PORT),
        "--worker-urls", *checked_worker_urls(worker_urls),
    ]


def router_routes(routing: Routing) -> dict | None:
    """The routes file's "router" entry (routes.routes_document): where the watcher reaches the router and
    how long it waits; None unless the gateway routes cache_aware."""
    if routing.policy != "cache_aware":
        return None
    return {"url": f"http://{LOOPBACK}:{routing.router_port}", "timeout_seconds": 2.0,
            # The router's own answer (400 after STARTUP_TIMEOUT_SECONDS) comes first.
            "add_timeout_seconds": STARTUP_TIMEOUT_SECONDS + 5.0}
