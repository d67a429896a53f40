"""Two gateways behind one virtual address (issue 33), on a lab of its own brought up with
`lab up --gateways 2`: keepalived really runs in both gateway nodes, and clients use the address
(the subnet's last, which the lab data gives as gateway_vip).

One worker: the proof is the gateways'. The module deploys once (its fixture) and runs in file
order: the first gateway takes the address; a power-off of the holder under load moves it, and its
return does not take it back; a rollout with a gateway off stops before anything is drained or
restarted; resumed with both up, it completes under load without a failed request.

The load of the power-off test is paced (a new request every PACE_SECONDS, each on its own), not a
fixed number of clients: a request streaming from a gateway that lost power waits for bytes that never
come, until its read timeout, and clients that all wait so would send nothing new to show when the
address serves again.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from ascend_fleet.lab import lab as lab_api
from ascend_fleet.lab.state import LabState
from ascend_fleet.loadgen import RequestResult, stream_chat
from ascend_fleet.node_layout import GATEWAY_CONFIG
from tests.lab.conftest import INSTANCES, Lab, brought_up, module_lab
from tests.lab.test_rollout import LOAD_RESULTS, MODEL, buffsize_data, instance_env, under_load, unit_starts

pytestmark = [pytest.mark.lab, pytest.mark.part("session-lab")]  # a lab of its own: placed to balance the parts

WORKER = "worker1"
GATEWAYS = ("gateway", "gateway2")
PACE_SECONDS = 0.1
READ_TIMEOUT_SECONDS = 8
FIGURES: dict[str, float] = {}


@pytest.fixture(scope="module")
def lab():
    """Two gateways and one worker, of their own (subnet N+8; test_mirror.py takes N+2), up anew."""
    yield from brought_up(module_lab("ha", "h", 8), 1, "--gateways", "2")


@pytest.fixture(scope="module")
def vip(lab) -> str:
    """The full deploy on fresh nodes; the address clients use."""
    lab.pyinfra("deploys/full.py", timeout=3600)
    return LabState.require(lab.lab_dir).spec.gateway_vip.split("/")[0]


def holders(lab: Lab, vip: str, gateways=GATEWAYS) -> list[str]:
    """The gateways that have the address on an interface now, asked on each."""
    return [node for node in gateways
            if lab.run(node, f"ip -o -4 addr show to {vip}/32").stdout.strip()]


def status_of_gateways(lab: Lab) -> dict[str, object]:
    """`ascend-fleet status --json`: each gateway's holds_vip, or "unreachable"."""
    result = lab.cli("status", lab.inventory, "--json", check=False)
    hosts = json.loads(result.stdout)["hosts"]
    return {host["host"]: "unreachable" if host["error"] else host["holds_vip"]
            for host in hosts if host["role"] == "gateway"}


def firing(lab: Lab, node: str, alert: str) -> list[dict]:
    """The labels of each alert of this name firing on the node's Prometheus, asked there."""
    answer = json.loads(lab.run(node, "curl -s http://127.0.0.1:9090/api/v1/alerts").stdout)
    return [a["labels"] for a in answer["data"]["alerts"] if a["labels"]["alertname"] == alert and a["state"] == "firing"]


def holds_as_watched(lab: Lab, watcher: str, expected: dict[str, str], timeout: float = 90) -> dict[str, str]:
    """What the watcher's Prometheus has scraped of each gateway's holds_vip, once it is what the gateways hold
    now (a scrape lags keepalived's notify by up to its interval): a move is a change it has seen
    (VirtualAddressMoved), so the series must be there before the move."""
    deadline = time.monotonic() + timeout
    while True:
        answer = json.loads(lab.run(watcher, "curl -s http://127.0.0.1:9090/api/v1/query "
                                             "--data-urlencode query=ascend_fleet_gateway_holds_vip").stdout)
        seen = {r["metric"]["host"]: r["value"][1] for r in answer["data"]["result"]}
        if seen == expected or time.monotonic() > deadline:
            return seen
        time.sleep(3)


def alerts_while_off(lab: Lab, watcher: str, timeout: float = 150) -> dict[str, list[str]]:
    """Once the watcher's Prometheus fires both: GatewayDown and VirtualAddressMoved, by host."""
    deadline = time.monotonic() + timeout
    while True:
        seen = {alert: sorted(labels["host"] for labels in firing(lab, watcher, alert))
                for alert in ("GatewayDown", "VirtualAddressMoved")}
        if all(seen.values()) or time.monotonic() > deadline:
            return seen
        time.sleep(3)


def keepalived_up(lab: Lab, node: str, timeout: float = 180) -> None:
    lab.wait_running(node, timeout=timeout)
    deadline = time.monotonic() + timeout
    while lab.run(node, "systemctl is-active keepalived nginx", check=False).returncode != 0:
        assert time.monotonic() < deadline, f"keepalived and nginx not active on {node} after {timeout}s"
        time.sleep(1)


