"""A bounded load generator: streaming chat completions through the gateway at a fixed concurrency.

With `turns` above 1 each client holds conversations: a session opens on a document of its own
(several KV blocks long), then asks `turns` questions, each request resending the whole history with
the answers so far, as a chat client does; its requests carry the session's id in `session_header`
(the gateway's session_affinity hashes it). A session whose request failed starts over.

Every request's outcome is recorded (status, error, latency, time to first token), so a
rollout or a model swap can be judged by what clients saw: how many requests, how many
failed, and the p99 latency. A request counts as failed unless it answers 200, streams at
least one content chunk and ends with `data: [DONE]`.

A client whose request failed waits before its next one, twice as long after each failure in a
row up to a cap, so a gateway that is down gets a few requests a second, not thousands. With
`give_up_after`, the load stops once no request has succeeded for that long.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from dataclasses import asdict, dataclass, field

import requests

from ascend_fleet.config.credentials import api_headers

# Each request opens its own connection, as independent clients do: a pooled keepalive
# connection that nginx closes during a reload would fail a request no client sent twice.
CONNECT_TIMEOUT_SECONDS = 5
READ_TIMEOUT_SECONDS = 120
PROMPTS = ("Say hello.", "Name three colours.", "Count to five.", "What is an NPU?")
# A session's opening document: words picked by its id, so sessions share no prefix but their own.
DOCUMENT_WORDS = ("npu", "kernel", "cluster", "gateway", "token", "cache", "model", "weights", "latency", "batch",
                  "prefill", "decode", "router", "session", "driver", "firmware", "ascend", "serving", "queue", "node")
DOCUMENT_WORD_COUNT = 300
BACKOFF_FIRST_SECONDS = 0.1
BACKOFF_MAX_SECONDS = 2.0
WAIT_POLL_SECONDS = 0.1  # how often wait() looks whether the clients ended or interrupt() came
# The system's reason inside a requests/urllib3 error: "[Errno 111] Connection refused".
OS_REASON = re.compile(r"\[Errno -?\d+\] ([^'\")]+)")


@dataclass(frozen=True)
class RequestResult:
    started: float  # seconds since the load started
    latency: float
    ttft: float | None
    ok: bool
    error: str | None = None
    turn: int = 1  # its place in its session (1: the opening)


def session_document(session: str) -> str:
    """The opening message of a session: a document only this session carries, then a question."""
    seed = sum(session.encode())
    words = [DOCUMENT_WORDS[(seed * 7 + i * (seed % 13 + 3)) % len(DOCUMENT_WORDS)] for i in range(DOCUMENT_WORD_COUNT)]
    return f"Session {session}. Read this log and answer my questions about it:\n{' '.join(words)}\nFirst, say hello."


def percentile(values: list[float], fraction: float) -> float | None:
    """Nearest-rank percentile: the smallest value with at least fraction of the values at or below it."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


@dataclass
class LoadReport:
    url: str
    concurrency: int
    duration: float
    results: list[RequestResult] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.results)

    @property
    def failures(self) -> list[RequestResult]:
        return [r for r in self.results if not r.ok]

    def summary(self) -> dict:
        latencies = [r.latency for r in self.results if r.ok]
        ttfts = [r.ttft for r in self.results if r.ok and r.ttft is not None]
        rounded = lambda value: None if value is None else round(value, 4)  # noqa: E731
        return {
            "url": self.url, "concurrency": self.concurrency, "duration_s": round(self.duration, 1),
            "requests": self.count, "errors": len(self.failures),
            "p50_latency_s": rounded(percentile(latencies, 0.5)), "p99_latency_s": rounded(percentile(latencies, 0.99)),
            "p50_ttft_s": rounded(percentile(ttfts, 0.5)), "p99_ttft_s": rounded(percentile(ttfts, 0.99)),
            "first_errors": [f"{r.started:.1f}s: {r.error}" for r in self.failures[:5]],
        }

    def to_dict(self) -> dict:
        return {**self.summary(), "results": [asdict(r) for r in self.results]}


