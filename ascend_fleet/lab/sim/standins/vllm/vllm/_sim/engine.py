"""The simulated engine: vLLM V1's scheduler (perfmodel.py) stepping in time, and paced token output.

Each step lasts what a cost model says: the performance model of the node's NPUs when the lab's
hardware file asks for it (performance.py), else a fixed pacing (FixedPacing).
"""

import asyncio
import hashlib
import logging
import os
import pickle
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from vllm._sim import perfmodel
from vllm._sim.metrics import ServerMetrics
from vllm._sim.text import TextCodec, generated_ids, natural_length


class RequestError(ValueError):
    """A request vLLM would answer with 400."""


ABORTED = "abort"  # what a request's queue gets when the engine aborts it (FinishReason.ABORT's string)


class EngineDeadError(Exception):
    """vLLM's EngineDeadError (vllm/v1/engine/exceptions.py): the engine core is gone; unrecoverable."""

    def __init__(self) -> None:
        super().__init__("EngineCore encountered an issue. See stack trace (above) for the root cause.")


@dataclass(frozen=True)
class FixedPacing:
    """Step time without the performance model: one inter-token latency a step plus a cost per
    prefilled token; environment variables so lab profiles can tune them."""

    itl_seconds: float
    prefill_seconds_per_token: float

    @classmethod
    def from_env(cls) -> "FixedPacing":
        return cls(
            itl_seconds=float(os.environ.get("VLLM_SIM_ITL_SECONDS", "0.02")),
            prefill_seconds_per_token=float(os.environ.get("VLLM_SIM_PREFILL_SECONDS_PER_TOKEN", "0.0002")),
        )

    def seconds(self, batch: perfmodel.Batch) -> float:
        return self.itl_seconds + self.prefill_seconds_per_token * (batch.tokens - batch.sequences)


@dataclass(frozen=True)
class Capacity:
    kv_cache_tokens: int
    max_num_seqs: int
    block_size: int
    max_model_len: int
    max_num_batched_tokens: int
    enable_prefix_caching: bool


def sha256(value) -> bytes:
    """vLLM's default --prefix-caching-hash-algo, sha256 (vllm/utils/hashing.py): SHA-256 of the pickled value."""
    return hashlib.sha256(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)).digest()


# init_none_hash (v1/core/kv_cache_utils.py): the first block's parent, random per start unless PYTHONHASHSEED
NONE_HASH = sha256(os.environ["PYTHONHASHSEED"]) if "PYTHONHASHSEED" in os.environ else os.urandom(32)


def block_hashes(token_ids: list[int], block_size: int) -> tuple[bytes, ...]:
    """vLLM's request block hasher (get_request_block_hasher, hash_block_tokens): one hash per full block,
    over its parent block's hash, its token ids and its extra keys (none here: no LoRA, images or salt)."""
    hashes, parent = [], NONE_HASH
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = sha256((parent, tuple(token_ids[start:start + block_size]), None))
        hashes.append(parent)
    return tuple(hashes)


