"""What the gateway routes and how the route watcher changes it: policies in nginx's config, an instance
out and back on the watcher's counts, never the last one out, and the checks it makes over HTTP."""

from __future__ import annotations

import http.server
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from ascend_fleet import TEMPLATES
from ascend_fleet.config.hostdata import node_config
from ascend_fleet.core.node_layout import LEAVING_TEXTFILE_PREFIX
from ascend_fleet.core.templating import render
from ascend_fleet.fleet.gateway_routes import render_gateway_config, routes_document
from ascend_fleet.node import route_watch
from ascend_fleet.node.route_watch import NodeReport, Routes, Watched, judge, nginx_text, step

BACKENDS = [{"host": "w1", "instance": "vllm-0", "address": "10.0.0.11", "port": 8000, "npus": [0, 1], "drained": False},
            {"host": "w1", "instance": "vllm-1", "address": "10.0.0.11", "port": 8001, "npus": [2, 3], "drained": False},
            {"host": "w2", "instance": "vllm-0", "address": "10.0.0.12", "port": 8000, "npus": [0, 1], "drained": True}]


def gateway_config(routing: dict | None = None):
    return node_config({"profile": "lab", "gateway": {"routing": routing or {}}}, "gw")


def server_line(text: str, key: str) -> str:
    return next(line for line in text.splitlines() if line.endswith(f"# {key}"))


def test_an_instance_taken_out_is_down_in_nginx_and_the_drained_one_stays_down():
    routes = Routes(routes_document(gateway_config(), BACKENDS))
    text = nginx_text(routes, {"w1/vllm-0"})
    assert server_line(text, "w1/vllm-0").endswith("down;  # w1/vllm-0")
    assert not server_line(text, "w1/vllm-1").endswith("down;  # w1/vllm-1")
    assert server_line(text, "w2/vllm-0").endswith("down;  # w2/vllm-0")
    assert nginx_text(routes, set()) == routes.document["nginx"]["routed"]
    assert [b["key"] for b in routes.checked] == ["w1/vllm-0", "w1/vllm-1"]  # the drained one is not checked


def test_session_affinity_hashes_the_named_header_consistently_and_spreads_requests_without_it():
    text = render_gateway_config(BACKENDS, gateway_config({"policy": "session_affinity",
                                                           "session_header": "X-Chat-Id"}).gateway, 10)
    assert "map $http_x_chat_id $ascend_fleet_session {" in text
    assert '""      $request_id;' in text
    assert "hash $ascend_fleet_session consistent;" in text and "least_conn" not in text


def test_cache_aware_sends_everything_to_the_gateways_own_router():
    text = render_gateway_config(BACKENDS, gateway_config({"policy": "cache_aware", "router_port": 30123}).gateway, 10)
    servers = [line.strip() for line in text.splitlines() if line.strip().startswith("server 1")]
    assert servers == ["server 127.0.0.1:30123 max_fails=2 fail_timeout=10s;  # vllm-router/loopback"]


@pytest.mark.parametrize("header", ["X-Session-Id; return 200", "x y", "", "é"])
def test_a_session_header_that_is_not_a_header_name_is_refused(header):
    from ascend_fleet.core.errors import FleetError
    with pytest.raises(FleetError, match="session_header"):
        gateway_config({"policy": "session_affinity", "session_header": header})


@pytest.mark.skipif(shutil.which("nginx") is None, reason="nginx is installed by scripts/setup (the lab's mirror)")
@pytest.mark.parametrize("policy", ["least_conn", "session_affinity", "cache_aware"])
def test_nginx_accepts_each_policy_with_instances_in_and_out(policy, tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = node_config({"profile": "lab", "gateway": {"listen_port": port, "routing": {"policy": policy}}}, "gw")
    routes = Routes(routes_document(config, BACKENDS))
    for out in (set(), {"w1/vllm-0"}, {"w1/vllm-0", "w1/vllm-1"}):
        (tmp_path / "site.conf").write_text(nginx_text(routes, out))
        (tmp_path / "nginx.conf").write_text(f"pid {tmp_path}/nginx.pid; error_log stderr; events {{}}\n"
                                             f"http {{ access_log off; include {tmp_path}/site.conf; }}\n")
        checked = subprocess.run(["nginx", "-t", "-q", "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf")],
                                 capture_output=True, text=True)
        assert checked.returncode == 0, checked.stderr


