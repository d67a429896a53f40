"""Read pyinfra facts from many hosts at once, outside a deploy, for commands such as `status`.

Each host gets one SSH connection (paramiko, with the inventory's ssh_* data, as pyinfra
would connect) and one shell round trip that runs every fact's command; each output is
handed to the same fact's process(), so a node's state is parsed exactly as a deploy
parses it. A host that cannot be reached is a HostFacts with an error, never an exception: one
line naming its address, why in a few words and what to do. paramiko's own log of the failure
(a traceback from its transport thread) is not printed.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import paramiko
from pyinfra.api import FactBase

CONNECT_TIMEOUT_SECONDS = 10
COMMAND_TIMEOUT_SECONDS = 60
MAX_PARALLEL_HOSTS = 32
# paramiko logs a failed handshake from its transport thread, traceback and all (Python's last-resort
# handler prints it when nothing is configured); the exception that follows says the same, and we
# print that, once. Our connections log here, where nothing is printed.
QUIET_LOG_CHANNEL = "ascend_fleet.remote.paramiko"
logging.getLogger(QUIET_LOG_CHANNEL).addHandler(logging.NullHandler())
logging.getLogger(QUIET_LOG_CHANNEL).propagate = False


@dataclass(frozen=True)
class FactQuery:
    """One fact to read: its class and the arguments of its command()."""

    fact: type[FactBase]
    arguments: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class HostFacts:
    host: str
    facts: dict[str, Any] = field(default_factory=dict)
    fact_errors: dict[str, str] = field(default_factory=dict)
    error: str | None = None  # why the host could not be read at all

    @property
    def reachable(self) -> bool:
        return self.error is None


def facts_of(queries: Mapping[str, FactQuery]) -> dict[str, FactBase]:
    """One fact object per query: a fact may keep state from command() for process() (FileContents does)."""
    return {name: query.fact() for name, query in queries.items()}


def fact_script(queries: Mapping[str, FactQuery], facts: Mapping[str, FactBase], marker: str) -> str:
    """One shell script running every fact command in its own subshell, each output after a marker line."""
    parts = []
    for name, query in queries.items():
        command = facts[name].command(**query.arguments)
        text = command if isinstance(command, str) else command.get_raw_value()
        parts.append(f"echo {marker}{name}; ( {text}\n) 2>/dev/null")
    return "\n".join(parts) + "\n"


def split_outputs(output: str, marker: str) -> dict[str, list[str]]:
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in output.splitlines():
        if line.startswith(marker):
            current = sections.setdefault(line[len(marker):], [])
        elif current is not None:
            current.append(line)
    return sections


def process_outputs(facts: Mapping[str, FactBase], sections: Mapping[str, list[str]]) -> tuple[dict, dict]:
    """Each fact's value as pyinfra would give it (default() for no output, else process()),
    and {fact: error} for outputs its process() could not read (the value is then None)."""
    values, errors = {}, {}
    for name, fact in facts.items():
        lines = sections.get(name, [])
        try:
            values[name] = fact.process(lines) if any(line.strip() for line in lines) else fact.default()
        except (ValueError, IndexError, KeyError) as exc:
            values[name], errors[name] = None, f"{type(exc).__name__}: {exc}"
    return values, errors


def ssh_address(host: str, data: Mapping[str, Any]) -> tuple[str, int]:
    return data.get("ssh_hostname") or host, int(data.get("ssh_port") or 22)


def connection_problem(address: str, exc: BaseException) -> str:
    """Why SSH to address failed, in a few words, and what to do: one line."""
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError) and exc.errors:
        exc = next(iter(exc.errors.values()))  # one per address the name resolved to; the first says it
    if isinstance(exc, paramiko.BadHostKeyException):
        why, todo = "its host key is not the one known_hosts holds", ("if it was reinstalled, check its new key "
                                                                      "on its console and replace the old one")
    elif isinstance(exc, paramiko.AuthenticationException):
        why, todo = "login refused", "check ssh_user and ssh_key (or ssh_password) in the inventory"
    elif isinstance(exc, paramiko.SSHException) and "known_hosts" in str(exc):
        why, todo = "its host key is not in known_hosts", ("add it (ssh-keyscan, checked on its console) to "
                                                           "the inventory's ssh_known_hosts_file")
    elif isinstance(exc, paramiko.SSHException) and "banner" in str(exc):
        why, todo = "no SSH server answered there", "check that sshd runs on it and ssh_port is right"
    elif isinstance(exc, ConnectionRefusedError):
        why, todo = "connection refused", "check that the host is up, sshd runs on it and ssh_port is right"
    elif isinstance(exc, (socket.timeout, TimeoutError)):
        why, todo = f"no answer within {CONNECT_TIMEOUT_SECONDS}s", "check that the host is up and reachable from here"
    elif isinstance(exc, socket.gaierror):
        why, todo = "the name does not resolve", "check ssh_hostname (or the host's name) in the inventory"
    else:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else f"{type(exc).__name__}: {exc}"
        todo = "check that the host is up and reachable from here"
    return f"cannot connect over SSH to {address}: {why}; {todo}"


def _connect(host: str, data: Mapping[str, Any]) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    client.set_log_channel(QUIET_LOG_CHANNEL)
    known_hosts = data.get("ssh_known_hosts_file")
    if known_hosts:
        client.load_host_keys(os.path.expanduser(known_hosts))
    else:
        client.load_system_host_keys()
    # pyinfra's default is accept-new; a status read never records a key, so only "yes" is stricter here.
    strict = str(data.get("ssh_strict_host_key_checking", "accept-new")).lower()
    client.set_missing_host_key_policy(paramiko.RejectPolicy() if strict == "yes" else paramiko.AutoAddPolicy())
    key = data.get("ssh_key")
    hostname, port = ssh_address(host, data)
    client.connect(
        hostname=hostname,
        port=port,
        username=data.get("ssh_user"),
        key_filename=os.path.expanduser(key) if key else None,
        passphrase=data.get("ssh_key_password"),
        password=data.get("ssh_password"),
        look_for_keys=not key,
        timeout=CONNECT_TIMEOUT_SECONDS,
        banner_timeout=CONNECT_TIMEOUT_SECONDS,
        auth_timeout=CONNECT_TIMEOUT_SECONDS,
    )
    return client


def read_host_facts(host: str, data: Mapping[str, Any], queries: Mapping[str, FactQuery]) -> HostFacts:
    """Every fact of one host in one SSH round trip."""
    marker = f"@@ascend-fleet-{uuid.uuid4().hex}:"
    facts = facts_of(queries)
    try:
        client = _connect(host, data)
    except (OSError, EOFError, paramiko.SSHException) as exc:
        hostname, port = ssh_address(host, data)
        return HostFacts(host, error=connection_problem(f"{hostname}:{port}", exc))
    try:
        # No exec_command: its stdin file's __del__ takes the channel's lock, and when that runs at
        # the exit of a process pyinfra's gevent patched (a rollout that stops at a gate), it
        # prints "RuntimeError: greenlet is being finalized" after the command's last line.
        channel = client.get_transport().open_session(timeout=COMMAND_TIMEOUT_SECONDS)
        channel.settimeout(COMMAND_TIMEOUT_SECONDS)
        channel.exec_command(fact_script(queries, facts, marker))
        output = channel.makefile("rb").read().decode(errors="replace")
    except (OSError, EOFError, paramiko.SSHException) as exc:
        return HostFacts(host, error=f"reading facts failed: {exc or type(exc).__name__}")
    finally:
        client.close()
    values, errors = process_outputs(facts, split_outputs(output, marker))
    return HostFacts(host, values, errors)


def read_fleet_facts(hosts: Mapping[str, tuple[Mapping[str, Any], Mapping[str, FactQuery]]],
                     on_read: Callable[[str], None] | None = None) -> dict[str, HostFacts]:
    """{host: (ssh data, queries)} -> {host: HostFacts}, every host read at the same time;
    on_read(host) as each one is read."""
    if not hosts:
        return {}
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL_HOSTS, len(hosts))) as pool:
        futures = {pool.submit(read_host_facts, name, data, queries): name for name, (data, queries) in hosts.items()}
        for future in as_completed(futures):
            if on_read:
                on_read(futures[future])
        return {name: future.result() for future, name in futures.items()}


def tunnel_argv(host: str, data: Mapping[str, Any], local_port: int, remote_port: int) -> list[str]:
    """OpenSSH's `ssh -N -L` forwarding 127.0.0.1:local_port to the host's 127.0.0.1:remote_port, with
    the inventory's ssh_* data (a dict, or pyinfra's HostData: read with .get only)."""
    known_hosts, key, user = data.get("ssh_known_hosts_file"), data.get("ssh_key"), data.get("ssh_user")
    address, port = ssh_address(host, data)
    argv = ["ssh", "-N", "-o", "ExitOnForwardFailure=yes", "-o", "BatchMode=yes",
            "-o", f"ConnectTimeout={CONNECT_TIMEOUT_SECONDS}",
            "-o", f"StrictHostKeyChecking={data.get('ssh_strict_host_key_checking') or 'accept-new'}",
            "-L", f"127.0.0.1:{local_port}:127.0.0.1:{remote_port}", "-p", str(port)]
    if known_hosts:
        argv += ["-o", f"UserKnownHostsFile={os.path.expanduser(known_hosts)}"]
    if key:
        argv += ["-i", os.path.expanduser(key)]
    return [*argv, f"{user}@{address}" if user else str(address)]


@contextmanager
def ssh_tunnel(host: str, data: Mapping[str, Any], remote_port: int, wait_seconds: float = 15):
    """A local port forwarded to 127.0.0.1:remote_port on the host (tunnel_argv), for a client that
    must reach a port the host's firewall keeps to itself (an instance port: loopback may reach it).
    Yields the local port."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        local_port = probe.getsockname()[1]
    tunnel = subprocess.Popen(tunnel_argv(host, data, local_port, remote_port), stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + wait_seconds
        while True:
            if tunnel.poll() is not None:
                raise OSError(f"ssh tunnel to {host}:{remote_port} ended: "
                              f"{tunnel.stderr.read().decode(errors='replace').strip()[-300:]}")
            try:
                socket.create_connection(("127.0.0.1", local_port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise OSError(f"ssh tunnel to {host}:{remote_port} not up after {wait_seconds:g}s") from None
                time.sleep(0.2)
        yield local_port
    finally:
        tunnel.terminate()
        tunnel.wait(timeout=10)
