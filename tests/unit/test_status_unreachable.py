"""`ascend-fleet status` of hosts it cannot read (a refused port, a port that closes at once, one that
accepts and says nothing): one line per host naming its address, why and what to do; no traceback."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import paramiko
import pytest

from ascend_fleet.control.status import status
from ascend_fleet.core import remote
from ascend_fleet.fleet.plan import load_inventory
from tests.loopback import loopback_server, refused_port, write_fleet

HOSTS = ("node1", "node2", "gw")


def host_lines(output: str) -> dict[str, str]:
    """The lines after the table that name a host: {host: the rest of its line}."""
    return {line.split(": ", 1)[0]: line.split(": ", 1)[1] for line in output.splitlines()
            if line.split(": ", 1)[0] in HOSTS}


@pytest.mark.parametrize("mode, why", [
    ("refused", "connection refused; check that the host is up, sshd runs on it and ssh_port is right"),
    ("closing", "no SSH server answered there; check that sshd runs on it and ssh_port is right"),
], ids=["port refusing", "port closing at once"])
def test_unreachable_hosts_are_one_line_each_without_a_traceback(tmp_path, mode, why):
    """Before: paramiko's 21-line traceback per host when the port closed at once (its transport
    thread logs it), and a line per instance besides the host's."""
    def read(port: int) -> subprocess.CompletedProcess:
        return subprocess.run([str(Path(sys.executable).with_name("ascend-fleet")), "status",
                               str(write_fleet(tmp_path, port))], cwd=tmp_path, capture_output=True, text=True,
                              timeout=60)

    if mode == "refused":
        port = refused_port()
        result = read(port)
    else:
        with loopback_server(mode) as (port, _):
            result = read(port)
    assert result.returncode == 1 and "Traceback" not in result.stdout + result.stderr, result.stderr
    assert result.stderr == ""  # not a terminal: no progress line either
    assert host_lines(result.stdout) == {host: f"cannot connect over SSH to 127.0.0.1:{port}: {why}" for host in HOSTS}


def test_a_host_that_accepts_and_says_nothing_is_one_line_after_the_connect_timeout(tmp_path, monkeypatch, capfd):
    monkeypatch.setattr(remote, "CONNECT_TIMEOUT_SECONDS", 1)
    monkeypatch.chdir(tmp_path)
    with loopback_server("silent") as (port, _):
        started = time.monotonic()
        assert status(write_fleet(tmp_path, port), as_json=False, watch=False, interval=5) == 1
    output = capfd.readouterr()
    assert time.monotonic() - started < 5 and "Traceback" not in output.out + output.err
    assert host_lines(output.out) == {
        host: f"cannot connect over SSH to 127.0.0.1:{port}: no SSH server answered there; check that sshd runs "
              "on it and ssh_port is right" for host in HOSTS}


def test_hosts_that_accept_and_hang_cost_one_timeout_together_not_one_per_round(monkeypatch):
    """Before: hosts were read `parallel` at a time, so 40 silent hosts 2 at a time cost 20 connect timeouts
    (a thousand, 200 at a time, five: 77 s with the table). Now every host is awaited at once."""
    monkeypatch.setattr(remote, "CONNECT_TIMEOUT_SECONDS", 1)
    with loopback_server("silent") as (port, _):
        hosts = {f"node{n}": ({"ssh_hostname": "127.0.0.1", "ssh_port": port}, {}) for n in range(40)}
        started = time.monotonic()
        read = remote.read_fleet_facts(hosts, parallel=2)
    assert time.monotonic() - started < 4
    assert {facts.error for facts in read.values()} == {
        f"cannot connect over SSH to 127.0.0.1:{port}: no SSH server answered there; check that sshd runs on it and "
        "ssh_port is right"}


def test_a_long_reading_says_how_far_it_got_on_stderr_when_not_on_a_terminal(tmp_path, monkeypatch, capfd):
    """A fleet of hundreds read into a log: a line every few seconds, so the log shows the read is not stuck."""
    from ascend_fleet.control import status as status_module

    monkeypatch.setattr(remote, "CONNECT_TIMEOUT_SECONDS", 2)
    monkeypatch.setattr(status_module, "PROGRESS_SECONDS", 0.5)
    monkeypatch.chdir(tmp_path)
    with loopback_server("silent") as (port, _):
        status(write_fleet(tmp_path, port), as_json=False, watch=False, interval=5)
    progress = capfd.readouterr().err.splitlines()
    assert progress and progress[0].startswith("status: 0 of 3 hosts read in "), progress
    assert progress[0].endswith("s; reading hosts over SSH, waiting for node1, node2, gw"), progress


