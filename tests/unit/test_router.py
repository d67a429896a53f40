"""The gateway's vllm-router as the deploy writes it: its command line (router_arguments), the hardened
unit, the worker API the route watcher keeps its workers with (node/router_api.py), the stop when the
policy is another, and its locks. The real router runs in tests/sim/test_vllm_router.py."""

from __future__ import annotations

import http.server
import json
import re
import shutil
import subprocess
import threading
import urllib.parse
from pathlib import Path

import pytest
from pyinfra.api import State
from pyinfra.facts.systemd import SystemdEnabled

from ascend_fleet import TEMPLATES
from ascend_fleet.config.hostdata import node_config
from ascend_fleet.config.node_os import node_os
from ascend_fleet.config.profile import available_profiles, load_profile
from ascend_fleet.core.bundle_layout import MANIFEST
from ascend_fleet.core.errors import FleetError
from ascend_fleet.core.node_layout import ROUTER_UNIT, ROUTER_WORKERS_FILE
from ascend_fleet.core.templating import render
from ascend_fleet.facts.systemd import UnitState
from ascend_fleet.facts.vllm_router import RouterWorkers
from ascend_fleet.fleet.bundle import bundle_routers, router_coverage_refusal
from ascend_fleet.fleet.profile_check import Platform
from ascend_fleet.fleet.profile_lock import ROUTER_GLIBC, router_lock, router_lock_path
from ascend_fleet.fleet.vllm_router import (
    METRICS_PORT,
    WORKERS_VARIABLE,
    router_arguments,
    router_routes,
    router_worker_urls,
)
from ascend_fleet.node import router_api
from ascend_fleet.operations import vllm_router
from tests.fakehost import FakeHost, commands, fact

BACKENDS = [{"host": "w1", "instance": "vllm-0", "address": "10.0.0.11", "port": 8000, "drained": False},
            {"host": "w1", "instance": "vllm-1", "address": "worker1.site", "port": 8001, "drained": False},
            {"host": "w2", "instance": "vllm-0", "address": "10.0.0.12", "port": 8000, "drained": True}]


def gateway(routing: dict | None = None, isolation: dict | None = None):
    config = node_config({"profile": "lab", "gateway": {"routing": {"policy": "cache_aware", **(routing or {})},
                                                        "isolation": isolation or {}}}, "gw")
    return config.gateway


def option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_the_router_listens_on_loopback_routes_cache_aware_and_takes_the_routable_instances_last():
    urls = router_worker_urls(BACKENDS)
    assert urls == ["http://10.0.0.11:8000", "http://worker1.site:8001"]  # the drained one is not a worker
    argv = router_arguments(gateway({"router_port": 30090}), urls)
    assert (option(argv, "--host"), option(argv, "--port"), option(argv, "--policy")) == ("127.0.0.1", "30090",
                                                                                          "cache_aware")
    assert (option(argv, "--prometheus-host"), option(argv, "--prometheus-port")) == ("127.0.0.1", str(METRICS_PORT))
    assert argv[-3:] == ["--worker-urls", *urls] and router_arguments(gateway(), [])[-1] == "--worker-urls"


def test_a_dead_workers_circuit_opens_within_one_requests_attempts():
    """Measured on 0.1.17: with the circuit's default 10 failures and 5 attempts, the two requests after a
    worker died failed; with fewer failures than attempts none did."""
    argv = router_arguments(gateway(), [])
    assert int(option(argv, "--cb-failure-threshold")) < int(option(argv, "--retry-max-retries"))


def test_the_router_judges_health_as_the_route_watcher_does():
    argv = router_arguments(gateway(isolation={"interval_seconds": 2.4, "health_timeout_seconds": 1.5, "fails": 4,
                                               "passes": 5}), [])
    assert [option(argv, name) for name in ("--health-check-endpoint", "--health-check-interval-secs",
                                            "--health-check-timeout-secs", "--health-failure-threshold",
                                            "--health-success-threshold")] == ["/health", "2", "2", "4", "5"]
    assert option(router_arguments(gateway(isolation={"interval_seconds": 0.2}), []),
                  "--health-check-interval-secs") == "1"  # whole seconds, at least one


