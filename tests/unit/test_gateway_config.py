"""The gateway's nginx config: only instances that served, every one tried once, and a clear 503
before any has served. nginx itself checks each config (`nginx -t`)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from ascend_fleet.config.fleetstate import FleetState, counts_as_served
from ascend_fleet.config.hostdata import Gateway
from ascend_fleet.fleet.gateway_routes import render_gateway_config


def gateway(backends: list[dict]) -> str:
    return render_gateway_config(backends, Gateway(), fail_timeout=10)


def nginx_accepts(site: str, tmp_path: Path) -> subprocess.CompletedProcess:
    (tmp_path / "site.conf").write_text(site)
    (tmp_path / "nginx.conf").write_text(f"pid {tmp_path}/nginx.pid; error_log stderr; events {{}}\n"
                                         f"http {{ access_log off; include {tmp_path}/site.conf; }}\n")
    return subprocess.run(["nginx", "-t", "-q", "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf")],
                          capture_output=True, text=True)


# A fleet of 1000 workers of 4 instances each (nginx 1.22.1 holds 319 servers in a 256k zone).
FLEET_OF_4000 = [{"host": f"npu-{w:04d}", "instance": f"vllm-{i}", "address": f"10.{w // 250}.{w % 250}.11",
                  "port": 8000 + i, "npus": [i], "drained": False} for w in range(1000) for i in range(4)]
BACKENDS = [{"host": "w1", "instance": "vllm-0", "address": "10.0.0.11", "port": 8000, "npus": [0], "drained": False},
            {"host": "w1", "instance": "vllm-1", "address": "10.0.0.11", "port": 8001, "npus": [1], "drained": False},
            {"host": "w2", "instance": "vllm-0", "address": "10.0.0.12", "port": 8000, "npus": [0], "drained": True}]


def test_every_routed_instance_is_tried_before_a_client_sees_an_error():
    config = gateway(BACKENDS)
    assert "proxy_next_upstream_tries 2;" in config  # two in rotation, the drained one is down
    assert "server 10.0.0.12:8000 max_fails=2 fail_timeout=10s down;  # w2/vllm-0" in config


def test_before_any_instance_served_the_gateway_answers_503_saying_so():
    config = gateway([])
    assert "upstream" not in config.split("server {")[0]
    assert "return 503" in config and "no instance of the fleet is serving yet" in config


@pytest.mark.skipif(shutil.which("nginx") is None, reason="nginx is installed by scripts/setup (the lab's mirror)")
@pytest.mark.parametrize("backends", [BACKENDS, [], FLEET_OF_4000], ids=["instances", "none served", "4000 instances"])
def test_nginx_accepts_the_config(backends, tmp_path):
    # nginx -t binds what the config listens on: a free port, so any user can run the check.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    site = render_gateway_config(backends, Gateway(listen_port=port), fail_timeout=10)
    checked = nginx_accepts(site, tmp_path)
    assert checked.returncode == 0, checked.stderr


def test_the_served_record_is_per_worker_and_a_worker_without_one_is_unknown(tmp_path):
    state = FleetState(tmp_path)
    assert state.served() == {}
    state.set_served("w1", {"vllm-1", "vllm-0"})
    state.set_served("w2", set())
    state.set_drained({"w1/vllm-1"})
    assert FleetState(tmp_path).served() == {"w1": {"vllm-0", "vllm-1"}, "w2": set()}
    assert FleetState(tmp_path).drained() == {"w1/vllm-1"}  # one file, neither record overwrites the other
    served = FleetState(tmp_path).served()
    assert counts_as_served(served, "w1", "vllm-0") and not counts_as_served(served, "w2", "vllm-0")
    assert counts_as_served(served, "w3", "vllm-0")  # no record yet: deployed before it was kept


def test_status_reads_every_instance_of_a_gateway_of_4000():
    """The status (and the rollout's view) of a fleet of 1000 workers: each instance found in the gateway's own
    routes file as the product writes it, drained or routed."""
    from ascend_fleet.config.hostdata import node_config
    from ascend_fleet.control.status import HostStatus, gateway_routes, routing
    from ascend_fleet.fleet.gateway_routes import routes_document

    backends = [{**backend, "drained": n % 10 == 0} for n, backend in enumerate(FLEET_OF_4000)]
    config = node_config({"profile": "lab", "gateway": {}}, "gw")
    routes = gateway_routes(json.dumps(routes_document(config, backends), indent=1).splitlines())
    read = HostStatus("gw", "gateway", "lab", routes=routes)
    assert len(routes) == 4000
    assert [routing(f"{b['host']}/{b['instance']}", [read]) for b in backends] == [
        "drained" if b["drained"] else "yes" for b in backends]
    assert routing("npu-9999/vllm-0", [read]) == "absent"
