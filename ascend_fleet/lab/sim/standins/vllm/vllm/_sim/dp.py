"""Data parallelism across nodes, as `vllm serve` runs it (vLLM 0.11.0 and 0.18.0 alike), and what
the module entry point `python -m vllm.entrypoints.openai.api_server` makes of the same options.

The head (`--data-parallel-size N --data-parallel-size-local L --data-parallel-address A
--data-parallel-rpc-port P`) binds its API port without listening, binds the engines' handshake
socket at A:P and waits, with no time limit, until every remote engine has said HELLO and then
READY; only then does it listen and serve. Members (`--headless ... --data-parallel-start-rank R`)
connect to A:P, retrying until the head is there, say HELLO for their ranks, load, say READY and
stay connected. Real vLLM does this over ZMQ (`vllm/v1/engine/utils.py` `launch_core_engines`,
`wait_for_engine_startup`; `vllm/v1/engine/core.py` `startup_handshake`); the simulator speaks a
protocol of its own over a plain TCP connection to the same A:P: one JSON object a line,
{"status": "HELLO"|"READY", "ranks": [...], "headless": true} from the member,
{"status": "INIT"} from the head. The member's connection then stands for everything real vLLM
keeps between the nodes (the ZMQ input/output sockets and the DP process group): when it closes,
the head's next collective fails (`on_lost`), as real vLLM's does at the next request wave.

Only `vllm serve` acts on `--headless` (serve.py `cmd` runs `run_headless`); the module entry point
parses it and calls `run_server` whatever it says, so its engine config is built as not headless
(`create_engine_config(headless=False)`). A start rank above 0 without `--headless` is then a rank of
external load balancing (hybrid, switched to external with one local rank): it runs an API server of
its own and its engine says HELLO to the head as not headless, which a head balancing internally
refuses (`wait_for_engine_startup`: "Remote engine R must use --headless unless in external or
hybrid dp lb mode").

With DP > 1, vLLM 0.18.0 takes the DP master port from `get_open_ports_list(5)` (`ParallelConfig.
__post_init__`): with VLLM_PORT set, the first five free ports scanning upward from it, the last of
the set's list popped. The head's rank-0 engine listens there (the DP process group's TCPStore) on
the DP address; the 29500 of the dataclass is replaced.

Environment of the simulator's own (tests only; the real values are constants):
    VLLM_SIM_STARTUP_POLL_SECONDS       the head's waiting-line period (real: STARTUP_POLL_PERIOD_MS, 10 s)
    VLLM_SIM_HANDSHAKE_TIMEOUT_SECONDS  how long a member waits for the head (real: HANDSHAKE_TIMEOUT_MINS, 5 min)
"""

import asyncio
import json
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from vllm._sim.errors import StartupError

DEFAULT_RPC_PORT = 29550  # ParallelConfig.data_parallel_rpc_port
DP_MASTER_PORT_COUNT = 5  # ParallelConfig.__post_init__: get_open_ports_list(5)
DEFAULT_ADDRESS = "127.0.0.1"  # ParallelConfig.data_parallel_master_ip
STARTUP_POLL_PERIOD_S = 10.0  # vllm/v1/engine/utils.py STARTUP_POLL_PERIOD_MS = 10000
HANDSHAKE_TIMEOUT_MINS = 5  # vllm/v1/engine/core.py
RECONNECT_SECONDS = 0.1  # ZMQ's default ZMQ_RECONNECT_IVL (100 ms)


@dataclass(frozen=True)
class DataParallel:
    size: int
    local: int
    start_rank: int
    address: str
    rpc_port: int
    headless: bool
    # external or hybrid load balancing: each node's front end manages only its own engines and serves
    # an API of its own (ParallelConfig.local_engines_only); the head then expects no headless members
    local_engines_only: bool

    @classmethod
    def from_args(cls, args, headless: bool) -> "DataParallel":
        """As EngineArgs.create_engine_config sees the options; `headless` is what the entry point
        passes it (`vllm serve --headless`: True; the api_server module: always False)."""
        size = args.data_parallel_size
        local = args.data_parallel_size_local
        start_rank = args.data_parallel_start_rank or 0
        external = getattr(args, "data_parallel_external_lb", False) or args.data_parallel_rank is not None
        # a start rank without --headless infers hybrid LB (one local rank switches it to external)
        hybrid = local is not None and local != size and (
            args.data_parallel_hybrid_lb or (start_rank > 0 and not headless))
        return cls(
            size=size,
            # EngineArgs.create_engine_config: the local size defaults to the whole DP size
            local=size if local is None else local,
            start_rank=start_rank,
            address=args.data_parallel_address or DEFAULT_ADDRESS,
            rpc_port=args.data_parallel_rpc_port if args.data_parallel_rpc_port is not None else DEFAULT_RPC_PORT,
            headless=headless,
            local_engines_only=external or hybrid,
        )

    @property
    def spans_nodes(self) -> bool:
        """Remote engines exist: the head handshakes with them over A:P."""
        return self.headless or self.local < self.size

    @property
    def is_head(self) -> bool:
        """Rank 0 of a DP instance: its engine holds the DP process group's store (the master port)."""
        return self.size > 1 and self.start_rank == 0 and not self.headless

    @property
    def uri(self) -> str:
        return f"tcp://{self.address}:{self.rpc_port}"

    @property
    def local_ranks(self) -> list[int]:
        return list(range(self.start_rank, self.start_rank + self.local))


