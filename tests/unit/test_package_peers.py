"""Vendor packages and wheels over the fleet: which worker seeds an artifact and whom each worker
asks, and the peers' fetch (the packages' shell command, the wheels' helper) run for real against
local HTTP servers (a good copy, a corrupt one, a dead port)."""

from __future__ import annotations

import functools
import hashlib
import http.server
import json
import socket
import subprocess
import threading
import time
from pathlib import Path
from types import SimpleNamespace

from pyinfra.context import ctx_host

from ascend_fleet.node import peer_wheels
from ascend_fleet.operations import vendor
from ascend_fleet.stages.peers import PackageSpread, package_spread

HOLDERS = {name: f"http://{name}:8090" for name in ("worker1", "worker2", "worker3", "worker4")}
EVERYONE = set(HOLDERS)


def test_the_first_worker_of_the_run_seeds_and_everyone_else_asks_it_first():
    assert package_spread("worker1", HOLDERS, EVERYONE) == PackageSpread(
        "worker1", ["http://worker2:8090", "http://worker3:8090", "http://worker4:8090"])
    assert package_spread("worker3", HOLDERS, EVERYONE) == PackageSpread(
        "worker1", ["http://worker1:8090", "http://worker4:8090", "http://worker2:8090"])


def test_a_limited_run_seeds_on_its_first_worker_and_still_asks_the_workers_left_out():
    spread = package_spread("worker3", HOLDERS, {"worker3", "worker4"})
    assert spread == PackageSpread("worker3", ["http://worker4:8090", "http://worker1:8090", "http://worker2:8090"])
    assert package_spread("worker4", HOLDERS, {"worker3", "worker4"}).peer_urls[0] == "http://worker3:8090"


def test_a_worker_alone_or_not_spreading_fetches_by_itself():
    assert package_spread("worker1", {"worker1": HOLDERS["worker1"]}, {"worker1"}) is None
    assert package_spread("worker5", HOLDERS, EVERYONE | {"worker5"}) is None  # peers: false, or another profile


PACKAGE = "Ascend-cann-nnal_8.5.0_linux-x86_64.run"
GOOD = b"#!/bin/sh\necho nnal\n" * 1000


def serve(root: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_port}"


def peer_holding(tmp_path: Path, name: str, content: bytes | None):
    root = tmp_path / name / vendor.PEER_PACKAGES_PATH
    root.mkdir(parents=True)
    if content is not None:
        (root / PACKAGE).write_bytes(content)
    return serve(tmp_path / name)


def dead_url() -> str:
    with socket.socket() as s:  # a port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def fetch_from_peers(tmp_path: Path, peer_urls: list[str]) -> tuple[subprocess.CompletedProcess, Path]:
    dest = tmp_path / "node" / PACKAGE
    dest.parent.mkdir()
    with ctx_host.use(SimpleNamespace(name="worker2")):
        command = vendor.from_peers_command(PACKAGE, hashlib.sha256(GOOD).hexdigest(), f"{dest}.partial", str(dest),
                                            peer_urls)
    return subprocess.run(["sh", "-c", command], check=False, capture_output=True, text=True, timeout=60), dest


def test_a_corrupt_copy_is_refused_and_the_package_taken_from_the_next_peer(tmp_path):
    servers = [peer_holding(tmp_path, "missing", None), peer_holding(tmp_path, "corrupt", GOOD[:-8] + b"rotten!\n"),
               peer_holding(tmp_path, "good", GOOD)]
    try:
        result, dest = fetch_from_peers(tmp_path, [dead_url()] + [url for _, url in servers])
    finally:
        for server, _ in servers:
            server.shutdown()
    assert result.returncode == 0
    assert dest.read_bytes() == GOOD
    assert not Path(f"{dest}.partial").exists()
    refused = [line for line in result.stderr.splitlines() if "refused" in line]
    assert len(refused) == 1 and refused[0].startswith(f"worker2: {PACKAGE} from {servers[1][1]}/"), result.stderr
    assert f"from {servers[2][1]}/packages/{PACKAGE}, sha256 verified" in result.stdout


def test_no_verified_copy_on_any_peer_leaves_nothing_for_the_origin_to_replace(tmp_path):
    server, url = peer_holding(tmp_path, "corrupt", b"not the package")
    try:
        result, dest = fetch_from_peers(tmp_path, [url, dead_url()])
    finally:
        server.shutdown()
    assert result.returncode == 0 and "fetching it from the origin" in result.stdout
    assert list(dest.parent.iterdir()) == []  # neither the corrupt copy nor a .partial



# ---------------------------------------------------------------- wheels


def index_page(files: dict[str, bytes]) -> str:
    return "".join(f'<a href="../../packages/{name}#sha256={hashlib.sha256(blob).hexdigest()}">{name}</a>\n'
                   for name, blob in files.items())


WHEEL = "vllm_ascend-0.13.0-py3-none-any.whl"
SDIST = "pathlib2-2.3.7.post1.tar.gz"
UNLISTED = "evil-1.0-py3-none-any.whl"


def test_project_of_wheels_and_sdists_and_the_digests_of_an_index_page():
    assert peer_wheels.project_of(WHEEL) == "vllm-ascend"
    assert peer_wheels.project_of(SDIST) == "pathlib2"
    page = index_page({WHEEL: b"w"}) + '<a href="../x-1.0.tar.gz">x-1.0.tar.gz</a>'
    assert peer_wheels.digests_in_page(page) == {WHEEL: hashlib.sha256(b"w").hexdigest()}


