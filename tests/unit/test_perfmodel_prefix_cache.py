"""The performance model's prefix cache, as vLLM V1 keeps one (docs/sim-fidelity.md, "Prefix cache"):
full blocks cached under chained hashes, hits not prefilled again, the last token always computed,
freed blocks evicted least recently freed first, lookups counted as vLLM's Prometheus counters count them."""

from __future__ import annotations

import hashlib

from ascend_fleet.sizing.perfmodel import Request, Scheduler, SchedulerLimits


def chain(tokens: list[int], block_size: int) -> tuple[bytes, ...]:
    """One hash per full block, each over the one before it and its own tokens."""
    hashes, parent = [], b""
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = hashlib.sha256(parent + repr(tokens[start:start + block_size]).encode()).digest()
        hashes.append(parent)
    return tuple(hashes)


def request(tokens: list[int], output_tokens: int, block_size: int) -> Request:
    return Request(len(tokens), output_tokens, block_hashes=chain(tokens, block_size))


def run(scheduler: Scheduler, *requests: Request) -> list[int]:
    """Serve the requests to their end, one after another; the tokens each one's first step computed."""
    first_steps = []
    for one in requests:
        scheduler.add(one)
        steps = 0
        while not one.finished:
            batch = scheduler.schedule()
            if not steps:
                first_steps.append(dict((r, tokens) for r, tokens in batch.scheduled)[one])
            steps += 1
            scheduler.complete(batch, now=float(steps))
    return first_steps


def limits(blocks: int, block_size: int, caching: bool = True) -> SchedulerLimits:
    return SchedulerLimits(max_num_seqs=8, max_num_batched_tokens=8192, kv_cache_tokens=blocks * block_size,
                           block_size=block_size, enable_prefix_caching=caching)


def test_a_request_sharing_a_three_block_prefix_skips_their_prefill():
    system = list(range(1000, 1000 + 3 * 128))  # three full blocks
    first, second = request(system + [1] * 50, 4, 128), request(system + [2] * 70, 4, 128)
    scheduler = Scheduler(limits(64, 128))
    run(scheduler, first)
    scheduler.add(second)
    batch = scheduler.schedule()
    assert dict(batch.scheduled) == {second: 70}  # it prefills only what follows the prefix
    assert second.computed == 3 * 128 and batch.context_tokens == 454
    assert scheduler.free_blocks == 64 - 4  # the three it found left the free queue, as its new one did
    scheduler.complete(batch, now=1.0)
    stats = scheduler.take_prefix_cache_stats()
    assert (stats.queries, stats.hits) == (434 + 454, 3 * 128)
    assert scheduler.take_prefix_cache_stats().queries == 0  # taken: counting starts afresh


def test_a_fully_cached_prompt_still_computes_its_last_token():
    prompt = list(range(3 * 128))
    scheduler = Scheduler(limits(64, 128))
    # all three blocks cached, but the last token's logits are needed: the hit stops a block short
    # (max_cache_hit_length = num_tokens - 1) and its whole block is computed again
    assert run(scheduler, request(prompt, 2, 128), request(prompt, 2, 128)) == [384, 128]
    assert run(scheduler, request(prompt + [7], 2, 128)) == [1]  # one token past three cached blocks


def test_the_least_recently_freed_cached_blocks_are_evicted_first():
    scheduler = Scheduler(limits(4, 4))  # room for two 8-token prompts
    a, b, c = ([base + i for i in range(8)] for base in (100, 200, 300))
    run(scheduler, request(a, 1, 4), request(b, 1, 4))
    assert scheduler.free_blocks == 4  # both done: every block free, all four cached
    run(scheduler, request(c, 1, 4))  # needs two: takes a's, freed first
    assert run(scheduler, request(b, 1, 4), request(a, 1, 4)) == [4, 8]  # b's first block hits, a's prefix is gone


def test_blocks_still_held_by_a_request_are_shared_not_evicted():
    prompt = list(range(8))
    scheduler = Scheduler(limits(4, 4))
    holder, sharer = request(prompt + [1], 4, 4), request(prompt + [2], 4, 4)
    scheduler.add(holder)
    scheduler.complete(scheduler.schedule(), now=1.0)  # holder: three blocks of the four
    scheduler.add(sharer)  # its two prefix blocks are the holder's: its one new block fits
    batch = scheduler.schedule()
    assert dict(batch.scheduled) == {holder: 1, sharer: 1} and sharer.computed == 8
    assert scheduler.free_blocks == 0 and holder.block_ids[:2] == sharer.block_ids[:2]


def test_without_block_hashes_nothing_hits_but_each_lookup_counts():
    prompt = list(range(3 * 128 + 10))
    scheduler = Scheduler(limits(64, 128))
    assert run(scheduler, Request(len(prompt), 2), Request(len(prompt), 2)) == [394, 394]
    stats = scheduler.take_prefix_cache_stats()
    assert (stats.queries, stats.hits) == (2 * 394, 0)


def test_with_prefix_caching_off_nothing_is_looked_up_or_counted():
    prompt = list(range(3 * 128 + 10))
    scheduler = Scheduler(limits(64, 128, caching=False))
    assert run(scheduler, request(prompt, 2, 128), request(prompt, 2, 128)) == [394, 394]
    stats = scheduler.take_prefix_cache_stats()
    assert (stats.queries, stats.hits) == (0, 0)


def test_a_preempted_request_resumes_from_its_own_cached_blocks_and_is_not_counted_again():
    # two 8-token prompts fill four blocks of five; at their first sampled token both need a third:
    # the newer is preempted, and the older ends a token later, freeing its blocks
    scheduler = Scheduler(limits(5, 4))
    older, newer = request(list(range(100, 108)), 2, 4), request(list(range(200, 208)), 8, 4)
    scheduler.add(older)
    scheduler.add(newer)
    resumed_with = None
    for step in range(1, 40):
        batch = scheduler.schedule()
        for one, tokens in batch.scheduled:
            if one is newer and newer.preemptions and resumed_with is None:
                resumed_with = (newer.computed, tokens)
        scheduler.complete(batch, now=float(step))
        if older.finished and newer.finished:
            break
    assert newer.preemptions == 1 and older.finished and newer.finished
    assert resumed_with == (8, 1)  # its two prompt blocks were still cached: only its sampled token again
    stats = scheduler.take_prefix_cache_stats()
    assert stats.queries == 16  # the two first lookups; the resumed one is vLLM's preempted_queries