class PacedLoad:
    """A new streaming chat request through url every PACE_SECONDS, each in a thread of its own."""

    def __init__(self, url: str):
        self.url, self.results, self.threads = url, [], []
        self.origin = time.monotonic()
        self.stopped = threading.Event()
        self.pacer = threading.Thread(target=self.pace, daemon=True)

    def now(self) -> float:
        return time.monotonic() - self.origin

    def one(self) -> None:
        self.results.append(stream_chat(self.url, MODEL, "Say hello", 16, self.origin, READ_TIMEOUT_SECONDS)[0])

    def pace(self) -> None:
        while not self.stopped.is_set():
            thread = threading.Thread(target=self.one, daemon=True)
            thread.start()
            self.threads.append(thread)
            self.stopped.wait(PACE_SECONDS)

    def __enter__(self) -> PacedLoad:
        self.pacer.start()
        return self

    def __exit__(self, *_exc) -> None:
        self.stopped.set()
        self.pacer.join()
        for thread in self.threads:
            thread.join()


def test_the_first_gateway_takes_the_address_and_status_says_which(lab, vip):
    assert holders(lab, vip) == ["gateway"]
    assert status_of_gateways(lab) == {"gateway": True, "gateway2": False}
    held = {"gateway": "1", "gateway2": "0"}
    assert holds_as_watched(lab, "gateway2", held) == held
    load = json.loads(lab.cli("load", lab.inventory, "--requests", "4", "--concurrency", "2", "--json").stdout)
    assert load["through"] == f"http://{vip}:80 (the virtual address, held by gateway)" and load["errors"] == 0


def test_the_holder_powered_off_under_load_fails_only_what_was_in_flight_and_its_return_takes_nothing(lab, vip):
    with PacedLoad(f"http://{vip}") as load:
        time.sleep(3)
        lab_api.power_off(lab.lab_dir, "gateway")
        off = load.now()
        time.sleep(10)
        moved = status_of_gateways(lab)
        alerts = alerts_while_off(lab, "gateway2")
        lab_api.power_on(lab.lab_dir, "gateway")
        keepalived_up(lab, "gateway")
        back = load.now()
        time.sleep(8)
    results: list[RequestResult] = load.results
    failed = sorted((r for r in results if not r.ok), key=lambda r: r.started)
    served_again = min(r.started + r.latency for r in results if r.ok and r.started >= off) - off
    FIGURES.update(requests=len(results), failed=len(failed), served_again_seconds=round(served_again, 2))
    print(f"power-off of the holder: {FIGURES}; failed: {[(round(r.started - off, 2), r.error) for r in failed]}")
    assert moved == {"gateway": "unreachable", "gateway2": True}
    # Watched from outside: the other gateway's Prometheus says the gateway is down and the address moved.
    assert alerts == {"GatewayDown": ["gateway"], "VirtualAddressMoved": ["gateway2"]}
    # Only what was in flight on the gateway that lost power fails: every request sent after, and after its
    # return, succeeds; new requests are answered within 3 s of the failure.
    assert all(r.started < off for r in failed), [(r.started - off, r.error) for r in failed]
    assert len(failed) <= (READ_TIMEOUT_SECONDS + 1) / PACE_SECONDS and served_again <= 3.0, FIGURES
    assert sum(r.ok for r in results if r.started >= back) > 50
    assert holders(lab, vip) == ["gateway2"]  # nopreempt: the returning gateway left it where it was
    assert status_of_gateways(lab) == {"gateway": False, "gateway2": True}


def test_a_rollout_with_a_gateway_off_stops_before_anything_is_drained_or_restarted(lab, vip):
    lab_api.power_off(lab.lab_dir, "gateway2")
    try:
        starts = unit_starts(lab, WORKER)
        with under_load(f"http://{vip}", "ha rollout, gateway2 off"):
            result = lab.cli("rollout", lab.inventory, "deploys/serve.py", "--data", buffsize_data(256),
                             "--max-unavailable", "1", check=False, timeout=1800)
        assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
        line = result.stderr.strip().splitlines()[-1]
        assert "gateway: gateway2: cannot connect over SSH" in line and "every gateway takes each drain" in line, line
        assert unit_starts(lab, WORKER) == starts and "HCCL_BUFFSIZE=256" not in instance_env(lab, WORKER)
        assert LOAD_RESULTS["ha rollout, gateway2 off"]["errors"] == 0
        config = lab.run("gateway", f"cat {GATEWAY_CONFIG}").stdout
        assert " down;" not in config  # the gateway that answered was not told to drain either
    finally:
        lab_api.power_on(lab.lab_dir, "gateway2")
    keepalived_up(lab, "gateway2")


def test_resumed_with_both_gateways_up_the_rollout_completes_under_load_without_a_failed_request(lab, vip):
    with under_load(f"http://{vip}", "ha rollout"):
        result = lab.cli("rollout", lab.inventory, "deploys/serve.py", "--resume", "--json", check=False,
                         timeout=3600)
    record = json.loads(result.stdout) if result.stdout.strip() else {}
    assert result.returncode == 0 and record.get("ok"), result.stdout[-3000:] + result.stderr[-3000:]
    assert instance_env(lab, WORKER).count("HCCL_BUFFSIZE=256") == len(INSTANCES)
    summary = LOAD_RESULTS["ha rollout"]
    assert summary["requests"] > 20 and summary["errors"] == 0, summary
