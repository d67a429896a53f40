"""The users' site in one lab (issue 50 item 3): a bastion the only way in, two gateways behind a virtual
address, a Debian worker and an openEuler worker, and no internet: `lab up --bastion --gateways 2
--offline-bundle DIR` (subnet N+5, worker2 on openEuler 24.03). The bundle is made from the site's own
inventory, with the lab's mirror on this machine (which the site's nodes cannot reach) as the indexes that
answer where it is made, and the lab's openEuler repositories; the gateway (group mirror) serves it, and the
deploy's own environment has no route to any index.

The module deploys once and again (its fixture) and runs in file order: the way in and the air gap, the
first deploy and what it installed (from the bundle; the openEuler worker's driver, packages and firewall),
a rerun that changes nothing, status and the address's holder, the holder powered off under load, a
rollout with a gateway off refused, resumed under load through the address, then a benchmark of one
instance through a tunnel over the bastion.

What it replaced, each case here: tests/lab/test_bastion.py (one worker behind a bastion),
tests/lab/test_gateway_ha.py (two gateways, one worker), tests/lab/test_offline_site.py (an offline lab
with an openEuler worker), and the deploy half of tests/lab/test_openeuler.py (which keeps the openEuler
node's shape and the refusals before any deploy). The load of the power-off test is paced (a new request
every PACE_SECONDS, each on its own): a request streaming from a gateway that lost power waits for bytes
that never come, until its read timeout, and clients that all wait so would send nothing new to show when
the address serves again.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from ascend_fleet.config.node_os import node_os
from ascend_fleet.control.loadgen import RequestResult, stream_chat
from ascend_fleet.core.node_layout import BUNDLE_APT_SOURCE, BUNDLE_DNF_REPO, FIREWALL_UNIT, GATEWAY_CONFIG
from ascend_fleet.lab import lab as lab_api
from ascend_fleet.lab import rpmrepo
from ascend_fleet.lab.lab import ssh_dir
from ascend_fleet.lab.rpmrepo import STANDINS
from ascend_fleet.lab.spec import SITE_MIRROR_PORT
from ascend_fleet.lab.state import LabState
from tests.lab.conftest import BIN, INSTANCES, PROJECT, Lab, brought_up, module_lab, needs_bench_venv
from tests.lab.test_bench import BENCH_TIMEOUT_SECONDS, SMALL_RUN
from tests.lab.test_full_deploy import assert_the_workers_hold_exactly_the_lock, changed_operations, chat, totals
from tests.lab.test_rollout import LOAD_RESULTS, MODEL, buffsize_data, instance_env, under_load, unit_starts

# Its own lab and mirror: the part with room (scripts/test), the whole module in one part (a test taking only
# `site` ran in another part, which brought the site up a second time).
pytestmark = [pytest.mark.lab, pytest.mark.part("unit-sim")]

WORKERS = ("worker1", "worker2")
OPENEULER = "worker2"
GATEWAYS = ("gateway", "gateway2")
ARCH = os.uname().machine
OPENEULER_DATA = node_os("openEuler", "24.03")
# What the product's data says a worker installs on openEuler 24.03.
OPENEULER_PACKAGES = ("python3", OPENEULER_DATA.nftables, OPENEULER_DATA.nginx,
                      OPENEULER_DATA.node_exporter.package, *OPENEULER_DATA.driver_prerequisites)
PUBLIC_INDEX = "https://pypi.org/simple/"
# The deploy's environment: its HTTP(S) goes to a port nothing listens on, but to the lab's own nodes.
NO_ROUTE = "http://127.0.0.1:9"
PACE_SECONDS = 0.1
READ_TIMEOUT_SECONDS = 8
FIGURES: dict[str, float] = {}


def offline_environment(site: Lab) -> dict:
    return {**site.env, "http_proxy": NO_ROUTE, "https_proxy": NO_ROUTE, "HTTP_PROXY": NO_ROUTE,
            "HTTPS_PROXY": NO_ROUTE, "no_proxy": f"{site.subnet},127.0.0.1,localhost",
            "NO_PROXY": f"{site.subnet},127.0.0.1,localhost"}


@pytest.fixture(scope="module")
def site_dir(tmp_path_factory):
    """The site's hardware file, and where its bundle goes (made by the `bundle` fixture, after `lab up`)."""
    made_in = tmp_path_factory.mktemp("site")
    (made_in / "hardware.yaml").write_text(f"nodes:\n  {OPENEULER}: {{os: openeuler-24.03}}\n")
    return made_in


