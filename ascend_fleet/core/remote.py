"""SSH outside a deploy, made as a deploy makes it: facts read from many hosts at once (`status`, the
rollout's gates), one script on one host (`run_script`), a local port forwarded to a host's loopback
(`ssh_tunnel`, for bench and tune).

Every connection is pyinfra's own SSH client with the keyword arguments pyinfra's SSH connector builds
from the host's data (`ssh_arguments`), so ssh_config_file, ~/.ssh/config, ProxyJump/ProxyCommand, keys
and known hosts act as in `pyinfra INVENTORY deploys/...`: a fleet behind a bastion is read through it.
Each host gets one connection and one shell round trip that runs every fact's command; each output is
handed to the same fact's process(), so a node's state is parsed exactly as a deploy
parses it. A host that cannot be reached is a HostFacts with an error, never an exception: one
line naming its address, why in a few words and what to do. paramiko's own log of the failure
(a traceback from its transport thread) is not printed.
"""

from __future__ import annotations

import errno
import logging
import resource
import select
import selectors
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import paramiko
from pyinfra.api import Config, FactBase, Inventory, State
from pyinfra.api.exceptions import PyinfraError
from pyinfra.connectors.sshuserclient import SSHClient
from pyinfra.connectors.sshuserclient.client import get_ssh_config

CONNECT_TIMEOUT_SECONDS = 10
COMMAND_TIMEOUT_SECONDS = 60
# Hosts read at once once they answered (answering_sockets): each costs two threads (ours and
# paramiko's) and a key exchange, which is work here; 200 finish their handshakes well within the
# connect timeout on a 2-core control machine. The wait for an answer is not bounded by it: every
# host is awaited at once, so hosts that accept and then hang cost one timeout together, not one per
# round of 200.
MAX_PARALLEL_HOSTS = 200
# Sockets kept open beside the answers awaited (the process's own files, the reads in flight).
RESERVED_FILES = 256
# paramiko logs a failed handshake from its transport thread, traceback and all (Python's last-resort
# handler prints it when nothing is configured); the exception that follows says the same, and we
# print that, once. Our connections log here, where nothing is printed.
QUIET_LOG_CHANNEL = "ascend_fleet.core.remote.paramiko"
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


def ssh_arguments(hosts: Mapping[str, Mapping[str, Any]]) -> dict[str, tuple[str, dict] | BaseException]:
    """{host: (hostname, keyword arguments of pyinfra's SSHClient.connect)} as pyinfra's SSH connector builds
    them from each host's data (ssh_config_file and its ProxyJump/ProxyCommand, keys, known hosts, user, port),
    or the error that stopped it (an unreadable ssh_key): a deploy and these reads connect the same way."""
    inventory = Inventory(([(name, _plain(data)) for name, data in hosts.items()], {}))
    State(inventory, Config(CONNECT_TIMEOUT=CONNECT_TIMEOUT_SECONDS))
    arguments: dict[str, tuple[str, dict] | BaseException] = {}
    for host in inventory:
        try:
            kwargs = host.connector.make_paramiko_kwargs()
        except (PyinfraError, OSError, paramiko.SSHException) as exc:
            arguments[host.name] = exc
            continue
        arguments[host.name] = (kwargs.pop("hostname"), kwargs)
    return arguments


def _plain(data: Mapping[str, Any]) -> dict:
    """Host data as a dict: pyinfra's HostData (read with .get only) or a mapping."""
    return data.dict() if hasattr(data, "dict") else dict(data)


def _connect(hostname: str, kwargs: dict) -> SSHClient:
    client = SSHClient()
    client.set_log_channel(QUIET_LOG_CHANNEL)
    client.connect(hostname, banner_timeout=CONNECT_TIMEOUT_SECONDS, auth_timeout=CONNECT_TIMEOUT_SECONDS, **kwargs)
    return client


@contextmanager
def connected(host: str, data: Mapping[str, Any], arguments: tuple[str, dict] | BaseException | None = None):
    """An SSH connection to the host as pyinfra makes it (ssh_arguments, or the arguments given), closed after;
    a failure is one OSError line (connection_problem)."""
    arguments = arguments or ssh_arguments({host: data})[host]
    hostname, port = ssh_address(host, data)
    if isinstance(arguments, BaseException):
        raise OSError(f"cannot connect over SSH to {hostname}:{port}: {arguments}") from None
    try:
        client = _connect(*arguments)
    except (OSError, EOFError, paramiko.SSHException) as exc:
        raise OSError(connection_problem(f"{hostname}:{port}", exc)) from None
    try:
        yield client
    finally:
        client.close()


