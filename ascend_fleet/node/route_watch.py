#!/usr/bin/env python3
"""Each gateway's route watcher: an instance that cannot serve leaves the gateway's routing by itself,
and comes back once it passes again; decided on the gateway, so it holds with the control machine off.

Why a watcher on each gateway (issue 34):
- open-source nginx has no active health checks: it learns of a dead instance only from requests
  that failed, and an instance whose NPU went Alarm still answers them; vllm-router asks /health only.
- on the gateway, not the worker: the gateway is what routes, and each judges what it can reach.

Every `interval_seconds`, each instance that is not drained is checked: its unit must not be stopping
(its ExecStop says so in the worker's node_exporter textfile first, and waits for the watchers), its
/health must answer 200 within `health_timeout_seconds` (not dead, not restarting or loading, not hung),
and none of its NPUs may be Alarm or Critical as npu-smi said last (ascend_npu_health in the same
textfile, node/npu_metrics.py). `fails` failed checks in a row take it out, `passes` passed ones bring
it back. Out is `down` in nginx's upstream (a reload: streams in flight finish on the old workers),
or out of vllm-router's workers. Never the last one: when every routed instance fails, none is taken
out, since a gateway cut off from the workers would otherwise refuse what they could still serve.

The gateway stage writes the routes file (fleet/gateway_routes.py): nginx's config rendered twice, every instance
in and every instance out, and which line is whose, so the template alone spells the config and this
program only picks each server line from one of the two; the instances to check; the settings.
`apply` (the stage, after writing it) and `watch` write nginx's config alike: nginx -t, then a
reload; a config nginx refuses is put back. The state (who is out, why, since when) is kept in a
file `status` reads, and as metrics for node_exporter's textfile collector (the alerts).

Standard library only: it runs with the gateway's system python3.

Usage: route_watch.py watch ROUTES_FILE | route_watch.py apply ROUTES_FILE
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

# npu-smi's health codes (npu_metrics.HEALTH_CODES): from Alarm on, the NPU is not trusted to serve.
NPU_OUT_FROM = 2
NPU_HEALTH = re.compile(r'^ascend_npu_health\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)', re.M)
NPU_LABEL = re.compile(r'npu="(\d+)"')
# Written by the instance's unit before it stops (the instance helper's leave-routing, ExecStop).
LEAVING_METRIC = "ascend_fleet_instance_leaving"
# The node's own word that the instance stops, not a check that may fail once: it leaves at the first reading.
STOPPING = "its unit is stopping (a restart or a stop on its node)"
LEAVING = re.compile(rf'^{LEAVING_METRIC}\{{instance="([^"]+)"\}}\s+1\b', re.M)
HEALTH_WORDS = {2: "Alarm", 3: "Critical"}
MAX_PARALLEL_CHECKS = 32
METRIC_PREFIX = "ascend_fleet_route"


@dataclass
class Watched:
    """What the watcher knows of one instance between checks."""

    failed: int = 0
    passed: int = 0
    reason: str | None = None  # the last failed check's, while it is out
    since: float | None = None  # when it left routing


@dataclass
class Routes:
    """The routes file as the gateway stage wrote it (fleet/gateway_routes.py routes_document)."""

    document: dict
    backends: list[dict] = field(init=False)

    def __post_init__(self) -> None:
        self.backends = self.document["backends"]

    @classmethod
    def read(cls, path: str) -> Routes:
        with open(path) as handle:
            return cls(json.load(handle))

    @property
    def checked(self) -> list[dict]:
        """The instances the gateway routes to when they pass: every one not drained."""
        return [backend for backend in self.backends if not backend["drained"]]

    def setting(self, name: str):
        return self.document["isolation"][name]


def check_health(url: str, timeout: float) -> str | None:
    """None when the instance's /health answers 200 in time, else why not."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout) as answer:
            status = answer.status
    except urllib.error.HTTPError as error:
        status = error.code
    except (OSError, ValueError) as error:
        reason = getattr(error, "reason", error)
        return f"/health answers nothing ({reason})"
    return None if status == 200 else f"/health answers {status}"


@dataclass(frozen=True)
class NodeReport:
    """What a worker's node_exporter textfile says: each NPU's npu-smi health code, the instances stopping."""

    npus: dict[int, int]
    leaving: frozenset[str]


def node_report(metrics_url: str, timeout: float) -> NodeReport | None:
    """The worker's report from its node_exporter textfile metrics, None when unread."""
    try:
        with urllib.request.urlopen(metrics_url, timeout=timeout) as answer:
            text = answer.read().decode(errors="replace")
    except (OSError, ValueError):
        return None
    npus = {}
    for match in NPU_HEALTH.finditer(text):
        npu = NPU_LABEL.search(match["labels"])
        if npu:
            try:
                npus[int(npu[1])] = int(float(match["value"]))
            except ValueError:
                continue
    return NodeReport(npus, frozenset(LEAVING.findall(text)))