def backoff_seconds(failures: int) -> float:
    """The wait before a client's next request after `failures` failed in a row (0: none)."""
    return 0.0 if failures == 0 else min(BACKOFF_MAX_SECONDS, BACKOFF_FIRST_SECONDS * 2 ** (failures - 1))


def request_error(exc: Exception) -> str:
    """A failed request in a few words: the system's reason (connection refused, name not known),
    the timeout that ran out, else the exception."""
    if isinstance(exc, requests.ConnectTimeout):
        return f"no connection within {CONNECT_TIMEOUT_SECONDS}s"
    if isinstance(exc, requests.ReadTimeout):
        return "no answer within the read timeout"
    reason = OS_REASON.search(str(exc)) if isinstance(exc, requests.ConnectionError) else None
    if reason:
        return f"{type(exc).__name__}: {reason.group(1).strip()}"
    return f"{type(exc).__name__}: {str(exc)[:160]}"


def stream_chat(url: str, model: str, prompt: str | list[dict], max_tokens: int, origin: float,
                read_timeout: float = READ_TIMEOUT_SECONDS, headers: dict | None = None) -> tuple[RequestResult, str]:
    """One streaming chat completion of a prompt (or a conversation's messages), read to its end, and the
    text it answered; silence for read_timeout seconds fails it."""
    started = time.monotonic()
    ttft, text = None, []
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "stream": True}
    try:
        with requests.post(f"{url}/v1/chat/completions", json=body, stream=True,
                           timeout=(CONNECT_TIMEOUT_SECONDS, read_timeout),
                           headers={"Connection": "close", **api_headers(), **(headers or {})}) as response:
            if response.status_code != 200:
                error = f"HTTP {response.status_code}: {' '.join(response.text.split())[:160]}"
                return RequestResult(started - origin, time.monotonic() - started, None, False, error), ""
            done, chunks, finish_reason = False, 0, None
            for line in response.iter_lines(decode_unicode=True):
                if not line.startswith("data: "):
                    continue
                payload = line.removeprefix("data: ")
                if payload == "[DONE]":
                    done = True
                    break
                event = json.loads(payload)
                if "error" in event:  # vLLM ends a stream it cannot finish (its engine died) with an error event
                    error = f"error event mid-stream: {str(event['error'].get('message'))[:160]}"
                    return RequestResult(started - origin, time.monotonic() - started, ttft, False, error), ""
                delta = event["choices"]
                if delta and delta[0].get("delta", {}).get("content"):
                    chunks += 1
                    text.append(delta[0]["delta"]["content"])
                    ttft = ttft if ttft is not None else time.monotonic() - started
                if delta and delta[0].get("finish_reason") is not None:
                    finish_reason = delta[0]["finish_reason"]
            latency = time.monotonic() - started
            if finish_reason == "abort":  # vLLM 0.18.0 aborts what is in flight when stopped (--shutdown-timeout 0)
                error = "answer aborted by the instance (finish_reason abort)"
                return RequestResult(started - origin, latency, ttft, False, error), ""
            if not done or chunks == 0:
                error = "stream ended before [DONE]" if not done else "stream carried no content"
                return RequestResult(started - origin, latency, ttft, False, error), ""
            return RequestResult(started - origin, latency, ttft, True), "".join(text)
    except (requests.RequestException, ValueError, KeyError) as exc:
        return RequestResult(started - origin, time.monotonic() - started, ttft, False, request_error(exc)), ""


