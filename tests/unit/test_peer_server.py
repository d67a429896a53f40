"""A worker's peer server (templates/weights-peer-nginx.conf.j2) run by nginx itself: it sends at
most PEER_UPLOADS weights files at once and answers 503 beyond, while its listings always answer."""

from __future__ import annotations

import http.client
import json
import shutil
import socket
import subprocess
import time

import pytest

from ascend_fleet.node.stage_weights import INCOMING_DIR_NAME, PARTIAL_DIR_NAME, PEER_RECEIVING_PATH, PEER_STAGING_PATH
from ascend_fleet.stages.peers import PEER_UPLOADS, render_peer_server_config

pytestmark = pytest.mark.skipif(shutil.which("nginx") is None,
                                reason="nginx is installed by scripts/setup (the lab's mirror)")
REVISION = "lab/Qwen3-Tiny/v1"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def peer_server(tmp_path):
    """nginx serving a staging revision with one big shard, and a shard still arriving; its port."""
    staging = tmp_path / "models" / PARTIAL_DIR_NAME / REVISION
    (staging / INCOMING_DIR_NAME).mkdir(parents=True)
    (staging / "model-00001-of-00001.safetensors").write_bytes(b"\0" * 64 * 1024 * 1024)
    (staging / INCOMING_DIR_NAME / "model-00002-of-00002.safetensors").write_bytes(b"a" * 1000)
    port = free_port()
    site = render_peer_server_config(port, str(tmp_path / "models"), access_log=str(tmp_path / "access.log"))
    (tmp_path / "site.conf").write_text(site.replace(f"listen {port};", f"listen 127.0.0.1:{port};"))
    # As root (CI), nginx's workers would run as nobody, who cannot read pytest's directories.
    (tmp_path / "nginx.conf").write_text(f"user root; pid {tmp_path}/nginx.pid; error_log stderr; daemon off; "
                                         "events {}\n"
                                         f"http {{ include {tmp_path}/site.conf; }}\n")
    nginx = subprocess.Popen(["nginx", "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf")],
                             stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert nginx.poll() is None, nginx.stderr.read()
            assert time.monotonic() < deadline, "nginx did not listen"
            time.sleep(0.05)
    yield port
    nginx.terminate()
    nginx.wait(timeout=10)


def start_download(port: int) -> tuple[socket.socket, str]:
    """A GET of the shard whose body is left unread (the send stays in progress); its status line."""
    client = socket.create_connection(("127.0.0.1", port), timeout=5)
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.sendall(f"GET /{PEER_STAGING_PATH}/{REVISION}/model-00001-of-00001.safetensors HTTP/1.1\r\n"
                   "Host: peer\r\n\r\n".encode())
    return client, client.recv(4096).split(b"\r\n", 1)[0].decode()


def test_the_peer_server_sends_a_few_files_at_once_and_lists_what_it_holds_meanwhile(peer_server):
    downloads = [start_download(peer_server) for _ in range(PEER_UPLOADS)]
    try:
        assert [status for _, status in downloads] == ["HTTP/1.1 200 OK"] * PEER_UPLOADS
        refused, status = start_download(peer_server)
        refused.close()
        assert status == "HTTP/1.1 503 Service Temporarily Unavailable"  # the stager asks another holder
        listing = http.client.HTTPConnection("127.0.0.1", peer_server, timeout=5)
        listing.request("GET", f"/{PEER_STAGING_PATH}/{REVISION}/")
        answer = listing.getresponse()
        assert answer.status == 200
        assert [entry["name"] for entry in json.load(answer)] == ["model-00001-of-00001.safetensors"]
    finally:
        for client, _ in downloads:
            client.close()


def get(port: int, path: str, headers: dict | None = None) -> tuple[int, bytes]:
    client = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    client.request("GET", path, headers=headers or {})
    answer = client.getresponse()
    return answer.status, answer.read()


def test_the_peer_server_sends_a_file_still_arriving_as_far_as_it_has_and_no_marker_or_journal(peer_server, tmp_path):
    arriving = f"/{PEER_RECEIVING_PATH}/{REVISION}/model-00002-of-00002.safetensors"
    status, body = get(peer_server, f"/{PEER_RECEIVING_PATH}/{REVISION}/")
    assert status == 200 and json.loads(body)[0] | {"mtime": None} == {
        "name": "model-00002-of-00002.safetensors", "type": "file", "size": 1000, "mtime": None}
    assert get(peer_server, arriving, {"Range": "bytes=600-"}) == (206, b"a" * 400)
    assert get(peer_server, arriving, {"Range": "bytes=1000-"})[0] == 416  # nothing beyond what arrived yet
    incoming = tmp_path / "models" / PARTIAL_DIR_NAME / REVISION / INCOMING_DIR_NAME
    with (incoming / "model-00002-of-00002.safetensors").open("ab") as more:
        more.write(b"b" * 24)
    assert get(peer_server, arriving, {"Range": "bytes=1000-"}) == (206, b"b" * 24)
    (incoming / "model-00003-of-00003.safetensors").write_bytes(b"")  # just created: nothing arrived yet
    empty = f"/{PEER_RECEIVING_PATH}/{REVISION}/model-00003-of-00003.safetensors"
    assert get(peer_server, empty, {"Range": "bytes=0-"}) == (200, b"")  # not 206 nor 416: nginx ignores the range
    (incoming / ".journal").write_text("{}")
    (incoming.parent / "sub").mkdir()
    for hidden in (f"/{PEER_RECEIVING_PATH}/{REVISION}/.journal", f"/{PEER_RECEIVING_PATH}/{REVISION}/../.incoming/",
                   f"/{PEER_RECEIVING_PATH}/{REVISION}"):
        assert get(peer_server, hidden)[0] == 404, hidden
