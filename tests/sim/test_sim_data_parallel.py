"""One simulated vLLM instance over two "nodes" with data parallelism, as real vLLM runs it.

A head (`--data-parallel-size 2 --data-parallel-size-local 1 --data-parallel-address A
--data-parallel-rpc-port P`) and a headless member (`--headless --data-parallel-start-rank 1`),
each a real process with its own fake node root, talking over 127.0.0.1 only. What real vLLM does
(vLLM 0.18.0 `vllm/v1/engine/utils.py`, `core.py`, `core_client.py`, `entrypoints/cli/serve.py`,
`entrypoints/launcher.py`) is in docs/sim-fidelity.md; these tests hold the simulator to it.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import time
import zipfile
from pathlib import Path

import pytest

from ascend_fleet.lab.processes import children
from ascend_fleet.lab.sim.tinymodel import build_tiny_qwen35_moe
from ascend_fleet.lab.sim.wheels import build_standin_wheels
from tests.sim.test_sim_server import QWEN35_RECIPE, QWEN35_STACK, SimServer, free_port, make_node_root

FAST = {
    "VLLM_SIM_LOAD_BASE_SECONDS": "0.3",
    "VLLM_SIM_LOAD_SECONDS_PER_GIB": "0",
    "VLLM_SIM_STARTUP_POLL_SECONDS": "0.2",  # real: every 10 s
    "VLLM_LOGGING_LEVEL": "DEBUG",  # real vLLM logs its waiting lines at DEBUG
}
WAITING = "Waiting for 0 local, 1 remote core engine proc(s) to connect."
DEAD = "EngineCore encountered an issue. See stack trace (above) for the root cause."
BOUND = 90  # seconds any one wait in these tests may take: a bound on busy cores, not a speed target


@pytest.fixture(scope="module")
def dp(tmp_path_factory):
    """The 0.18.0 stand-ins, the tiny Qwen3.5-MoE W8A8 model, and two node roots (head, member)."""
    site = tmp_path_factory.mktemp("site-dp")
    for wheel in build_standin_wheels(QWEN35_STACK, tmp_path_factory.mktemp("wheels-dp")):
        zipfile.ZipFile(wheel).extractall(site)
    model = build_tiny_qwen35_moe(tmp_path_factory.mktemp("models") / "qwen3.5")
    return site, model, make_node_root(tmp_path_factory.mktemp("head")), make_node_root(tmp_path_factory.mktemp("member"))


class Pair:
    """Starts a head and members of one DP-2 instance on 127.0.0.1 with its own RPC port."""

    def __init__(self, dp, tmp_path: Path):
        self.site, self.model, self.head_root, self.member_root = dp
        self.tmp = tmp_path
        self.rpc_port = free_port()
        self.started: list[SimServer] = []

    def dp_args(self) -> list[str]:
        return ["--data-parallel-size", "2", "--data-parallel-size-local", "1",
                "--data-parallel-address", "127.0.0.1", "--data-parallel-rpc-port", str(self.rpc_port)]

    def head(self, env: dict | None = None, extra: list[str] = (), entry: str = "serve") -> SimServer:
        server = SimServer(self.site, self.head_root, self.tmp / "head.log", "0,1,2,3",
                           [str(self.model), *QWEN35_RECIPE, *self.dp_args(), *extra], {**FAST, **(env or {})}, entry)
        self.started.append(server)
        return server

    def member(self, env: dict | None = None, extra: list[str] = (), name: str = "member",
               root: Path | None = None, entry: str = "serve") -> SimServer:
        server = SimServer(self.site, root or self.member_root, self.tmp / f"{name}.log", "0,1,2,3",
                           [str(self.model), *QWEN35_RECIPE, "--headless", "--data-parallel-start-rank", "1",
                            *self.dp_args(), *extra], {**FAST, **(env or {})}, entry)
        self.started.append(server)
        return server

    def serving(self) -> tuple[SimServer, SimServer]:
        """A head, then (its HCCL range and ports held, as two hosts' would not clash) a member."""
        head = self.head()
        wait_for(lambda: "Started DP Coordinator process" in head.output(), "the head binds", head)
        return head, self.member()

    def kill_all(self) -> None:
        for server in self.started:
            server.kill()


@pytest.fixture
def pair(dp, tmp_path):
    started = Pair(dp, tmp_path)
    yield started
    started.kill_all()


def title(pid: int) -> str:
    """A process's title as ps shows it (setproctitle writes it over argv)."""
    return Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").decode()


def refuses(server: SimServer) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=2):
            return False
    except ConnectionRefusedError:
        return True


