"""The `lab` fixture: one rehearsal lab (3 workers + gateway) for the whole test session; and
`second_lab`, another such lab for the modules that run beside it (scripts/test's other-labs part).

It runs the same commands a user runs (`ascend-fleet lab up/down`, `pyinfra inventories/lab.py`)
in a lab of its own (own directory, name and subnet), so a lab the user has up is left alone.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from ascend_fleet.control.bench import BENCH_VENV, bench_venv_ready
from ascend_fleet.core.node_layout import instance_unit
from ascend_fleet.lab import lab as lab_api
from ascend_fleet.lab.spec import DEFAULT_LAB_DIR
from ascend_fleet.lab.state import LabState

PROJECT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
needs_bench_venv = pytest.mark.skipif(not bench_venv_ready(BENCH_VENV), reason=f"no bench virtualenv at {BENCH_VENV}: "
                                      "scripts/test builds it, or `ascend-fleet bench --setup`")
# A failed run's whole output goes to a file here (its error names it): the first failing operation
# may lie far above the end of a deploy's output.
TEST_LOGS = Path(os.environ.get("ASCEND_FLEET_TEST_LOGS", PROJECT / "test-logs"))
FAILURE_TAIL = 6000
# Each test process's labs use subnets 10.213.N.0/24 to N+8 and lab directories test-N*.
TEST_NETS = range(200, 250, 10)
TEST_NET_LOCKS = Path("/run/lock")
HELD_LOCKS: list = []  # open for as long as this process runs: its claim


def claimed_test_net() -> int:
    """This process's N, held (flock) until it exits: ASCEND_FLEET_TEST_NET if set, else the first
    of TEST_NETS no other test process holds. Two runs on one lab would tear down and redeploy each
    other's nodes (likeliest cause of two CI failures: a rehearsal still running when CI began); so a
    second run takes other subnets, and an N asked for that another run holds is refused."""
    asked = os.environ.get("ASCEND_FLEET_TEST_NET")
    for net in [int(asked)] if asked else TEST_NETS:
        lock = open(TEST_NET_LOCKS / f"ascend-fleet-test-{net}.lock", "a")  # noqa: SIM115 (held until exit)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            continue
        HELD_LOCKS.append(lock)
        return net
    if asked:
        raise pytest.UsageError(f"another test run on this machine holds ASCEND_FLEET_TEST_NET {asked}: "
                                "let it finish or pick another number")
    raise pytest.UsageError(f"every test net ({', '.join(map(str, TEST_NETS))}) is held by a test run on "
                            "this machine: let one finish")


TEST_NET = claimed_test_net()
# On this machine, beside the lab `ascend-fleet lab up` makes by default (not a node's path).
TEST_LAB_DIR = DEFAULT_LAB_DIR.parent / f"test-{TEST_NET}"
# The lab data's instances on each worker (group_data/lab.py: 8 NPUs at TP4).
INSTANCES = ("vllm-0", "vllm-1")
# For a deploy that only sets a lab up for its test, with no load running: it restarts every instance at
# once, where a plain deploy restarts those the gateway routes to one at a time (test_plain_deploy's part).
ALL_AT_ONCE = ("--data", "max_unavailable=64")


def failed_run(command: str, returncode: int, output: str) -> AssertionError:
    """The error of a command that failed: its whole output saved in TEST_LOGS (the message names the
    file), the lines that say error, and the output's end."""
    TEST_LOGS.mkdir(parents=True, exist_ok=True)
    name = "-".join(command.split()[:3]).replace("/", "_")
    descriptor, path = tempfile.mkstemp(prefix=f"{time.strftime('%Y%m%dT%H%M%S')}-{name}-", suffix=".log",
                                        dir=TEST_LOGS)
    with open(descriptor, "w") as log:
        log.write(f"$ {command}\n{output}")
    errors = [line for line in output.splitlines() if "error" in line.lower()][:20]
    return AssertionError(f"{command} exited {returncode}; its whole output: {path}\n"
                          + "".join(f"{line}\n" for line in errors)
                          + f"its last {FAILURE_TAIL} characters:\n{output[-FAILURE_TAIL:]}")