@pytest.fixture(scope="module")
def site(site_dir):
    """The users' site, up anew: bastion, two gateways, worker1 on Debian 12, worker2 on openEuler 24.03."""
    yield from brought_up(module_lab("site", "s", 5), len(WORKERS), "--bastion", "--gateways", str(len(GATEWAYS)),
                          "--offline-bundle", str(site_dir / "bundle"), "--hardware", str(site_dir / "hardware.yaml"))


@pytest.fixture(scope="module")
def bundle(site, site_dir, tmp_path_factory):
    """`ascend-fleet bundle` of the site's inventory, as an operator makes it where the indexes answer: here the
    lab's mirror on this machine, which the site's nodes cannot reach (its index, vendor files, model, proxy of
    Debian's archive) by --data, and the lab's openEuler repositories (a folder: a file URL) with the headers of
    the kernel its openEuler node runs."""
    repositories = tmp_path_factory.mktemp("openeuler-repositories")
    rpmrepo.publish(repositories, ARCH)
    mirror = site.mirror_url
    made = subprocess.run([str(BIN / "ascend-fleet"), "bundle", site.inventory, "--out", str(site_dir / "bundle"),
                           "--arch", ARCH, "--data", f"pip_index_url={mirror}/simple",
                           "--data", f"vendor_mirror_url={mirror}/files",
                           "--data", f"model_mirror_url={mirror}",
                           "--os", f"Debian 12={mirror}/debian",
                           "--os", f"openEuler 24.03=file://{repositories}/openeuler/{rpmrepo.RELEASE}",
                           "--kernel", rpmrepo.kernel_release(ARCH)],
                          env=site.env, cwd=PROJECT, capture_output=True, text=True, timeout=1800)
    assert made.returncode == 0, made.stdout + made.stderr[-3000:]
    return site_dir / "bundle"


@pytest.fixture(scope="module")
def deployed(site, bundle):
    """The full deploy, twice (timed), through the bastion, from an environment with no route to any index."""
    home = site.env
    site.env = offline_environment(site)
    try:
        started = time.monotonic()
        first = site.pyinfra("deploys/full.py", timeout=3600)
        FIGURES["first_deploy_seconds"] = round(time.monotonic() - started)
        started = time.monotonic()
        again = site.pyinfra("deploys/full.py", timeout=3600)
        FIGURES["rerun_seconds"] = round(time.monotonic() - started)
    finally:
        site.env = home
    print(f"the users' site, full deploy: {FIGURES}")
    return {"first": first.stdout, "again": again.stdout}


@pytest.fixture(scope="module")
def vip(site) -> str:
    """The address clients use."""
    return LabState.require(site.lab_dir).spec.gateway_vip.split("/")[0]



def holders(site: Lab, vip: str, gateways=GATEWAYS) -> list[str]:
    """The gateways that have the address on an interface now, asked on each."""
    return [node for node in gateways if site.run(node, f"ip -o -4 addr show to {vip}/32").stdout.strip()]


def status_of_gateways(site: Lab) -> dict[str, object]:
    """`ascend-fleet status --json`: each gateway's holds_vip, or "unreachable"."""
    result = site.cli("status", site.inventory, "--json", check=False)
    hosts = json.loads(result.stdout)["hosts"]
    return {host["host"]: "unreachable" if host["error"] else host["holds_vip"]
            for host in hosts if host["role"] == "gateway"}


def firing(site: Lab, node: str, alert: str) -> list[dict]:
    """The labels of each alert of this name firing on the node's Prometheus, asked there."""
    answer = json.loads(site.run(node, "curl -s http://127.0.0.1:9090/api/v1/alerts").stdout)
    return [a["labels"] for a in answer["data"]["alerts"] if a["labels"]["alertname"] == alert and a["state"] == "firing"]


def holds_as_watched(site: Lab, watcher: str, expected: dict[str, str], timeout: float = 90) -> dict[str, str]:
    """What the watcher's Prometheus has scraped of each gateway's holds_vip, once it is what the gateways hold
    now (a scrape lags keepalived's notify by up to its interval): a move is a change it has seen
    (VirtualAddressMoved), so the series must be there before the move."""
    deadline = time.monotonic() + timeout
    while True:
        answer = json.loads(site.run(watcher, "curl -s http://127.0.0.1:9090/api/v1/query "
                                              "--data-urlencode query=ascend_fleet_gateway_holds_vip").stdout)
        seen = {r["metric"]["host"]: r["value"][1] for r in answer["data"]["result"]}
        if seen == expected or time.monotonic() > deadline:
            return seen
        time.sleep(3)