def _run(client: SSHClient, script: str, timeout: float) -> tuple[int, str]:
    # No exec_command: its stdin file's __del__ takes the channel's lock, and when that runs at
    # the exit of a process pyinfra's gevent patched (a rollout that stops at a gate), it
    # prints "RuntimeError: greenlet is being finalized" after the command's last line.
    channel = client.get_transport().open_session(timeout=timeout)
    channel.settimeout(timeout)
    channel.exec_command(script)
    output = channel.makefile("rb").read().decode(errors="replace")
    return channel.recv_exit_status(), output


@dataclass(frozen=True)
class RemoteRun:
    status: int
    output: str  # stdout; stderr is the script's to redirect


def run_script(host: str, data: Mapping[str, Any], script: str,
               timeout: float = COMMAND_TIMEOUT_SECONDS) -> RemoteRun:
    """One shell script on one host, over pyinfra's SSH; OSError (one line) when the host cannot be reached
    or the script does not finish within timeout seconds."""
    with connected(host, data) as client:
        try:
            return RemoteRun(*_run(client, script, timeout))
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise OSError(f"{host}: running a script over SSH failed: {exc or type(exc).__name__}") from None


def read_host_facts(host: str, data: Mapping[str, Any], queries: Mapping[str, FactQuery],
                    arguments: tuple[str, dict] | BaseException | None = None) -> HostFacts:
    """Every fact of one host in one SSH round trip (arguments: ssh_arguments' for the host)."""
    marker = f"@@ascend-fleet-{uuid.uuid4().hex}:"
    facts = facts_of(queries)
    try:
        with connected(host, data, arguments) as client:
            try:
                _, output = _run(client, fact_script(queries, facts, marker), COMMAND_TIMEOUT_SECONDS)
            except (OSError, EOFError, paramiko.SSHException) as exc:
                return HostFacts(host, error=f"reading facts failed: {exc or type(exc).__name__}")
    except OSError as exc:
        return HostFacts(host, error=str(exc))
    values, errors = process_outputs(facts, split_outputs(output, marker))
    return HostFacts(host, values, errors)


def read_fleet_facts(hosts: Mapping[str, tuple[Mapping[str, Any], Mapping[str, FactQuery]]],
                     on_read: Callable[[str], None] | None = None,
                     parallel: int = MAX_PARALLEL_HOSTS) -> dict[str, HostFacts]:
    """{host: (ssh data, queries)} -> {host: HostFacts}: every host reached directly awaited at once
    (answering_sockets), then `parallel` of those that answered (and those behind a jump host) read at a
    time; on_read(host) as each one is read."""
    if not hosts:
        return {}
    arguments = ssh_arguments({name: data for name, (data, _) in hosts.items()})
    direct = {name: target for name, arguments_of in arguments.items()
              if (target := direct_target(arguments_of)) is not None}
    answered, silent = answering_sockets(direct, CONNECT_TIMEOUT_SECONDS)
    read: dict[str, HostFacts] = {}
    for name, exc in silent.items():
        address, port = ssh_address(name, hosts[name][0])
        read[name] = HostFacts(name, error=connection_problem(f"{address}:{port}", exc))
        if on_read:
            on_read(name)
    for name, sock in answered.items():
        hostname, kwargs = arguments[name]
        arguments[name] = (hostname, {**kwargs, "sock": sock})
    left = {name: plan for name, plan in hosts.items() if name not in read}
    if left:
        with ThreadPoolExecutor(max_workers=min(parallel, len(left))) as pool:
            futures = {pool.submit(read_host_facts, name, data, queries, arguments[name]): name
                       for name, (data, queries) in left.items()}
            for future in as_completed(futures):
                if on_read:
                    on_read(futures[future])
            read |= {name: future.result() for future, name in futures.items()}
    return {name: read[name] for name in hosts}


def direct_target(arguments: tuple[str, dict] | BaseException) -> tuple[str, int] | None:
    """(address, port) pyinfra's client connects to for these arguments, as its ssh config lookup makes them
    (HostName, Port), or None when it goes through a jump host (ProxyJump, ProxyCommand) or cannot connect."""
    if isinstance(arguments, BaseException):
        return None
    hostname, kwargs = arguments
    config = get_ssh_config(kwargs.get("_pyinfra_ssh_config_file"))
    found = config.lookup(hostname) if config else {}
    if "proxyjump" in found or "proxycommand" in found:
        return None
    return found.get("hostname", hostname), int(found["port"]) if "port" in found else int(kwargs.get("port", 22))


