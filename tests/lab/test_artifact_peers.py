"""Vendor packages and wheels spread over the fleet like the weights: the driver, CANN and Python
stages on every worker at once ask the origin (the lab mirror) once per package and per wheel, the
others take it from a peer; a corrupt copy on a peer is refused by the worker fetching it, which
takes it from elsewhere.

Every run is the real deploy (`pyinfra inventories/lab.py deploys/driver.py deploys/cann.py`,
`deploys/python_stack.py`). The mirror logs what the origin sent (<lab>/mirror/run/access.log);
each worker's nginx logs what it sent its peers (PEER_LOG).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from urllib.parse import unquote

import pytest

from ascend_fleet.config.profile import load_profile
from ascend_fleet.core.node_layout import PACKAGE_DIR, PEER_SERVER_LOG, WHEEL_DIR
from ascend_fleet.lab.mirror import mirror_root
from ascend_fleet.operations.vendor import PEER_PACKAGES_PATH

pytestmark = pytest.mark.lab

PEER_LOG = PEER_SERVER_LOG
PEER_PORT = 8090
MIRROR_GET = re.compile(r'"GET /(files|packages)/(\S+) HTTP/[\d.]+" (\d{3})')
PEER_GET = re.compile(r'^(\S+) .*"GET /(?:packages|wheels)/(\S+) HTTP/[\d.]+" (\d{3})', re.MULTILINE)


class Logs:
    """What the origin and each worker's peer server sent from now on."""

    def __init__(self, lab):
        self.lab = lab
        self.mirror_log = mirror_root(lab.lab_dir) / "run" / "access.log"
        self.mirror_offset = self.mirror_log.stat().st_size
        self.peer_offsets = {worker: self.peer_log_size(worker) for worker in lab.workers}

    def peer_log_size(self, worker: str) -> int:
        return int(self.lab.run(worker, f"stat -c %s {PEER_LOG} 2>/dev/null || echo 0").stdout)

    def from_origin(self, what: str = "files") -> Counter:
        """Vendor package (files) or wheel (packages) -> how many times the origin sent it whole (200)."""
        with self.mirror_log.open() as f:
            f.seek(self.mirror_offset)
            return Counter(unquote(name) for where, name, status in MIRROR_GET.findall(f.read())
                           if where == what and status == "200")

    def from_peer(self, worker: str) -> list[tuple[str, str, str]]:
        """(client address, file, status) of each package or wheel request the worker's peer server answered."""
        text = self.lab.run(worker, f"tail -c +{self.peer_offsets[worker] + 1} {PEER_LOG}").stdout
        return [(client, unquote(name), status) for client, name, status in PEER_GET.findall(text)]

    def sent(self) -> Sent:
        """What was sent until now, read once: what later tests fetch is not in it."""
        return Sent({what: self.from_origin(what) for what in ("files", "packages")},
                    {worker: self.from_peer(worker) for worker in self.lab.workers})


@dataclass(frozen=True)
class Sent:
    """What the origin and each worker's peer server sent during one run (Logs' questions, answered then)."""
    origin: dict[str, Counter]
    peers: dict[str, list[tuple[str, str, str]]]

    def from_origin(self, what: str = "files") -> Counter:
        return self.origin[what]

    def from_peer(self, worker: str) -> list[tuple[str, str, str]]:
        return self.peers[worker]


def packages_of(lab, worker: str) -> dict[str, str]:
    """The lab profile's packages on this worker's architecture: file name -> sha256."""
    profile = load_profile("lab")
    arch = lab.run(worker, "uname -m").stdout.strip()
    return {name: profile.sha256_of(name) for name in profile.vendor_files(arch).values()}


def sha256s(lab, worker: str, names) -> dict[str, str]:
    out = lab.run(worker, f"cd {PACKAGE_DIR} && sha256sum {' '.join(names)}", check=False).stdout
    return {name: digest for digest, name in (line.split() for line in out.splitlines())}