class LoadGenerator:
    """`concurrency` clients sending one request after another until stopped, the deadline,
    max_requests, or (give_up_after) that many seconds without a request that succeeded."""

    def __init__(self, url: str, model: str, concurrency: int = 4, max_tokens: int = 16,
                 duration: float | None = None, max_requests: int | None = None, give_up_after: float | None = None,
                 turns: int = 1, session_header: str = "X-Session-Id", label: str = "s"):
        self.url, self.model, self.concurrency, self.max_tokens = url.rstrip("/"), model, concurrency, max_tokens
        self.duration, self.max_requests, self.give_up_after = duration, max_requests, give_up_after
        self.turns, self.session_header, self.label = turns, session_header, label
        self.gave_up = False  # stopped by give_up_after
        self.interrupted = False  # interrupt(): requests in flight left unfinished
        self._results: list[RequestResult] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._origin = self._last_ok = 0.0

    def _claim(self) -> bool:
        """Whether a client may send another request (bounded by count and time)."""
        if self._stop.is_set() or (self.duration is not None and time.monotonic() - self._origin >= self.duration):
            return False
        with self._lock:
            if self.max_requests is not None and self._sent >= self.max_requests:
                return False
            self._sent += 1
            return True

    def _record(self, result: RequestResult) -> None:
        now = time.monotonic()
        with self._lock:
            self._results.append(result)
            if result.ok:
                self._last_ok = now
            elif self.give_up_after is not None and now - self._last_ok >= self.give_up_after:
                self.gave_up = True
                self._stop.set()

    def _client(self, index: int) -> None:
        n, failures, sessions = index, 0, 0
        messages, headers, turn = [], {}, 0
        while self._claim():
            if self.turns == 1:
                prompt = PROMPTS[n % len(PROMPTS)]
            else:
                if turn == 0:  # a new session
                    session = f"{self.label}-{index}-{sessions}"
                    sessions += 1
                    messages, headers = [{"role": "user", "content": session_document(session)}], \
                        {self.session_header: session}
                prompt = messages
            result, answer = stream_chat(self.url, self.model, prompt, self.max_tokens, self._origin, headers=headers)
            n += 1
            turn += 1
            self._record(RequestResult(**{**asdict(result), "turn": turn}))
            if self.turns > 1:
                messages = [*messages, {"role": "assistant", "content": answer},
                            {"role": "user", "content": PROMPTS[turn % len(PROMPTS)]}]
                turn = 0 if turn >= self.turns or not result.ok else turn
            failures = 0 if result.ok else failures + 1
            if failures:
                left = math.inf if self.duration is None else self.duration - (time.monotonic() - self._origin)
                self._stop.wait(max(0.0, min(backoff_seconds(failures), left)))

    def start(self) -> LoadGenerator:
        self._origin, self._sent = time.monotonic(), 0
        self._last_ok = self._origin
        self._threads = [threading.Thread(target=self._client, args=(i,), daemon=True, name=f"load-{i}")
                         for i in range(self.concurrency)]
        for thread in self._threads:
            thread.start()
        return self

    def snapshot(self) -> LoadReport:
        with self._lock:
            return LoadReport(self.url, self.concurrency, time.monotonic() - self._origin, list(self._results))

    def wait(self) -> LoadReport:
        """Until the bound is reached (duration, max_requests, give_up_after) or at once after
        interrupt(), then the report (of the requests that ended)."""
        while any(thread.is_alive() for thread in self._threads) and not self.interrupted:
            time.sleep(WAIT_POLL_SECONDS)
        return self.snapshot()

    def in_flight(self) -> int:
        with self._lock:
            return self._sent - len(self._results)

    def interrupt(self) -> None:
        """Send no more, and let wait() return without the requests in flight (Ctrl-C). It sets flags
        and the stop event, whose lock only the clients take, so a signal handler may call it."""
        self.interrupted = True
        self._stop.set()

    def stop(self) -> LoadReport:
        """Let every request in flight finish, send no more, and report."""
        self._stop.set()
        return self.wait()

    def __enter__(self) -> LoadGenerator:
        return self.start()

    def __exit__(self, *_exc) -> None:
        self.stop()
