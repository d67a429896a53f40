"""The real vllm-router (the lab profile's release, installed from its committed lock) started with
router_arguments' command line against stand-in workers on loopback: cache-aware routing keeps a shared
prefix on one worker, the route watcher's API (node/router_api.py) removes and adds workers with no
restart and no request in flight lost, and a killed worker fails no new request.

The stand-ins answer what the router asks of a vLLM worker: /health, /tokenize (vLLM's answer: the
prompt's token ids, here one per character), and streaming /v1/chat/completions; each records what it got.
The router's virtualenv is kept in /tmp between runs (keyed by its lock), so a rerun installs nothing."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import venv
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import pytest

from ascend_fleet.config.hostdata import node_config
from ascend_fleet.config.profile import load_profile
from ascend_fleet.fleet.profile_check import Platform, pip_environment
from ascend_fleet.fleet.profile_lock import ROUTER_GLIBC, router_lock_path
from ascend_fleet.fleet.vllm_router import router_arguments, router_routes
from ascend_fleet.node import router_api

pytestmark = pytest.mark.network  # the router's wheels come from PyPI on the first run

# argv: name, seconds between streamed events. Prints its port; GET /_log gives what it was asked.
WORKER = """\
import json, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

NAME, DELAY = sys.argv[1], float(sys.argv[2])
LOG = []