def alerts_while_off(site: Lab, watcher: str, timeout: float = 150) -> dict[str, list[str]]:
    """Once the watcher's Prometheus fires both: GatewayDown and VirtualAddressMoved, by host."""
    deadline = time.monotonic() + timeout
    while True:
        seen = {alert: sorted(labels["host"] for labels in firing(site, watcher, alert))
                for alert in ("GatewayDown", "VirtualAddressMoved")}
        if all(seen.values()) or time.monotonic() > deadline:
            return seen
        time.sleep(3)


def keepalived_up(site: Lab, node: str, timeout: float = 180) -> None:
    site.wait_running(node, timeout=timeout)
    deadline = time.monotonic() + timeout
    while site.run(node, "systemctl is-active keepalived nginx", check=False).returncode != 0:
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


def test_this_machine_reaches_the_nodes_only_through_the_bastion(site):
    for node in ("worker1", OPENEULER, *GATEWAYS):
        with pytest.raises(OSError) as refused:
            socket.create_connection((site.address(node), 22), timeout=10).close()
        assert refused.value.errno == errno.EHOSTUNREACH, (node, refused.value)
    keys = ssh_dir(site.lab_dir)
    direct = subprocess.run(["ssh", "-i", str(keys / "id_ed25519"), "-o", f"UserKnownHostsFile={keys / 'known_hosts'}",
                             "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10",
                             f"root@{site.address('worker1')}", "true"], capture_output=True, text=True, timeout=60)
    assert direct.returncode == 255 and "No route to host" in direct.stderr, direct.stderr
    # `lab ssh`'s way (Lab.run): the worker sees the connection come from the bastion.
    seen_from = site.run("worker1", "echo $SSH_CONNECTION").stdout.split()[0]
    assert seen_from == site.address("bastion")


def test_no_index_answers_the_nodes_or_the_deploys_environment(site):
    for node in ("worker1", OPENEULER, *GATEWAYS):
        for url in (f"{site.mirror_url}/simple/", PUBLIC_INDEX):
            tried = site.run(node, f"curl -sS --max-time 5 -o /dev/null {url}", check=False)
            assert tried.returncode != 0, (node, url, tried.stdout)
    probe = ("import requests, sys\ntry:\n    requests.get(sys.argv[1], timeout=10)\nexcept requests.RequestException:"
             "\n    sys.exit(7)\n")
    tried = subprocess.run([sys.executable, "-c", probe, PUBLIC_INDEX], env=offline_environment(site), timeout=60)
    assert tried.returncode == 7
    piped = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-d", os.devnull, "--index-url",
                            PUBLIC_INDEX, "--retries", "0", "--timeout", "5", "idna"],
                           env=offline_environment(site), capture_output=True, text=True, timeout=120)
    assert piped.returncode != 0, piped.stdout


@pytest.fixture(scope="module")
def first_holder(site, deployed, vip) -> list[str]:
    """The gateways holding the address after the first deploy (asked once; one, if all is well). keepalived's
    nopreempt keeps it with the first to start: the higher priority wins only when both start within its skew
    of each other (a CI rehearsal's deploy through the bastion started gateway2's first)."""
    return holders(site, vip)


def other(gateway: str) -> str:
    return next(name for name in GATEWAYS if name != gateway)


def test_the_first_deploy_serves_through_the_virtual_address_held_by_one_gateway(site, deployed, vip, first_holder):
    assert totals(deployed["first"])["errors"] == 0
    held = first_holder
    assert len(held) == 1, held
    load = json.loads(site.cli("load", site.inventory, "--requests", "8", "--concurrency", "2", "--json").stdout)
    assert load["through"] == f"http://{vip}:80 (the virtual address, held by {held[0]})" and load["errors"] == 0


def test_the_fleet_installs_from_the_bundle_its_gateway_serves(site, deployed):
    gateway = site.address("gateway")
    assert "deb [trusted=yes] http://" in site.run("worker1", f"cat {BUNDLE_APT_SOURCE}").stdout
    installed = site.run(OPENEULER, f"cat {BUNDLE_DNF_REPO}; rpm -q nginx node_exporter nftables").stdout
    assert f"baseurl=http://{gateway}:{SITE_MIRROR_PORT}/os/openeuler-24.03-{ARCH}" in installed, installed
    assert "not installed" not in installed, installed
    served = site.run("worker1", f"curl -fsS --max-time 5 http://{gateway}:{SITE_MIRROR_PORT}/simple/vllm/")
    assert "vllm-" in served.stdout


