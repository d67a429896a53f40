"""Start-up of the simulated vLLM server, in vLLM's order: CLI, platform, model, NPUs, HCCL, load, serve.

Environment (beside vLLM's and Ascend's own: ASCEND_RT_VISIBLE_DEVICES,
HCCL_IF_BASE_PORT, HCCL_IF_IP, VLLM_PORT, VLLM_HOST_IP, ASCEND_TOOLKIT_HOME):

    VLLM_API_KEY                        as in vLLM: the key /v1 requests need when --api-key is not given
    VLLM_LOGGING_LEVEL                  as in vLLM: the log level (default INFO; DEBUG shows the DP waiting lines)
    VLLM_SIM_LOAD_BASE_SECONDS          fixed part of the simulated weight load (default 1.0)
    VLLM_SIM_LOAD_SECONDS_PER_GIB       load time per GiB of safetensors shards (default 2.0)
    VLLM_SIM_ITL_SECONDS                time per engine step without the performance model (default 0.02)
    VLLM_SIM_PREFILL_SECONDS_PER_TOKEN  and per prefilled token in it (default 0.0002); performance.py
    VLLM_SIM_WATCHDOG_SECONDS           tests only: the API server's engine watchdog period (real: 5 s)
    ASCEND_SIM_ROOT                     tests only: a directory standing in for "/" (see runtime.py)

Data parallelism across nodes (a head and --headless members): dp.py. The engine-core processes: engine_core.py.
"""

import asyncio
import json
import logging
import os
import signal
import socket
import sys
import time
from dataclasses import replace
from importlib.metadata import entry_points
from pathlib import Path

import uvicorn

from vllm._sim import planner, runtime
from vllm._sim.app import ServingState, create_app
from vllm._sim.claims import Claims, advertise_hbm, bind_hccl_ports, bind_internal_port, claim_npus
from vllm._sim.dp import (
    DataParallel,
    HandshakeTimeout,
    RemoteEngines,
    join_head,
    listen_master_port,
    master_port_candidates,
)
from vllm._sim.engine import Capacity, Engine, StepLoop
from vllm._sim.engine_core import EngineCores, core_names, fail_on_npu_runtime_error
from vllm._sim.errors import StartupError
from vllm._sim.metrics import ServerMetrics
from vllm._sim.model import ModelDir, open_model_dir
from vllm._sim.options import build_parser, load_option_data
from vllm._sim.performance import pacing
from vllm._sim.text import TextCodec
from vllm._version import __version__

log = logging.getLogger("vllm")

DTYPE_NAMES = {
    "half": "float16",
    "float16": "float16",
    "bfloat16": "bfloat16",
    "float": "float32",
    "float32": "float32",
}
# Plan findings that stop real vLLM at start-up (the rest are the planner's own judgement).
FATAL_FINDINGS = {
    "tp-heads",
    "tp-kv-heads",
    "tp-linear-heads",
    "max-model-len",
    "weights-do-not-fit",
    "concurrency-below-one",
}
DEFAULT_MAX_NUM_SEQS = 256
# EngineArgs' default for the API server on a device under 70 GiB, as a 910B3's 64 GiB is
# (vllm/engine/arg_utils.py, _set_default_args: default_max_num_batched_tokens); whether vllm-ascend
# changes it is not known here (docs/sim-fidelity.md).
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048
ASCEND_QUANTIZATION = "ascend"  # vllm-ascend's method for msModelSlim weights
WATCHDOG_SECONDS = 5.0  # launcher.py watchdog_loop: VLLM_WATCHDOG_TIME_S
SHUTDOWN_MIN_SECONDS = 5.0  # v1/utils.py shutdown: "Allow at least 5 seconds for remaining procs to terminate."


