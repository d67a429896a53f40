"""A real SSH server on loopback for unit tests of the control machine's SSH (ascend_fleet/core/remote.py):
paramiko's server side, which runs each exec request with /bin/sh on this machine and opens direct-tcpip
channels (what ProxyJump and port forwards ask for) to loopback ports. Logins: the one key it is given.
It records what it was asked, so a test can tell a hop through it from a direct login."""

from __future__ import annotations

import logging
import socket
import subprocess
import threading
from pathlib import Path

import paramiko

from ascend_fleet.core.remote import relay

# A client that closes first makes paramiko's server side log "Socket exception": not the test's news.
QUIET_LOG_CHANNEL = "tests.sshserver"
logging.getLogger(QUIET_LOG_CHANNEL).addHandler(logging.NullHandler())
logging.getLogger(QUIET_LOG_CHANNEL).propagate = False


def make_key(path: Path) -> paramiko.PKey:
    """An ed25519 key pair at path and path.pub (ssh-keygen: paramiko writes no ed25519 keys)."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return paramiko.Ed25519Key.from_private_key_file(str(path))


class _Server(paramiko.ServerInterface):
    def __init__(self, client_key: paramiko.PKey, asked: list[str]):
        self.client_key, self.asked = client_key, asked
        self.commands: dict[int, str] = {}
        self.destinations: dict[int, tuple[str, int]] = {}

    def get_allowed_auths(self, username):
        return "publickey"

    def check_auth_publickey(self, username, key):
        return paramiko.AUTH_SUCCESSFUL if key == self.client_key else paramiko.AUTH_FAILED

    def check_channel_request(self, kind, chanid):
        return paramiko.OPEN_SUCCEEDED if kind == "session" else paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_direct_tcpip_request(self, chanid, origin, destination):
        self.asked.append(f"forward {destination[0]}:{destination[1]}")
        try:
            socket.create_connection(destination, timeout=2).close()
        except OSError:
            return paramiko.OPEN_FAILED_CONNECT_FAILED
        self.destinations[chanid] = destination
        return paramiko.OPEN_SUCCEEDED

    def check_channel_exec_request(self, channel, command):
        self.asked.append("exec")
        self.commands[channel.get_id()] = command.decode()
        return True


class LoopbackSSHServer:
    """Listens on 127.0.0.1:port until closed; `asked` lists each exec and forward in order."""

    def __init__(self, host_key: paramiko.PKey, client_key: paramiko.PKey):
        self.host_key, self.client_key, self.asked = host_key, client_key, []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def known_hosts_line(self, name: str = "127.0.0.1") -> str:
        return f"[{name}]:{self.port} {self.host_key.get_name()} {self.host_key.get_base64()}\n"

    def close(self) -> None:
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(sock,), daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        transport = paramiko.Transport(sock)
        transport.set_log_channel(QUIET_LOG_CHANNEL)
        transport.add_server_key(self.host_key)
        server = _Server(self.client_key, self.asked)
        try:
            transport.start_server(server=server)
        except (paramiko.SSHException, EOFError, OSError):
            return
        while transport.is_active():
            channel = transport.accept(timeout=1)
            if channel is None:
                continue
            destination = server.destinations.get(channel.get_id())
            if destination:  # direct-tcpip, to where check_channel_direct_tcpip_request recorded
                threading.Thread(target=self._forward, args=(channel, destination), daemon=True).start()
            else:
                threading.Thread(target=self._exec, args=(server, channel), daemon=True).start()

    def _exec(self, server: _Server, channel: paramiko.Channel) -> None:
        for _ in range(50):
            if channel.get_id() in server.commands:
                break
            threading.Event().wait(0.1)
        command = server.commands.get(channel.get_id(), "true")
        done = subprocess.run(["/bin/sh", "-c", command], capture_output=True, timeout=60)
        try:
            channel.sendall(done.stdout)
            channel.sendall_stderr(done.stderr)
            channel.send_exit_status(done.returncode)
            channel.close()
        except (EOFError, OSError, paramiko.SSHException):
            pass  # the client went away first: what it read is its business

    def _forward(self, channel: paramiko.Channel, destination: tuple[str, int]) -> None:
        relay(socket.create_connection(destination, timeout=5), channel, threading.Event())