def startup_poll_seconds() -> float:
    return float(os.environ.get("VLLM_SIM_STARTUP_POLL_SECONDS", STARTUP_POLL_PERIOD_S))


def handshake_timeout_seconds() -> float:
    return float(os.environ.get("VLLM_SIM_HANDSHAKE_TIMEOUT_SECONDS", HANDSHAKE_TIMEOUT_MINS * 60))


async def send(writer: asyncio.StreamWriter, message: dict) -> None:
    writer.write(json.dumps(message).encode() + b"\n")
    await writer.drain()


async def receive(reader: asyncio.StreamReader) -> dict | None:
    line = await reader.readline()
    return json.loads(line) if line else None


class EngineStartupError(RuntimeError):
    """What makes real vLLM's wait_for_engine_startup raise: the head stops."""


class RemoteEngines:
    """The head's side: the handshake socket at A:P and the state of every remote rank."""

    def __init__(self, dp: DataParallel, log: logging.Logger, on_lost: Callable[[str], None]):
        self.dp = dp
        self.log = log
        self.on_lost = on_lost
        self.state = {rank: "NEW" for rank in range(dp.size) if rank >= dp.local}  # remote ranks only
        self.changed = asyncio.Event()
        self.failure: EngineStartupError | None = None
        self.server: asyncio.base_events.Server | None = None
        self.connections: list[asyncio.StreamWriter] = []

    async def bind(self) -> None:
        try:
            self.server = await asyncio.start_server(self._member, self.dp.address, self.dp.rpc_port)
        except OSError as err:
            # what pyzmq's bind raises for the same socket address
            reason = os.strerror(err.errno) if err.errno else str(err)
            raise StartupError(f"zmq.error.ZMQError: {reason} (addr='{self.dp.uri}')") from None

    def pending(self, status: str) -> int:
        return sum(1 for state in self.state.values() if state == status)

    def _fail(self, message: str) -> None:
        self.failure = self.failure or EngineStartupError(message)
        self.changed.set()

    async def _member(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections.append(writer)
        address, port = writer.get_extra_info("peername")[:2]
        peer = f"{address}:{port}"
        ranks: list[int] = []
        try:
            hello = await receive(reader)
            if hello is None:
                return
            ranks = hello["ranks"]
            for rank in ranks:
                if rank not in self.state:
                    return self._fail(f"Message from engine with unexpected data parallel rank: {rank}")
                if hello.get("headless") and self.dp.local_engines_only:
                    return self._fail(f"Remote engine {rank} must not use --headless in external or hybrid dp lb mode")
                if not hello.get("headless") and not self.dp.local_engines_only:
                    return self._fail(
                        f"Remote engine {rank} must use --headless unless in external or hybrid dp lb mode"
                    )
                if self.state[rank] != "NEW":
                    return self._fail(f"Unexpected HELLO message for remote engine {rank} in {self.state[rank]} state.")
            await send(writer, {"status": "INIT"})
            for rank in ranks:
                self.state[rank] = "CONNECTED"
                self.log.debug("HELLO from remote core engine process %s.", rank)
            self.changed.set()
            ready = await receive(reader)
            if ready is None:
                # real vLLM keeps waiting for a READY that never comes; so does the simulator
                self.log.debug("remote engine(s) %s at %s left before READY", ranks, peer)
                return
            for rank in ranks:
                self.state[rank] = "READY"
                self.log.debug("READY from remote core engine process %s.", rank)
            self.changed.set()
            while await reader.read(4096):
                pass
            self.on_lost(f"data parallel rank(s) {', '.join(map(str, ranks))} at {peer} closed the connection")
        except (OSError, ValueError, KeyError) as err:
            if ranks and all(self.state.get(r) == "READY" for r in ranks):
                self.on_lost(f"data parallel rank(s) {', '.join(map(str, ranks))} at {peer}: {err}")

    async def wait_until_ready(self, local_load: Awaitable[None]) -> None:
        """Real vLLM's wait_for_engine_startup: no deadline; the waiting lines at DEBUG each period.

        Local engines say HELLO as soon as their processes start (counted connected at once)
        and READY when their load ends."""
        local_task = asyncio.ensure_future(local_load)
        period = startup_poll_seconds()
        try:
            while True:
                if self.failure:
                    raise self.failure
                local_start = 0 if local_task.done() else self.dp.local
                if local_task.done() and local_task.exception():
                    raise local_task.exception()
                remote_connect = self.pending("NEW")
                remote_start = self.pending("CONNECTED")
                if not (remote_connect or remote_start or local_start):
                    break
                self.changed.clear()
                waiter = asyncio.ensure_future(self.changed.wait())
                watched = {waiter} if local_task.done() else {waiter, local_task}
                done, _ = await asyncio.wait(watched, timeout=period)
                waiter.cancel()
                if not done:
                    if remote_connect:
                        self.log.debug(
                            "Waiting for %d local, %d remote core engine proc(s) to connect.", 0, remote_connect
                        )
                    if local_start or remote_start:
                        self.log.debug(
                            "Waiting for %d local, %d remote core engine proc(s) to start.", local_start, remote_start
                        )
        except BaseException:
            local_task.cancel()
            raise
        # the handshake socket closes once every engine is in (zmq_socket_ctx in launch_core_engines)
        self.server.close()

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for writer in self.connections:
            writer.close()


class HandshakeTimeout(RuntimeError):
    pass


async def join_head(dp: DataParallel, load: Callable[[], Awaitable[None]]) -> asyncio.StreamWriter:
    """A member's engines (headless, or an external-LB rank's, which say they are not): connect to the
    head (retrying, silently, as ZMQ does), HELLO, load, READY.

    Raises HandshakeTimeout when no INIT came within the handshake timeout. Returns the connection,
    which the member keeps open while it runs."""
    deadline = asyncio.get_running_loop().time() + handshake_timeout_seconds()
    while True:
        try:
            reader, writer = await asyncio.open_connection(dp.address, dp.rpc_port)
            break
        except OSError:
            if asyncio.get_running_loop().time() >= deadline:
                raise HandshakeTimeout() from None
            await asyncio.sleep(RECONNECT_SECONDS)
    await send(writer, {"status": "HELLO", "ranks": dp.local_ranks, "headless": dp.headless})
    remaining = max(deadline - asyncio.get_running_loop().time(), 0)
    try:
        init = await asyncio.wait_for(receive(reader), remaining)
    except asyncio.TimeoutError:
        init = None
    if not init or init.get("status") != "INIT":
        # a head that refused us (or died) sends nothing: real ZMQ would still be waiting for the INIT
        if init is None and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(max(deadline - asyncio.get_running_loop().time(), 0))
        raise HandshakeTimeout()
    await load()
    await send(writer, {"status": "READY", "ranks": dp.local_ranks, "headless": dp.headless})
    return writer


def master_port_candidates(vllm_port: int | None) -> list[int]:
    """vLLM 0.18.0's get_open_ports_list(5) (vllm/utils/network_utils.py): with VLLM_PORT set, five free
    ports scanning upward from it, each search starting past the last port found; else five ephemeral
    ports. A list made from a set, as vLLM makes it, so that pop() takes the port vLLM takes."""
    found = set()
    start = vllm_port
    while len(found) < DP_MASTER_PORT_COUNT:
        port = start if start is not None else 0
        while True:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                try:
                    probe.bind(("", port))
                except OSError:
                    port += 1
                    continue
                port = probe.getsockname()[1]
                break
        found.add(port)
        start = port + 1 if vllm_port is not None else None
    return list(found)


def listen_master_port(address: str, port: int) -> socket.socket:
    """The head's DP process group store (stateless_init_torch_distributed_process_group, rank 0)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((address, port))
        sock.listen()
    except OSError as err:
        sock.close()
        raise StartupError(f"RuntimeError: the DP master port {address}:{port} could not be bound: "
                           f"{os.strerror(err.errno)} (simulated)") from None
    return sock