@pytest.mark.parametrize("address", ["10.0.0.1 --policy random", "a;b", "a\nb", "$(id)", "a'b", "", "-x",
                                     "host/path", "a b"])
def test_a_worker_address_the_command_line_could_not_carry_as_one_word_is_refused(address):
    with pytest.raises(FleetError, match="is not http://HOST:PORT"):
        router_worker_urls([{"address": address, "port": 8000, "drained": False}])
    with pytest.raises(FleetError, match="is not http://HOST:PORT"):
        router_arguments(gateway(), [f"http://{address}:8000"])


@pytest.mark.parametrize("port", [0, 65536, "30080 --x", METRICS_PORT])
def test_a_router_port_that_is_not_a_free_port_number_is_refused(port):
    hostile = gateway().model_copy(update={"routing": gateway().routing.model_copy(update={"router_port": port})})
    with pytest.raises(FleetError, match="router_port"):
        router_arguments(hostile, [])


def test_the_watcher_reaches_the_router_on_loopback_only_when_the_policy_is_cache_aware():
    assert router_routes(gateway({"router_port": 30090}).routing)["url"] == "http://127.0.0.1:30090"
    assert router_routes(gateway({"policy": "least_conn"}).routing) is None


def unit_text(program: str, arguments: list[str]) -> str:
    return render(TEMPLATES / "vllm-router.service.j2", version="0.1.17", program=program, arguments=arguments,
                  workers_file=ROUTER_WORKERS_FILE, workers_variable=WORKERS_VARIABLE)


def test_the_unit_is_hardened_and_runs_as_a_user_of_its_own():
    lines = set(unit_text("/x/vllm-router", router_arguments(gateway(), [])).splitlines())
    for line in ("DynamicUser=yes", "NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=yes",
                 "PrivateTmp=yes", "PrivateDevices=yes", "CapabilityBoundingSet=", "MemoryDenyWriteExecute=yes",
                 "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX", "SystemCallFilter=@system-service",
                 "Restart=always"):
        assert line in lines, line


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_systemd_reads_the_command_line_back_word_for_word_with_the_workers_from_their_file(tmp_path):
    program = tmp_path / "venv dir" / "%n" / "vllm-router"  # a space and a specifier: one word as written
    program.parent.mkdir(parents=True)
    program.symlink_to("/bin/true")
    arguments = router_arguments(gateway(), [])
    unit = tmp_path / ROUTER_UNIT
    unit.write_text(unit_text(str(program), arguments))
    clean = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)], capture_output=True, text=True)
    assert (clean.returncode, clean.stderr) == (0, ""), clean.stderr
    dumped = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)], capture_output=True, text=True,
                            env={"SYSTEMD_LOG_LEVEL": "debug", "PATH": "/usr/bin:/bin"})
    parsed = re.search(r"Command Line: (.+)", dumped.stdout + dumped.stderr)[1]
    # systemd's dump shows the variable still to expand (at exec time, one word per URL of its file)
    assert parsed == f'"{program}" ' + " ".join(arguments) + f' "\\${WORKERS_VARIABLE}"', parsed


class FakeRouter(http.server.BaseHTTPRequestHandler):
    """vllm-router's worker API as 0.1.17 answers it (docs/vllm-router.md); `refused` URLs never get healthy."""

    workers: list[str] = []
    refused: set[str] = set()
    calls: list[str] = []

    def log_message(self, *_args) -> None:
        pass

    def answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self.calls.append(f"GET {self.path}")
        self.answer(200, json.dumps({"urls": self.workers}).encode())

    def do_POST(self) -> None:
        self.calls.append(f"POST {self.path}")
        path, _, query = self.path.partition("?")
        url = urllib.parse.parse_qs(query)["url"][0]
        if path == "/add_worker" and url in self.refused:
            return self.answer(400, f"Timeout 10s waiting for worker {url} to become healthy".encode())
        if path == "/add_worker":
            self.workers.append(url)
        else:
            self.workers.remove(url) if url in self.workers else None
        self.answer(200, b"Successfully")