def test_an_instance_leaves_after_its_fails_and_returns_after_its_passes():
    watched: dict[str, Watched] = {}
    healthy = {"a": None, "b": None}
    assert step(watched, {"a": "/health answers 503", "b": None}, fails=2, passes=3, now=100) == []
    changes = step(watched, {"a": "/health answers 503", "b": None}, fails=2, passes=3, now=101)
    assert changes == ["a leaves routing: /health answers 503 (2 checks in a row)"]
    assert route_watch.isolated(watched) == {"a": {"reason": "/health answers 503", "since": 101}}
    assert step(watched, healthy, 2, 3, 102) == [] and step(watched, healthy, 2, 3, 103) == []
    assert step(watched, healthy, 2, 3, 104) == ["a returns to routing: 3 checks passed after 3.0s out "
                                                 "(/health answers 503)"]
    assert route_watch.isolated(watched) == {}


def test_the_last_routed_instance_never_leaves_even_when_it_fails():
    watched: dict[str, Watched] = {}
    both_fail = {"a": "/health answers nothing (timed out)", "b": "/health answers nothing (timed out)"}
    for now in range(5):  # a gateway cut off from every worker: they all stay
        assert step(watched, both_fail, fails=2, passes=3, now=now) == []
    watched = {}
    step(watched, {"a": "NPU 0 Alarm", "b": None}, 1, 3, 0)
    assert list(route_watch.isolated(watched)) == ["a"]
    assert step(watched, {"a": "NPU 0 Alarm", "b": "/health answers 503"}, 1, 3, 1) == []  # b is the last


def test_an_npu_of_the_instance_in_alarm_or_worse_takes_it_out_a_warning_or_another_npu_does_not():
    backend = {"key": "w1/vllm-0", "npus": [0, 1]}
    assert judge(backend, None, NodeReport({0: 0, 1: 2, 2: 3}, frozenset())) == "NPU 1 Alarm"
    assert judge(backend, None, NodeReport({0: 1, 1: 0, 2: 3}, frozenset())) is None  # Warning; NPU 2 is not its
    assert judge(backend, None, None) is None  # node_exporter unread: /health alone decides
    assert judge(backend, "/health answers 503", NodeReport({0: 3}, frozenset())) == "/health answers 503"


def test_an_instance_whose_unit_is_stopping_leaves_before_it_fails_anything():
    backend = {"key": "w1/vllm-0", "npus": [0, 1]}
    stopping = NodeReport({0: 0, 1: 0}, frozenset({"vllm-0"}))
    assert judge(backend, None, stopping) == "its unit is stopping (a restart or a stop on its node)"
    assert judge({**backend, "key": "w1/vllm-1"}, None, stopping) is None


def test_a_stopping_unit_leaves_at_the_first_check_a_failing_one_after_its_fails():
    watched: dict[str, Watched] = {}
    changes = step(watched, {"a": route_watch.STOPPING, "b": "/health answers 503", "c": None}, 2, 3, 0)
    assert changes == [f"a leaves routing: {route_watch.STOPPING} (at the first check)"]
    assert list(route_watch.isolated(watched)) == ["a"]


@pytest.fixture
def instance_helper(tmp_path) -> tuple[Path, Path]:
    """(the node's instance helper, rendered as the serve stage does, its textfile directory)."""
    helper, textfiles = tmp_path / "ascend-fleet-instance", tmp_path / "textfile"
    helper.write_text(render(TEMPLATES / "ascend-fleet-instance.sh.j2", textfile_dir=textfiles,
                             metric=route_watch.LEAVING_METRIC, file_prefix=LEAVING_TEXTFILE_PREFIX,
                             out_of_routing_dir=tmp_path / "out-of-routing"))
    helper.chmod(0o755)
    return helper, textfiles