def test_why_ssh_failed_is_said_in_a_few_words_with_what_to_do():
    cases = {
        socket.gaierror(-2, "Name or service not known"): "the name does not resolve; check ssh_hostname",
        TimeoutError("timed out"): f"no answer within {remote.CONNECT_TIMEOUT_SECONDS}s; check that the host is up",
        paramiko.AuthenticationException("Authentication failed."): "login refused; check ssh_user and ssh_key",
        paramiko.SSHException("Server '10.0.0.2' not found in known_hosts"): "its host key is not in known_hosts; add",
        OSError(113, "No route to host"): "No route to host; check that the host is up",
        paramiko.ssh_exception.NoValidConnectionsError({("10.0.0.2", 22): ConnectionRefusedError(111, "refused")}):
            "connection refused; ",
    }
    for exc, said in cases.items():
        expected = f"cannot connect over SSH to 10.0.0.2:22: {said}"
        assert remote.connection_problem("10.0.0.2:22", exc).startswith(expected)


@pytest.mark.parametrize("mode", ["refused", "silent"], ids=["between readings", "during a reading"])
def test_ctrl_c_stops_status_watch_without_gevents_report(tmp_path, mode):
    """Before: during a reading (hosts that accept and say nothing), gevent printed the KeyboardInterrupt it
    raised in a greenlet reading a host, and the loop went on. Now Ctrl-C ends the watch after the reading in
    progress (at most the SSH connect timeout), exit 0. The Ctrl-C waits for the watch's own sign that it
    reads (a first table; a host contacted), not a fixed time: a busy machine imports for seconds."""
    import contextlib
    import signal

    with (loopback_server("silent") if mode == "silent" else contextlib.nullcontext((refused_port(), None))) as (
            port, server):
        watching = subprocess.Popen([str(Path(sys.executable).with_name("ascend-fleet")), "status", "--watch",
                                     "--interval", "0.2", str(write_fleet(tmp_path, port))],
                                    cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        first = (server or watching).stdout.readline()  # the server's "connection", or the table's first line
        watching.send_signal(signal.SIGINT)
        started = time.monotonic()
        out, err = watching.communicate(timeout=60)
    assert first and watching.returncode == 0, err
    assert time.monotonic() - started < remote.CONNECT_TIMEOUT_SECONDS + 5
    assert "KeyboardInterrupt" not in out + err and "Traceback" not in out + err, err


def test_ctrl_c_while_the_watch_loads_the_inventory_ends_it_before_any_reading(tmp_path, monkeypatch, capfd):
    """Before: loading imports pyinfra's CLI, which patches for gevent; a Ctrl-C there ended in a traceback
    ("cannot release un-acquired lock") or was lost, and the watch ran on (CI: 60 s, then killed)."""
    import os
    import signal

    from ascend_fleet.control import status as status_module

    def interrupted_load(inventory: Path):
        os.kill(os.getpid(), signal.SIGINT)
        return load_inventory(inventory)

    def not_caught(*_):
        raise AssertionError("the Ctrl-C reached past status --watch")  # not pytest's own KeyboardInterrupt

    monkeypatch.setattr(status_module, "load_inventory", interrupted_load)
    monkeypatch.chdir(tmp_path)
    previous = signal.signal(signal.SIGINT, not_caught)
    try:
        assert status(write_fleet(tmp_path, refused_port()), as_json=False, watch=True, interval=0.2) == 0
    finally:
        signal.signal(signal.SIGINT, previous)
    assert capfd.readouterr().out == ""  # no reading


def test_ctrl_c_before_a_command_takes_over_is_one_word_and_exit_130(monkeypatch, capsys):
    """Ctrl-C while the command's modules import (seconds on a busy control machine): "aborted", not a
    traceback through importlib."""
    from ascend_fleet import cli

    def interrupted(name):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_app", interrupted)
    monkeypatch.setattr(sys, "argv", ["ascend-fleet", "status", "fleet.py"])
    with pytest.raises(SystemExit) as exited:
        try:
            cli.main()
        except KeyboardInterrupt:  # not let through to pytest, which would end the whole run
            pytest.fail("the Ctrl-C went through main() as a traceback")
    assert (exited.value.code, capsys.readouterr().err) == (130, "aborted\n")


def test_limit_reads_the_hosts_it_names_and_the_gateways_and_a_limit_matching_nothing_is_one_line(tmp_path):
    """A fleet of hundreds is read in part with pyinfra's --limit (a group, a name, a pattern); the gateways
    are read too, as they say what is routed."""
    inventory = write_fleet(tmp_path, refused_port())

    def read(*limit: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(Path(sys.executable).with_name("ascend-fleet")), "status", str(inventory), *limit],
                              cwd=tmp_path, capture_output=True, text=True, timeout=60)

    assert set(host_lines(read("--limit", "canary").stdout)) == {"node1", "gw"}
    assert set(host_lines(read("--limit", "node*").stdout)) == {"node1", "node2", "gw"}
    refused = read("--limit", "nodes")
    assert refused.returncode == 2 and refused.stdout == ""
    assert " ".join(refused.stderr.split()) == (
        f"error: {inventory}: --limit nodes: no group or host of the inventory matches it; "
        "groups: canary, gateway, loopback, wave1, workers")
