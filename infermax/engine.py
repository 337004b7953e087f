"""The event engine: Algorithm 1's batch loop over arriving requests.

A plain loop rather than SimPy: there is one server, arrivals are known in
advance and sorted, and a batch starts exactly when the previous one ends (or,
when idle, at the next arrival), so the only events are batch ends and
arrivals. `benchmarks/engine_loop.py` drives the identical loop body through a
SimPy process: it took 0.98-1.11x the plain loop's time (within noise on heavy
batches, +2 us/batch on tiny ones), so SimPy buys nothing here but a dependency.
"""

from __future__ import annotations

import gc
import math
import time
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from numbers import Real
from typing import Sequence

from .costmodel.base import CostModel
from .costmodel.swap import SwapCost
from .limits import Limits
from .metrics import SimResult
from .replay import Replayer, ScheduleViolation, check_clock_finite
from .request import Request
from .schedule import ScheduledBatch, batch_shape_problem
from .schedulers import NoProgressError, Scheduler, SchedulerError, make_scheduler


# Under a deadline the clock is looked at on every loop iteration from this one on (a look costs ~60 ns, against
# 15-70 µs of a batch's bookkeeping), and from the first on runs of more than `LARGE_RUN_REQUESTS` requests. A small
# run's first iterations go unwatched so that the schedule search's first candidate finishes under any time limit
# (`solvers/search.py`); a large run's batches can take milliseconds each (vLLM on 1,000,000 requests: 255 batches
# in 1.5 s), which overran a 1 s limit by seconds when the clock was looked at every 256 iterations only.
DEADLINE_CHECK_EVERY = 256
LARGE_RUN_REQUESTS = 65_536


# Loop iterations between two collections of the young generations while the automatic collector is off
# (`_young_collections_only`).
GC_YOUNG_EVERY = 1024


