"""vllm-router's worker API as the gateway's route watcher uses it (gateway.routing.policy cache_aware):
the router's workers kept equal to the instances the gateway routes to, at run time, with no restart of
the router (a restart would cut the streams in flight). docs/vllm-router.md has what each call does, as
tried on vllm-router 0.1.17:

- GET /list_workers answers {"urls": [...]}, the URLs as they were added;
- POST /add_worker?url=U answers 200 once U's /health answered 200, 400 when U is listed already or its
  /health did not answer 200 within the router's --worker-startup-timeout-secs (a client that gives up
  first cancels the add);
- POST /remove_worker?url=U answers 200, listed or not; a request in flight on U finishes.

Standard library only: it runs with the gateway's system python3, beside route_watch.py, which imports it.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request

LIST_WORKERS = ("GET", "/list_workers")


def add_worker(url: str) -> tuple[str, str]:
    """The request that adds the worker at url: (method, path with its query)."""
    return "POST", "/add_worker?" + urllib.parse.urlencode({"url": url})


def remove_worker(url: str) -> tuple[str, str]:
    """The request that removes the worker at url: (method, path with its query)."""
    return "POST", "/remove_worker?" + urllib.parse.urlencode({"url": url})


def listed_workers(body: bytes) -> list[str]:
    """The worker URLs of a /list_workers answer."""
    return list(json.loads(body)["urls"])


def call(router: dict, request: tuple[str, str], timeout: float) -> tuple[int, bytes]:
    """(status, body) of one request to the router; OSError when it does not answer."""
    method, path = request
    with_body = urllib.request.Request(router["url"] + path, method=method, data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(with_body, timeout=timeout) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def sync_workers(router: dict, backends: list[dict]) -> str | None:
    """Make the router's workers the backends' URLs (routes-file entries, each with "url"): None, or why
    not. One GET when they already are. Adds come before removals, so a swap from one set of instances to
    another never leaves the router with none."""
    try:
        status, body = call(router, LIST_WORKERS, router["timeout_seconds"])
        listed = listed_workers(body) if status == 200 else None
    except (OSError, ValueError, KeyError) as error:
        return f"vllm-router at {router['url']} does not answer /list_workers ({getattr(error, 'reason', error)})"
    if listed is None:
        return f"vllm-router at {router['url']} answers /list_workers with {status}"
    wanted = [backend["url"] for backend in backends]
    problems = []
    for url in [url for url in wanted if url not in listed]:
        problem = worker_call(router, add_worker(url), router["add_timeout_seconds"], "add")
        problems += [problem] if problem else []
    for url in [url for url in listed if url not in wanted]:
        problem = worker_call(router, remove_worker(url), router["timeout_seconds"], "remove")
        problems += [problem] if problem else []
    return "; ".join(problems) or None


def worker_call(router: dict, request: tuple[str, str], timeout: float, verb: str) -> str | None:
    """None when the router did it, else one line saying why not."""
    url = urllib.parse.parse_qs(urllib.parse.urlsplit(request[1]).query)["url"][0]
    try:
        status, body = call(router, request, timeout)
    except OSError as error:
        return f"vllm-router did not {verb} {url}: {getattr(error, 'reason', error)}"
    if status == 200:
        return None
    return f"vllm-router did not {verb} {url}: {status} {body.decode(errors='replace').strip()[:200]}"