def configure_logging() -> None:
    """vLLM's log line format, on stdout."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(
        logging.Formatter("%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s", "%m-%d %H:%M:%S")
    )
    log.addHandler(handler)
    log.setLevel(os.environ.get("VLLM_LOGGING_LEVEL", "INFO").upper())


def release_number(version: str) -> str:
    """0.11.0rc1 -> 0.11.0: vllm-ascend releases follow the vLLM release they are built for."""
    return version.split("rc")[0].split("+")[0].split(".post")[0]


def check_platform() -> None:
    """vLLM finds the NPU only through the vllm-ascend plugin, which needs torch_npu and CANN."""
    plugins = {ep.name: ep for ep in entry_points(group="vllm.platform_plugins")}
    if "ascend" not in plugins:
        raise StartupError("Failed to infer device type: no platform plugin for the NPU (is vllm-ascend installed?)")
    import vllm_ascend

    if release_number(vllm_ascend.__version__) != release_number(__version__):
        raise StartupError(
            f"vllm-ascend {vllm_ascend.__version__} does not match vLLM {__version__}: install the pair its release pins"
        )
    try:
        runtime.check_cann_environment()
    except ImportError as err:
        raise StartupError(f"Failed to import vllm_ascend platform: ImportError: {err}") from None


def read_hardware() -> dict:
    path = runtime.node_path(runtime.HARDWARE_FILE)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise StartupError(f"no NPU hardware description at {path}") from None


def select_npus(world_size: int) -> list[int]:
    visible = runtime.visible_npus()
    if len(visible) < world_size:
        raise StartupError(
            f"World size {world_size} needs {world_size} NPUs but {len(visible)} are visible "
            f"(ASCEND_RT_VISIBLE_DEVICES={os.environ.get('ASCEND_RT_VISIBLE_DEVICES', '<unset>')})"
        )
    return visible[:world_size]


def resolve_dtype(requested: str, config: dict) -> str:
    """--dtype auto takes the checkpoint's dtype, as vLLM does."""
    if requested == "auto":
        requested = config.get("torch_dtype") or config.get("dtype") or "bfloat16"
    return DTYPE_NAMES.get(requested, requested)


def modelslim_scheme(model: ModelDir) -> str:
    """The scheme of msModelSlim weights (`--quantization ascend`), from their quant_model_description.json;
    without one, the failure of the installed vllm-ascend (0.18.0 loads the file itself, in
    maybe_update_config; earlier releases leave it to vLLM's get_quant_config)."""
    import vllm_ascend

    path = model.path / planner.MODELSLIM_DESCRIPTION
    if not path.exists():
        release = tuple(int(part) for part in release_number(vllm_ascend.__version__).split(".")[:2])
        if release < (0, 18):
            raise StartupError("ValueError: Cannot find the config file for ascend")
        raise StartupError(
            "ValueError: ERROR: ModelSlim Quantization Config Not Found: You have enabled '--quantization ascend' "
            f"(ModelSlim quantization), but the model '{model.path}' does not contain the required quantization "
            f"config file ('{planner.MODELSLIM_DESCRIPTION}')."
        )
    return planner.modelslim_scheme(json.loads(path.read_text()))


def plan_capacity(args, model: ModelDir, hardware: dict) -> planner.InstancePlan:
    """The planner's plan for this instance on this node's HBM; vLLM's start-up failures where it refuses."""
    try:
        shape = planner.ModelShape.from_config(model.config)
        quantization = args.quantization
        if quantization == ASCEND_QUANTIZATION:
            shape = replace(shape, checkpoint_quantization=modelslim_scheme(model))
            quantization, _ = planner.planned_quantization(shape, None, ascend=True)
        chip = planner.chip_by_name(hardware["chip"])
        reserved = chip.hbm_bytes - chip.usable_hbm_bytes  # firmware and driver keep this much of each card
        dtype = resolve_dtype(args.dtype, model.config)
        plan = planner.plan_instance(
            shape,
            chip,
            tp=args.tensor_parallel_size,
            max_model_len=args.max_model_len or shape.max_position_embeddings,
            gpu_memory_utilization=args.gpu_memory_utilization,
            dtype=dtype,
            quantization=quantization,
            ep=args.enable_expert_parallel,
            mtp=planner.speculates_with_mtp(json.loads(args.speculative_config or "{}")),  # the option is a str
            hbm_bytes_override=hardware["hbm_mb"] * planner.MIB - reserved,
            kv_dtype=None
            if args.kv_cache_dtype == "auto"
            else DTYPE_NAMES.get(args.kv_cache_dtype, args.kv_cache_dtype),
        )
    except planner.ConfigError as err:
        raise StartupError(str(err)) from None
    fatal = [f for f in plan.findings if f.code in FATAL_FINDINGS]
    if fatal:
        raise StartupError(startup_failure(fatal[0], plan))
    return plan