def test_every_worker_holds_the_same_python_files_and_they_are_the_bundles_lock(site, bundle, deployed):
    assert_the_workers_hold_exactly_the_lock(site, list(WORKERS), bundle / "locks")


def test_the_openeuler_worker_builds_its_driver_against_the_running_kernels_headers(site, deployed):
    """Huawei's guide installs kernel-devel-$(uname -r) and kernel-headers-$(uname -r); the repositories' newest
    (update/ carries a later kernel's) would leave DKMS without the running kernel's tree."""
    out = site.run(OPENEULER, "uname -r; rpm -q kernel-devel kernel-headers; "
                              "test -e /lib/modules/$(uname -r)/build/include && echo tree-found").stdout.split()
    kernel = rpmrepo.kernel_release(ARCH)
    assert out == [kernel, f"kernel-devel-{kernel}", f"kernel-headers-{kernel}", "tree-found"], out


def test_the_openeuler_worker_gets_its_packages_with_dnf(site, deployed):
    out = site.run(OPENEULER, f"rpm -q {' '.join(OPENEULER_PACKAGES)}; dnf -q history list", check=False).stdout
    assert "not installed" not in out, out
    versions = {standin.name: f"{standin.name}-{standin.version}-{standin.release}" for standin in STANDINS}
    for package in OPENEULER_PACKAGES:
        if package in versions:
            assert versions[package] in out, (package, out)
    assert "install" in out.lower(), out  # dnf's own history: the packages came through dnf


def test_the_openeuler_worker_serves_both_gateways_its_firewall_handed_over(site, deployed, vip):
    worker = site.address(OPENEULER)
    # From each gateway to the openEuler node's instance: firewalld (active from its first boot) no
    # longer rejects it, and the instance firewall the product installs in its place admits the gateways.
    for gateway in GATEWAYS:
        assert worker in site.run(gateway, f"cat {GATEWAY_CONFIG}").stdout
        models = site.run(gateway, f"curl -fsS --max-time 10 http://{worker}:8000/v1/models").stdout
        assert MODEL in models, (gateway, models)
    states = site.run(OPENEULER, f"systemctl is-enabled firewalld; systemctl is-active firewalld {FIREWALL_UNIT}",
                      check=False).stdout.split()
    assert states == ["masked", "inactive", "active"], states
    for _ in range(8):  # round robin over both workers' instances
        answer = chat(f"http://{vip}")
        assert answer.status_code == 200, answer.text


def test_a_rerun_changes_nothing(deployed):
    again = totals(deployed["again"])
    assert again["changed"] == 0 and again["errors"] == 0, (again, changed_operations(deployed["again"]))


def test_status_through_the_bastion_is_green_and_says_which_gateway_holds_the_address(site, deployed,
                                                                                     first_holder):
    result = site.cli("status", site.inventory, "--json", check=False)
    reading = json.loads(result.stdout)
    assert result.returncode == 0 and reading["ok"], result.stdout[-3000:] + result.stderr[-3000:]
    rows = [instance for host in reading["hosts"] for instance in host["instances"]]
    assert len(rows) == len(WORKERS) * len(INSTANCES)
    assert all(row["health"] == 200 and row["routed"] == "yes" for row in rows), rows
    [holder] = first_holder
    assert status_of_gateways(site) == {holder: True, other(holder): False}
    held = {holder: "1", other(holder): "0"}
    assert holds_as_watched(site, other(holder), held) == held