def test_a_stopping_unit_flags_itself_waits_for_the_watchers_and_clears_the_flag_once_back(instance_helper):
    helper, textfiles = instance_helper
    started = time.monotonic()
    subprocess.run([helper, "leave-routing", "vllm-1", "1"], check=True, env={"PATH": "/usr/bin:/bin"})
    assert time.monotonic() - started >= 1
    flag = textfiles / f"{LEAVING_TEXTFILE_PREFIX}vllm-1.prom"
    assert route_watch.LEAVING.findall(flag.read_text()) == ["vllm-1"]
    subprocess.run([helper, "back-in-routing", "vllm-1"], check=True)
    assert list(textfiles.iterdir()) == []


def test_a_unit_whose_vllm_already_exited_flags_itself_without_waiting(instance_helper):
    helper, textfiles = instance_helper
    started = time.monotonic()
    subprocess.run([helper, "leave-routing", "vllm-1", "30"], check=True,
                   env={"PATH": "/usr/bin:/bin", "EXIT_CODE": "exited", "EXIT_STATUS": "0"})  # as systemd sets them
    assert time.monotonic() - started < 10
    assert (textfiles / f"{LEAVING_TEXTFILE_PREFIX}vllm-1.prom").exists()


def test_a_unit_the_deploy_restarts_out_of_routing_flags_itself_without_waiting_and_its_start_clears_both(
        instance_helper):
    helper, textfiles = instance_helper
    marker = helper.parent / "out-of-routing" / "vllm-1"
    marker.parent.mkdir()
    marker.touch()  # units.running's unrouted_marker
    started = time.monotonic()
    subprocess.run([helper, "leave-routing", "vllm-1", "30"], check=True, env={"PATH": "/usr/bin:/bin"})
    assert time.monotonic() - started < 10 and (textfiles / f"{LEAVING_TEXTFILE_PREFIX}vllm-1.prom").exists()
    subprocess.run([helper, "back-in-routing", "vllm-1"], check=True)
    assert list(textfiles.iterdir()) == [] and not marker.exists()


class Worker(http.server.BaseHTTPRequestHandler):
    """A worker's /health and its node_exporter's textfile metrics, answering what the test sets."""

    health = 200
    metrics = ('ascend_npu_health{chip="910B3",npu="0"} 0\nascend_npu_health{chip="910B3",npu="1"} 2\n'
               'ascend_fleet_instance_leaving{instance="vllm-2"} 1\n')

    def do_GET(self):  # noqa: N802 (http.server's name)
        status, body = (self.health, b"") if self.path == "/health" else (200, self.metrics.encode())
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args):
        pass


def test_the_watcher_asks_health_and_the_workers_npu_report_over_http():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Worker)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        backends = [{"key": "w1/vllm-0", "url": url, "npus": [0], "drained": False, "npu_metrics_url": f"{url}/m"},
                    {"key": "w1/vllm-1", "url": url, "npus": [1], "drained": False, "npu_metrics_url": f"{url}/m"},
                    {"key": "w1/vllm-2", "url": url, "npus": [2], "drained": False, "npu_metrics_url": f"{url}/m"},
                    {"key": "w2/vllm-0", "url": "http://127.0.0.1:9", "npus": [0], "drained": False}]
        routes = Routes({"backends": backends, "isolation": {"health_timeout_seconds": 1.0}})
        verdicts = route_watch.check_all(routes)
        assert {key: verdicts[key] for key in ("w1/vllm-0", "w1/vllm-1", "w1/vllm-2")} == {
            "w1/vllm-0": None, "w1/vllm-1": "NPU 1 Alarm",
            "w1/vllm-2": "its unit is stopping (a restart or a stop on its node)"}
        assert route_watch.check_all(routes)["w2/vllm-0"].startswith("/health answers nothing")
        Worker.health = 503
        assert route_watch.check_all(routes)["w1/vllm-0"] == "/health answers 503"
    finally:
        Worker.health = 200
        server.shutdown()


def test_the_watcher_program_is_standard_library_only():
    """It runs with the gateway's system python3, where none of the control machine's packages are."""
    source = Path(route_watch.__file__).read_text()
    imported = {line.split()[1].split(".")[0] for line in source.splitlines()
                if line.startswith(("import ", "from ")) and "__future__" not in line}
    import sys
    assert imported <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)