def wheel_peer(tmp_path: Path, name: str, files: dict[str, bytes]) -> tuple[http.server.ThreadingHTTPServer, str]:
    """A peer server's /wheels/ as nginx's JSON autoindex shows it."""
    root = tmp_path / name
    (root / "wheels").mkdir(parents=True)
    for file_name, blob in files.items():
        (root / "wheels" / file_name).write_bytes(blob)
    (root / "wheels" / "index.json").write_text(json.dumps([{"name": n, "type": "file"} for n in files]))

    class Handler(http.server.SimpleHTTPRequestHandler):
        def translate_path(self, path):
            return str(root / "wheels" / "index.json") if path == "/wheels/" else super().translate_path(path)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_port}"


def test_wheels_from_peers_are_checked_against_the_origin_index_not_the_peer(tmp_path, capsys):
    good = {WHEEL: b"the wheel", SDIST: b"the sdist"}
    index = tmp_path / "index"
    for name, blob in good.items():
        (index / peer_wheels.project_of(name)).mkdir(parents=True)
        (index / peer_wheels.project_of(name) / "index.html").write_text(index_page({name: blob}))
    servers = [serve(index),
               wheel_peer(tmp_path, "corrupt", {WHEEL: b"a rotten wheel", UNLISTED: b"not on the index"}),
               wheel_peer(tmp_path, "good", good)]
    wheel_dir = tmp_path / "node"
    try:
        code = peer_wheels.main(["--wheel-dir", str(wheel_dir), "--index-url", servers[0][1],
                                 "--peer", dead_url(), "--peer", servers[1][1], "--peer", servers[2][1]])
    finally:
        for server, _ in servers:
            server.shutdown()
    out, err = capsys.readouterr()
    assert code == 0 and "2 wheels from peers" in out
    assert {p.name: p.read_bytes() for p in wheel_dir.iterdir() if p.is_file()} == good  # no evil, no rotten
    assert f"wheel {WHEEL} from {servers[1][1]} has sha256" in err and "refused" in err
    assert list((wheel_dir / peer_wheels.INCOMING_DIR_NAME).iterdir()) == []


def hanging_peer() -> socket.socket:
    """A peer that accepts connections (the kernel does, from the listen backlog) and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    return listener


def test_peers_that_accept_and_hang_cost_one_listing_timeout_together(tmp_path, monkeypatch):
    monkeypatch.setattr(peer_wheels, "PEER_LISTING_TIMEOUT_SECONDS", 1)
    index = tmp_path / "index"
    (index / "vllm-ascend").mkdir(parents=True)
    (index / "vllm-ascend" / "index.html").write_text(index_page({WHEEL: b"the wheel"}))
    hanging = [hanging_peer() for _ in range(5)]
    servers = [serve(index), wheel_peer(tmp_path, "good", {WHEEL: b"the wheel"})]
    peers = [f"http://127.0.0.1:{listener.getsockname()[1]}" for listener in hanging] + [servers[1][1]]
    wheel_dir = tmp_path / "node"
    (wheel_dir / peer_wheels.INCOMING_DIR_NAME).mkdir(parents=True)
    started = time.monotonic()
    try:
        taken = peer_wheels.from_peers(peers, wheel_dir, wheel_dir / peer_wheels.INCOMING_DIR_NAME,
                                       peer_wheels.Origin([servers[0][1]]))
    finally:
        for server, _ in servers:
            server.shutdown()
        for listener in hanging:
            listener.close()
    assert taken == 1 and (wheel_dir / WHEEL).read_bytes() == b"the wheel"
    assert time.monotonic() - started < 3.5  # one timeout for the five, not five (one after another: 5 s)


def test_only_the_first_peers_are_asked(monkeypatch):
    asked = []
    monkeypatch.setattr(peer_wheels, "peer_listing", lambda peer: asked.append(peer) or [])
    peers = [f"http://worker{n}:8090" for n in range(peer_wheels.PEERS_ASKED + 5)]
    peer_wheels.from_peers(peers, Path("/nonexistent"), Path("/nonexistent"), peer_wheels.Origin([]))
    assert sorted(asked) == sorted(peers[:peer_wheels.PEERS_ASKED])


def test_admit_refuses_a_download_that_does_not_match_the_index(tmp_path, capsys):
    index = tmp_path / "index"
    (index / "vllm-ascend").mkdir(parents=True)
    (index / "vllm-ascend" / "index.html").write_text(index_page({WHEEL: b"the wheel"}))
    (index / "torch").mkdir(parents=True)
    (index / "torch" / "index.html").write_text(index_page({"torch-2.13.0-py3-none-any.whl": b"torch"}))
    incoming = tmp_path / "node" / peer_wheels.INCOMING_DIR_NAME
    incoming.mkdir(parents=True)
    (incoming / WHEEL).write_bytes(b"the wheel")
    (incoming / "torch-2.13.0-py3-none-any.whl").write_bytes(b"a corrupt mirror")
    (incoming / UNLISTED).write_bytes(b"an index without digests")  # from the origin itself: kept
    server, url = serve(index)
    try:
        code = peer_wheels.main(["--wheel-dir", str(tmp_path / "node"), "--index-url", url, "--admit"])
    finally:
        server.shutdown()
    assert code == 1 and "torch-2.13.0-py3-none-any.whl downloaded from the index" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "node").iterdir() if p.is_file()) == [UNLISTED, WHEEL]
    assert list(incoming.iterdir()) == []
