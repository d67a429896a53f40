"""Performance model of one vLLM engine on Ascend NPUs: how long an engine step takes, and what a
load of requests meets (continuous batching, chunked prefill, queueing, preemption, prefix caching).

Standard library only: it is copied into the lab's simulated vLLM beside planner.py, whose engine
paces its tokens with it (scaled in time); the calibration test and `plan --predict` run it here as
a discrete-event simulation. The model, its sources and its calibration: docs/sim-performance.md.

One step (vLLM V1: one forward pass over every token the scheduler picked), per NPU of the TP group:

    memory       (dense weights + routed experts the step's tokens touch + KV and state read)
                 / (HBM bandwidth x Efficiency.hbm)
    compute      2 x active parameters per NPU x tokens / (peak x Efficiency.compute)
    collectives  per TP all-reduce (2 a layer) and EP all-to-all (2 a MoE layer):
                 latency x rounds (a message over HCCL_BUFFSIZE goes in several) + bytes / links
    compute      also attention's FLOPs: 4 x heads x head_dim per token per context token it attends to,
                 on each full-attention layer (QK^T and PV; a prefill chunk attends to half itself)
    launches     layers x (Efficiency.layer_seconds of the graph mode + sequences x
                 Efficiency.sequence_layer_seconds): what the published A2 runs show beyond the above
    step         max(memory, compute) + collectives + launches + Efficiency.step_overhead_seconds
    speculative  with an MTP draft of k tokens accepted at rate a: a decoding sequence verifies k + 1
                 tokens and the draft runs k one-layer passes; the step yields 1 + k x a tokens, so
                 it is counted as that many steps' worth of one token (its time divided by 1 + k x a)

ASSUMED (Efficiency()) holds the assumed constants with no fixed costs; CALIBRATED, which every caller uses
(plan --predict-concurrency, tune, the bench gate, the lab's simulated timing), is what perf_fit.py fits
on the fitting half of the published A2 runs (perf_runs.yaml), starting from ASSUMED.
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
from collections import OrderedDict, deque
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field

from . import planner  # beside this file in ascend_fleet and in the simulated vLLM


@dataclass(frozen=True)
class Efficiency:
    """Shares of the chip's peaks a serving step reaches, and its fixed costs (docs/sim-performance.md
    says how each was chosen). The defaults are the assumptions perf_fit starts from."""

    # assumed: once fitted to the handbook's 72B run (issue 48 discredits it); the published runs cannot
    # tell it from the per-layer cost (perf_fit's docstring)
    hbm: float = 0.9
    compute: float = 0.75  # assumed; perf_fit fits it to the fitting half's TTFTs
    collective_latency_seconds: float = 15e-6  # assumed
    step_overhead_seconds: float = 0.001  # assumed
    # fixed cost of one layer in one step, by graph mode (GRAPH_MODES), and per running sequence
    layer_seconds_full_decode: float = 0.0
    layer_seconds_piecewise: float = 0.0
    layer_seconds_eager: float | None = 0.0  # None: no eager run fitted it, eager is not predicted
    sequence_layer_seconds: float = 0.0

    def layer_seconds(self, graph_mode: str) -> float:
        if graph_mode == "eager" and self.layer_seconds_eager is None:
            raise ValueError("eager mode's per-layer cost is unknown: no eager run was fitted")
        return {"full_decode_only": self.layer_seconds_full_decode, "piecewise": self.layer_seconds_piecewise,
                "eager": self.layer_seconds_eager}[graph_mode]


ASSUMED = Efficiency()  # where perf_fit's fit starts
# perf_fit.fit on the fitting half (`python -m ascend_fleet.sizing.perf_fit` prints it and every run's ratios),
# rounded to three figures; tests/unit/test_perfmodel_runs.py holds the two equal
CALIBRATED = Efficiency(compute=0.255, layer_seconds_full_decode=0.371e-3, layer_seconds_piecewise=0.620e-3,
                        layer_seconds_eager=0.734e-3, sequence_layer_seconds=5.17e-6)
# CALIBRATED's predicted / published ratios on the held-out runs (perf_fit.held_out_ratios, to two places;
# the same test holds them): the error band `plan --predict-concurrency` prints
HELD_OUT_RATIOS = {  # in perf_runs.yaml's order
    "ttft_ms": (2.37, 2.70, 0.74),
    "tpot_ms": (0.99, 0.98, 1.03, 0.99, 0.98, 0.97, 0.96, 1.00, 1.00, 1.03, 1.42, 1.88),
    "output_throughput_tok_s": (1.02, 1.06, 0.97, 1.02, 1.02, 1.03, 0.91, 1.12, 0.95, 1.98, 1.39),
}
# vllm-ascend's graph modes (--compilation-config cudagraph_mode, --enforce-eager)
GRAPH_MODES = ("eager", "piecewise", "full_decode_only")


@dataclass(frozen=True)
class Batch:
    """What one engine step computes: (request, new tokens) pairs."""

    scheduled: tuple[tuple[Request, int], ...]

    @property
    def tokens(self) -> int:
        return sum(tokens for _, tokens in self.scheduled)

    @property
    def sequences(self) -> int:
        return len(self.scheduled)

    @property
    def context_tokens(self) -> int:
        """KV entries attention reads: each sequence's whole context after this step."""
        return sum(request.computed + tokens for request, tokens in self.scheduled)