def test_the_holder_powered_off_under_load_fails_only_what_was_in_flight_and_its_return_takes_nothing(
        site, deployed, vip, first_holder):
    [holder] = first_holder
    with PacedLoad(f"http://{vip}") as load:
        time.sleep(3)
        lab_api.power_off(site.lab_dir, holder)
        off = load.now()
        time.sleep(10)
        moved = status_of_gateways(site)
        alerts = alerts_while_off(site, other(holder))
        lab_api.power_on(site.lab_dir, holder)
        keepalived_up(site, holder)
        back = load.now()
        time.sleep(8)
    results: list[RequestResult] = load.results
    failed = sorted((r for r in results if not r.ok), key=lambda r: r.started)
    served_again = min(r.started + r.latency for r in results if r.ok and r.started >= off) - off
    FIGURES.update(requests=len(results), failed=len(failed), served_again_seconds=round(served_again, 2))
    print(f"power-off of the holder: {FIGURES}; failed: {[(round(r.started - off, 2), r.error) for r in failed]}")
    assert moved == {holder: "unreachable", other(holder): True}
    # Watched from outside: the other gateway's Prometheus says the gateway is down and the address moved.
    assert alerts == {"GatewayDown": [holder], "VirtualAddressMoved": [other(holder)]}
    # Only what was in flight on the gateway that lost power fails: every request sent after, and after its
    # return, succeeds; new requests are answered within 3 s of the failure.
    assert all(r.started < off for r in failed), [(r.started - off, r.error) for r in failed]
    assert len(failed) <= (READ_TIMEOUT_SECONDS + 1) / PACE_SECONDS and served_again <= 3.0, FIGURES
    assert sum(r.ok for r in results if r.started >= back) > 50
    assert holders(site, vip) == [other(holder)]  # nopreempt: the returning gateway left it where it was
    assert status_of_gateways(site) == {holder: False, other(holder): True}


def test_a_rollout_with_a_gateway_off_stops_before_anything_is_drained_or_restarted(site, deployed, vip):
    lab_api.power_off(site.lab_dir, "gateway2")
    try:
        starts = {worker: unit_starts(site, worker) for worker in WORKERS}
        with under_load(f"http://{vip}", "site rollout, gateway2 off"):
            result = site.cli("rollout", site.inventory, "deploys/serve.py", "--data", buffsize_data(256),
                              "--max-unavailable", "1", check=False, timeout=1800)
        assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
        line = result.stderr.strip().splitlines()[-1]
        assert "gateway: gateway2: cannot connect over SSH" in line and "every gateway takes each drain" in line, line
        for worker in WORKERS:
            assert unit_starts(site, worker) == starts[worker]
            assert "HCCL_BUFFSIZE=256" not in instance_env(site, worker)
        assert LOAD_RESULTS["site rollout, gateway2 off"]["errors"] == 0
        assert " down;" not in site.run("gateway", f"cat {GATEWAY_CONFIG}").stdout  # nor was the other told to drain
    finally:
        lab_api.power_on(site.lab_dir, "gateway2")
    keepalived_up(site, "gateway2")


def test_resumed_with_both_gateways_up_the_rollout_completes_under_load_through_the_address(site, deployed, vip):
    """A real change (HCCL_BUFFSIZE) to every instance, one at a time, under load through the address: the
    rollout's deploys, gates and drains reach the nodes through the bastion, and each drain both gateways."""
    with under_load(f"http://{vip}", "site rollout"):
        result = site.cli("rollout", site.inventory, "deploys/serve.py", "--resume", "--json", check=False,
                          timeout=3600)
    record = json.loads(result.stdout) if result.stdout.strip() else {}
    assert result.returncode == 0 and record.get("ok"), result.stdout[-3000:] + result.stderr[-3000:]
    assert sorted(name for step in record["steps"] for name in step["instances"]) == sorted(
        f"{worker}/{instance}" for worker in WORKERS for instance in INSTANCES)
    assert all(len(step["instances"]) == 1 and step["status"] == "done" for step in record["steps"]), record["steps"]
    for worker in WORKERS:
        assert instance_env(site, worker).count("HCCL_BUFFSIZE=256") == len(INSTANCES)
    summary = LOAD_RESULTS["site rollout"]
    assert summary["requests"] > 20 and summary["errors"] == 0, summary


@needs_bench_venv
def test_bench_of_one_instance_goes_through_a_tunnel_over_the_bastion(site, deployed, tmp_path):
    result = site.cli("bench", site.inventory, "--instance", f"{OPENEULER}/vllm-0", *SMALL_RUN,
                      "--slo", "ttft_ms=600000,tpot_ms=60000", "--result-dir", str(tmp_path), check=False,
                      timeout=BENCH_TIMEOUT_SECONDS)
    saved = [json.loads(path.read_text()) for path in tmp_path.glob("*.json")]
    assert result.returncode == 0 and saved, result.stdout[-3000:] + result.stderr[-3000:]
    assert saved[0]["ascend_fleet"]["instance"] == f"{OPENEULER}/vllm-0"
    assert saved[0]["completed"] == 12 and saved[0]["failed"] == 0