def check_engine_args(args, max_model_len: int) -> None:
    """What vLLM's configs refuse at start-up across options, in its words: the scheduler's batch against
    the context and the seats (vllm/config/scheduler.py, SchedulerConfig.verify_max_model_len in 0.18.0,
    _verify_args in 0.11.0) and the speculative method (vllm/config/speculative.py: pydantic holds
    SpeculativeConfig.method to the SpeculativeMethod Literal; the names are the release's option data)."""
    batched = args.max_num_batched_tokens
    if batched is not None and args.enable_chunked_prefill is False and batched < max_model_len:
        raise StartupError(
            f"ValueError: max_num_batched_tokens ({batched}) is smaller than max_model_len ({max_model_len}). "
            "This effectively limits the maximum sequence length to max_num_batched_tokens and makes vLLM reject "
            "longer sequences. Please increase max_num_batched_tokens or decrease max_model_len.")
    if batched is not None and args.max_num_seqs is not None and batched < args.max_num_seqs:
        raise StartupError(f"ValueError: max_num_batched_tokens ({batched}) must be greater than or equal to "
                           f"max_num_seqs ({args.max_num_seqs}).")
    method = json.loads(args.speculative_config or "{}").get("method")  # the option is a str
    methods = load_option_data().get("speculative_methods")
    if method is not None and methods is not None and method not in methods:
        allowed = ", ".join(f"'{name}'" for name in methods[:-1]) + f" or '{methods[-1]}'"
        raise StartupError(f"pydantic_core._pydantic_core.ValidationError: 1 validation error for SpeculativeConfig "
                           f"method: Input should be {allowed} [type=literal_error, input_value='{method}', "
                           "input_type=str]")


def startup_failure(finding: planner.Finding, plan: planner.InstancePlan) -> str:
    """The message vLLM stops with for a finding; the planner's own words where vLLM has none."""
    if finding.code == "concurrency-below-one":
        needed = plan.kv_cache_bytes_per_token_per_npu * plan.max_model_len / planner.GIB
        available = max(plan.kv_cache_pool_bytes_per_npu, 0) / planner.GIB
        return (
            f"To serve at least one request with the models's max seq len ({plan.max_model_len}), "
            f"({needed:.2f} GiB KV cache is needed, which is larger than the available KV cache memory ({available:.2f} GiB). "
            f"Based on the available memory, the estimated maximum model length is {plan.kv_cache_tokens}. "
            "Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine."
        )
    if finding.code == "weights-do-not-fit":
        return f"NPU out of memory while loading weights: {finding.message}"
    return finding.message


def log_kv_cache(plan: planner.InstancePlan, style: str) -> None:
    """The start-up lines operators read, in the pinned release's format."""
    tokens, length = f"{plan.kv_cache_tokens:,}", f"{plan.max_model_len:,}"
    if style == "combined":
        log.info(
            "NPU KV cache size: %s tokens, Maximum concurrency for %s tokens per request: %.2fx",
            tokens,
            length,
            plan.max_concurrency,
        )
    else:
        log.info("GPU KV cache size: %s tokens", tokens)
        log.info("Maximum concurrency for %s tokens per request: %.2fx", length, plan.max_concurrency)


def load_seconds(weight_bytes: int) -> float:
    base = float(os.environ.get("VLLM_SIM_LOAD_BASE_SECONDS", "1.0"))
    per_gib = float(os.environ.get("VLLM_SIM_LOAD_SECONDS_PER_GIB", "2.0"))
    return base + per_gib * weight_bytes / planner.GIB