class StepLoop:
    """vLLM's busy loop: one engine step at a time over perfmodel's scheduler, each lasting what the
    cost model says (times time_scale), then a token to every request whose context caught up."""

    def __init__(self, capacity: Capacity, cost, time_scale: float, metrics: ServerMetrics):
        self.scheduler = perfmodel.Scheduler(perfmodel.SchedulerLimits(
            max_num_seqs=capacity.max_num_seqs, max_num_batched_tokens=capacity.max_num_batched_tokens,
            kv_cache_tokens=capacity.kv_cache_tokens, block_size=capacity.block_size,
            enable_prefix_caching=capacity.enable_prefix_caching))
        self.cost = cost
        self.time_scale = time_scale
        self.metrics = metrics
        self.tokens: dict[perfmodel.Request, asyncio.Queue] = {}
        self._work = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._stepping = False  # a step is under way: at_next_step waits for its end
        self.between_steps: list = []
        self.halted = False  # the engine core was killed: no step runs again

    @property
    def busy(self) -> bool:
        return not self.scheduler.idle

    async def wait_for_work(self) -> None:
        """Until a request is in the scheduler (at once if one is)."""
        await self._work.wait()

    def _publish(self) -> None:
        self.metrics.running.set(len(self.scheduler.running))
        self.metrics.waiting.set(len(self.scheduler.waiting))
        limits = self.scheduler.limits
        self.metrics.kv_cache_usage.set((limits.blocks - self.scheduler.free_blocks) / max(limits.blocks, 1))
        lookups = self.scheduler.take_prefix_cache_stats()
        self.metrics.prefix_cache_queries.inc(lookups.queries)
        self.metrics.prefix_cache_hits.inc(lookups.hits)

    @property
    def unfinished(self) -> int:
        """The scheduler's get_num_unfinished_requests: waiting and running."""
        return len(self.scheduler.waiting) + len(self.scheduler.running)

    def at_next_step(self, action) -> None:
        """Run `action` between steps, as the engine core's busy loop handles a shutdown request before its
        next step (core.py run_busy_loop: `while self._handle_shutdown()`): a step under way ends first."""
        if self._stepping:
            self.between_steps.append(action)
        else:
            action()

    def abort_all(self) -> int:
        """scheduler.finish_requests(None, FINISHED_ABORTED): every unfinished request leaves, its queue
        gets ABORTED; returns how many."""
        aborted = [*self.scheduler.waiting, *self.scheduler.running]
        for request in aborted:
            self.scheduler.abort(request)
            if (queue := self.tokens.pop(request, None)) is not None:
                queue.put_nowait(ABORTED)
        self._publish()
        return len(aborted)

    def halt(self) -> None:
        """The engine core killed (utils.py shutdown: kill_process_tree): no more steps, nothing sent."""
        self.halted = True
        if self._task is not None:
            self._task.cancel()

    def submit(self, request: perfmodel.Request) -> asyncio.Queue:
        """Queue a request; its queue gets one None per token, ABORTED, or the error that ended the engine."""
        if self._task is None and not self.halted:
            self._task = asyncio.ensure_future(self._run())
        queue = self.tokens[request] = asyncio.Queue()
        self.scheduler.add(request)
        self._publish()
        self._work.set()
        return queue

    def abort(self, request: perfmodel.Request) -> None:
        """The request is over (done, or its client gone): it leaves the batch and frees its blocks."""
        if self.tokens.pop(request, None) is not None:
            self.scheduler.abort(request)
            self._publish()

    def fail_all(self, error: Exception) -> None:
        for queue in self.tokens.values():
            queue.put_nowait(error)

    async def _run(self) -> None:
        while True:
            batch = self.scheduler.schedule()
            self._publish()
            if not batch.scheduled:
                self._work.clear()
                await self._work.wait()
                continue
            self._stepping = True
            try:
                await asyncio.sleep(self.cost.seconds(batch) * self.time_scale)
                for request in self.scheduler.complete(batch, time.monotonic()):
                    if request in self.tokens:
                        self.tokens[request].put_nowait(None)
            finally:
                self._stepping = False
            while self.between_steps:
                self.between_steps.pop(0)()


@dataclass(frozen=True)
class TokenEvent:
    text: str
    finish_reason: str | None
    token: bool = True  # False: the abort that ends a request, which carries no token