def addresses(lab) -> dict[str, str]:
    return {node["name"]: node["address"] for node in lab.status()["nodes"]}


@pytest.fixture(scope="module")
def packages(lab):
    """The lab profile's packages (one architecture in the lab), none on any worker."""
    wanted = packages_of(lab, lab.workers[0])
    assert all(packages_of(lab, worker) == wanted for worker in lab.workers[1:])
    for worker in lab.workers:
        lab.run(worker, f"cd {PACKAGE_DIR} 2>/dev/null && rm -f {' '.join(wanted)} || true")
    return wanted


@pytest.fixture(scope="module")
def fetched(lab, packages):
    """The driver and CANN stages run on every worker at once; what the origin and the peers sent."""
    logs = Logs(lab)
    lab.pyinfra("deploys/driver.py", "deploys/cann.py", timeout=1800)
    return logs.sent()


def test_each_package_leaves_the_origin_once_for_the_whole_fleet(lab, packages, fetched):
    assert fetched.from_origin() == Counter({name: 1 for name in packages})
    seeder, *others = sorted(lab.workers)
    address = addresses(lab)
    served = Counter((client, name) for client, name, status in fetched.from_peer(seeder) if status == "200")
    assert served == Counter({(address[other], name): 1 for other in others for name in packages})


def test_every_worker_holds_the_verified_packages_and_runs_the_stack(lab, packages, fetched):
    stack = load_profile("lab").stack
    for worker in lab.workers:
        assert sha256s(lab, worker, packages) == packages, worker
        assert lab.run(worker, f"ls -A {PACKAGE_DIR} | grep -c partial || true").stdout.strip() == "0"
        assert f"Version={stack.driver}" in lab.run(worker, "cat /usr/local/Ascend/driver/version.info").stdout
        toolkit = lab.run(worker, "cat /usr/local/Ascend/cann/*-linux/ascend_toolkit_install.info").stdout
        assert f"version={stack.cann}" in toolkit, (worker, toolkit)
        nnal = lab.run(worker, "cat /usr/local/Ascend/nnal/atb/latest/version.info").stdout
        assert f"Ascend-cann-atb : {stack.nnal}" in nnal, (worker, nnal)  # NNAL's own record format


def test_a_corrupt_copy_on_a_peer_is_refused_and_the_package_taken_from_another(lab, packages, fetched):
    first, fetcher, corrupt = sorted(lab.workers)  # the fetcher asks the worker after it first
    address = addresses(lab)
    package = next(name for name in packages if "nnal" in name)
    lab.run(corrupt, f"printf rotten | dd of={PACKAGE_DIR}/{package} bs=1 seek=4096 conv=notrunc status=none")
    lab.run(fetcher, f"rm {PACKAGE_DIR}/{package}")
    # A fetch in progress is never offered, even under a package's name.
    lab.run(first, f"cp {PACKAGE_DIR}/{package} {PACKAGE_DIR}/{package}.partial")
    url = f"http://{address[first]}:{PEER_PORT}/{PEER_PACKAGES_PATH}/{package}"
    assert lab.run(fetcher, f"curl -s -o /dev/null -w '%{{http_code}}' {url}.partial").stdout == "404"
    lab.run(first, f"rm {PACKAGE_DIR}/{package}.partial")

    logs = Logs(lab)
    result = lab.pyinfra("-vvv", "deploys/cann.py", "--limit", fetcher)  # -vvv: the commands' output
    assert re.search(rf"{fetcher}: {re.escape(package)} from http://{re.escape(address[corrupt])}:\S+ has "
                     rf"sha256 \w+, the profile expects {packages[package]}: refused", result.stdout), result.stdout[-3000:]
    assert sha256s(lab, fetcher, [package]) == {package: packages[package]}
    assert (address[fetcher], package, "200") in logs.from_peer(corrupt)
    assert (address[fetcher], package, "200") in logs.from_peer(first)
    assert not logs.from_origin()

    # The corrupt peer's own next deploy replaces its copy, again from a peer.
    lab.pyinfra("deploys/cann.py", "--limit", corrupt)
    assert sha256s(lab, corrupt, [package]) == {package: packages[package]}
    assert not logs.from_origin()


