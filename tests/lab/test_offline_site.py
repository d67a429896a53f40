"""An air-gapped site, rehearsed (issue 32): a bundle made once from the session lab's mirror (its index, its
vendor files, its model, its proxy of Debian's archive) and the lab's openEuler repositories, then a fresh
lab of its own (subnet N+5, `lab up --offline-bundle`; worker2 on openEuler) whose nodes reach nothing on
the host, the mirror included, and a deploy whose
environment's HTTP goes to a proxy that does not answer. The gateway (group mirror) serves the bundle; every
package, .run file and weight comes from it. Then a rerun changes nothing."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import requests

from ascend_fleet.lab import rpmrepo
from ascend_fleet.lab.spec import SITE_MIRROR_PORT
from ascend_fleet.node_layout import BUNDLE_APT_SOURCE, BUNDLE_DNF_REPO
from tests.lab.conftest import BIN, PROJECT, brought_up, module_lab
from tests.lab.test_full_deploy import assert_the_workers_hold_exactly_the_lock, changed_operations, totals

pytestmark = pytest.mark.lab

PUBLIC_INDEX = "https://pypi.org/simple/"
OPENEULER = "worker2"
# The deploy's environment: its HTTP(S) goes to a port nothing listens on, but to the lab's own nodes.
NO_ROUTE = "http://127.0.0.1:9"


def offline_environment(lab) -> dict:
    return {**lab.env, "http_proxy": NO_ROUTE, "https_proxy": NO_ROUTE, "HTTP_PROXY": NO_ROUTE,
            "HTTPS_PROXY": NO_ROUTE, "no_proxy": f"{lab.subnet},127.0.0.1,localhost",
            "NO_PROXY": f"{lab.subnet},127.0.0.1,localhost"}


@pytest.fixture(scope="module")
def bundle(lab, tmp_path_factory):
    """`ascend-fleet bundle` of the session lab's fleet, made once: with Debian 12's OS packages (Debian's
    archive through the session lab's proxy) and openEuler 24.03's (the lab's openEuler repositories, here
    in a folder: a file URL) with the headers of the kernel its openEuler node runs."""
    made_in = tmp_path_factory.mktemp("offline")
    rpmrepo.publish(made_in, os.uname().machine)
    out = made_in / "bundle"
    made = subprocess.run([str(BIN / "ascend-fleet"), "bundle", lab.inventory, "--out", str(out), "--arch", "x86_64",
                           "--os", f"Debian 12={lab.mirror_url}/debian",
                           "--os", f"openEuler 24.03=file://{made_in}/openeuler/{rpmrepo.RELEASE}",
                           "--kernel", rpmrepo.kernel_release(os.uname().machine)],
                          env=lab.env, cwd=PROJECT, capture_output=True, text=True, timeout=1800)
    assert made.returncode == 0, made.stdout + made.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def offline(bundle, tmp_path_factory):
    """Two workers: worker1 on Debian 12, worker2 on the lab's openEuler 24.03 (dnf, firewalld)."""
    hardware = tmp_path_factory.mktemp("offline-lab") / "hardware.yaml"
    hardware.write_text(f"nodes:\n  {OPENEULER}: {{os: openeuler-24.03}}\n")
    yield from brought_up(module_lab("offline", "o", 5), 2, "--offline-bundle", str(bundle),
                          "--hardware", str(hardware))


@pytest.fixture(scope="module")
def deployed(offline):
    """The full deploy, twice, from the deploy's environment without a route to any index."""
    home = offline.env
    offline.env = offline_environment(offline)
    try:
        first = offline.pyinfra("deploys/full.py", timeout=3600)
        again = offline.pyinfra("deploys/full.py", timeout=3600)
    finally:
        offline.env = home
    return {"first": first.stdout, "again": again.stdout}


def test_no_index_answers_the_nodes_or_the_deploys_environment(offline, lab):
    for node in ("gateway", "worker1", OPENEULER):
        for url in (f"{offline.mirror_url}/simple/", f"{lab.mirror_url}/simple/", PUBLIC_INDEX):
            tried = offline.run(node, f"curl -sS --max-time 5 -o /dev/null {url}", check=False)
            assert tried.returncode != 0, (node, url, tried.stdout)
    probe = ("import requests, sys\ntry:\n    requests.get(sys.argv[1], timeout=10)\nexcept requests.RequestException:"
             "\n    sys.exit(7)\n")
    for url in (PUBLIC_INDEX, f"{lab.mirror_url}/simple/"):
        tried = subprocess.run([sys.executable, "-c", probe, url], env=offline_environment(offline), timeout=60)
        assert tried.returncode == 7, url
    piped = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-d", os.devnull, "--index-url",
                            PUBLIC_INDEX, "--retries", "0", "--timeout", "5", "idna"],
                           env=offline_environment(offline), capture_output=True, text=True, timeout=120)
    assert piped.returncode != 0, piped.stdout


def test_the_fleet_installs_from_the_bundle_its_gateway_serves_and_serves(offline, deployed):
    gateway = next(n for n in offline.status()["nodes"] if n["name"] == "gateway")["address"]
    assert "deb [trusted=yes] http://" in offline.run("worker1", f"cat {BUNDLE_APT_SOURCE}").stdout
    installed = offline.run(OPENEULER, f"cat {BUNDLE_DNF_REPO}; rpm -q nginx node_exporter nftables").stdout
    assert f"baseurl=http://{gateway}:{SITE_MIRROR_PORT}/os/openeuler-24.03-x86_64" in installed, installed
    assert "not installed" not in installed, installed
    served = offline.run("worker1", f"curl -fsS --max-time 5 http://{gateway}:{SITE_MIRROR_PORT}/simple/vllm/")
    assert "vllm-" in served.stdout
    for _ in range(4):
        answer = requests.post(f"http://{gateway}/v1/chat/completions", timeout=30, json={
            "model": "lab/Qwen3-Tiny", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8})
        assert answer.status_code == 200, answer.text


def test_every_worker_holds_the_same_python_files_and_they_are_the_bundles_lock(offline, bundle, deployed):
    assert_the_workers_hold_exactly_the_lock(offline, ["worker1", "worker2"], bundle / "locks")


def test_a_rerun_changes_nothing(deployed):
    again = totals(deployed["again"])
    assert again["changed"] == 0 and again["errors"] == 0, (again, changed_operations(deployed["again"]))