@pytest.fixture
def fake_router():
    FakeRouter.workers, FakeRouter.refused, FakeRouter.calls = [], set(), []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeRouter)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield {"url": f"http://127.0.0.1:{server.server_port}", "timeout_seconds": 2.0, "add_timeout_seconds": 2.0}
    server.shutdown()


def test_the_watcher_adds_the_new_instances_before_it_removes_the_old_and_asks_once_when_in_step(fake_router):
    blue, green = [{"url": "http://10.0.0.11:8000"}], [{"url": "http://10.0.0.11:8100"}]
    FakeRouter.workers = [blue[0]["url"]]
    assert router_api.sync_workers(fake_router, green) is None
    assert FakeRouter.calls == ["GET /list_workers", "POST /add_worker?url=http%3A%2F%2F10.0.0.11%3A8100",
                                "POST /remove_worker?url=http%3A%2F%2F10.0.0.11%3A8000"]
    assert FakeRouter.workers == [green[0]["url"]]
    FakeRouter.calls.clear()
    assert router_api.sync_workers(fake_router, green) is None and FakeRouter.calls == ["GET /list_workers"]


def test_a_worker_the_router_would_not_add_is_one_line_and_the_rest_still_done(fake_router):
    FakeRouter.workers, FakeRouter.refused = ["http://a:1"], {"http://b:2"}
    problem = router_api.sync_workers(fake_router, [{"url": "http://b:2"}, {"url": "http://c:3"}])
    assert problem == "vllm-router did not add http://b:2: 400 Timeout 10s waiting for worker http://b:2 to become " \
                      "healthy"
    assert FakeRouter.workers == ["http://c:3"]


def test_a_router_that_does_not_answer_is_one_line():
    problem = router_api.sync_workers({"url": "http://127.0.0.1:9", "timeout_seconds": 1.0,
                                       "add_timeout_seconds": 1.0}, [])
    assert problem.startswith("vllm-router at http://127.0.0.1:9 does not answer /list_workers (")


def test_the_router_api_module_needs_only_the_standard_library():
    imported = re.findall(r"^(?:import|from) (\S+)", Path(router_api.__file__).read_text(), re.M)
    assert set(imported) <= {"__future__", "json", "urllib.error", "urllib.parse", "urllib.request"}


@pytest.mark.parametrize("state, enabled, expected", [
    ({"LoadState": "not-found", "ActiveState": "inactive"}, False, []),
    ({"LoadState": "loaded", "ActiveState": "active"}, True, [f"systemctl disable --now {ROUTER_UNIT}"]),
    ({"LoadState": "loaded", "ActiveState": "activating"}, False, [f"systemctl disable --now {ROUTER_UNIT}"]),
    ({"LoadState": "loaded", "ActiveState": "inactive"}, True, [f"systemctl disable --now {ROUTER_UNIT}"]),
    ({"LoadState": "loaded", "ActiveState": "inactive"}, False, []),
])
def test_with_another_policy_the_router_is_stopped_and_disabled_and_nothing_is_done_where_it_never_was(
        state, enabled, expected):
    fake = FakeHost({UnitState: state, fact(SystemdEnabled, services=[ROUTER_UNIT]): {ROUTER_UNIT: enabled}})
    assert commands(vllm_router.stopped, fake, unit=ROUTER_UNIT) == expected
    assert bool(fake.noops) == (not expected)


def test_the_router_probe_says_what_it_got():
    probe = RouterWorkers()
    assert probe.process(['answers {"urls":["http://a:1"]}']) == {"workers": ["http://a:1"]}
    assert probe.process(["silent [Errno 111] Connection refused"]) == {"problem": "[Errno 111] Connection refused"}
    assert probe.process(["answers Not Found"]) == {"problem": "/list_workers answered 'Not Found'"}