def api_socket(host: str | None, port: int, listen: bool = True) -> socket.socket:
    """vLLM binds its API socket with SO_REUSEPORT: a second server on the same port starts and splits traffic.

    Real vLLM binds it before starting its engines and listens only when it serves (setup_server,
    create_server_socket): until then a connection is refused. The DP head does so (listen=False,
    uvicorn listens); the single-node path still listens at once and answers 503 while loading."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host or "0.0.0.0", port))
    if listen:
        sock.listen()
    return sock


class Instance:
    """One simulated vLLM server between start-up checks and shutdown."""

    def __init__(self, args, claims: Claims, headless: bool):
        self.args = args
        self.claims = claims
        check_platform()
        self.model = open_model_dir(Path(args.model_tag or args.model))
        hardware = read_hardware()
        self.plan = plan_capacity(args, self.model, hardware)
        check_engine_args(args, self.plan.max_model_len)
        self.dp = DataParallel.from_args(args, headless)
        if self.dp.size > 1 and os.environ.get("VLLM_PORT") and load_option_data().get("dp_master_ports") == "repeat":
            # 0.11.0/0.13.0 ParallelConfig.__post_init__: get_open_ports_list(5) adds get_open_port(), the
            # same free VLLM_PORT each time, to a set until it holds five: it never returns (real vLLM
            # spins there; the simulator sleeps)
            while True:
                time.sleep(3600)
        # each node's engines hold TP x PP NPUs each: a DP member holds them for its local ranks
        self.npus = select_npus(args.tensor_parallel_size * args.pipeline_parallel_size * self.dp.local)
        claim_npus(claims, self.npus)
        bind_hccl_ports(claims)
        if self.dp.is_head:
            # chosen when the config is made, before vLLM's other internal ports; rank 0's engine listens there
            vllm_port = int(os.environ["VLLM_PORT"]) if os.environ.get("VLLM_PORT") else None
            claims.sockets.append(listen_master_port(self.dp.address, master_port_candidates(vllm_port).pop()))
        bind_internal_port(claims, log)
        names = args.served_model_name or [args.model_tag or args.model]
        self.metrics = ServerMetrics(names[0])
        # the head's client schedules over every DP engine: their KV blocks add up (wait_for_engine_startup
        # sums num_gpu_blocks), each engine runs max_num_seqs
        shape = planner.ModelShape.from_config(self.model.config)
        paced = pacing(hardware, shape, self.plan)
        # on unless told otherwise or the model cannot cache prefixes (0.18.0's EngineArgs default:
        # ModelConfig.is_prefix_caching_supported, False for hybrid models)
        prefix_caching = not shape.is_hybrid if args.enable_prefix_caching is None else args.enable_prefix_caching
        # vllm-ascend's refresh_block_size (0.18.0 utils.py): 128 unless given; but for a hybrid model, 128
        # whatever is given while prefix caching or chunked prefill (on by default) is on
        block_size = args.block_size or 128
        if not shape.is_hybrid and (prefix_caching or args.enable_chunked_prefill is not False):
            block_size = 128
        capacity = Capacity(
            kv_cache_tokens=paced.kv_cache_tokens * self.dp.size,
            max_num_seqs=(args.max_num_seqs or DEFAULT_MAX_NUM_SEQS) * self.dp.size,
            block_size=block_size,
            max_model_len=self.plan.max_model_len,
            max_num_batched_tokens=args.max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS,
            enable_prefix_caching=prefix_caching,
        )
        engine = Engine(TextCodec(self.model.path, self.model.tokenizer_config), capacity,
                        StepLoop(capacity, paced.cost, paced.time_scale, self.metrics), self.metrics,
                        self.model.weights_digest)
        self.state = ServingState(engine, names, str(self.model.path), __version__,
                                  tool_parser=args.tool_call_parser if args.enable_auto_tool_choice else None)

    async def load(self) -> None:
        """The simulated weight load; /health answers 200 when it ends."""
        started = time.monotonic()
        await asyncio.sleep(load_seconds(self.model.weight_bytes))
        log.info("Loading weights took %.2f seconds", time.monotonic() - started)
        log.info("Model loading took %.4f GiB memory", self.plan.weight_bytes_per_npu / planner.GIB)
        log_kv_cache(self.plan, load_option_data()["kv_cache_log"])
        advertise_hbm(self.claims, self.npus, self.plan.budget_bytes_per_npu // planner.MIB)
        self.state.ready = True

    def engine_cores(self, on_death) -> EngineCores:
        """This node's engine-core processes, one per local engine."""
        return EngineCores(core_names(self.dp.local_ranks, self.dp.size > 1, self.state.release), on_death)

    async def serve(self) -> None:
        """Start the engine cores, then serve until SIGTERM or until the engine dies (then exit 0, as
        launcher.py's terminate_if_errored stops uvicorn); an engine core lost before serving fails the start."""
        loop = asyncio.get_running_loop()
        serving = False
        start_failed = loop.create_future()

        def engine_core_died(name: str, returncode: int) -> None:
            if serving:  # the client's engine monitor thread
                self.state.engine.die(f"Engine core proc {name} died unexpectedly, shutting down client.")
            else:  # utils.py wait_for_engine_startup: a local core process exited
                start_failed.set_result("RuntimeError: Engine core initialization failed. See root cause above. "
                                        f"Failed core proc(s): {{'{name}': {returncode}}}")

        cores = self.engine_cores(engine_core_died)
        cores.start()
        try:
            spans_nodes = self.dp.spans_nodes
            sock = api_socket(self.args.host, self.args.port, listen=not spans_nodes)
            self.claims.sockets.append(sock)

            async def load() -> None:
                nonlocal serving
                await self.load()
                serving = True

            if spans_nodes:
                await self.wait_for_engines(start_failed)
                serving = True
                load = no_load
            log.info("Starting vLLM API server 0 on http://%s:%d", self.args.host or "0.0.0.0", self.args.port)
            config = uvicorn.Config(
                create_app(self.state, load, api_keys(self.args)),
                log_level=self.args.uvicorn_log_level,
                access_log=not self.args.disable_uvicorn_access_log,
                timeout_keep_alive=5,
            )
            server = uvicorn.Server(config)

            def terminate_if_errored() -> None:
                if self.state.engine.dead:
                    server.should_exit = True

            self.state.terminate_if_errored = terminate_if_errored
            start_failed.add_done_callback(lambda _: setattr(server, "should_exit", True))
            watchdog = asyncio.ensure_future(watch_engine(terminate_if_errored))
            faults = asyncio.ensure_future(fail_on_npu_runtime_error(
                runtime.node_path(runtime.HARDWARE_FILE), self.npus, self.state.engine,
                workers=self.args.tensor_parallel_size * self.args.pipeline_parallel_size))
            shutting_down = self.handle_shutdown(server)
            try:
                await server.serve(sockets=[sock])
            finally:
                watchdog.cancel()
                faults.cancel()
                # uvicorn may end first (its last stream closed): the engine core still ends its own shutdown,
                # as the real server waits for that process (CoreEngineProcManager.shutdown joins it).
                if shutting_down:
                    _, left = await asyncio.wait(shutting_down, timeout=1)
                    for task in left:
                        task.cancel()
            if start_failed.done():
                raise StartupError(start_failed.result())
        finally:
            cores.stop()

    def handle_shutdown(self, server: uvicorn.Server) -> list[asyncio.Task]:
        """A release with --shutdown-timeout (0.18.0): launcher.py serve_http's SIGTERM/SIGINT handler, set before
        uvicorn serves, beside uvicorn's own (Server.capture_signals: stop listening, close idle connections,
        wait for the open ones). Its handle_shutdown runs engine_client.shutdown(timeout=shutdown_timeout): the
        engine core, signalled too (systemd signals the whole unit; CoreEngineProcManager.shutdown terminates it
        again), aborts or drains its requests (Engine.request_shutdown) and is killed if work is left after
        max(timeout, 5) s (v1/utils.py shutdown); then should_exit. A stream the killed engine leaves gets
        nothing more, and uvicorn waits for it. Earlier releases: no handler, uvicorn's stop alone (not their source's
        path: docs/sim-fidelity.md, "Shutdown on SIGTERM"). Returns the shutdown's task once it started."""
        timeout = getattr(self.args, "shutdown_timeout", None)
        tasks: list[asyncio.Task] = []
        if timeout is None:
            return tasks
        loop = asyncio.get_running_loop()
        engine = self.state.engine

        async def shut_down() -> None:
            await engine.wait_shut_down(max(timeout, SHUTDOWN_MIN_SECONDS))
            server.should_exit = True

        def signal_handler() -> None:
            # before serving, real vLLM has no engine core to ask (setup_server's handler raises); here uvicorn's stops
            if self.state.ready and not engine.shutdown_requested:
                engine.request_shutdown(timeout)
                tasks.append(asyncio.ensure_future(shut_down()))

        loop.add_signal_handler(signal.SIGTERM, signal_handler)
        loop.add_signal_handler(signal.SIGINT, signal_handler)
        return tasks

    async def wait_for_engines(self, start_failed: asyncio.Future) -> None:
        """The DP head: its engines' handshake socket at A:P, then every rank in before serving; a local
        engine core lost meanwhile (`start_failed`) stops the start."""
        engines = RemoteEngines(self.dp, log, self.state.engine.lose_peer)
        await engines.bind()
        self.remote_engines = engines
        log.info("Started DP Coordinator process (PID: %d)", os.getpid())
        loop = asyncio.get_running_loop()
        waiting = asyncio.ensure_future(engines.wait_until_ready(self.load()))
        # setup_server's SIGTERM handler interrupts start-up
        loop.add_signal_handler(signal.SIGTERM, waiting.cancel)
        try:
            await asyncio.wait({waiting, start_failed}, return_when=asyncio.FIRST_COMPLETED)
            if not start_failed.done():
                await waiting
        except asyncio.CancelledError:
            engines.close()
            raise Interrupted() from None
        except RuntimeError as err:
            engines.close()
            raise StartupError(f"RuntimeError: {err}") from None
        finally:
            loop.remove_signal_handler(signal.SIGTERM)
            signal.signal(signal.SIGTERM, lambda *_: None)  # as run() set it, for uvicorn's re-raise
        if start_failed.done():
            waiting.cancel()
            engines.close()
            raise StartupError(start_failed.result())

    async def run_member(self) -> int:
        """A --headless member (serve.py run_headless): its engines join the head; no API server."""
        log.info(
            "Launching %d data parallel engine(s) in headless mode, with head node address %s.",
            self.dp.local,
            self.dp.uri,
        )
        loop = asyncio.get_running_loop()
        stopped = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stopped.set)
        loop.add_signal_handler(signal.SIGINT, stopped.set)
        # CoreEngineProcManager.join_first: an engine process that dies ends the launcher's wait as a signal does
        cores = self.engine_cores(lambda _name, _returncode: stopped.set())
        cores.start()
        try:
            joining = asyncio.ensure_future(join_head(self.dp, self.load))
            stop = asyncio.ensure_future(stopped.wait())
            await asyncio.wait({joining, stop}, return_when=asyncio.FIRST_COMPLETED)
            if joining.done() and joining.exception() is None:
                connection = joining.result()
                # joined: run until stopped. A head that goes away is not noticed (no heartbeat in vLLM:
                # the member's engine idles until its next collective, which only the head starts).
                await stop
                connection.close()
            elif joining.done():
                err = joining.exception()
                if not isinstance(err, HandshakeTimeout):
                    raise err
                log.error("EngineCore failed to start.")
                log.error("RuntimeError: Did not receive response from front-end process within 5 minutes")
            else:
                joining.cancel()
        finally:
            cores.stop()
        # run_headless: whatever ended the engines, the launcher shuts down and returns (exit 0)
        log.info("Shutting down.")
        return 0

    async def run_external_rank(self) -> int:
        """A start rank above 0 without --headless, as the api_server module starts a member whatever
        --headless says: an external-LB rank with an API server of its own (bound, not listening, until
        its engine is in), whose engine says HELLO to the head as not headless. A head balancing
        internally refuses it and sends no init message; the engine gives up after the handshake
        timeout and the front end raises."""
        if self.dp.local == 1 and not getattr(self.args, "data_parallel_external_lb", False):
            log.warning("data_parallel_hybrid_lb is not eligible when data_parallel_size_local = 1, "
                        "autoswitch to data_parallel_external_lb.")
        self.claims.sockets.append(api_socket(self.args.host, self.args.port, listen=False))
        try:
            connection = await join_head(self.dp, self.load)
        except HandshakeTimeout:
            log.error("EngineCore failed to start.")
            log.error("RuntimeError: Did not receive response from front-end process within 5 minutes")
            engines = ", ".join(f"'EngineCore_DP{rank}': 1" for rank in self.dp.local_ranks)
            raise StartupError("RuntimeError: Engine core initialization failed. See root cause above. "
                               f"Failed core proc(s): {{{engines}}}") from None
        connection.close()
        raise StartupError("an external or hybrid load-balanced DP rank whose head accepted it is not simulated")


