"""What a better schedule does differently from the scheduler's: a few statistics of each Schedule, side by side.

They are read off the schedules' batches alone (no replay, so `better` spends nothing of its time limit on them):

- ``batches``: how many;
- ``requests_per_batch``: mean items per batch;
- ``prompt_tokens_beside_decodes``: mean prompt (and refill) tokens in the batches that also decode; every
  decoding request waits for them, so a schedule for the sum of latencies keeps them low while many requests run;
- ``evictions``: recompute evictions plus swaps out;
- ``length_order``: the rank correlation (Spearman) between a request's length ``I + O`` and the batch in which it
  finishes: 1 when requests finish shortest first, near 0 when the order ignores length (every request of an
  identical-length workload ties: 0).

Decision: an item is a decode when every token of the request but its last generated one is cached (``I + g − 1``
after ``g`` tokens), else prompt work (a prefill chunk, or a refill of ``I + g`` tokens after a recompute eviction),
as the replayer counts them; a cache hit starts the request on that many cached tokens, an eviction drops them, and
a swap leaves the count as it is.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from infermax.schedule import Schedule


@dataclass(frozen=True)
class ScheduleShape:
    batches: int
    requests_per_batch: float
    prompt_tokens_beside_decodes: float
    evictions: int
    length_order: float


def shape(schedule: Schedule) -> ScheduleShape:
    """The statistics of the module docstring for one schedule."""
    prompt = {r.id: r.prompt_tokens for r in schedule.requests}
    cached = dict.fromkeys(prompt, 0)
    generated = dict.fromkeys(prompt, 0)
    finish: dict[int, int] = {}
    items = evictions = 0
    beside, decoding_batches = 0, 0
    for j, batch in enumerate(schedule.batches):
        evictions += len(batch.evict) + len(batch.swap_out)
        for rid in batch.evict:
            cached[rid] = 0
        for rid, tokens in batch.cache_hits:
            cached[rid] = tokens
        prompt_tokens, decodes = 0, 0
        for rid, c in batch.items:
            g = generated[rid]
            if g and cached[rid] == prompt[rid] + g - 1:  # a decode: every token but the last one is cached
                decodes += 1
            else:  # a prefill or refill (after an eviction: the prompt and the tokens generated so far)
                prompt_tokens += c
            cached[rid] += c
            if cached[rid] >= prompt[rid] + g:
                generated[rid] = g + 1
            finish[rid] = j
        items += len(batch.items)
        if decodes:
            decoding_batches += 1
            beside += prompt_tokens
    n = len(schedule.batches)
    lengths = [r.prompt_tokens + r.output_tokens for r in schedule.requests if r.id in finish]
    ends = [finish[r.id] for r in schedule.requests if r.id in finish]
    return ScheduleShape(n, items / n if n else 0.0, beside / decoding_batches if decoding_batches else 0.0,
                         evictions, _spearman(lengths, ends))


# Seconds per batch item that `shape` takes: 225 ns measured on this project's 2-core machine (Sarathi's schedule of
# 4,096 × I = 512, O = 128: 524,288 items in 0.118 s), with a margin for slower machines.
SECONDS_PER_ITEM = 4e-7


def differences(base: Schedule, found: Schedule, seconds_left: float = float("inf")) -> dict[str, list[float]] | None:
    """``{statistic: [base's, found's]}``; None when reading both schedules (estimated from their items at
    `SECONDS_PER_ITEM`) would take more than ``seconds_left``, so that a command's time limit still holds."""
    items = sum(len(b.items) for b in base.batches) + sum(len(b.items) for b in found.batches)
    if items * SECONDS_PER_ITEM > seconds_left:
        return None
    a, b = asdict(shape(base)), asdict(shape(found))
    return {k: [a[k], b[k]] for k in a}


def compared(base: Schedule, found: Schedule, seconds_left: float, notes: dict) -> dict[str, list[float]] | None:
    """`differences`, or None with ``notes["differences_skipped"]`` saying why (`better` and `optimize`)."""
    out = differences(base, found, seconds_left)
    if out is None:
        notes["differences_skipped"] = "too little time left to compare the two schedules"
    return out


def _spearman(x: list[int], y: list[int]) -> float:
    """Spearman's rank correlation (SciPy's, ties at their mean rank); 0 when either side is constant."""
    if len(set(x)) < 2 or len(set(y)) < 2:
        return 0.0
    from scipy.stats import spearmanr  # imported on use: `better` reaches it only with a schedule to compare

    return float(spearmanr(x, y).statistic)