def judge(backend: dict, health: str | None, report: NodeReport | None) -> str | None:
    """Why the instance must not be routed to now, or None. An unread report (node_exporter down) is not a
    verdict on the instance: /health alone decides then."""
    if report and backend["key"].split("/", 1)[1] in report.leaving:
        return STOPPING
    if health:
        return health
    bad = [f"NPU {npu} {HEALTH_WORDS.get(code, code)}" for npu, code in sorted((report.npus if report else {}).items())
           if npu in backend["npus"] and code >= NPU_OUT_FROM]
    return ", ".join(bad) or None


def check_all(routes: Routes) -> dict[str, str | None]:
    """{backend key: why it fails now, or None} for every checked instance, asked in parallel."""
    backends = routes.checked
    if not backends:
        return {}
    timeout = routes.setting("health_timeout_seconds")
    metrics_urls = sorted({b["npu_metrics_url"] for b in backends if b.get("npu_metrics_url")})
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL_CHECKS, len(backends) + len(metrics_urls))) as pool:
        health = dict(zip([b["key"] for b in backends],
                          pool.map(lambda b: check_health(b["url"], timeout), backends)))
        reports = dict(zip(metrics_urls, pool.map(lambda u: node_report(u, timeout), metrics_urls)))
    return {b["key"]: judge(b, health[b["key"]], reports.get(b.get("npu_metrics_url"))) for b in backends}


def step(watched: dict[str, Watched], verdicts: dict[str, str | None], fails: int, passes: int,
         now: float) -> list[str]:
    """Count each verdict in; those that crossed `fails` leave (a stopping unit at its first), those that
    crossed `passes` return. Returns what changed, as log lines. Never takes out the last routed instance."""
    changes = []
    for key in list(watched):
        if key not in verdicts:  # drained, or no longer in the data
            del watched[key]
    for key, reason in verdicts.items():
        state = watched.setdefault(key, Watched())
        if reason:
            state.failed, state.passed = state.failed + 1, 0
            if state.since is not None:
                state.reason = reason
        else:
            state.failed, state.passed = 0, state.passed + 1
    for key, state in watched.items():
        if state.since is not None and state.passed >= passes:
            changes.append(f"{key} returns to routing: {passes} checks passed after {now - state.since:.1f}s out "
                           f"({state.reason})")
            state.since, state.reason = None, None
    for key, state in watched.items():
        needed = 1 if verdicts[key] == STOPPING else fails
        if state.since is None and state.failed >= needed:
            if not any(s.since is None and s.failed < fails for k, s in watched.items() if k != key):
                continue  # every other routed instance fails too: they stay, there is nothing better
            state.since, state.reason = now, verdicts[key]
            counted = "at the first check" if needed == 1 else f"{needed} checks in a row"
            changes.append(f"{key} leaves routing: {verdicts[key]} ({counted})")
    return changes


def isolated(watched: dict[str, Watched]) -> dict[str, dict]:
    return {key: {"reason": s.reason, "since": s.since} for key, s in sorted(watched.items()) if s.since is not None}


def nginx_text(routes: Routes, out: set[str]) -> str:
    """nginx's config with the instances in `out` down: each of their server lines from the render
    with every instance out, every other line from the render with every instance in."""
    routed, without = (routes.document["nginx"][kind].split("\n") for kind in ("routed", "isolated"))
    if len(routed) != len(without):
        raise ValueError("the routes file's two nginx renders differ in lines")
    for key, index in routes.document["nginx"]["server_lines"].items():
        if key in out:
            routed[index] = without[index]
    return "\n".join(routed)


def first_error(output: str) -> str:
    lines = output.strip().splitlines() or ["no output"]
    return next((line for line in lines if re.search(r"emerg|failed|error", line, re.I)), lines[0])


def write_nginx(routes: Routes, out: set[str]) -> str | None:
    """Put nginx's config for `out` in place and reload nginx; None, or why the old one keeps serving."""
    path = routes.document["nginx"]["config"]
    text = nginx_text(routes, out)
    try:
        with open(path) as handle:
            if handle.read() == text:
                return None
    except FileNotFoundError:
        pass
    previous = f"{path}.previous"
    had = os.path.exists(path)
    if had:
        os.replace(path, previous)
    write_atomically(path, text, 0o644)
    checked = subprocess.run(["nginx", "-t"], capture_output=True, text=True)
    if checked.returncode != 0:
        if had:
            os.replace(previous, path)
        else:
            os.unlink(path)
        return f"new gateway config rejected by nginx -t, the previous one keeps serving: {first_error(checked.stderr)}"
    if had:
        os.unlink(previous)
    active = subprocess.run(["systemctl", "is-active", "--quiet", "nginx"]).returncode == 0
    reloaded = subprocess.run(["systemctl", "reload" if active else "start", "nginx"], capture_output=True, text=True)
    if reloaded.returncode != 0:
        return f"systemctl reload nginx failed: {first_error(reloaded.stderr)}"
    return None