class Engine:
    """Turns a tokenized prompt into a stream of deterministic tokens paced by the step loop, and
    records vLLM's metrics."""

    def __init__(self, codec: TextCodec, capacity: Capacity, steps: StepLoop, metrics: ServerMetrics,
                 weights_digest: bytes):
        self.codec = codec
        self.weights_digest = weights_digest
        self.capacity = capacity
        self.steps = steps
        self.metrics = metrics
        self.vocabulary = codec.generation_vocabulary()
        self.dead = False
        self.peer_lost: str | None = None  # a DP peer whose connection closed: the next collective fails
        self.shutdown_requested = False  # 0.18.0's EngineShutdownState: RUNNING until SIGTERM

    def lose_peer(self, reason: str) -> None:
        """A remote DP engine left. Real vLLM has no heartbeat: its engines notice at their next
        collective, which runs only while requests are in flight (DPEngineCoreProc.run_busy_loop)."""
        self.peer_lost = reason
        if self.steps.busy:
            self.die()

    def check_alive(self) -> None:
        """At each request: an engine whose DP peer left fails its first collective now."""
        if self.peer_lost and not self.dead:
            self.die()
        if self.dead:
            raise EngineDeadError()

    def die(self, *cause: str) -> None:
        """The engine core is gone: the ERROR lines that say why, then its client's (AsyncLLM's output handler
        fails with EngineDeadError), and every request in flight fails with that error. Without `cause`, the
        engine's own fatal error at a DP collective whose peer left: it sends ENGINE_CORE_DEAD before it exits, so
        the client's process monitor, finding engine_dead set, says nothing (core.py _send_engine_dead,
        core_client.py monitor_engine_cores). The API server's exit is its own (server.py, app.py)."""
        if self.dead:
            return
        self.dead = True
        log = logging.getLogger("vllm")
        for line in cause or ("EngineCore encountered a fatal error.",
                              f"(simulated) the data parallel group's collective failed: {self.peer_lost}"):
            log.error("%s", line)
        log.error("AsyncLLM output_handler failed.")
        log.error("vllm.v1.engine.exceptions.EngineDeadError: %s", EngineDeadError())
        self.steps.fail_all(EngineDeadError())

    def check_length(self, prompt_tokens: int, max_tokens: int) -> None:
        """vLLM's 400 for a request longer than --max-model-len."""
        limit = self.capacity.max_model_len
        if max_tokens < 1:
            raise RequestError(f"max_tokens must be at least 1, got {max_tokens}.")
        if prompt_tokens + max_tokens > limit:
            raise RequestError(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, {max_tokens} in the completion). "
                "Please reduce the length of the messages or completion."
            )

    def output_length(self, prompt_ids: list[int], max_tokens: int, ignore_eos: bool) -> tuple[int, str]:
        """How many tokens the request gets and why it stops."""
        natural = natural_length(prompt_ids)
        if ignore_eos or natural >= max_tokens:
            return max_tokens, "length"
        return natural, "stop"

    def request_shutdown(self, timeout: int) -> None:
        """0.18.0's engine core on SIGTERM (core.py run_engine_core's signal_handler, then _handle_shutdown before
        its next step): timeout 0 aborts every unfinished request, else they go on (the launcher's deadline is
        the server's, wait_shut_down); from now on a new request is rejected (_reject_add_in_shutdown)."""
        if self.shutdown_requested:
            return
        self.shutdown_requested = True
        log = logging.getLogger("vllm")

        def handle_shutdown() -> None:
            log.info("Shutdown initiated (timeout=%d)", timeout)
            if timeout == 0:
                if self.steps.unfinished:
                    log.info("Aborting %d requests", self.steps.unfinished)
                self.steps.abort_all()
            elif self.steps.unfinished:
                log.info("Draining %d in-flight requests (timeout=%ds)", self.steps.unfinished, timeout)

        self.steps.at_next_step(handle_shutdown)

    async def wait_shut_down(self, seconds: float) -> bool:
        """Until the engine has no work left ("Shutdown complete", and its process exits), at most `seconds`;
        past them the engine core is killed (halt) and False returned."""
        deadline = time.monotonic() + seconds
        while self.steps.unfinished or self.steps.between_steps:
            if time.monotonic() >= deadline:
                self.steps.halt()
                return False
            await asyncio.sleep(0.05)
        logging.getLogger("vllm").info("Shutdown complete")
        return True

    async def generate(self, prompt_ids: list[int], max_tokens: int, ignore_eos: bool,
                       request_id: str = "") -> AsyncIterator[TokenEvent]:
        """Yield the output token by token, as the step loop produces them; an aborted request ends with
        a TokenEvent carrying no token and finish_reason "abort"."""
        if self.dead:
            raise EngineDeadError()
        if self.shutdown_requested:  # core.py _reject_add_in_shutdown: an abort output, no token
            logging.getLogger("vllm").info("Rejecting request %s (server shutting down)", request_id)
            yield TokenEvent("", ABORTED, token=False)
            return
        arrival = time.monotonic()
        count, finish_reason = self.output_length(prompt_ids, max_tokens, ignore_eos)
        ids = generated_ids(prompt_ids, count, self.vocabulary, self.weights_digest)
        # every block of prompt and output hashed up front: the scheduler caches an output block only once
        # its tokens are generated, as vLLM hashes them
        hashes = block_hashes(prompt_ids + ids, self.capacity.block_size) if self.capacity.enable_prefix_caching else ()
        request = perfmodel.Request(len(prompt_ids), count, arrival=arrival, block_hashes=hashes)
        produced = self.steps.submit(request)
        try:
            text, last = "", arrival
            for index in range(1, count + 1):
                outcome = await produced.get()
                if outcome == ABORTED:
                    yield TokenEvent("", ABORTED, token=False)
                    return
                if outcome is not None:
                    raise outcome
                now = time.monotonic()
                if index == 1:
                    self.metrics.prompt_tokens.inc(len(prompt_ids))
                    self.metrics.ttft.observe(now - arrival)
                else:
                    self.metrics.itl.observe(now - last)
                last = now
                full = self.codec.decode(ids[:index])  # whole-prefix decode keeps multi-byte characters intact
                self.metrics.generation_tokens.inc()
                yield TokenEvent(full[len(text):], finish_reason if index == count else None)
                text = full
            self.metrics.e2e.observe(time.monotonic() - arrival)
        finally:
            self.steps.abort(request)