@contextmanager
def _young_collections_only():
    """The batch loop with Python's automatic garbage collection off (on again afterwards, as it was), the loop
    collecting the two young generations itself every `GC_YOUNG_EVERY` iterations.

    Why: a simulation keeps every batch it plans (the Schedule), so the heap grows by a few objects per batch,
    and the automatic collector examines each object about six times (two young collections, then the full
    collections its growth triggers), which cost Sarathi about 5 µs and BROS about 13 µs of each batch's
    20-80 µs (whole long-prompt and azure-conv runs, with and without the collector, 2026-11-28). Collecting
    the young generations examines each object about once and still frees the reference cycles a batch
    leaves behind; cycles that reach the old generation wait for the next full collection after the run.
    Garbage collection changes no result."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class SimulationTimeout(RuntimeError):
    """A simulation given a deadline (`simulate`'s ``deadline_s``) did not finish by it; nothing is returned."""


# Under a deadline, one fast-forward applies at most this many copies, and the clock is looked at whenever this many
# have been fast-forwarded since the last look (the loop's own looks start at `DEADLINE_CHECK_EVERY`): a single
# request decoding 10^7 tokens was one fast-forward of 10^7 batches, which ran for minutes past a 5 s time limit.
# (Stopping a fast-forward early changes nothing: the scheduler plans the same decode batch again.)
FAST_FORWARD_UNDER_DEADLINE = 1 << 16


def _timeout(scheduler, rp, now_s: float) -> SimulationTimeout:
    return SimulationTimeout(
        f"scheduler '{scheduler.name}' stopped at its deadline after {len(rp.batch_rows):,} batches, with "
        f"{rp.unfinished:,} of {len(rp.states):,} requests unfinished at t={now_s:.6g}s")


def check_requests(requests: Sequence[Request]) -> None:
    """A workload must hold at least one request, each a `Request` (a list of tuples ended in an AttributeError deep
    in the engine or the solvers)."""
    if not requests:
        raise ValueError("the workload has no requests")
    not_requests = [r for r in requests if not isinstance(r, Request)]
    if not_requests:
        raise TypeError(f"requests must be infermax.request.Request objects, got {type(not_requests[0]).__name__} "
                        f"{not_requests[0]!r:.80} (infermax.workload builds them: fixed, sampled, load_trace)")


def check_fits(requests: Sequence[Request], limits: Limits) -> None:
    """Every request must fit ``M`` at its last step (``I + O − 1`` KV tokens) under any schedule (of a workload
    `check_requests` accepted)."""
    for r in requests:
        need = limits.blocks(r.peak_kv_tokens)
        if need > limits.M:
            raise ValueError(
                f"request {r.id} (I={r.prompt_tokens}, O={r.output_tokens}) needs {need} KV tokens when it generates "
                f"its last token, more than M={limits.M}: no schedule can finish it")


def simulate(
    requests: Sequence[Request],
    scheduler: str | Scheduler = "vllm",
    limits: Limits | None = None,
    cost_model: CostModel | None = None,
    progress: bool = False,
    meta: dict | None = None,
    fast_forward: bool = True,
    swap_cost: SwapCost | None = None,
    closed_loop_until_s: float | None = None,
    deadline_s: float | None = None,
) -> SimResult:
    """Run ``requests`` through ``scheduler``; every batch is validated and timed by the replayer.

    With ``fast_forward`` (and a scheduler whose ``repeats_full_decode`` promises it), runs of identical
    decode-only batches are applied without re-planning them (``Replayer.repeat_full_decode``); the
    result is identical to stepping batch by batch (``fast_forward=False``), which the tests check.
    ``swap_cost`` times KV swaps (needed only by schedulers that swap); it is recorded in the result's
    ``meta["swap_cost"]`` so that a replay of the schedule times the swaps identically.
    Requests with a ``closed_loop_group`` are submitted group by group (`ClosedLoop`); a group whose
    release time would exceed ``closed_loop_until_s`` is never submitted and is not in the result
    (``meta["unreleased_requests"]`` counts them).
    ``deadline_s`` (a `time.perf_counter` time): past it the run stops with `SimulationTimeout` (looked at on every
    loop iteration from the `DEADLINE_CHECK_EVERY`-th, or from the first on large runs), so that a command's time
    limit also covers the simulations it runs.
    """
    _check_run_options(swap_cost, closed_loop_until_s, deadline_s)
    scheduler, limits, cost_model = _checked_setup(requests, scheduler, limits, cost_model)
    scheduler.swap_cost = swap_cost
    scheduler.longest_prompt_tokens = max(r.prompt_tokens for r in requests)
    scheduler.expect(requests)
    loop = ClosedLoop(requests, closed_loop_until_s)
    rp = _replayer_for(scheduler, loop.open_requests, limits, cost_model, swap_cost)
    arrivals = sorted(rp.states.values(), key=_arrival_order)
    next_arrival = 0
    now = arrivals[0].req.arrival_s
    waited_until: float | None = None
    total_tokens = sum(r.prompt_tokens + r.output_tokens for r in requests)
    batches_without_token = 0
    steps = copied = 0  # loop iterations; batches fast-forwarded since the clock was last looked at
    first_look = 1 if len(requests) > LARGE_RUN_REQUESTS else DEADLINE_CHECK_EVERY  # (under a deadline)
    bar = _Tracker(sum(r.output_tokens for r in requests)) if progress else nullcontext(None)
    with bar as tracker, _young_collections_only():
        while rp.unfinished:
            steps += 1
            if not steps % GC_YOUNG_EVERY:
                gc.collect(1)
            if deadline_s is not None and steps >= first_look and time.perf_counter() > deadline_s:
                raise _timeout(scheduler, rp, now)
            first = next_arrival
            while next_arrival < len(arrivals) and arrivals[next_arrival].req.arrival_s <= now:
                next_arrival += 1
            if next_arrival > first:
                scheduler.add_arrivals(arrivals[first:next_arrival])
            batch = scheduler.next_batch(now)
            if type(batch) is not ScheduledBatch and not isinstance(batch, ScheduledBatch):
                raise SchedulerError(f"scheduler '{scheduler.name}': {batch_shape_problem(batch)}")
            if not batch.items and (batch.evict or batch.swap_out or batch.swap_in):
                # an idle step applies nothing: evictions or swaps planned with it would be silently lost
                raise SchedulerError(f"scheduler '{scheduler.name}' planned evictions or swaps with an empty batch "
                                     f"at t={now:.6g}s; they need a batch to run with")
            if not batch.items:
                if next_arrival < len(arrivals):
                    now = waited_until = arrivals[next_arrival].req.arrival_s
                    continue
                raise NoProgressError(
                    f"scheduler '{scheduler.name}' planned an empty batch at t={now:.6g}s with {rp.unfinished} "
                    f"request(s) unfinished and no arrivals left ({scheduler.describe_state()})")
            batch.not_before_s = waited_until
            waited_until = None
            try:
                finished = rp.apply(batch)
            except ScheduleViolation as exc:
                raise SchedulerError(f"scheduler '{scheduler.name}' planned an invalid batch: {exc}") from exc
            except (TypeError, ValueError) as exc:  # a malformed batch (a custom scheduler's), or another error
                problem = batch_shape_problem(batch)
                if problem is None:
                    raise
                raise SchedulerError(f"scheduler '{scheduler.name}' planned a malformed batch: {problem}") from exc
            scheduler.batch_done(batch, finished)
            released = [rp.add_request(r) for r in loop.finished(finished, rp.clock_s)]
            if released:
                arrivals[next_arrival:] = sorted(arrivals[next_arrival:] + released, key=_arrival_order)
            generated = rp.last_generated
            if fast_forward and rp.last_full_decode and scheduler.repeats_full_decode(batch):
                stop = arrivals[next_arrival].req.arrival_s if next_arrival < len(arrivals) else None
                copies = rp.repeat_full_decode(
                    batch, stop, None if deadline_s is None else FAST_FORWARD_UNDER_DEADLINE)
                if copies:
                    scheduler.repeated_full_decode(batch, copies)
                    copied += copies
                    if deadline_s is not None and copied >= FAST_FORWARD_UNDER_DEADLINE:
                        copied = 0
                        if time.perf_counter() > deadline_s:
                            raise _timeout(scheduler, rp, rp.clock_s)
                generated += generated * copies
            now = rp.clock_s
            if not now < math.inf:  # (a comparison per loop iteration; fast-forwarded copies only add to it)
                check_clock_finite(rp)
            batches_without_token = 0 if generated else batches_without_token + 1
            if batches_without_token > total_tokens:
                raise NoProgressError(
                    f"scheduler '{scheduler.name}' ran {batches_without_token} batches in a row without generating a "
                    f"token (more than the workload's {total_tokens} tokens): it is livelocked ({scheduler.describe_state()})")
            if tracker is not None and (generated or not rp.unfinished):
                tracker.advance(generated)
    run_meta = {"scheduler": scheduler.name, "cost_model": getattr(cost_model, "name", type(cost_model).__name__),
                **({"swap_cost": swap_cost.to_dict()} if swap_cost is not None else {}), **(meta or {})}
    if loop.groups:
        run_meta.update(closed_loop_until_s=closed_loop_until_s, unreleased_requests=loop.unreleased)
    result = SimResult.from_replayer(rp, meta=run_meta)  # (brings lazily advanced requests up to date)
    extra = scheduler.run_summary(result)
    if extra:
        result.meta["scheduler_summary"] = extra
    return result


def _checked_setup(requests: Sequence[Request], scheduler: str | Scheduler, limits: Limits | None,
                   cost_model: CostModel | None) -> tuple[Scheduler, Limits, CostModel]:
    """The scheduler (built from its name with the limits it implies), limits and cost model of a run, after the
    checks that refuse it before anything is simulated: no requests, a request that no schedule can finish in
    ``M``, a run whose tables would not fit this machine's memory, prefix caching for a scheduler without it."""
    check_requests(requests)
    _check_arguments(scheduler, limits, cost_model)
    if cost_model is None:
        from .costmodel import load_cost_model

        cost_model = load_cost_model()
    limits = limits or Limits()
    if isinstance(scheduler, str):
        scheduler, limits = make_scheduler(scheduler, limits, cost_model)
    check_fits(requests, limits)
    from .workload import check_fits_in_memory

    check_fits_in_memory(len(requests), "", batches=max(r.output_tokens for r in requests))
    if limits.prefix_caching and not scheduler.supports_prefix_caching:
        raise ValueError(f"scheduler '{scheduler.name}' does not support prefix caching; schedulers that do: "
                         f"{', '.join(caching_schedulers()) or 'none'}")
    return scheduler, limits, cost_model


def _check_arguments(scheduler, limits, cost_model) -> None:
    """The types of `simulate`'s scheduler, limits and cost model (a notebook's ``simulate(reqs, "vllm", {"C": 512})``
    or ``cost_model="linear"`` ended in an AttributeError from inside the engine)."""
    if not isinstance(scheduler, str) and not hasattr(scheduler, "next_batch"):
        raise TypeError(f"scheduler must be a registered scheduler's name (see `infermax schedulers`) or a Scheduler, "
                        f"got {type(scheduler).__name__} {scheduler!r:.60}")
    if limits is not None and not isinstance(limits, Limits):
        raise TypeError(f"limits must be an infermax.limits.Limits (e.g. Limits(C=512, M=100_000)), got "
                        f"{type(limits).__name__} {limits!r:.60}")
    if cost_model is not None and not hasattr(cost_model, "batch_time_s"):
        raise TypeError(f"cost_model must be a cost model (infermax.costmodel.load_cost_model builds one, e.g. "
                        f"load_cost_model(kind='linear')), got {type(cost_model).__name__} {cost_model!r:.60}")


def _check_run_options(swap_cost, closed_loop_until_s, deadline_s) -> None:
    """`simulate`'s optional run arguments: a swap cost model, and times in seconds (``swap_cost="a100"`` had ended in
    an AttributeError at the end of the run; a deadline given as text was never looked at on a small run)."""
    if swap_cost is not None and not isinstance(swap_cost, SwapCost):
        raise TypeError(f"swap_cost must be an infermax.costmodel.swap.SwapCost (SwapCost.for_system(gpu, model) builds "
                        f"one) or None, got {type(swap_cost).__name__} {swap_cost!r:.60}")
    for name, value in (("closed_loop_until_s", closed_loop_until_s), ("deadline_s", deadline_s)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, Real) or value != value):
            raise TypeError(f"{name} must be a number of seconds or None, got {type(value).__name__} {value!r:.60}")


