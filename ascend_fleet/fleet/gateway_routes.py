"""What the gateway routes: the instances of the fleet, each in or out of rotation, and how a request picks one.

- The backends are the instances of every worker of the inventory that has served (fleetstate.py),
  of the colour each worker serves with; those drained (a rollout, a swap, `ascend-fleet drain`) are
  `down`; a multi-node instance is its head's.
- The policy is data (hostdata.Routing): `least_conn` (the fewest requests in flight),
  `session_affinity` (nginx's consistent hash on a header the data names: the turns of a session meet
  the KV cache of its history on one instance, and losing an instance moves only its sessions), or
  `cache_aware` (the vLLM project's vllm-router on the gateway, behind nginx: it sends a request to the
  instance whose cache holds the longest part of its prompt).
- At run time each gateway's route watcher (node/route_watch.py) takes out an instance that fails its
  checks and puts it back; this module writes what it works from (routes_document): nginx's config
  rendered with every instance in and with every instance out, the instances to check, the settings.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from ascend_fleet import TEMPLATES
from ascend_fleet.config.fleetstate import FleetState, backend_key, counts_as_served
from ascend_fleet.config.host_config import host_node_config
from ascend_fleet.config.hostdata import Gateway, Isolation, NodeConfig
from ascend_fleet.core.node_layout import (
    GATEWAY_CONFIG,
    ROUTE_WATCH_LOCK,
    ROUTE_WATCH_STATE,
    ROUTE_WATCH_TEXTFILE,
)
from ascend_fleet.core.service_ports import NODE_EXPORTER_PORT
from ascend_fleet.core.templating import render
from ascend_fleet.fleet.firewall import host_address
from ascend_fleet.fleet.multi_node import DataParallelRole

GATEWAY_UPSTREAM = {"max_fails": 2, "read_timeout": 3600, "upstream_keepalive_timeout": 4}
# The upstream's shared zone holds every server's state: measured with Debian's nginx 1.22.1, `nginx -t`
# needs about 0.77 KB a server over a 12 KB base (256k holds 319; 4000 need 3092k). Sized at twice that,
# for longer names and names that resolve to several addresses (a peer each), never below nginx's usual 256k.
UPSTREAM_ZONE_MIN_KB, UPSTREAM_ZONE_KB_PER_SERVER, UPSTREAM_ZONE_BASE_KB = 256, 2, 64
# node_exporter is asked for its textfile collector only: the NPU health npu-smi wrote there.
NPU_METRICS_QUERY = "/metrics?collect%5B%5D=textfile"


def leave_routing_seconds(inventory: Iterable) -> int:
    """How long a stopping instance waits for the gateways' route watchers to take it out (its ExecStop):
    they do at their next check (an interval, and one more for a check already under way) and a second
    for nginx's reload; the first gateway's settings (every gateway carries the same group data), the
    defaults without one."""
    isolation = next((c.gateway.isolation for c in map(host_node_config, inventory) if c.is_gateway), Isolation())
    return math.ceil(isolation.interval_seconds * 2 + 1)


def worker_url(address: str, port: int) -> str:
    """An instance's URL from the gateway, as the route watcher asks it and vllm-router names it."""
    return f"http://{address}:{port}"


def upstream_zone_kb(servers: int) -> int:
    return max(UPSTREAM_ZONE_MIN_KB, UPSTREAM_ZONE_BASE_KB + UPSTREAM_ZONE_KB_PER_SERVER * servers)


def fleet_backends(inventory: Iterable, roles: dict[str, DataParallelRole], state: FleetState) -> list[dict]:
    """Every instance of every worker in the inventory (every host, also those a --limit leaves out)
    that has served (fleetstate.py), as the gateway addresses it; those drained (host/instance) are
    kept out of rotation. Each worker's instances are those of the colour it serves with
    (host_node_config); a multi-node instance's members are its head's (roles: fleet.fleet_roles)."""
    drained, served = state.drained(), state.served()
    backends = []
    for worker in inventory:
        config = host_node_config(worker)
        role = roles.get(worker.name)
        if not config.is_worker or (role and not role.is_head):  # a headless member serves no HTTP
            continue
        address = host_address(worker)
        backends += [{"host": worker.name, "instance": i.name, "address": address, "port": i.port,
                      "npus": list(i.npus), "drained": backend_key(worker.name, i.name) in drained}
                     for i in config.instances if counts_as_served(served, worker.name, i.name)]
    return backends


def render_gateway_config(backends: list[dict], gateway: Gateway, fail_timeout: int,
                          out: frozenset[str] = frozenset()) -> str:
    """The gateway's nginx config over these backends (as fleet_backends gives them), those in `out`
    (host/instance) down as if drained."""
    routing = gateway.routing
    if routing.policy == "cache_aware":  # nginx sends every request to the gateway's own router
        servers = [{"host": "vllm-router", "instance": "loopback", "address": "127.0.0.1",
                    "port": routing.router_port, "down": False}] if backends else []
    else:
        servers = [{**backend, "down": backend["drained"] or backend_key(backend["host"], backend["instance"]) in out}
                   for backend in backends]
    return render(TEMPLATES / "nginx-gateway.conf.j2", upstream=gateway.upstream_name,
                  listen_port=gateway.listen_port, backends=servers, zone_kb=upstream_zone_kb(len(servers)),
                  policy=routing.policy, session_variable=routing.session_header.lower().replace("-", "_"),
                  # Every server once: a request is not answered 502 while one instance can take it.
                  next_upstream_tries=sum(not server["down"] for server in servers) if servers else 0,
                  fail_timeout=fail_timeout, **GATEWAY_UPSTREAM)


def routes_document(config: NodeConfig, backends: list[dict], router: dict | None = None) -> dict:
    """The routes file of a gateway, for its route watcher (node/route_watch.py says how it is read)."""
    routed = [backend for backend in backends if not backend["drained"]]
    every_in = render_gateway_config(backends, config.gateway, config.gateway_fail_timeout)
    every_out = render_gateway_config(backends, config.gateway, config.gateway_fail_timeout,
                                      frozenset(backend_key(b["host"], b["instance"]) for b in routed))
    server_lines = {line.rsplit("# ", 1)[-1].strip(): index
                    for index, (line, out) in enumerate(zip(every_in.split("\n"), every_out.split("\n")))
                    if line != out}
    return {
        "nginx": {"config": GATEWAY_CONFIG, "routed": every_in, "isolated": every_out, "server_lines": server_lines},
        # The URL as vllm-router names the instance: the watcher compares them as strings.
        "backends": [{"key": backend_key(b["host"], b["instance"]), "url": worker_url(b["address"], b["port"]),
                      "npus": b["npus"], "drained": b["drained"],
                      "npu_metrics_url": f"http://{b['address']}:{NODE_EXPORTER_PORT}{NPU_METRICS_QUERY}"}
                     for b in backends],
        "isolation": config.gateway.isolation.model_dump(),
        "router": router,
        "state_file": ROUTE_WATCH_STATE, "lock_file": ROUTE_WATCH_LOCK, "textfile": ROUTE_WATCH_TEXTFILE,
    }