def test_the_pinned_router_has_committed_hashed_locks_for_both_arches_and_pythons():
    pinned = load_profile("vllm-ascend-0.18.0").router
    for arch in ("x86_64", "aarch64"):
        for python in ("3.11", "3.9"):
            lock = router_lock(pinned, arch, python)
            assert lock is not None and lock.pins["vllm-router"] == pinned.vllm_router, (arch, python)
            assert {"setproctitle", "aiohttp", "orjson", "uvicorn", "fastapi", "requests"} <= lock.pins.keys()
    assert router_lock(pinned, "x86_64", "3.12") is None  # none committed: the gateway installs the pin alone
    assert {load_profile(name).router for name in available_profiles()} == {pinned}  # every profile pins it


def test_a_site_lock_without_the_pin_or_a_hash_is_refused(tmp_path):
    pinned = load_profile("lab").router
    name = router_lock_path(pinned, Platform("x86_64", "3.11", ROUTER_GLIBC)).name
    (tmp_path / name).write_text("fastapi==0.1 \\\n    --hash=sha256:" + "0" * 64 + "\n")
    with pytest.raises(FleetError, match="does not pin vllm-router==0.1.17"):
        router_lock(pinned, "x86_64", "3.11", tmp_path)
    (tmp_path / name).write_text("vllm-router==0.1.17\n")
    with pytest.raises(FleetError, match="vllm-router==0.1.17 has no sha256"):
        router_lock(pinned, "x86_64", "3.11", tmp_path)


def test_a_bundle_without_the_gateways_router_says_what_it_has(tmp_path):
    (tmp_path / MANIFEST).write_text(json.dumps({"routers": [{"vllm_router": "0.1.17", "arch": "x86_64",
                                                             "python": "3.11", "lock": "locks/x"}]}))
    assert router_coverage_refusal(tmp_path, "0.1.17", "x86_64", "3.11") is None
    refusal = router_coverage_refusal(tmp_path, "0.1.17", "aarch64", "3.11")
    assert refusal.startswith(f"bundle {tmp_path} has no vllm-router 0.1.17 for aarch64 Python 3.11 (it has "
                              "vllm-router 0.1.17 x86_64 Python 3.11)")


def test_a_bundle_carries_the_router_of_each_cache_aware_gateway_for_each_arch_and_gateway_python(tmp_path,
                                                                                                monkeypatch):
    fetched = []
    monkeypatch.setattr("ascend_fleet.fleet.bundle.download_lock_files",
                        lambda what, lock, platform, urls: fetched.append((lock.name, platform.python, urls)))
    (tmp_path / "locks").mkdir()
    gateways = [node_config({"profile": "lab", "pip_index_url": "http://mirror:8080/simple",
                             "gateway": {"routing": {"policy": policy}}}, name)
                for name, policy in (("gw1", "cache_aware"), ("gw2", "cache_aware"), ("gw3", "least_conn"))]
    entries = bundle_routers(State(), gateways, ["x86_64"], [node_os("Debian", "11"), node_os("Debian", "12")],
                             tmp_path, progress=lambda line: None)
    assert [(e["arch"], e["python"], e["lock"]) for e in entries] == [
        ("x86_64", "3.11", "locks/vllm-router-0.1.17.x86_64-py3.11.txt"),
        ("x86_64", "3.9", "locks/vllm-router-0.1.17.x86_64-py3.9.txt")]  # once for both gateways
    assert fetched == [("vllm-router-0.1.17.x86_64-py3.11.txt", "3.11", ["http://mirror:8080/simple"]),
                       ("vllm-router-0.1.17.x86_64-py3.9.txt", "3.9", ["http://mirror:8080/simple"])]
    committed = router_lock(load_profile("lab").router, "x86_64", "3.9")
    assert (tmp_path / "locks" / "vllm-router-0.1.17.x86_64-py3.9.txt").read_text() == committed.text
    assert bundle_routers(State(), gateways[2:], None, [], tmp_path, progress=lambda line: None) == []