class Worker(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def answer(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/_log":
            return self.answer(200, LOG)
        self.answer(200 if self.path in ("/health", "/v1/models") else 404, {"data": [{"id": "m"}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        text = "".join(m.get("content", "") for m in body.get("messages", []))
        if self.path == "/tokenize":
            return self.answer(200, {"count": len(text), "max_model_len": 65536, "tokens": [ord(c) for c in text]})
        if self.path != "/v1/chat/completions":
            return self.answer(404, {"detail": "Not Found"})
        LOG.append({"text": text, "authorization": self.headers.get("Authorization")})
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for event in [*(json.dumps({"worker": NAME, "index": i}) for i in range(body["max_tokens"])), "[DONE]"]:
            data = f"data: {event}\\n\\n".encode()
            self.wfile.write(b"%x\\r\\n%s\\r\\n" % (len(data), data))
            self.wfile.flush()
            time.sleep(DELAY)
        self.wfile.write(b"0\\r\\n\\r\\n")

ThreadingHTTPServer.daemon_threads = True
server = ThreadingHTTPServer(("127.0.0.1", 0), Worker)
print(server.server_address[1], flush=True)
server.serve_forever()
"""
PREFIX = "You are the assistant of a long shared system prompt, cached by whichever worker saw it. " * 30


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def router_program() -> Path:
    """The lab profile's vllm-router in a virtualenv of this Python, installed exactly from its lock."""
    pinned = load_profile("lab").router
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    lock = router_lock_path(pinned, Platform(os.uname().machine, python, ROUTER_GLIBC))
    if not lock.exists():
        pytest.skip(f"no committed lock {lock.name} for this machine's Python")
    home = Path("/tmp") / f"ascend-fleet-test-vllm-router-{hashlib.sha256(lock.read_bytes()).hexdigest()[:16]}"
    program, installed = home / "bin" / "vllm-router", home / "installed-from-lock"
    with open(f"{home}.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # one test run installs, another waits and reuses it
        if not installed.exists():
            shutil.rmtree(home, ignore_errors=True)  # a run stopped half-way
            venv.create(home, with_pip=True)
            subprocess.run([home / "bin" / "python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                            "--no-deps", "--require-hashes", "--index-url", "https://pypi.org/simple", "-r", str(lock)],
                           check=True, env=pip_environment(dict(os.environ)), timeout=600)
            installed.touch()
    return program


@contextmanager
def workers(*delays: float):
    """Stand-in workers, one per delay: yields [(url, process)]."""
    started = [subprocess.Popen([sys.executable, "-c", WORKER, f"w{i}", str(delay)], stdout=subprocess.PIPE, text=True)
               for i, delay in enumerate(delays)]
    try:
        yield [(f"http://127.0.0.1:{int(process.stdout.readline())}", process) for process in started]
    finally:
        for process in started:
            process.kill()
            process.wait()


def gateway(port: int):
    return node_config({"profile": "lab", "gateway": {"routing": {"policy": "cache_aware", "router_port": port}}},
                       "gw").gateway


@contextmanager
def running_router(program: Path, urls: list[str], **replaced: str):
    """The router started with router_arguments' command line (its metrics on a free port, so that runs side
    by side do not meet; `replaced`: options given other values): yields (its routes entry, its process)."""
    port = free_port()
    argv = router_arguments(gateway(port), urls)
    for name, value in {"--prometheus-port": str(free_port()), **replaced}.items():
        argv[argv.index(name) + 1] = value
    process = subprocess.Popen([program, *argv], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    routes = router_routes(gateway(port).routing)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                router_api.call(routes, router_api.LIST_WORKERS, 1)
                break
            except OSError:
                assert time.monotonic() < deadline and process.poll() is None, "vllm-router did not start"
                time.sleep(0.2)
        yield routes, process
    finally:
        process.terminate()
        process.wait(30)


def chat(routes: dict, text: str, tokens: int = 2, authorization: str | None = None) -> tuple[int, list[str]]:
    """(status, the events' workers and [DONE]) of one streamed chat completion through the router."""
    request = urllib.request.Request(
        routes["url"] + "/v1/chat/completions", method="POST",
        data=json.dumps({"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": tokens,
                         "stream": True}).encode(),
        headers={"Content-Type": "application/json", **({"Authorization": authorization} if authorization else {})})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            events = [line.removeprefix(b"data: ").decode().strip() for line in answer if line.startswith(b"data: ")]
            return answer.status, [e if e == "[DONE]" else json.loads(e)["worker"] for e in events]
    except urllib.error.HTTPError as error:
        return error.code, []


def served_by(events: list[str]) -> str:
    return events[0]


def first_event_after(routes: dict, tokens: int) -> tuple[float, float]:
    """Seconds to a streamed completion's first event and to its end, through the router."""
    request = urllib.request.Request(routes["url"] + "/v1/chat/completions", method="POST", data=json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": tokens, "stream": True}).encode(),
        headers={"Content-Type": "application/json"})
    started = time.monotonic()
    with urllib.request.urlopen(request, timeout=60) as answer:
        answer.readline()
        first = time.monotonic() - started
        answer.read()
    return first, time.monotonic() - started


def test_requests_that_share_a_long_prefix_go_to_one_worker_with_the_clients_key_streamed(router_program):
    with workers(0.05, 0.05) as started, running_router(router_program, [url for url, _ in started]) as (routes, _):
        first, whole = first_event_after(routes, 20)  # 20 events 0.05 s apart: passed on as they come
        assert first < 0.5 < whole, (first, whole)
        answers = [chat(routes, f"{PREFIX} question {i}", authorization="Bearer sk-fleet") for i in range(8)]
        assert {status for status, _ in answers} == {200} and all(events[-1] == "[DONE]" for _, events in answers)
        assert len({served_by(events) for _, events in answers}) == 1, answers
        owner = dict(zip([f"w{i}" for i in range(2)], started))[served_by(answers[0][1])][0]
        with urllib.request.urlopen(f"{owner}/_log") as log:
            seen = json.load(log)
        shared = [entry for entry in seen if entry["text"].startswith(PREFIX)]
        assert len(shared) == 8 and {entry["authorization"] for entry in shared} == {"Bearer sk-fleet"}


def test_workers_removed_and_added_at_run_time_take_effect_at_once_and_lose_no_request_in_flight(router_program):
    with workers(0.05, 0.05) as started, running_router(router_program, [url for url, _ in started]) as (routes,
                                                                                                        process):
        urls = dict(zip(["w0", "w1"], [url for url, _ in started]))
        owner = served_by(chat(routes, f"{PREFIX} warm")[1])
        other = next(name for name in urls if name != owner)
        in_flight = {}
        stream = threading.Thread(target=lambda: in_flight.update(answer=chat(routes, f"{PREFIX} long", tokens=40)))
        stream.start()
        time.sleep(0.5)  # about a quarter of its 40 events sent
        assert router_api.sync_workers(routes, [{"url": urls[other]}]) is None  # the owner leaves routing
        after = [chat(routes, f"{PREFIX} after {i}") for i in range(3)]
        stream.join()
        assert in_flight["answer"][0] == 200 and in_flight["answer"][1][-1] == "[DONE]"
        assert len(in_flight["answer"][1]) == 41 and set(in_flight["answer"][1][:-1]) == {owner}
        assert [(status, served_by(events)) for status, events in after] == [(200, other)] * 3
        assert router_api.sync_workers(routes, [{"url": urls[owner]}, {"url": urls[other]}]) is None
        _, body = router_api.call(routes, router_api.LIST_WORKERS, 2)
        assert sorted(router_api.listed_workers(body)) == sorted(urls.values())
        assert process.poll() is None  # the same process throughout: no restart


UPSTREAM_DEFAULTS = {"--cb-failure-threshold": "10", "--health-check-interval-secs": "60"}


@pytest.mark.parametrize("replaced, failed", [({}, 0), (UPSTREAM_DEFAULTS, 2)],
                         ids=["router_arguments", "upstream defaults"])
def test_a_killed_worker_fails_no_new_request(router_program, replaced, failed):
    """One client, every request sharing the prefix the killed worker held. With the upstream defaults
    (a circuit opens after 10 failures, health checked each minute) the first two requests after the kill
    failed, each tried 5 times on the dead worker."""
    with workers(0.01, 0.01) as started, running_router(router_program, [url for url, _ in started],
                                                        **replaced) as (routes, _):
        owner = served_by(chat(routes, f"{PREFIX} warm")[1])
        process = dict(zip(["w0", "w1"], [p for _, p in started]))[owner]
        process.kill()
        process.wait()
        answers = [chat(routes, f"{PREFIX} question {i}") for i in range(10)]
        assert sum(status != 200 for status, _ in answers) == failed, answers
        assert Counter(served_by(events) for status, events in answers if status == 200).keys() <= {"w0", "w1"} - {
            owner}