def _replayer_for(scheduler: Scheduler, requests: Sequence[Request], limits: Limits, cost_model: CostModel,
                  swap_cost: SwapCost | None) -> Replayer:
    """The replayer that validates and times the run's batches, with the scheduler given what it may read from it:
    the prefix cache, and for a scheduler that lets decoders advance lazily, the hooks that bring them up to date."""
    rp = Replayer(requests, limits, cost_model, swap_cost, lazy_decoders=scheduler.lazy_decode_ok)
    scheduler.prefix_cache = rp.prefix_cache
    if rp.lazy_decoders:
        scheduler.cached_tokens, scheduler.sync_states = rp.cached_tokens, rp.sync
        scheduler.cohort_block_openers = rp.cohort_block_openers
    return rp


def caching_schedulers() -> list[str]:
    """Names of the registered schedulers that support prefix caching."""
    from .schedulers import available, get_spec

    return [name for name in available() if get_spec(name).supports_prefix_caching]


def _arrival_order(s):
    return (s.req.arrival_s, s.id)


class ClosedLoop:
    """Closed-loop submission of requests with a ``closed_loop_group``: the lowest group is open; each
    later group is released when every request of the previous group has finished, arriving at
    ``max(arrival_s, that time)``, unless that time exceeds ``until_s`` (then no later group is)."""

    def __init__(self, requests: Sequence[Request], until_s: float | None = None):
        by_group: dict[int, list[Request]] = {}
        self.open_requests = []
        for r in requests:
            if r.closed_loop_group is None:
                self.open_requests.append(r)
            else:
                by_group.setdefault(r.closed_loop_group, []).append(r)
        self.groups = [by_group[g] for g in sorted(by_group)]
        self.until_s = until_s
        self.unreleased = sum(len(g) for g in self.groups[1:])
        self._next = 1  # index of the next group to release
        self._left = {r.id for r in self.groups[0]} if self.groups else set()
        if self.groups:
            self.open_requests += self.groups[0]

    def finished(self, finished, now_s: float) -> list[Request]:
        """Requests released because ``finished`` (states) completed the current group at ``now_s``."""
        if not self._left:
            return []
        self._left.difference_update(s.id for s in finished)
        if self._left or self._next >= len(self.groups):
            return []
        if self.until_s is not None and now_s > self.until_s:
            self._next = len(self.groups)
            return []
        group = [replace(r, arrival_s=max(r.arrival_s, now_s)) for r in self.groups[self._next]]
        self._next += 1
        self.unreleased -= len(group)
        self._left = {r.id for r in group}
        return group


class _Tracker:
    """Throttled rich progress bar over generated tokens."""

    def __init__(self, total_tokens: int):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(TextColumn("simulating"), BarColumn(), MofNCompleteColumn(), TextColumn("tokens"),
                                 TimeElapsedColumn(), transient=True)
        self.task = self.progress.add_task("simulate", total=total_tokens)
        self.pending = 0

    def advance(self, n: int) -> None:
        self.pending += n
        if self.pending >= 2048:
            self.flush()

    def flush(self) -> None:
        self.progress.update(self.task, advance=self.pending)
        self.pending = 0

    def __enter__(self):
        self.progress.start()
        return self

    def __exit__(self, *exc):
        self.flush()
        self.progress.stop()
