"""`ascend-fleet load` against a gateway that does not serve (a refused port, a server answering 503,
one that never answers): failed requests back off, a load that never succeeds stops in one line,
and Ctrl-C stops it at once with a line saying what it sent."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ascend_fleet.loadgen import BACKOFF_MAX_SECONDS, backoff_seconds
from tests.loopback import loopback_server, refused_port, write_fleet

CLI = Path(sys.executable).with_name("ascend-fleet")


def run_load(inventory: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(CLI), "load", str(inventory), *args], capture_output=True, text=True,
                          cwd=inventory.parent, timeout=60)


def test_a_client_waits_twice_as_long_after_each_failure_up_to_the_cap():
    assert [backoff_seconds(n) for n in range(7)] == [0, 0.1, 0.2, 0.4, 0.8, 1.6, BACKOFF_MAX_SECONDS]
    assert backoff_seconds(50) == BACKOFF_MAX_SECONDS


@pytest.mark.parametrize("gateway", ["refused", "503"])
def test_a_gateway_that_does_not_serve_gets_a_few_requests_a_second(tmp_path, gateway):
    """Before: 5,788 requests in 5 s against a refused port. Now each of the 4 clients sends at
    0, 0.1, 0.3, 0.7 and 1.5 s (and 3.1 s), about 5 requests in 3 s."""
    def load(port: int) -> subprocess.CompletedProcess:
        return run_load(write_fleet(tmp_path, 22, port), "--duration", "3", "--give-up-after", "0", "--json")

    if gateway == "refused":
        result, expected_error = load(refused_port()), "ConnectionError: Connection refused"
    else:
        with loopback_server("503") as (port, _):
            result, expected_error = load(port), "HTTP 503: <html><body><h1>503 Service Temporarily Unavailable"
    summary = json.loads(result.stdout)
    assert 4 <= summary["requests"] <= 4 * 6 and summary["errors"] == summary["requests"], summary
    assert result.returncode == 1 and summary["first_errors"][0].split(": ", 1)[1].startswith(expected_error)


def test_a_load_where_every_request_fails_stops_in_one_line_naming_the_gateway(tmp_path):
    port = refused_port()
    started = time.monotonic()
    result = run_load(write_fleet(tmp_path, 22, port), "--duration", "60", "--give-up-after", "2")
    assert time.monotonic() - started < 10 and result.returncode == 1 and result.stdout == ""
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith(f"error: load: every request through http://127.0.0.1:{port} failed for 2s ("), \
        result.stderr
    assert "last: ConnectionError: Connection refused); stopped. Is the gateway up?" in result.stderr


@pytest.mark.parametrize("mode", ["503", "silent"], ids=["answering 503", "never answering"])
def test_ctrl_c_stops_the_load_at_once_with_a_line_saying_what_it_sent(tmp_path, mode):
    """Before: Ctrl-C killed one client (pyinfra's gevent runs the clients as greenlets) and the
    load went on. A server that never answers holds every request: Ctrl-C does not wait for them."""
    with loopback_server(mode) as (port, server):
        load = subprocess.Popen([str(CLI), "load", str(write_fleet(tmp_path, 22, port)), "--duration", "60"],
                                cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        server.stdout.readline()  # the first request arrived: the load runs
        time.sleep(0.5)
        load.send_signal(signal.SIGINT)
        sent = time.monotonic()
        stdout, stderr = load.communicate(timeout=10)
    assert time.monotonic() - sent < 2 and load.returncode == 130, stderr
    lines = (stdout + stderr).splitlines()
    assert len(lines) == 1 and lines[0].startswith("load interrupted (Ctrl-C) after "), lines
    assert f"through http://127.0.0.1:{port}, " in lines[0]
    if mode == "silent":
        assert lines[0].endswith("; 4 in flight not counted") and " 0 requests " in lines[0], lines[0]
    else:
        assert " failed (last: HTTP 503: " in lines[0], lines[0]