@dataclass(frozen=True)
class StepCost:
    """The per-NPU figures of one instance that its step time depends on."""

    chip: planner.Chip
    tp: int
    ep: bool
    layers: int
    moe_layers: int
    hidden_size: int
    dense_weight_bytes: int  # read every step
    expert_weight_bytes: int  # routed experts, read as far as the step's tokens touch them
    expert_share_per_token: float  # experts_per_token / num_experts
    flops_per_token: float  # 2 x active parameters on this NPU
    kv_bytes_per_token: int
    state_bytes_per_sequence: int
    int8: bool
    hccl_buffsize_bytes: int
    efficiency: Efficiency = CALIBRATED
    attention_flops_per_context_token: float = 0.0  # per new token and context token it attends to, this NPU
    graph_mode: str = "piecewise"
    speculative_tokens: int = 0  # an MTP draft's num_speculative_tokens
    acceptance_rate: float = 0.0  # the share of drafted tokens accepted

    @classmethod
    def for_plan(cls, shape: planner.ModelShape, plan: planner.InstancePlan, chip: planner.Chip,
                 hccl_buffsize_mib: int = planner.DEFAULT_POLICY.hccl_buffsize_mib,
                 efficiency: Efficiency = CALIBRATED, graph_mode: str = "piecewise", speculative_tokens: int = 0,
                 acceptance_rate: float = 0.0) -> StepCost:
        params = shape.parameter_count()
        routed_only = planner.ParameterCount(0, 0, 0, 0, 0, 0, params.routed_experts, 0, 0)
        experts = planner.weight_bytes_per_npu(shape, plan.dtype, plan.quantization, tp=plan.tp, ep=plan.ep,
                                               dp=plan.dp, params=routed_only) if shape.moe else 0
        share = shape.moe.experts_per_token / shape.moe.num_experts if shape.moe else 0.0
        active = params.total - params.routed_experts * (1 - share)
        return cls(chip=chip, tp=plan.tp, ep=plan.ep, layers=shape.num_layers,
                   moe_layers=shape.moe.moe_layers if shape.moe else 0, hidden_size=shape.hidden_size,
                   dense_weight_bytes=plan.weight_bytes_per_npu - experts, expert_weight_bytes=experts,
                   expert_share_per_token=share, flops_per_token=2 * active / plan.tp,
                   kv_bytes_per_token=plan.kv_cache_bytes_per_token_per_npu,
                   state_bytes_per_sequence=plan.linear_state_bytes_per_sequence_per_npu,
                   int8=plan.quantization in ("w8a8",), hccl_buffsize_bytes=hccl_buffsize_mib * planner.MIB,
                   efficiency=efficiency,
                   attention_flops_per_context_token=4 * shape.full_attention_layers * shape.num_attention_heads
                   * shape.head_dim / plan.tp,
                   graph_mode=graph_mode, speculative_tokens=speculative_tokens, acceptance_rate=acceptance_rate)

    def seconds(self, batch: Batch) -> float:
        """Wall time of one engine step over `batch` (per token it yields, with a speculative draft)."""
        if not batch.tokens:
            return 0.0
        decoding = sum(1 for request, tokens in batch.scheduled if request.computed + tokens >= request.known_tokens)
        verified = decoding * self.speculative_tokens  # draft tokens each decoding sequence checks
        tokens = batch.tokens + verified
        attended = sum(tokens * (request.computed + tokens / 2) for request, tokens in batch.scheduled)
        attended += verified * batch.context_tokens / max(batch.sequences, 1)
        step = self.forward_seconds(tokens, batch.context_tokens, batch.sequences, attended, self.layers)
        if self.speculative_tokens and decoding:
            draft = self.forward_seconds(decoding, batch.context_tokens, decoding, 0.0, 1) * self.speculative_tokens
            return (step + draft) / (1 + self.speculative_tokens * self.acceptance_rate)
        return step

    def forward_seconds(self, tokens: int, context_tokens: int, sequences: int, attended: float, layers: int) -> float:
        """One forward pass of `layers` (the model's, or an MTP draft's one) over `tokens` new tokens of
        `sequences`, reading `context_tokens` of KV and computing attention over `attended` pairs."""
        share = layers / self.layers
        touched = 1 - (1 - self.expert_share_per_token) ** tokens  # expected share of experts hit
        read = share * (self.dense_weight_bytes + self.expert_weight_bytes * touched
                        + self.kv_bytes_per_token * context_tokens + self.state_bytes_per_sequence * sequences)
        memory = read / (self.chip.hbm_bytes_per_second * self.efficiency.hbm)
        peak = self.chip.fp16_flops * (2 if self.int8 else 1)
        flops = share * (self.flops_per_token * tokens + self.attention_flops_per_context_token * attended)
        compute = flops / (peak * self.efficiency.compute)
        launches = layers * (self.efficiency.layer_seconds(self.graph_mode)
                             + sequences * self.efficiency.sequence_layer_seconds)
        return (max(memory, compute) + share * self.collectives_seconds(tokens) + launches
                + self.efficiency.step_overhead_seconds)

    def collectives_seconds(self, tokens: int) -> float:
        """TP all-reduces (attention and MLP outputs) and EP all-to-alls (dispatch and combine) of one step."""
        count = (2 * self.layers if self.tp > 1 else 0) + (2 * self.moe_layers if self.ep else 0)
        if not count:
            return 0.0
        message = tokens * self.hidden_size * 2
        rounds = math.ceil(message / self.hccl_buffsize_bytes)
        peers = max(self.tp - 1, 1)  # a full HCCS mesh: one link to each peer
        transfer = 2 * message * peers / max(self.tp, 2) / (self.chip.link_bytes_per_second * peers)
        return count * (rounds * self.efficiency.collective_latency_seconds + transfer)