VENV = load_profile("lab").pip.venv
PINNED = "vllm-ascend"


def wheels_on(lab, worker: str) -> dict[str, str]:
    out = lab.run(worker, f"cd {WHEEL_DIR} && sha256sum *", check=False).stdout
    return {name: digest for digest, name in (line.split() for line in out.splitlines())}


def installed_version(lab, worker: str, distribution: str) -> str:
    out = lab.run(worker, f"{VENV}/bin/python -m pip show {distribution} 2>/dev/null || true").stdout
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Version:")), "")


@pytest.fixture(scope="module")
def wheels_fetched(lab, fetched):
    """The Python stage on every worker at once, each lacking a pinned distribution (or the whole
    virtualenv, on a fresh lab), no wheel kept and pip's cache empty."""
    for worker in lab.workers:
        lab.run(worker, f"rm -rf {WHEEL_DIR} /root/.cache/pip; [ ! -x {VENV}/bin/python ] || "
                        f"{VENV}/bin/python -m pip uninstall --yes --quiet {PINNED}")
    logs = Logs(lab)
    lab.pyinfra("deploys/python_stack.py", timeout=1800)
    return logs.sent()


def test_each_wheel_leaves_the_origin_once_and_every_worker_runs_the_pinned_stack(lab, wheels_fetched):
    seeder, *others = sorted(lab.workers)
    address = addresses(lab)
    wheels = wheels_on(lab, seeder)
    assert any(name.startswith("vllm_ascend-") for name in wheels), wheels
    assert wheels_fetched.from_origin("packages") == Counter({name: 1 for name in wheels})
    served = Counter((client, name) for client, name, status in wheels_fetched.from_peer(seeder) if status == "200")
    assert served == Counter({(address[other], name): 1 for other in others for name in wheels})
    pin = load_profile("lab").stack.vllm_ascend
    for worker in lab.workers:
        assert wheels_on(lab, worker) == wheels, worker
        assert installed_version(lab, worker, PINNED) == pin, worker


def test_a_corrupt_wheel_on_a_peer_is_refused_and_taken_from_another(lab, wheels_fetched):
    first, fetcher, corrupt = sorted(lab.workers)
    address = addresses(lab)
    wheel = next(name for name in wheels_on(lab, first) if name.startswith("vllm_ascend-"))
    lab.run(corrupt, f"printf rotten | dd of={WHEEL_DIR}/{wheel} bs=1 seek=100 conv=notrunc status=none")
    lab.run(fetcher, f"rm {WHEEL_DIR}/{wheel} && {VENV}/bin/python -m pip uninstall --yes --quiet {PINNED}")
    logs = Logs(lab)
    result = lab.pyinfra("-vvv", "deploys/python_stack.py", "--limit", fetcher)
    assert re.search(rf"wheel {re.escape(wheel)} from http://{re.escape(address[corrupt])}:\S+ has sha256 \w+, "
                     r"the origin index gives \w+: refused", result.stdout), result.stdout[-3000:]
    assert wheels_on(lab, fetcher)[wheel] == wheels_on(lab, first)[wheel]
    assert installed_version(lab, fetcher, PINNED) == load_profile("lab").stack.vllm_ascend
    assert (address[fetcher], wheel, "200") in logs.from_peer(first)
    assert not logs.from_origin("packages")

    # The corrupt peer's next install checks its wheels again: the rotten one is deleted, fetched anew.
    lab.run(corrupt, f"{VENV}/bin/python -m pip uninstall --yes --quiet {PINNED}")
    lab.pyinfra("deploys/python_stack.py", "--limit", corrupt)
    assert wheels_on(lab, corrupt)[wheel] == wheels_on(lab, first)[wheel]
    assert not logs.from_origin("packages")
