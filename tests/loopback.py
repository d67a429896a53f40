"""A fleet that does not answer, on loopback: its inventory (every host's SSH and the gateway on
127.0.0.1 ports) and the servers behind those ports: none (refused), one that closes each
connection at once, one that accepts and says nothing, one that answers every request 503."""

from __future__ import annotations

import socket
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

FLEET_DATA = """\
profile = "lab"
model = {"id": "Qwen/Qwen3-0.6B", "revision": "r1", "source": "hf"}
tensor_parallel_size = 4
serving = {"max_model_len": 4096, "gpu_memory_utilization": 0.9, "dtype": "bfloat16"}
rollout_waves = ["canary", "wave1"]
"""

# argv: mode (closing, silent or 503). Prints its port, then a line per connection or request.
SERVER = """\
import socket, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Unavailable(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        print("request", flush=True)
        body = b"<html><body><h1>503 Service Temporarily Unavailable</h1></body></html>"
        self.send_response(503)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

if sys.argv[1] == "503":
    server = ThreadingHTTPServer(("127.0.0.1", 0), Unavailable)
    print(server.server_address[1], flush=True)
    server.serve_forever()
listener = socket.create_server(("127.0.0.1", 0))
print(listener.getsockname()[1], flush=True)
held = []
while True:
    connection, _ = listener.accept()
    print("connection", flush=True)
    if sys.argv[1] == "closing":
        connection.close()
    else:
        held.append(connection)
"""


def refused_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def loopback_server(mode: str):
    """A server of SERVER's `mode`: yields (its port, its process, whose stdout has a line per contact)."""
    server = subprocess.Popen([sys.executable, "-c", SERVER, mode], stdout=subprocess.PIPE, text=True)
    try:
        yield int(server.stdout.readline()), server
    finally:
        server.kill()
        server.wait()


def write_fleet(directory: Path, ssh_port: int, gateway_port: int = 80) -> Path:
    """Workers node1 (canary), node2 (wave1) and a gateway gw, all at 127.0.0.1:ssh_port, the gateway
    listening on gateway_port; returns the inventory."""
    (directory / "group_data").mkdir()
    (directory / "group_data" / "loopback.py").write_text(FLEET_DATA)
    (directory / "group_data" / "gateway.py").write_text(
        f"gateway = {{'listen_port': {gateway_port}, 'upstream_name': 'vllm_backend'}}\n")
    ssh = {"ssh_hostname": "127.0.0.1", "ssh_port": ssh_port, "ssh_user": "root"}
    worker = {**ssh, "chip": "910B3", "npu_count": 8, "nvme_mount": "/mnt/nvme"}
    inventory = directory / "loopback.py"
    inventory.write_text(f"workers = [('node1', {worker!r}), ('node2', {worker!r})]\ncanary = ['node1']\n"
                         f"wave1 = ['node2']\ngateway = [('gw', {ssh!r})]\n")
    return inventory
