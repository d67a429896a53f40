"""`ascend-fleet load` against a gateway that does not serve (a refused port, a server answering 503,
one that never answers): failed requests back off, a load that never succeeds stops in one line,
and Ctrl-C stops it at once with a line saying what it sent."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from ascend_fleet.control.loadgen import BACKOFF_MAX_SECONDS, backoff_seconds
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


@contextmanager
def chat_server(answer):
    """A loopback stand-in of a chat endpoint: answer(headers, body) gives the SSE text of each POST,
    sent as vLLM sends it (text/event-stream, utf-8); yields its URL."""
    import http.server
    import threading

    class Chat(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            payload = answer(self.headers, json.loads(self.rfile.read(int(self.headers["Content-Length"])))).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream; charset=utf-8")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *_args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Chat)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def test_multi_turn_sessions_resend_their_history_under_one_session_id():
    """Each request of a session carries the whole conversation so far and the session's header; the next
    session starts over on a document of its own."""
    from ascend_fleet.control.loadgen import LoadGenerator

    seen = []

    def answer(headers, body) -> str:
        seen.append((headers.get("X-Chat"), body["messages"]))
        chunk = json.dumps({"choices": [{"delta": {"content": f"answer {len(seen)}"}}]})
        return f"data: {chunk}\n\ndata: [DONE]\n\n"

    with chat_server(answer) as url:
        report = LoadGenerator(url, "m", concurrency=1, max_requests=5, turns=3, session_header="X-Chat",
                               label="t").start().wait()
    assert report.count == 5 and not report.failures
    assert [r.turn for r in report.results] == [1, 2, 3, 1, 2]
    sessions = [session for session, _ in seen]
    assert sessions[:3] == ["t-0-0"] * 3 and sessions[3:] == ["t-0-1"] * 2
    first, second, third = (messages for _, messages in seen[:3])
    assert len(first) == 1 and first[0]["content"].startswith("Session t-0-0.")
    assert second[:2] == [*first, {"role": "assistant", "content": "answer 1"}] and len(second) == 3
    assert third[:4] == [*second, {"role": "assistant", "content": "answer 2"}]
    assert seen[3][1][0]["content"].startswith("Session t-0-1.")  # a document of its own
    assert seen[3][1][0]["content"] != first[0]["content"]


def test_a_stream_that_ends_with_finish_reason_abort_is_a_failure_naming_it():
    """vLLM 0.18.0 stopped with the default --shutdown-timeout 0 aborts what is in flight: the stream keeps its 200,
    ends with a chunk whose finish_reason is "abort", then [DONE] (vllm/v1/engine/core.py _handle_shutdown,
    chat_completion/serving.py chat_completion_stream_generator). The text so far is not an answer."""
    from ascend_fleet.control.loadgen import LoadGenerator, stream_chat

    def chunk(delta: dict, finish_reason: str | None = None) -> str:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return f"data: {json.dumps({'object': 'chat.completion.chunk', 'choices': [choice]})}\n\n"

    def aborting(_headers, _body) -> str:
        return (chunk({"role": "assistant", "content": ""}) + chunk({"content": "half an"})
                + chunk({"content": " answer"}) + chunk({"content": ""}, "abort") + "data: [DONE]\n\n")

    with chat_server(aborting) as url:
        result, text = stream_chat(url, "m", "hello", 16, time.monotonic())
        report = LoadGenerator(url, "m", concurrency=1, max_requests=2).start().wait()
    assert not result.ok and text == ""
    assert result.error == "answer aborted by the instance (finish_reason abort)"
    assert result.ttft is not None  # tokens came before the abort
    assert report.count == 2 and len(report.failures) == 2