@dataclass(eq=False)
class Request:
    """One request as the scheduler sees it (vLLM's num_computed_tokens and output so far)."""

    prompt_tokens: int
    output_tokens: int
    arrival: float = 0.0
    computed: int = 0  # tokens whose KV is in the cache
    generated: int = 0
    preemptions: int = 0
    token_times: list[float] = field(default_factory=list)
    # vLLM's request.block_hashes: one per full block of its tokens (prompt, then output), each chained
    # from the one before; without them the prefix cache neither finds nor keeps its blocks
    block_hashes: tuple[Hashable, ...] = ()
    block_ids: list[int] = field(default_factory=list)  # its KV blocks, in token order
    cached_blocks: int = 0  # how many of them, from the first, are in the prefix cache (num_cached_block)

    @property
    def known_tokens(self) -> int:
        return self.prompt_tokens + self.generated

    @property
    def finished(self) -> bool:
        return self.generated >= self.output_tokens


@dataclass(frozen=True)
class SchedulerLimits:
    """The serving options that bound a step: --max-num-seqs, --max-num-batched-tokens, the KV cache,
    and whether it keeps a prefix cache (--enable-prefix-caching)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    kv_cache_tokens: int
    block_size: int = 128
    enable_prefix_caching: bool = False

    @property
    def blocks(self) -> int:
        return self.kv_cache_tokens // self.block_size


@dataclass
class PrefixCacheStats:
    """vLLM's PrefixCacheStats (v1/metrics/stats.py) as its Prometheus counters count them: prompt tokens
    looked up and tokens found cached, by requests never preempted."""

    queries: int = 0
    hits: int = 0


class Scheduler:
    """vLLM V1's scheduler loop (v1/core/sched/scheduler.py) over a block pool: running requests first,
    each its next tokens within the token budget; a request that cannot get blocks preempts the
    newest running one (its KV freed, recomputed later); waiting requests join while no preemption
    happened this step, max_num_seqs allows and their first chunk's blocks are free.

    With prefix caching, the pool is vLLM's BlockPool (v1/core/block_pool.py): a full block is cached
    under its hash as soon as it is allocated; a joining request starts from the longest chain of cached
    blocks its hashes find (their tokens are not computed again); freed blocks keep their KV in the
    free queue, in the order they were freed, until allocation takes them from its head."""

    def __init__(self, limits: SchedulerLimits):
        self.limits = limits
        self.free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(limits.blocks))  # head: reused first
        self.ref_counts = [0] * limits.blocks
        self.block_hash: dict[int, Hashable] = {}  # cached block -> its hash
        self.cached: dict[Hashable, dict[int, None]] = {}  # hash -> the blocks holding it (cached_block_hash_to_block)
        self.prefix_cache = PrefixCacheStats()
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.preemptions = 0

    @property
    def free_blocks(self) -> int:
        return len(self.free_queue)

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    def take_prefix_cache_stats(self) -> PrefixCacheStats:
        """The lookups since the last call (KVCacheManager.make_prefix_cache_stats), counting afresh."""
        stats, self.prefix_cache = self.prefix_cache, PrefixCacheStats()
        return stats

    def abort(self, request: Request) -> None:
        """Drop a request wherever it is (a client gone), freeing its blocks."""
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self._free(request)

    def _cache_hit(self, request: Request) -> list[int]:
        """KVCacheManager.get_computed_blocks: the cached blocks of the request's longest cached prefix,
        short of its last token, whose logits must be computed. vLLM counts every lookup, also one
        whose request then finds no free blocks and is looked up again next step."""
        if not self.limits.enable_prefix_caching:
            return []
        hit = []
        for block_hash in itertools.islice(request.block_hashes, (request.known_tokens - 1) // self.limits.block_size):
            holders = self.cached.get(block_hash)
            if not holders:
                break  # a chain: no later block can be cached either
            hit.append(next(iter(holders)))
        if not request.preemptions:  # a resumed request's lookups are counted apart, not exported
            self.prefix_cache.queries += request.known_tokens
            self.prefix_cache.hits += len(hit) * self.limits.block_size
        return hit

    def _allocate(self, request: Request, tokens: int, hit: Sequence[int] = ()) -> bool:
        """KVCacheManager.allocate_slots: blocks for the first `tokens` of the request's context, `hit`
        (cached blocks it starts from) taken first; a hit block idle in the free queue leaves it, so it
        counts against the free ones. Then its blocks full of known tokens join the prefix cache."""
        need = max(math.ceil(tokens / self.limits.block_size) - len(request.block_ids) - len(hit), 0)
        idle_hits = sum(1 for block in hit if not self.ref_counts[block]) if hit else 0
        if need + idle_hits > len(self.free_queue):
            return False
        for block in hit:  # BlockPool.touch
            if not self.ref_counts[block]:
                del self.free_queue[block]
            self.ref_counts[block] += 1
        request.block_ids.extend(hit)
        request.cached_blocks += len(hit)
        for _ in range(need):  # BlockPool.get_new_blocks: from the head, evicting what it cached
            block, _ = self.free_queue.popitem(last=False)
            self._evict(block)
            self.ref_counts[block] = 1
            request.block_ids.append(block)
        if self.limits.enable_prefix_caching:
            self._cache_full_blocks(request, min(tokens, request.known_tokens))
        return True

    def _cache_full_blocks(self, request: Request, tokens: int) -> None:
        """BlockPool.cache_full_blocks: each block the first `tokens` fill, under its hash."""
        full = min(tokens // self.limits.block_size, len(request.block_hashes))
        for index in range(request.cached_blocks, full):
            block, block_hash = request.block_ids[index], request.block_hashes[index]
            self.block_hash[block] = block_hash
            self.cached.setdefault(block_hash, {})[block] = None
        request.cached_blocks = max(request.cached_blocks, full)

    def _evict(self, block: int) -> None:
        """BlockPool._maybe_evict_cached_block: a block taken for new tokens loses what it cached."""
        block_hash = self.block_hash.pop(block, None)
        if block_hash is not None:
            holders = self.cached[block_hash]
            del holders[block]
            if not holders:
                del self.cached[block_hash]

    def _free(self, request: Request) -> None:
        """SingleTypeKVCacheManager.free: last block first, so a request's tail is evicted before the
        prefix it may share; a block no request holds goes to the free queue's tail (BlockPool.free_blocks)."""
        for block in reversed(request.block_ids):
            self.ref_counts[block] -= 1
            if not self.ref_counts[block]:
                self.free_queue[block] = None
        request.block_ids = []
        request.cached_blocks = 0

    def _preempt(self, request: Request) -> None:
        self._free(request)
        request.computed = 0
        request.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(request)

    def schedule(self) -> Batch:
        budget = self.limits.max_num_batched_tokens
        scheduled: list[tuple[Request, int]] = []
        preempted = False
        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            tokens = min(request.known_tokens - request.computed, budget)
            while not self._allocate(request, request.computed + tokens):
                victim = self.running.pop()
                self._preempt(victim)
                preempted = True
                if victim is request:
                    break
            else:
                scheduled.append((request, tokens))
                budget -= tokens
                index += 1
                continue
            break
        while not preempted and self.waiting and budget > 0 and len(self.running) < self.limits.max_num_seqs:
            request = self.waiting[0]
            hit = self._cache_hit(request)
            computed = len(hit) * self.limits.block_size
            tokens = min(request.known_tokens - computed, budget)
            if not self._allocate(request, computed + tokens, hit):
                break
            request.computed = computed  # the cached prefix is not prefilled again
            self.waiting.popleft()
            self.running.append(request)
            scheduled.append((request, tokens))
            budget -= tokens
        return Batch(tuple(scheduled))

    def complete(self, batch: Batch, now: float) -> list[Request]:
        """The step ended at `now`: requests whose context caught up sample a token; finished ones
        leave. Returns the requests that got a token."""
        sampled = []
        for request, tokens in batch.scheduled:
            if request not in self.running:
                continue  # aborted while the step ran
            request.computed += tokens
            if request.computed < request.known_tokens:
                continue  # a prefill chunk short of the prompt's end
            request.generated += 1
            request.token_times.append(now)
            sampled.append(request)
            if request.finished:
                self.running.remove(request)
                self._free(request)
        return sampled