def write_atomically(path: str, text: str, mode: int) -> None:
    """Readers (nginx, node_exporter, status) never see a half-written file: write beside it, then rename."""
    fd, staged = tempfile.mkstemp(dir=os.path.dirname(path), prefix=f".{os.path.basename(path)}.")
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.chmod(staged, mode)
    os.replace(staged, path)


def metrics_text(routes: Routes, out: dict[str, dict], checked_at: float) -> str:
    lines = [
        f"# HELP {METRIC_PREFIX}_isolated Whether this gateway's route watcher took the instance out of routing.",
        f"# TYPE {METRIC_PREFIX}_isolated gauge",
        *(f'{METRIC_PREFIX}_isolated{{backend="{b["key"]}"}} {int(b["key"] in out)}' for b in routes.checked),
        f"# HELP {METRIC_PREFIX}_watch_checked_seconds When the route watcher last checked every instance.",
        f"# TYPE {METRIC_PREFIX}_watch_checked_seconds gauge",
        f"{METRIC_PREFIX}_watch_checked_seconds {checked_at:.3f}",
    ]
    return "\n".join(lines) + "\n"


def save_state(routes: Routes, watched: dict[str, Watched], checked_at: float) -> None:
    out = isolated(watched)
    state_file = routes.document["state_file"]
    os.makedirs(os.path.dirname(state_file), exist_ok=True)
    write_atomically(state_file, json.dumps({"isolated": out, "checked_at": checked_at}, indent=1) + "\n", 0o644)
    textfile = routes.document.get("textfile")
    if textfile and os.path.isdir(os.path.dirname(textfile)):
        write_atomically(textfile, metrics_text(routes, out, checked_at), 0o644)


def isolated_keys(state_text: str) -> dict[str, dict]:
    """{key: {"reason", "since"}} of those out, from the state file's text; none when it is unreadable."""
    try:
        out = json.loads(state_text).get("isolated", {})
    except (ValueError, AttributeError):
        return {}
    return out if isinstance(out, dict) else {}


def load_state(routes: Routes) -> dict[str, Watched]:
    """Who is out, from the state file (a restarted watcher keeps them out until they pass)."""
    try:
        with open(routes.document["state_file"]) as handle:
            out = isolated_keys(handle.read())
    except OSError:
        out = {}
    keys = {b["key"] for b in routes.checked}
    return {key: Watched(reason=value["reason"], since=value["since"]) for key, value in out.items() if key in keys}


class Locked:
    """The one writer of the gateway's routing at a time: the watcher's cycle or the stage's apply."""

    def __init__(self, routes: Routes):
        self.path = routes.document["lock_file"]

    def __enter__(self) -> Locked:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self.handle = open(self.path, "w")
        fcntl.flock(self.handle, fcntl.LOCK_EX)
        return self

    def __exit__(self, *_exc) -> None:
        self.handle.close()


def routing_applied(routes: Routes, watched: dict[str, Watched]) -> str | None:
    """Make the gateway route as `routes` and `watched` say; None, or why it could not."""
    out = set(isolated(watched))
    router = routes.document.get("router")
    if router is None:
        return write_nginx(routes, out)
    # nginx sends everything to the router (its config does not change with who is out); the router's
    # workers are the instances routed and not out.
    from router_api import sync_workers  # installed beside this program when the policy is cache_aware
    return write_nginx(routes, set()) or sync_workers(router, [b for b in routes.checked if b["key"] not in out])


def apply(path: str) -> int:
    """Once, from the gateway stage: the routes file as written, those out staying out."""
    routes = Routes.read(path)
    with Locked(routes):
        watched = load_state(routes)
        problem = routing_applied(routes, watched)
        save_state(routes, watched, time.time())
    if problem:
        print(problem, file=sys.stderr)
        return 1
    return 0


def watch(path: str) -> int:
    """Check, decide, apply, for ever; the routes file is read again whenever the stage rewrites it."""
    routes, read_at = Routes.read(path), os.stat(path).st_mtime_ns
    watched, unapplied = load_state(routes), True  # at start, route as the files say
    print(f"watching {len(routes.checked)} instances every {routes.setting('interval_seconds')}s", flush=True)
    while True:
        started = time.monotonic()
        if os.stat(path).st_mtime_ns != read_at:
            routes, read_at = Routes.read(path), os.stat(path).st_mtime_ns
        verdicts = check_all(routes)
        with Locked(routes):
            changes = step(watched, verdicts, routes.setting("fails"), routes.setting("passes"), time.time())
            for line in changes:
                print(line, flush=True)
            # A change nginx or the router refused is tried again each check; the router's workers are
            # compared each check (one loopback GET), as a restarted router has its start's workers.
            if changes or unapplied or routes.document.get("router"):
                problem = routing_applied(routes, watched)
                unapplied = problem is not None
                if problem:
                    print(problem, file=sys.stderr, flush=True)
            save_state(routes, watched, time.time())
        time.sleep(max(0.0, routes.setting("interval_seconds") - (time.monotonic() - started)))


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[1] not in ("watch", "apply"):
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    return watch(argv[2]) if argv[1] == "watch" else apply(argv[2])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