def wait_for(predicate, what: str, server: SimServer) -> None:
    deadline = time.monotonic() + BOUND
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"{what} within {BOUND} s\n{server.output()}")


def completion(server: SimServer) -> http.client.HTTPResponse:
    return server.post("/v1/chat/completions", {"model": "qwen3.5", "max_tokens": 4,
                                                "messages": [{"role": "user", "content": "hi"}]})


def test_the_head_refuses_connections_until_the_member_joins_then_serves(pair):
    head = pair.head()
    wait_for(lambda: WAITING in head.output(), "the head logs its waiting line", head)
    assert head.process.poll() is None and refuses(head)
    assert "Started DP Coordinator process" in head.output()
    assert "Defaulting api_server_count to data_parallel_size (2)." in head.output()
    member = pair.member()
    assert head.health_statuses()[-1] == 200
    reply = completion(head)
    assert reply.status == 200 and json.loads(reply.read())["usage"]["completion_tokens"] == 4
    assert json.loads(head.get("/v1/models")[1])["data"][0]["id"] == "qwen3.5"
    assert ("Launching 1 data parallel engine(s) in headless mode, with head node address "
            f"tcp://127.0.0.1:{pair.rpc_port}.") in member.output()
    # the head going away is not noticed by an idle member (no heartbeat in vLLM)
    head.process.kill()
    head.process.wait()
    time.sleep(1)
    assert member.process.poll() is None
    assert member.stop() == 0 and "Shutting down." in member.output()


def test_a_member_started_first_waits_for_the_head(pair):
    member = pair.member()
    wait_for(lambda: "headless mode" in member.output(), "the member starts", member)
    time.sleep(1)
    assert member.process.poll() is None
    head = pair.head()
    assert head.health_statuses()[-1] == 200
    assert completion(head).status == 200
    assert head.stop() == 0
    assert member.stop() == 0


def test_a_member_killed_mid_serving_makes_the_heads_next_request_fail_and_the_head_exit(pair):
    head, member = pair.serving()
    assert head.health_statuses()[-1] == 200
    member.process.send_signal(signal.SIGKILL)
    member.process.wait()
    time.sleep(0.5)
    # idle: nothing runs a collective, so nothing has noticed yet
    assert head.get("/health")[0] == 200
    reply = completion(head)
    assert reply.status == 500
    assert json.loads(reply.read())["error"] == {"message": DEAD, "type": "InternalServerError",
                                                  "param": None, "code": 500}
    assert head.process.wait(timeout=BOUND) == 0  # the API server exits 0, as real vLLM's does
    # the head's engine fails its collective and sends ENGINE_CORE_DEAD before it exits: the client's process
    # monitor, finding the engine dead already, says nothing
    output = head.output()
    assert "EngineCore encountered a fatal error." in output and "AsyncLLM output_handler failed." in output
    assert "died unexpectedly" not in output


def test_a_members_engine_core_killed_ends_the_member_and_the_heads_next_request_fails(pair):
    head, member = pair.serving()
    assert head.health_statuses()[-1] == 200
    assert [title(pid) for pid in children(head.process.pid)] == ["VLLM::EngineCore_DP0"]
    cores = children(member.process.pid)
    assert [title(pid) for pid in cores] == ["VLLM::EngineCore_DP1"]
    os.kill(cores[0], signal.SIGKILL)
    # CoreEngineProcManager.join_first returns: run_headless shuts down and returns
    assert member.process.wait(timeout=BOUND) == 0
    assert member.output().rstrip().endswith("Shutting down.")
    assert completion(head).status == 500
    assert head.process.wait(timeout=BOUND) == 0


def test_the_head_has_no_startup_deadline_for_remote_engines(pair):
    """VLLM_ENGINE_READY_TIMEOUT_S bounds only the wait after the handshake, which the members pass
    before their READY: a head without its member waits on, refusing connections."""
    head = pair.head({"VLLM_ENGINE_READY_TIMEOUT_S": "1", "VLLM_LOGGING_LEVEL": "INFO"})
    wait_for(lambda: "Started DP Coordinator process" in head.output(), "the head starts", head)
    time.sleep(2.5)
    assert head.process.poll() is None and refuses(head)
    assert "core engine proc(s)" not in head.output()  # DEBUG lines: not at the default level
    assert head.stop() == 0


def test_a_member_without_a_head_gives_up_after_the_handshake_timeout(pair):
    member = pair.member({"VLLM_SIM_HANDSHAKE_TIMEOUT_SECONDS": "1"})
    assert member.process.wait(timeout=BOUND) == 0  # run_headless returns: the launcher exits 0
    output = member.output()
    assert "EngineCore failed to start." in output
    assert "RuntimeError: Did not receive response from front-end process within 5 minutes" in output
    assert "Shutting down." in output