class Lab:
    """A lab brought up with the CLI, and the ways tests talk to it."""

    def __init__(self, lab_dir: Path, name: str, subnet: str, inventory: str = "inventories/lab.py"):
        self.lab_dir, self.name, self.subnet, self.inventory = lab_dir, name, subnet, inventory
        self.env = {**os.environ, "ASCEND_FLEET_LAB_DIR": str(lab_dir)}

    def cli(self, *args: str, check: bool = True, timeout: float = 900) -> subprocess.CompletedProcess:
        result = subprocess.run([str(BIN / "ascend-fleet"), *args], env=self.env, cwd=PROJECT,
                                capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"ascend-fleet {' '.join(args)} exited {result.returncode}:\n"
                                 f"{result.stdout}\n{result.stderr}")
        return result

    def up(self, nodes: int = 3, *extra: str) -> None:
        self.cli("lab", "up", "--nodes", str(nodes), "--name", self.name, "--subnet", self.subnet, *extra)

    def down(self) -> None:
        self.cli("lab", "down")

    def with_workers(self, workers: int) -> Lab:
        """This lab with `workers` workers: brought up when it is not, grown when it has fewer (the nodes
        it has keep what they run), brought up anew when it has more."""
        have = len(self.workers) if LabState.load(self.lab_dir) else 0
        if have > workers:
            self.down()
        if have != workers:
            self.up(workers)
        return self

    def status(self) -> dict:
        """What `ascend-fleet lab status --json` prints (test_lab.py runs the command itself), read in
        this process: each command costs a Python start of about 1.5 s CPU, and tests ask often."""
        return lab_api.status(self.lab_dir)

    @property
    def nodes(self) -> list[str]:
        return [node["name"] for node in self.status()["nodes"]]

    @property
    def workers(self) -> list[str]:
        return [node["name"] for node in self.status()["nodes"] if node["role"] == "worker"]

    def address(self, node: str) -> str:
        """The node's address on the lab bridge."""
        return next(n for n in self.status()["nodes"] if n["name"] == node)["address"]

    @property
    def mirror_url(self) -> str:
        return self.status()["mirror"]["url"]

    def boot_id(self, node: str) -> str:
        return self.run(node, "cat /proc/sys/kernel/random/boot_id").stdout.strip()

    def run(self, node: str, command: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
        """Run a shell command as root on a node over SSH (the lab's key, its known_hosts): the ssh
        `ascend-fleet lab ssh` runs (test_secrets.py runs that command itself), without its Python start."""
        argv = lab_api.ssh_argv(self.lab_dir, LabState.require(self.lab_dir).spec.node(node))
        result = subprocess.run([*argv, command], env=self.env, cwd=PROJECT, capture_output=True, text=True,
                                timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"{node}: `{command}` exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
        return result

    def pyinfra(self, *args: str, check: bool = True, timeout: float = 1800,
                cwd: Path = PROJECT) -> subprocess.CompletedProcess:
        """Run pyinfra on the lab's inventory; its output (pyinfra logs to stderr) is in .stdout.
        With --dry, without -y: -y would skip the change detection a dry run is for. cwd: the folder it
        runs from, whose profiles/ comes before the package's (an operator's fleet repository)."""
        yes = [] if "--dry" in args else ["-y"]
        result = subprocess.run([str(BIN / "pyinfra"), *yes, self.inventory, *args], env=self.env,
                                cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                timeout=timeout)
        if check and result.returncode != 0:
            raise failed_run(f"pyinfra {self.inventory} {' '.join(args)}", result.returncode, result.stdout)
        return result

    def reboot(self, node: str) -> None:
        """Reboot through pyinfra's own server.reboot, which returns once the node is back."""
        before = self.boot_id(node)
        self.pyinfra("server.reboot", "--limit", node)
        assert self.boot_id(node) != before, f"{node} did not reboot"

    @contextmanager
    def npu_link_down(self, node: str, npu: int):
        """NPU npu's RoCE link on node down while the block runs: the switch side of its port, on the
        lab's parameter plane (the node sees no carrier)."""
        spec = LabState.require(self.lab_dir).spec
        port = spec.npu_host_port(spec.node(node), npu)
        subprocess.run(["ip", "link", "set", port, "down"], check=True)
        try:
            yield
        finally:
            subprocess.run(["ip", "link", "set", port, "up"], check=True)

    def wait_running(self, node: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if next(n for n in self.status()["nodes"] if n["name"] == node)["state"] == "running":
                return
            time.sleep(0.5)
        raise AssertionError(f"{node} not running after {timeout}s")


def down_windows(lab: Lab) -> dict[str, tuple[int, int]]:
    """Each instance's last time out of service ("worker1/vllm-0": (stopped, active again)): from
    leaving the active state (its stop) to entering it again (/health 200, ExecStartPost), in the
    kernel's monotonic clock, which the lab's nodes share with this machine."""
    windows = {}
    for worker in lab.workers:
        out = lab.run(worker, " ; ".join(f"systemctl show -P ActiveExitTimestampMonotonic {instance_unit(i)}; "
                                         f"systemctl show -P ActiveEnterTimestampMonotonic {instance_unit(i)}"
                                         for i in INSTANCES)).stdout
        values = [int(v) for v in out.split()]
        for instance, (left, back) in zip(INSTANCES, zip(values[::2], values[1::2])):
            windows[f"{worker}/{instance}"] = (left, back)
    return windows


def require_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("lab tests need root (namespaces, mounts, a bridge)")


def brought_up(lab: Lab, workers: int = 3, *options: str):
    """The lab up anew (`lab up` options: options) for as long as the fixture lasts, then down."""
    require_root()
    lab.down()  # a previous session that crashed
    lab.up(workers, *options)
    yield lab
    lab.down()


def module_lab(suffix: str, letter: str, net: int, inventory: str = "inventories/lab.py") -> Lab:
    """A module's lab of its own: directory test-N-suffix, name letter+N, subnet N+net."""
    return Lab(TEST_LAB_DIR.with_name(f"{TEST_LAB_DIR.name}-{suffix}"), f"{letter}{TEST_NET}",
               f"10.213.{TEST_NET + net}.0/24", inventory=inventory)


@pytest.fixture(scope="session")
def lab():
    yield from brought_up(Lab(TEST_LAB_DIR, f"t{TEST_NET}", f"10.213.{TEST_NET}.0/24"))


@pytest.fixture(scope="session")
def second_lab():
    """A lab of its own (subnet N+3) for the modules of scripts/test's other-labs part, which runs beside
    the session lab's. Such a module takes it as its `lab` and deploys what it needs in its own
    fixture. tests/conftest.py runs them in the order that makes that cheapest (SECOND_LAB_ORDER):
    test_full_deploy first, on fresh nodes; test_multi_node last, which grows the lab to 4 workers.
    Run otherwise (alone, or after a crash), each brings the lab to what it needs."""
    yield from brought_up(Lab(TEST_LAB_DIR.with_name(f"{TEST_LAB_DIR.name}-fresh"), f"f{TEST_NET}",
                              f"10.213.{TEST_NET + 3}.0/24"))