@dataclass(frozen=True)
class LoadResult:
    """vllm bench serve's figures for a simulated run (milliseconds, tokens per second)."""

    completed: int
    duration_seconds: float
    output_throughput: float
    total_token_throughput: float
    mean_ttft_ms: float
    median_ttft_ms: float
    p99_ttft_ms: float
    mean_tpot_ms: float
    median_tpot_ms: float
    p99_tpot_ms: float
    p99_itl_ms: float
    preemptions: int


def percentile(values: Sequence[float], share: float) -> float:
    """numpy's default (linear) percentile, as vllm bench serve reports them."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * share
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def simulate(requests: Iterable[Request], limits: SchedulerLimits, cost: StepCost,
             max_concurrency: int | None = None) -> LoadResult:
    """Run the requests (arrival times set) through the scheduler in simulated time."""
    pending = deque(sorted(requests, key=lambda r: r.arrival))
    everyone = list(pending)
    scheduler = Scheduler(limits)
    now, in_flight = 0.0, 0
    while pending or not scheduler.idle:
        while pending and pending[0].arrival <= now and (max_concurrency is None or in_flight < max_concurrency):
            request = pending.popleft()
            request.arrival = now if max_concurrency else request.arrival  # a closed loop sends it now
            scheduler.add(request)
            in_flight += 1
        batch = scheduler.schedule()
        if not batch.scheduled:
            if not pending or pending[0].arrival <= now:
                raise ValueError(f"a request of {scheduler.waiting[0].known_tokens} tokens does not fit a KV cache "
                                 f"of {limits.kv_cache_tokens} tokens")
            now = pending[0].arrival  # idle until the next arrival
            continue
        now += cost.seconds(batch)
        in_flight -= sum(1 for request in scheduler.complete(batch, now) if request.finished)
    return summarize(everyone, scheduler.preemptions)


def summarize(requests: Sequence[Request], preemptions: int) -> LoadResult:
    ttft = [(r.token_times[0] - r.arrival) * 1000 for r in requests]
    tpot = [(r.token_times[-1] - r.token_times[0]) * 1000 / (r.output_tokens - 1) for r in requests
            if r.output_tokens > 1]
    itl = [(b - a) * 1000 for r in requests for a, b in zip(r.token_times, r.token_times[1:])]
    duration = max(r.token_times[-1] for r in requests) - min(r.arrival for r in requests)
    return LoadResult(
        completed=len(requests), duration_seconds=duration,
        output_throughput=sum(r.output_tokens for r in requests) / duration,
        total_token_throughput=sum(r.prompt_tokens + r.output_tokens for r in requests) / duration,
        mean_ttft_ms=statistics.fmean(ttft), median_ttft_ms=percentile(ttft, 0.5), p99_ttft_ms=percentile(ttft, 0.99),
        mean_tpot_ms=statistics.fmean(tpot) if tpot else 0.0, median_tpot_ms=percentile(tpot, 0.5) if tpot else 0.0,
        p99_tpot_ms=percentile(tpot, 0.99) if tpot else 0.0, p99_itl_ms=percentile(itl, 0.99) if itl else 0.0,
        preemptions=preemptions)


def poisson_arrivals(count: int, rate: float, seed: int = 0) -> list[float]:
    """Send times of `count` requests at `rate` per second (vllm bench serve: exponential gaps)."""
    rng = random.Random(seed)
    times, now = [], 0.0
    for _ in range(count):
        times.append(now)
        now += rng.expovariate(rate) if math.isfinite(rate) else 0.0
    return times


def fixed_load(count: int, prompt_tokens: int, output_tokens: int, rate: float = math.inf,
               seed: int = 0) -> list[Request]:
    """`count` requests of fixed lengths (vllm bench serve --dataset-name random --ignore-eos)."""
    return [Request(prompt_tokens, output_tokens, arrival=at) for at in poisson_arrivals(count, rate, seed)]


def predict(shape: planner.ModelShape, plan: planner.InstancePlan, chip: planner.Chip, concurrency: int,
            prompt_tokens: int, output_tokens: int, max_num_seqs: int, max_num_batched_tokens: int,
            hccl_buffsize_mib: int = planner.DEFAULT_POLICY.hccl_buffsize_mib, efficiency: Efficiency = CALIBRATED,
            graph_mode: str = "piecewise", speculative_tokens: int = 0, acceptance_rate: float = 0.0) -> LoadResult:
    """What the model predicts for `concurrency` clients each sending fixed-length requests back to
    back (vllm bench serve --max-concurrency C --request-rate inf): four rounds of them."""
    limits = SchedulerLimits(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                             kv_cache_tokens=plan.kv_cache_tokens * plan.dp)
    cost = StepCost.for_plan(shape, plan, chip, hccl_buffsize_mib, efficiency, graph_mode, speculative_tokens,
                             acceptance_rate)
    return simulate(fixed_load(4 * concurrency, prompt_tokens, output_tokens), limits, cost,
                    max_concurrency=concurrency)