def test_the_rpc_port_taken_stops_the_head(pair):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", pair.rpc_port))
        taken.listen()
        head = pair.head()
        assert head.process.wait(timeout=BOUND) == 1
    assert f"zmq.error.ZMQError: Address already in use (addr='tcp://127.0.0.1:{pair.rpc_port}')" in head.output()


def test_headless_with_an_api_server_count_is_refused_as_in_0_18(pair):
    member = pair.member(extra=["--api-server-count", "2"])
    assert member.process.wait(timeout=BOUND) == 1
    assert ("--api-server-count=2 cannot be used with --headless "
            "(no API servers are started in headless mode).") in member.output()


def test_a_second_member_for_the_same_rank_stops_the_head(pair, tmp_path):
    """wait_for_engine_startup raises on a HELLO for a rank already connected (here: while the
    first member is still loading, a third node claims rank 1 too)."""
    head = pair.head()
    wait_for(lambda: "Started DP Coordinator process" in head.output(), "the head binds", head)
    first = pair.member({"VLLM_SIM_LOAD_BASE_SECONDS": "30"})
    wait_for(lambda: "Waiting for 0 local, 1 remote core engine proc(s) to start." in head.output(),
             "the member connects", head)
    third = tmp_path / "third"
    third.mkdir()
    pair.member(name="second", root=make_node_root(third))
    assert head.process.wait(timeout=BOUND) == 1
    assert "RuntimeError: Unexpected HELLO message for remote engine 1 in CONNECTED state." in head.output()
    assert first.process.poll() is None  # the first member is not told: it waits for its head


def listening(port_range: range) -> set[int]:
    """The ports of port_range something listens on (on any address), read from the kernel."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            port = int(local.rsplit(":", 1)[1], 16)
            if state == "0A" and port in port_range:  # 0A: LISTEN
                found.add(port)
    return found


def test_the_head_takes_its_dp_master_port_upward_from_vllm_port_not_29500(pair):
    """vLLM 0.18.0 with DP > 1: the master port is one of get_open_ports_list(5), which scans up from
    VLLM_PORT; the dataclass's 29500 is replaced. With the VLLM_PORT range free, it lies within
    VLLM_PORT .. VLLM_PORT + 4, beside the internal port at VLLM_PORT itself."""
    head = pair.head()
    wait_for(lambda: "Started DP Coordinator process" in head.output(), "the head binds", head)
    ports = listening(range(head.vllm_port, head.vllm_port + 5))
    assert head.vllm_port in ports and len(ports) == 2, (head.vllm_port, ports)
    assert not listening(range(29500, 29501))


def test_a_member_started_by_the_api_server_module_is_refused_by_its_head(pair):
    """The module entry point ignores --headless: the member becomes an external-LB rank (an API server
    of its own), its engine says HELLO as not headless, and the head stops with vLLM's error. The
    member's engine, never answered, gives up at the handshake timeout and its front end fails."""
    head = pair.head(entry="api_server", extra=["--api-server-count", "2"])
    wait_for(lambda: "Started DP Coordinator process" in head.output(), "the head binds", head)
    member = pair.member({"VLLM_SIM_HANDSHAKE_TIMEOUT_SECONDS": "4"}, entry="api_server")
    assert head.process.wait(timeout=BOUND) == 1
    assert member.process.poll() is None and refuses(member)  # its own API socket, bound, not listening
    assert ("RuntimeError: Remote engine 1 must use --headless unless in external or hybrid dp lb mode"
            in head.output())
    assert "Defaulting api_server_count" not in head.output()  # the module runs one API server, not two
    assert member.process.wait(timeout=BOUND) == 1
    output = member.output()
    assert ("data_parallel_hybrid_lb is not eligible when data_parallel_size_local = 1, autoswitch to "
            "data_parallel_external_lb.") in output
    assert "headless mode" not in output
    assert ("RuntimeError: Engine core initialization failed. See root cause above. "
            "Failed core proc(s): {'EngineCore_DP1': 1}") in output


def test_the_api_server_module_takes_headless_with_an_api_server_count(pair):
    """serve.py's refusal of --headless with --api-server-count is `vllm serve`'s alone."""
    member = pair.member({"VLLM_SIM_HANDSHAKE_TIMEOUT_SECONDS": "1"}, extra=["--api-server-count", "2"],
                         entry="api_server")
    assert member.process.wait(timeout=BOUND) == 1
    assert "cannot be used with --headless" not in member.output()
    assert "Engine core initialization failed" in member.output()