async def no_load() -> None:
    """The DP head loads before it serves: nothing is left for the app's start-up."""


async def watch_engine(terminate_if_errored) -> None:
    """launcher.py watchdog_loop: every 5 s, stop the server if the engine is dead (a stream's error
    reaches no exception handler, so nothing else would)."""
    period = float(os.environ.get("VLLM_SIM_WATCHDOG_SECONDS", WATCHDOG_SECONDS))
    while True:
        await asyncio.sleep(period)
        terminate_if_errored()


class Interrupted(Exception):
    """SIGTERM before the DP head served."""


def check_data_parallel_args(args) -> None:
    """serve.py's checks of the DP options before anything starts (cmd, run_headless)."""
    release = tuple(int(part) for part in release_number(__version__).split(".")[:2])
    if args.headless:
        if release >= (0, 18):
            if args.api_server_count is not None and args.api_server_count > 0:
                raise StartupError(
                    f"ValueError: --api-server-count={args.api_server_count} cannot be used with --headless "
                    "(no API servers are started in headless mode)."
                )
        elif args.api_server_count > 1:
            raise StartupError("ValueError: api_server_count can't be set in headless mode")
        if args.data_parallel_size_local is not None and args.data_parallel_size_local <= 0:
            raise StartupError("ValueError: data_parallel_size_local must be > 0 in headless mode")
    elif release >= (0, 18) and args.api_server_count is None and args.data_parallel_size > 1:
        # the head runs one API server process per DP rank unless told otherwise
        if args.data_parallel_start_rank is None and not args.data_parallel_hybrid_lb:
            log.info("Defaulting api_server_count to data_parallel_size (%d).", args.data_parallel_size)


