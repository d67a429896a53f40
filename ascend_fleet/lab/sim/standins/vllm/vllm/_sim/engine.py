"""The simulated engine: admission against max_num_seqs and the KV cache, and paced token output."""

import asyncio
import logging
import math
import os
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from vllm._sim.metrics import ServerMetrics
from vllm._sim.text import TextCodec, generated_ids, natural_length


class RequestError(ValueError):
    """A request vLLM would answer with 400."""


class EngineDeadError(Exception):
    """vLLM's EngineDeadError (vllm/v1/engine/exceptions.py): the engine core is gone; unrecoverable."""

    def __init__(self) -> None:
        super().__init__("EngineCore encountered an issue. See stack trace (above) for the root cause.")


@dataclass(frozen=True)
class Timing:
    """How fast the simulated NPUs "compute"; environment variables so lab profiles can tune them."""

    itl_seconds: float
    prefill_seconds_per_token: float

    @classmethod
    def from_env(cls) -> "Timing":
        return cls(
            itl_seconds=float(os.environ.get("VLLM_SIM_ITL_SECONDS", "0.02")),
            prefill_seconds_per_token=float(os.environ.get("VLLM_SIM_PREFILL_SECONDS_PER_TOKEN", "0.0002")),
        )


@dataclass(frozen=True)
class Capacity:
    kv_cache_tokens: int
    max_num_seqs: int
    block_size: int
    max_model_len: int


class Scheduler:
    """Runs a request once max_num_seqs and the KV cache have room for its whole length; others wait."""

    def __init__(self, capacity: Capacity, metrics: ServerMetrics):
        self.capacity = capacity
        self.metrics = metrics
        self.running = 0
        self.waiting = 0
        self.reserved_tokens = 0
        self.dead = False
        self._changed = asyncio.Condition()

    async def wake_all(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def _blocks(self, tokens: int) -> int:
        """Tokens rounded up to whole KV blocks, as the block allocator hands them out."""
        return math.ceil(tokens / self.capacity.block_size) * self.capacity.block_size

    def _fits(self, tokens: int) -> bool:
        return (
            self.running < self.capacity.max_num_seqs and self.reserved_tokens + tokens <= self.capacity.kv_cache_tokens
        )

    def _publish(self) -> None:
        self.metrics.running.set(self.running)
        self.metrics.waiting.set(self.waiting)
        self.metrics.kv_cache_usage.set(self.reserved_tokens / self.capacity.kv_cache_tokens)

    @asynccontextmanager
    async def slot(self, tokens: int):
        need = self._blocks(tokens)
        async with self._changed:
            self.waiting += 1
            self._publish()
            try:
                await self._changed.wait_for(lambda: self.dead or self._fits(need))
            finally:
                self.waiting -= 1
            if self.dead:
                self._publish()
                raise EngineDeadError()
            self.running += 1
            self.reserved_tokens += need
            self._publish()
        try:
            yield
        finally:
            async with self._changed:
                self.running -= 1
                self.reserved_tokens -= need
                self._publish()
                self._changed.notify_all()


@dataclass(frozen=True)
class TokenEvent:
    text: str
    finish_reason: str | None


class Engine:
    """Turns a tokenized prompt into a paced stream of deterministic tokens and records vLLM's metrics."""

    def __init__(self, codec: TextCodec, capacity: Capacity, timing: Timing, metrics: ServerMetrics):
        self.codec = codec
        self.capacity = capacity
        self.timing = timing
        self.metrics = metrics
        self.scheduler = Scheduler(capacity, metrics)
        self.vocabulary = codec.generation_vocabulary()
        self.peer_lost: str | None = None  # a DP peer whose connection closed: the next collective fails
        self.on_dead: Callable[[], None] | None = None

    @property
    def dead(self) -> bool:
        return self.scheduler.dead

    def lose_peer(self, reason: str) -> None:
        """A remote DP engine left. Real vLLM has no heartbeat: its engines notice at their next
        collective, which runs only while requests are in flight (DPEngineCoreProc.run_busy_loop)."""
        self.peer_lost = reason
        if self.scheduler.running or self.scheduler.waiting:
            self.die()

    def check_alive(self) -> None:
        """At each request: an engine whose DP peer left fails its first collective now."""
        if self.peer_lost and not self.dead:
            self.die()
        if self.dead:
            raise EngineDeadError()

    def die(self) -> None:
        """The engine core's fatal error and the API server's reaction to it (engine_dead, then exit)."""
        if self.dead:
            return
        self.scheduler.dead = True
        log = logging.getLogger("vllm")
        log.error("EngineCore encountered a fatal error.")
        log.error("(simulated) the data parallel group's collective failed: %s", self.peer_lost)
        log.error("Engine core proc EngineCore_DP0 died unexpectedly, shutting down client.")
        asyncio.ensure_future(self.scheduler.wake_all())
        if self.on_dead is not None:
            self.on_dead()

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

    async def generate(self, prompt_ids: list[int], max_tokens: int, ignore_eos: bool) -> AsyncIterator[TokenEvent]:
        """Yield the output token by token: prefill delay first, then one token per ITL."""
        arrival = time.monotonic()
        count, finish_reason = self.output_length(prompt_ids, max_tokens, ignore_eos)
        ids = generated_ids(prompt_ids, count, self.vocabulary)
        async with self.scheduler.slot(len(prompt_ids) + max_tokens):
            await asyncio.sleep(self.timing.prefill_seconds_per_token * len(prompt_ids) + self.timing.itl_seconds)
            self.metrics.prompt_tokens.inc(len(prompt_ids))
            self.metrics.ttft.observe(time.monotonic() - arrival)
            text, last = "", time.monotonic()
            for produced in range(1, count + 1):
                if self.dead:
                    raise EngineDeadError()
                if produced > 1:
                    await asyncio.sleep(self.timing.itl_seconds)
                    now = time.monotonic()
                    self.metrics.itl.observe(now - last)
                    last = now
                full = self.codec.decode(ids[:produced])  # whole-prefix decode keeps multi-byte characters intact
                self.metrics.generation_tokens.inc()
                yield TokenEvent(full[len(text) :], finish_reason if produced == count else None)
                text = full
            self.metrics.e2e.observe(time.monotonic() - arrival)