def answering_sockets(targets: Mapping[str, tuple[str, int]], timeout: float,
                      ) -> tuple[dict[str, socket.socket], dict[str, BaseException]]:
    """Connect to every (address, port) at once and wait, until one deadline `timeout` seconds away, for each
    to speak (an SSH server sends its banner first) or close. Returns ({host: its connected socket, for SSH to
    go on over}, {host: why it was silent until the deadline}); a host whose connect failed at once (refused,
    no route, a name that does not resolve) is in neither: its own connect says why, at once."""
    answered: dict[str, socket.socket] = {}
    silent: dict[str, BaseException] = {}
    batch = max(1, open_files_allowed() - RESERVED_FILES)
    names = list(targets)
    for start in range(0, len(names), batch):
        pending: dict[socket.socket, str] = {}
        with selectors.DefaultSelector() as selector:
            for name in names[start:start + batch]:
                sock = _connecting(*targets[name])
                if sock is not None:
                    pending[sock] = name
                    selector.register(sock, selectors.EVENT_WRITE)
            deadline = time.monotonic() + timeout
            while pending and (left := deadline - time.monotonic()) > 0:
                for key, events in selector.select(left):
                    sock = key.fileobj
                    if events & selectors.EVENT_WRITE:
                        if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):  # refused, unreachable
                            selector.unregister(sock)
                            sock.close()
                            del pending[sock]
                        else:
                            selector.modify(sock, selectors.EVENT_READ)
                    else:
                        selector.unregister(sock)
                        sock.setblocking(True)
                        answered[pending.pop(sock)] = sock
            for sock, name in pending.items():
                connected_yet = selector.get_key(sock).events == selectors.EVENT_READ
                silent[name] = (paramiko.SSHException("Error reading SSH protocol banner") if connected_yet
                                else TimeoutError("timed out"))
                sock.close()
    return answered, silent


def _connecting(address: str, port: int) -> socket.socket | None:
    """A non-blocking socket connecting to address:port, or None when that fails at once."""
    try:
        family, kind, proto, _, where = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
    except OSError:
        return None
    sock.setblocking(False)
    if sock.connect_ex(where) not in (0, errno.EINPROGRESS):
        sock.close()
        return None
    return sock


def open_files_allowed() -> int:
    """How many files this process may open: its soft limit raised to the hard one (often 1024 of
    1048576), so a thousand hosts can be awaited at once."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


@contextmanager
def ssh_tunnel(host: str, data: Mapping[str, Any], remote_port: int):
    """A local port forwarded to 127.0.0.1:remote_port on the host over one SSH connection made as pyinfra
    makes it (through the inventory's bastion, if any), for a client that must reach a port the host's
    firewall keeps to itself (an instance port: loopback may reach it). Yields the local port; OSError
    (one line) when the host cannot be reached or nothing listens on the port there."""
    with connected(host, data) as client:
        transport = client.get_transport()
        try:
            transport.open_channel("direct-tcpip", ("127.0.0.1", remote_port), ("127.0.0.1", 0),
                                   timeout=CONNECT_TIMEOUT_SECONDS).close()
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise OSError(f"ssh tunnel to {host}:{remote_port}: {exc or type(exc).__name__}; check that the "
                          "instance runs (`ascend-fleet status`)") from None
        with socket.socket() as listener:
            listener.bind(("127.0.0.1", 0))
            listener.listen(64)
            listener.settimeout(0.5)
            stopped = threading.Event()
            accepting = threading.Thread(target=_forward_connections, daemon=True,
                                         args=(listener, transport, remote_port, stopped))
            accepting.start()
            try:
                yield listener.getsockname()[1]
            finally:
                stopped.set()
                accepting.join(timeout=5)


def _forward_connections(listener: socket.socket, transport: paramiko.Transport, remote_port: int,
                         stopped: threading.Event) -> None:
    """Each connection to the listener, forwarded over its own direct-tcpip channel until either side ends."""
    while not stopped.is_set():
        try:
            local, origin = listener.accept()
        except TimeoutError:
            continue
        except OSError:
            return
        try:
            channel = transport.open_channel("direct-tcpip", ("127.0.0.1", remote_port), origin,
                                             timeout=CONNECT_TIMEOUT_SECONDS)
        except (OSError, EOFError, paramiko.SSHException):
            local.close()
            continue
        threading.Thread(target=relay, args=(local, channel, stopped), daemon=True).start()


def relay(one: socket.socket | paramiko.Channel, other: socket.socket | paramiko.Channel,
          stopped: threading.Event) -> None:
    """Bytes both ways between two connections until either ends (or stopped is set); both closed after."""
    with one, other:
        while not stopped.is_set():
            readable, _, _ = select.select([one, other], [], [], 0.5)
            for source, sink in ((one, other), (other, one)):
                if source in readable:
                    chunk = source.recv(65536)
                    if not chunk:
                        return
                    sink.sendall(chunk)