def api_keys(args) -> list[str]:
    """vLLM's keys: --api-key (one or more), else VLLM_API_KEY; none leaves /v1 open."""
    keys = args.api_key or os.environ.get("VLLM_API_KEY")
    return ([keys] if isinstance(keys, str) else list(keys)) if keys else []


def run(argv: list[str], entry: str) -> int:
    """Parse the pinned release's CLI, start up, serve until SIGTERM/SIGINT; 1 on a start-up failure."""
    args = build_parser(entry).parse_args(argv)
    configure_logging()
    log.info("vLLM API server version %s", __version__)
    claims = Claims()
    # only `vllm serve` acts on --headless and --api-server-count (serve.py cmd); the api_server
    # module parses both and runs one API server (run_server) whatever they say
    headless = entry == "serve" and args.headless
    try:
        if entry == "serve":
            check_data_parallel_args(args)
        instance = Instance(args, claims, headless)
        if headless:
            return asyncio.run(instance.run_member())
        if instance.dp.local_engines_only and instance.dp.start_rank > 0:
            return asyncio.run(instance.run_external_rank())
        # uvicorn drains in-flight requests on SIGTERM, then re-raises the signal;
        # ignoring the re-raised one makes a graceful stop exit 0.
        signal.signal(signal.SIGTERM, lambda *_: None)
        asyncio.run(instance.serve())
    except StartupError as err:
        log.error("%s", err)
        return 1
    except Interrupted:
        log.info("Shutting down.")
        return 0
    finally:
        claims.release()
    return 0
