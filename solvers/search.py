"""Search for better schedules at scale: a portfolio of simulated schedulers, then local search.

The exact MILP (`solvers/optimize.py`) proves optimality for a handful of requests; at B = 1,000+ this
module looks for schedules that are as good as possible and says how it found them. Every candidate
is a `Scheduler` run through `infermax.engine.simulate`, so every batch is validated by the replayer;
the best schedule is replayed once more under the caller's limits and its objective recomputed (a
mismatch above 1e-9 relative raises: no unreplayed number is ever reported).

Order of evaluation (cheap and promising first; docs/design.md, "Schedule search"):

1. the usual winners among the registered Algorithm-1 schedulers (their ``-ef`` variants are also
   the cheapest to simulate), skipping those whose policy cannot satisfy the forced `Policies`;
2. clairvoyant schedulers (`solvers/search_policies.py`): the latest-start plan with a few start
   spacings and orders, forward profile-checked admission with a few rankings (both eviction-free),
   for the sum of latencies of mixed lengths shortest-first waves (forward admission with ``Rmax`` =
   B/2, B/4, B/8, and with a cap on the running requests' I + O), and, when the objective weighs TTFT,
   first-token-first (prefills every request's prompt as early as the limits allow, evicting) at a few
   prefill budgets; for the sum of latencies of mixed lengths, before these, Algorithm 1's ranking group
   ordered by each request's own work (`WorkRankedScheduler`, eviction-free, a few ``Rmax``);
3. the other registered Algorithm-1 schedulers, then points of the template's space: Sarathi P=C with other ``P``, admission caps ``Rmax``
   around the number of requests whose peaks fit ``M``, ranking keys with and without eviction; then
   vLLM-ef and vLLM with ``P`` at each of the cost model's token-count steps (`_step_aligned`);
4. local search while time remains: hill-climbing from the best candidate, then from the best of
   every other family (neighbouring parameters, random perturbations of a plan's placement order).

A candidate that prefills every prompt in one batch (no chunked prefill) is not started when a prompt exceeds its
``min(C, P)``: it could not serve that request (`_cannot_run`, counted in ``SearchResult.cannot_run``).
A candidate that differs from a simulated one only in an ``Rmax`` cap that run never reached is recorded with that
run's value instead of being simulated again (`_same_run`).

The time limit covers the whole call: the first candidate always runs; afterwards a candidate
starts only if its estimated time (the slowest evaluation seen of its family, else of any family)
fits in what is left after reserving the final replay.
"""

from __future__ import annotations

import functools
import math
import random
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

from infermax.costmodel.base import BatchFeatures
from infermax.engine import simulate
from infermax.limits import Limits
from infermax.replay import BATCH_COLUMNS, replay
from infermax.request import Request
from infermax.schedule import Schedule
from infermax.schedulers import Algorithm1Policy, Algorithm1Scheduler, available, get_spec, make_scheduler

from .objective import Objective
from .policy import Policies, policy_violations
from .search_policies import (ClairvoyantScheduler, FirstTokenScheduler, PlannedScheduler, PrefillFirstScheduler,
                              WorkRankedScheduler, chunked_prefill_plan, latest_start_plan, marginal_work_s,
                              prefill_partition)

REPLAY_RTOL = 1e-9


@dataclass
class SearchResult:
    schedule: Schedule | None  # best found, replay-validated under the caller's limits
    value_s: float  # its objective (Objective.value of the replayed result); inf if none
    method: str  # which candidate produced it
    candidates: list[dict]  # every evaluated candidate: name, family, params, value_s or error, elapsed_s
    evaluations: int
    elapsed_s: float
    skipped: int = 0  # candidates not started because the time left could not cover them
    cannot_run: int = 0  # candidates not started because they cannot prefill the longest prompt (`_cannot_run`)

    def report(self) -> dict:
        """What `better` and `optimize` show of the search beside their answer."""
        return {"search_evaluations": self.evaluations, "search_wall_s": self.elapsed_s,
                **({"search_cannot_run": self.cannot_run} if self.cannot_run else {})}

    def to_dict(self) -> dict:
        return {"value_s": self.value_s, "method": self.method, "candidates": self.candidates,
                "evaluations": self.evaluations, "elapsed_s": self.elapsed_s, "skipped": self.skipped,
                "cannot_run": self.cannot_run}


@dataclass
class Candidate:
    name: str
    family: str  # registered | template | plan | clairvoyant | first-token | work-ranked | ...
    params: dict
    build: Callable[[], tuple]  # -> (scheduler instance or registered name, limits to simulate with)
    registered: bool = False
    order_ids: list[int] | None = None  # a plan's explicit placement order (kept out of params: large)
    work_s: dict[int, float] | None = None  # a work-ranked candidate's per-request works (for its neighbours)
    # For a candidate that prefills every prompt in one batch (no chunking): the most prompt tokens it can prefill,
    # min(C, P) of its limits; None for one that chunks
    whole_prompt_cap: int | None = None


@dataclass
class _State:
    requests: Sequence[Request]
    limits: Limits
    cost_model: object
    objective: Objective
    policies: Policies
    deadline: float
    progress: Callable[[str], None] | None
    records: list[dict] = field(default_factory=list)
    family_s: dict[str, float] = field(default_factory=dict)
    best: tuple | None = None  # (value, candidate, result)
    seen: set = field(default_factory=set)
    skipped: int = 0
    values: list = field(default_factory=list)  # (value, candidate) of every successful evaluation
    longest: Request | None = None  # the request with the longest prompt (`_cannot_run`)
    cannot_run: int = 0
    # per `_rmax_free_key`: (effective Rmax, KV holders' peak, value, name) of each run simulated (`_same_run`)
    peaks: dict = field(default_factory=dict)


def search_within(requests, limits, cost_model, objective: Objective, time_limit_s: float, policies: Policies,
                  progress: Callable[[str], None] | None = None) -> "SearchResult | None":
    """`search` for a caller under a deadline: None when no time is left (the bound may have used it all), or, on a
    large run, too little to set up one simulation of ``requests`` (`scale.simulation_setup_refusal`)."""
    from .scale import simulation_setup_refusal

    if time_limit_s <= 0 or simulation_setup_refusal(len(requests), time_limit_s):
        return None
    return search(requests, limits, cost_model, objective, time_limit_s=time_limit_s, policies=policies,
                  progress=progress)


def search(requests, limits, cost_model, objective: Objective, *, time_limit_s: float,
           policies: Policies = Policies(), progress: Callable[[str], None] | None = None,
           seed: int = 0) -> SearchResult:
    """The best schedule found for ``objective`` within ``time_limit_s`` (module docstring); replay-validated."""
    if not requests:
        raise ValueError("the workload has no requests")
    if not time_limit_s > 0:
        raise ValueError(f"time_limit_s must be > 0, got {time_limit_s!r}")
    t_start = time.perf_counter()
    limits = limits or Limits()
    st = _State(requests, limits, cost_model, objective, policies, t_start + time_limit_s, progress,
                longest=max(requests, key=lambda r: (r.prompt_tokens, -r.id)))
    rng = random.Random(seed)
    candidates = (_portfolio(requests, limits, objective, policies, cost_model)
                  + _step_aligned(limits, policies, cost_model)
                  + _prefill_first(requests, limits, objective, cost_model, policies))
    for cand in candidates:
        _evaluate(st, cand)
    _local_search(st, rng)
    left = st.deadline - time.perf_counter()
    if left >= 1.0 and not st.skipped:  # say why a search under a long time limit came back early
        _log(st, f"search done in {time.perf_counter() - t_start:.1f} s, {left:.0f} s before its time limit: every "
                 f"candidate and every neighbour of the local search was tried")
    return _finish(st, t_start)


# --- candidates -----------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _algorithm1_policy(name: str) -> Algorithm1Policy | None:
    """The `Algorithm1Policy` of a registered scheduler, None for any other kind of scheduler."""
    try:
        sched = get_spec(name).factory(Limits(), None)
    except Exception:  # noqa: BLE001 — schedulers that need more to build are not Algorithm 1
        return None
    return sched.policy if isinstance(sched, Algorithm1Scheduler) else None


def _policy_allows(pol: Algorithm1Policy, policies: Policies) -> bool:
    """Whether every schedule of ``pol`` obeys ``policies`` (by construction, without simulating)."""
    if policies.eviction_free and not pol.eviction_free:
        return False
    if policies.no_hybrid and pol.hybrid:
        return False
    if policies.no_chunked_prefill and pol.chunked_prefill:
        return False
    return True


def whole_prompt_cap(name: str, limits: Limits) -> int | None:
    """The most prompt tokens registered Algorithm-1 scheduler ``name`` prefills in one batch, ``min(C, P)`` of the
    limits `simulate` gives it (its default P applied); None when it chunks prefills, is not an Algorithm-1 scheduler,
    or refuses the limits (refused again, and recorded, when it runs)."""
    if _algorithm1_policy(name) is None:
        return None
    try:
        sched, lim = make_scheduler(name, limits)
    except Exception:  # noqa: BLE001 — see the docstring
        return None
    return None if sched.policy.chunked_prefill else min(lim.C, lim.prefill_budget)


def _registered(name: str, limits: Limits) -> Candidate:
    return Candidate(name, "registered", {"scheduler": name}, lambda: (name, None), registered=True,
                     whole_prompt_cap=whole_prompt_cap(name, limits))


def _template(name: str, pol: Algorithm1Policy, limits: Limits, **overrides) -> Candidate:
    """An Algorithm-1 point with ``P``/``Rmax``/``C`` overrides (never looser than the caller's limits; ``C`` caps every
    batch's tokens, `cheap_batch_tokens`)."""
    lim = _token_capped(limits, overrides.get("C"))
    if "P" in overrides:
        lim = replace(lim, P=min(overrides["P"], lim.prefill_budget))
    elif lim.P is None and pol.default_P is not None:
        lim = replace(lim, P=min(pol.default_P, lim.C))
    if "Rmax" in overrides:
        lim = replace(lim, Rmax=overrides["Rmax"] if limits.Rmax is None else min(overrides["Rmax"], limits.Rmax))
    label = name + "".join(f" {k}={v}" for k, v in overrides.items())
    return Candidate(label, "template", {"policy": name, **overrides},
                     lambda: (Algorithm1Scheduler(lim, pol, name=label), lim),
                     whole_prompt_cap=None if pol.chunked_prefill else min(lim.C, lim.prefill_budget))


def _plan(requests, limits: Limits, hybrid: bool, order="long_peak", start_every: int = 1,
          prefill_cap: int | None = None, label_order: str | None = None) -> Candidate:
    shown = label_order or order
    label = f"latest-start plan order={shown} start_every={start_every}" + (
        f" prefill_cap={prefill_cap}" if prefill_cap is not None else "")

    def build():
        plan = latest_start_plan(requests, limits, order, start_every=start_every, prefill_cap=prefill_cap)
        return PlannedScheduler(limits, plan, hybrid=hybrid, name=label), limits

    return Candidate(label, "plan", {"order": shown, "start_every": start_every, "prefill_cap": prefill_cap,
                                     "hybrid": hybrid}, build,
                     order_ids=None if isinstance(order, str) else list(order),
                     whole_prompt_cap=min(limits.C, limits.prefill_budget))


def _clairvoyant(limits: Limits, hybrid: bool, rank: str, max_admit: int | None = None,
                 rmax: int | None = None, work_cap: int | None = None, defer: float | None = None,
                 cost_model=None) -> Candidate:
    """`ClairvoyantScheduler`; ``defer``: its `PrefillDeferral` weight (needs ``cost_model``)."""
    label = f"clairvoyant rank={rank}" + (f" max_admit={max_admit}" if max_admit else "") + (
        f" Rmax={rmax}" if rmax else "") + (f" work_cap={work_cap}" if work_cap else "") + (
        f" defer={defer:g}" if defer else "")
    lim = limits if rmax is None else replace(limits, Rmax=rmax if limits.Rmax is None else min(rmax, limits.Rmax))
    return Candidate(label, "clairvoyant", {"rank": rank, "max_admit": max_admit, "Rmax": rmax, "hybrid": hybrid,
                                            "work_cap": work_cap, "defer": defer},
                     lambda: (ClairvoyantScheduler(lim, cost_model if defer else None, rank=rank, max_admit=max_admit,
                                                   hybrid=hybrid, name=label, work_cap_tokens=work_cap,
                                                   defer_weight=defer), lim))


def _first_token(limits: Limits, hybrid: bool, P: int | None = None, srpt: bool = False,
                 defer: bool = False, lookahead: bool = False, cost_model=None, C: int | None = None) -> Candidate:
    """First-token-first (`FirstTokenScheduler`); ``lookahead`` times its chunks with ``cost_model``; ``C``: an
    optional batch token cap (`cheap_batch_tokens`)."""
    label = "first-token-first" + (" srpt" if srpt else "") + (" defer" if defer else "") + (
        " lookahead" if lookahead else "") + (f" P={P}" if P else "") + (f" C={C}" if C else "")
    lim = _token_capped(limits, C)
    lim = lim if P is None else replace(lim, P=min(P, lim.prefill_budget))
    return Candidate(label, "first-token", {"P": P, "hybrid": hybrid, "srpt": srpt, "defer": defer,
                                            "lookahead": lookahead, "C": C},
                     lambda: (FirstTokenScheduler(lim, cost_model if lookahead else None, hybrid=hybrid, name=label,
                                                  srpt=srpt, defer_decodes=defer, lookahead=lookahead), lim))


def _work_ranked(limits: Limits, pol: Algorithm1Policy, work_s: dict[int, float], rmax: int | None,
                 C: int | None = None, decode_room: bool = False) -> Candidate:
    """`WorkRankedScheduler` (least own work first) with ``pol``'s admission rules, an optional ``Rmax`` cap and an
    optional batch token cap ``C`` (`cheap_batch_tokens`). ``decode_room`` (with ``Rmax``): the prefill budget leaves
    a token for every KV holder, P = C − Rmax, so that no prefill chunk ranked before a running request takes its
    decode's place in the batch (the ranking group mixes both). On the Azure slice under the default A100 model
    (C = 384, Rmax 65) the mean latency falls from 22.94 to 19.15 s; on azure-code's first 500 requests it rises
    (6.59 to 7.01 s at C = 384, Rmax 40), hence a candidate of its own."""
    lim = limits if rmax is None else replace(limits, Rmax=rmax if limits.Rmax is None else min(rmax, limits.Rmax))
    lim = _token_capped(lim, C)
    P = lim.C - lim.Rmax if decode_room and lim.Rmax is not None and lim.Rmax < lim.C else None
    if P is not None:
        lim = replace(lim, P=min(P, lim.prefill_budget))
    label = "work-ranked" + (f" Rmax={rmax}" if rmax else "") + (f" C={C}" if C else "") + (
        f" P={lim.P}" if P is not None else "")
    return Candidate(label, "work-ranked", {"Rmax": rmax, "C": C, "policy": "rank-i-ef",
                                            "P": lim.P if P is not None else None},  # (P set: decode room)
                     lambda: (WorkRankedScheduler(lim, pol, work_s, name=label), lim), work_s=work_s)


def _token_capped(limits: Limits, C: int | None) -> Limits:
    """``limits`` with at most ``C`` tokens per batch (and P no larger); every schedule within them is within
    ``limits``."""
    if C is None or C >= limits.C:
        return limits
    return replace(limits, C=C, P=None if limits.P is None else min(limits.P, C))


def _work_ranked_family(requests, limits: Limits, cost_model, policies_of: dict, policies: Policies,
                        token_caps: Sequence[int] = ()) -> tuple[list[Candidate], list[Candidate]]:
    """For the sum of latencies of mixed lengths: `_work_ranked` with the eviction-free policy of rank-i-ef, uncapped
    and with ``Rmax`` at 0.9 and 0.75 of the requests that fit ``M`` (the Azure slice of the optimality study:
    27.38 s mean latency at Rmax 64 of 73 that fit, 27.53 s uncapped, 28.15 s at 48; rank-i-ef 28.92 s), then
    uncapped with every batch at most each of ``token_caps`` tokens (`cheap_batch_tokens`), then with both caps and
    room for every decode (`_work_ranked`'s ``decode_room``); and, second in the pair, lower caps for later in the
    portfolio (`_concurrency_ladder`)."""
    pol = policies_of.get("rank-i-ef")
    if pol is None or not _policy_allows(pol, policies):
        return [], []
    work = marginal_work_s(requests, cost_model, limits)
    if work is None:
        return [], []
    n_fit = _fit_count(requests, limits)
    # (a cap of as many requests as there are caps nothing: it would repeat the uncapped candidate)
    caps = [None] + sorted({c for f in (0.9, 0.75) for c in (max(1, int(n_fit * f)),) if c < len(requests)},
                           reverse=True)
    ladder = _concurrency_ladder(min(n_fit, len(requests)), set(caps))
    return [_work_ranked(limits, pol, work, cap) for cap in caps] + [
        _work_ranked(limits, pol, work, None, C) for C in token_caps] + [
        _work_ranked(limits, pol, work, cap, C, decode_room=True) for C in token_caps for cap in caps[1:] if cap < C], [
        _work_ranked(limits, pol, work, cap) for cap in ladder]


# The ladder's lowest cap and its length: at most this many candidates, none below this many requests
LADDER_FLOOR, LADDER_STEPS = 16, 4


def _concurrency_ladder(n_fit: int, taken: set) -> list[int]:
    """``Rmax`` caps far below what ``M`` holds: ``n_fit`` (the requests that fit ``M``, or all of them if fewer)
    halved, quartered, … (at most ``LADDER_STEPS`` of them, none under ``LADDER_FLOOR``, none already in ``taken``), for
    the local search to refine.

    Why: the caps near ``n_fit`` are right only where memory is what limits the batch. On the Azure slice of the
    optimality study the best concurrency (about 64 running requests, batches of about 50 ms) is a trade between the
    batches' intercepts and how long each member waits, not memory: with ``M`` raised tenfold to 1M, schedules within
    the old limits remain valid, yet a 60 s search found 32.09 s of mean latency (caps of 657 and 547) against
    27.41 s at M = 100K."""
    out, cap = [], n_fit // 2
    while cap >= LADDER_FLOOR and len(out) < LADDER_STEPS:
        if cap not in taken:
            out.append(cap)
        cap //= 2
    return out


def _fit_count(requests, limits: Limits) -> int:
    """How many requests of mean peak ``I + O − 1`` fit ``M`` at once."""
    mean_peak = sum(r.peak_kv_tokens for r in requests) / len(requests)
    return max(1, int(limits.M // limits.blocks(math.ceil(mean_peak))))


def _waves(requests, limits: Limits, objective: Objective, policies_of: dict, policies: Policies,
           caps: Sequence[int] = ()) -> list[Candidate]:
    """For the sum of latencies: Sarathi P=C with ``Rmax`` = B/2 … B/16, i.e. requests served in waves of that
    size (with equal lengths a wave finishes together and the next is admitted at once). Each batch pays
    an intercept, so finishing a few requests early beats finishing all together late: at Fig. 12's
    I = 64, O = 4, B = 32 (linear model), waves of 8 give a latency sum of 5.04 s against 6.22 s for the
    best candidate before (vLLM-ef, one wave)."""
    pol = policies_of.get("sarathi-pc")
    if objective.latency <= 0 or pol is None or not _policy_allows(pol, policies):
        return []
    sizes = sorted({len(requests) // d for d in (2, 4, 8, 16)} - {0}, reverse=True)
    # ``caps``: the same waves with every batch capped at a cheap token count (`cheap_batch_tokens`); fitted A100
    # profile, I = 512, O = 128: B = 64, waves of 32 at C = 384, 300.3 s against 305.6 s in one wave; B = 256, waves
    # of 64, 3,207.1 s against 3,251.6 s
    return [_template("sarathi-pc", pol, limits, Rmax=g) for g in sizes] + [
        _template("sarathi-pc", pol, limits, Rmax=g, C=C) for C in caps for g in sizes]


def _portfolio(requests, limits: Limits, objective: Objective, policies: Policies, cost_model) -> list[Candidate]:
    """The candidates in evaluation order (module docstring): the usual winners first (eviction-free registered
    schedulers, Sarathi P=C at the cheapest token count, work-ranked), then the clairvoyant families in the order
    the objective favours, then every registered scheduler and points of the Algorithm-1 template's space."""
    ours_ok = not (policies.no_chunked_prefill and any(r.prompt_tokens > min(limits.C, limits.prefill_budget)
                                                      for r in requests))
    identical = len({(r.prompt_tokens, r.output_tokens) for r in requests}) == 1
    latency_like = objective.latency > 0 or objective.ttft > 0
    policies_of = {n: _algorithm1_policy(n) for n in available()}
    alg1 = [n for n, p in policies_of.items() if p is not None and _policy_allows(p, policies)]
    cheap = cheap_batch_tokens(cost_model, limits)
    # Eviction-free registered schedulers are the cheapest to simulate; these are the usual winners.
    first = ["vllm-ef", "sarathi-pc-ef"] + (["rank-i-ef", "rank-o-ef"] if latency_like else [])
    first = [n for n in first if n in alg1]
    out: list[Candidate] = [_registered(n, limits) for n in first]
    sarathi_pc = policies_of.get("sarathi-pc")
    if cheap and sarathi_pc is not None and _policy_allows(sarathi_pc, policies):
        # right after them, Sarathi P=C capped at the cheapest token count: the best found at I = 512, O = 128 from
        # B = 256 to 4,096 for makespan and the sum of latencies (fitted A100 profile), so that a search with time
        # for only a few candidates (B = 16,384) reaches it; the template loop below lists it again (skipped)
        out.append(_template("sarathi-pc", sarathi_pc, limits, C=cheap[0]))
    ladder: list[Candidate] = []  # low concurrency caps: after the clairvoyant families (`_concurrency_ladder`)
    if objective.latency > 0 and not identical:
        usual, ladder = _work_ranked_family(requests, limits, cost_model, policies_of, policies, cheap)
        out += usual
    waves = _waves(requests, limits, objective, policies_of, policies, cheap)
    if ours_ok:  # clairvoyant schedulers, those aimed at the objective first
        plans = _plan_family(requests, limits, not policies.no_hybrid, identical)
        forward = _forward_family(requests, limits, objective, policies, cost_model, identical)
        # Time-limited searches on large instances reach only the first few: mean TTFT is won by
        # first-token-first, the sum of latencies by waves or forward admission, makespan by plans.
        out += _first_token_family(requests, limits, objective, policies, cost_model, cheap) + waves + (
            forward + plans if latency_like else plans + forward)
    else:
        out += waves
    out += ladder
    out += [_registered(n, limits) for n in alg1 if n.endswith("-ef") and n not in first]
    out += [_registered(n, limits) for n in alg1 if not n.endswith("-ef")]
    return out + _template_points(requests, limits, policies_of, policies, latency_like, cheap)


def _plan_family(requests, limits: Limits, hybrid: bool, identical: bool) -> list[Candidate]:
    """Latest-start plans (`latest_start_plan`): a start every 4, 16 or 1 batches, one with prefills capped at
    min(C, P), and with mixed lengths the shortest-output and arrival orders."""
    plans = [_plan(requests, limits, hybrid, start_every=k) for k in (4, 16, 1)]
    plans.append(_plan(requests, limits, hybrid, start_every=4, prefill_cap=min(limits.C, limits.prefill_budget)))
    if not identical:
        plans += [_plan(requests, limits, hybrid, order=o, start_every=4) for o in ("short_output", "arrival")]
    return plans


def _forward_family(requests, limits: Limits, objective: Objective, policies: Policies, cost_model,
                    identical: bool) -> list[Candidate]:
    """`ClairvoyantScheduler` (forward admission in a clairvoyant rank order): the ranks that suit the objective,
    with KV-holder caps for the latency-like ones, and for the sum of latencies of mixed lengths first waves in
    shortest-first order, with work caps and prompt deferral."""
    hybrid = not policies.no_hybrid
    latency_like = objective.latency > 0 or objective.ttft > 0
    ranks = (["small_area", "short_total", "short_output", "short_prompt", "arrival"] if latency_like
             else ["arrival", "short_output"])
    forward = [_clairvoyant(limits, hybrid, rk) for rk in (ranks[:1] if identical else ranks)]
    if latency_like:
        n_fit = _fit_count(requests, limits)
        forward += [_clairvoyant(limits, hybrid, ranks[0], rmax=max(1, int(n_fit * f))) for f in (0.25, 0.5, 0.75)]
    if objective.latency <= 0 or identical:
        return forward
    # waves in shortest-first order: at most B/d requests hold KV, so the short ones run (and finish)
    # before the long ones start. A.3 LISO+SISO, B = 8: 2.011 s against 2.71 s for the best candidate
    # before (every registered scheduler 2.98 s); B = 32: 19.58 s against 21.04 s.
    # With a work cap (running I + O within 1, 2 or 4 longest requests) the long ones also run few at a
    # time: LISO+SISO B = 32, 16.48 s against 19.58 s (waves alone); B = 256, 662.3 s against 730.8 s.
    longest = max(r.prompt_tokens + r.output_tokens for r in requests)
    # With prompts held back while the running requests finish (`PrefillDeferral`), a short request is not
    # delayed by long prompts prefilled beside it: A.3 LISO+SISO B = 16, 4.587 s against 4.987 s; B = 64,
    # 52.02 s against 54.62 s; LILO+SILO B = 16, 126.10 s against 128.63 s (weights 0.01-0.1); LISO+SILO
    # B = 64, 347.76 s against 351.73 s (weight 1 and local search)
    n = len(requests)
    return [_clairvoyant(limits, hybrid, rk, rmax=n // d) for d in (2, 4, 8)
            for rk in ("short_total", "small_area") if n // d] + [
        _clairvoyant(limits, hybrid, "short_total", rmax=n // d, work_cap=f * longest)
        for f in (2, 1, 4) for d in (2, 1, 4) if n // d] + [
        _clairvoyant(limits, hybrid, "short_total", rmax=n // d, work_cap=cap, defer=w, cost_model=cost_model)
        for w in (0.01, 0.1, 1.0) for cap in (None, 2 * longest) for d in (2, 1, 4) if n // d] + forward


def _first_token_family(requests, limits: Limits, objective: Objective, policies: Policies, cost_model,
                        cheap: list[int]) -> list[Candidate]:
    """For mean TTFT (with chunking allowed): `FirstTokenScheduler` at a few prefill budgets, in a few prefill
    batches when every prompt fits them, shortest prompt left first (with decodes deferred and a lookahead when
    requests arrive over time), and capped at the model's cheap token counts. Empty for other objectives."""
    if objective.ttft <= 0 or policies.eviction_free or policies.no_chunked_prefill:
        return []
    hybrid, budget = not policies.no_hybrid, min(limits.C, limits.prefill_budget)
    first_tokens = [_first_token(limits, hybrid, P) for P in (None, budget // 2, budget // 4, budget // 16) if P != 0]
    # all the prompts fit a few batches: split them into k prefill batches (each first token waits for
    # its batch only; fewer, larger batches share the intercept: Fig. 12 I = 8, B = 32, k = 2)
    prompts = sum(r.prompt_tokens for r in requests)
    first_tokens += [_first_token(limits, hybrid, P) for P in (-(-prompts // k) for k in (2, 3, 4))
                     if 0 < P < budget // 16]
    # With arrivals over time a short prompt should not wait behind a long one's chunks: shortest
    # prompt left first, with small chunks so that it can cut in (Azure slice: P = 512 best)
    srpt = [_first_token(limits, hybrid, P, srpt=True) for P in (budget // 8, budget // 4, budget // 2) if P != 0]
    online = len({r.arrival_s for r in requests}) > 1
    if online:  # and decodes deferred until every request has arrived: no prompt waits behind them; first
        # with one prompt per batch, cut at the arrival of a shorter one (lookahead)
        srpt = [_first_token(limits, hybrid, P, srpt=True, defer=True, lookahead=True, cost_model=cost_model)
                for P in (None, budget // 2) if P != 0] + [
            _first_token(limits, hybrid, P, srpt=True, defer=True) for P in (budget // 2, budget // 4) if P != 0] + srpt
    # batches capped just under the model's cheapest token-count steps (`cheap_batch_tokens`), with decodes
    # deferred when requests arrive over time (azure-conv's first 2,000, default model: 0.1334 s against
    # 0.1395 s for the best uncapped candidate; without deferring 0.1491 s)
    srpt += [_first_token(limits, hybrid, None, srpt=True, defer=d, C=C)
             for C in cheap for d in ((True, False) if online else (False,))]
    return srpt + first_tokens if online else first_tokens + srpt


def _template_points(requests, limits: Limits, policies_of: dict, policies: Policies, latency_like: bool,
                     cheap: list[int]) -> list[Candidate]:
    """Points of the Algorithm-1 template's space around five registered policies: ``Rmax`` at ½-2× the requests
    that fit ``M`` at once, waves for vLLM (latency-like objectives), prefill budgets, and the cheap token caps."""
    out: list[Candidate] = []
    n_fit = _fit_count(requests, limits)
    for name in ("sarathi-pc", "vllm", "rank-o", "rank-o-ef", "vllm-ef"):
        pol = policies_of.get(name)
        if pol is None or not _policy_allows(pol, policies):
            continue
        for f in (0.5, 1.0, 1.5, 2.0):
            out.append(_template(name, pol, limits, Rmax=max(1, int(n_fit * f))))
        if latency_like and name in ("vllm", "vllm-ef"):  # waves (`_waves`)
            out += [_template(name, pol, limits, Rmax=len(requests) // d) for d in (2, 4, 8, 16) if len(requests) // d]
        for P in (256, 1024, 2048):
            if P < limits.prefill_budget:
                out.append(_template(name, pol, limits, P=P))
        if pol.chunked_prefill:  # batches capped just under the model's cheapest token-count steps: Sarathi P=C at
            # C = 384 on the fitted A100 profile, I = 512, O = 128, B = 64, latency sum 305.6 s against 319.8 s before
            out += [_template(name, pol, limits, C=C) for C in cheap]
    return out


def _step_aligned(limits: Limits, policies: Policies, cost_model) -> list[Candidate]:
    """vLLM (eviction-free first) with the prefill budget ``P`` at each of the cost model's token-count steps
    (``n_tokens_gt<t>``), largest step first: prefill-only batches that stay just under a step (the batch
    time jumps above it) are cheaper per token. Found by hand at B = 16, I = 64, O = 4: three prefill
    batches of 6, 6 and 4 prompts under the fitted A100 profile's 384-token step, then decodes, 0.9%
    above the lower bound, which no other candidate reached."""
    steps = _token_steps(cost_model)
    out = []
    for name in ("vllm-ef", "vllm"):
        pol = _algorithm1_policy(name)
        if pol is not None and _policy_allows(pol, policies):
            out += [_template(name, pol, limits, P=t)
                    for t in sorted(steps, key=lambda t: -steps[t]) if t < limits.prefill_budget]
    return out


def _token_steps(cost_model) -> dict[int, float]:
    """The cost model's token-count steps ``[n_tokens > t]`` with a positive coefficient: threshold t -> the largest
    such coefficient."""
    from .bounds import token_step

    steps: dict[int, float] = {}
    for term in cost_model.milp_terms():
        for piece in term.pieces:
            for feature, coef in piece.coef_s.items():
                step = token_step(feature)
                if step is not None and step[0] == "n_tokens" and coef > 0:
                    steps[step[1]] = max(steps.get(step[1], 0.0), coef)
    return steps


def cheap_batch_tokens(cost_model, limits: Limits, count: int = 2) -> list[int]:
    """Batch token caps just under the cost model's token-count steps, the cheapest per token first.

    Each step threshold t below C is a candidate (a batch of t tokens does not pay the step, one of t + 1 does),
    priced by the time per token of a prefill-only batch of one t-token prompt from an empty cache; the ``count``
    cheapest are kept, and only those cheaper per token than such a batch of C tokens. Empty for a model without
    token-count steps, such as the paper's linear model.
    Why: under the fitted A100 profile a 384-token batch costs 73 us per token and a 4,096-token one 89, so
    capping the batches at 384 tokens lowers the work of a loaded queue; on azure-code's first 1,000 requests
    (C = 4,096, M = 100K) the search's best mean latency falls from 12.04 to 9.58 s (work-ranked capped at 384) and
    its best mean TTFT from 5.51 to 5.02 s (docs/design.md, "Schedule search", (6b))."""
    thresholds = [t for t in _token_steps(cost_model) if 1 <= t < limits.C]
    if not thresholds:
        return []

    def per_token_s(n: int) -> float:
        features = BatchFeatures()
        features.add_prefill(n, 0)
        return cost_model.batch_time_s(features) / n

    ceiling = per_token_s(limits.C)
    priced = sorted((per_token_s(t), t) for t in thresholds)
    return [t for price, t in priced[:count] if price < ceiling]


def _prefill_first(requests, limits: Limits, objective: Objective, cost_model, policies: Policies
                   ) -> list[Candidate]:
    """For makespan on an offline instance: every prompt prefilled first, then the decodes together
    (`PrefillFirstScheduler`): in the groups of whole prompts that make the prefill batches cheapest
    (`prefill_partition`: each may stop just under a token-count step; obeys every forced policy: no hybrid batch,
    no chunk, no eviction), and, unless chunking is forbidden, in chunks of each cheap batch size
    (`cheap_batch_tokens`, `chunked_prefill_plan`), which price every prompt token at that size's rate."""
    if objective.makespan <= 0 or len({r.arrival_s for r in requests}) > 1:
        return []
    out = []
    groups = prefill_partition(requests, limits, cost_model)
    if groups is not None:
        label = f"prefill-first partition ({len(groups)} prefill batches)"
        out.append(Candidate(label, "prefill-first", {"groups": len(groups)},
                             lambda: (PrefillFirstScheduler(limits, groups, name=label), limits)))
    for tokens in ([] if policies.no_chunked_prefill else cheap_batch_tokens(cost_model, limits)):
        plan = chunked_prefill_plan(requests, limits, tokens)
        if plan is not None:
            label = f"prefill-first chunks of {tokens} ({len(plan)} prefill batches)"
            out.append(Candidate(label, "prefill-first", {"chunk_tokens": tokens},
                                 lambda plan=plan, label=label: (PrefillFirstScheduler(limits, plan, name=label),
                                                                 limits)))
    return out


# --- evaluation -------------------------------------------------------------------------------------

def _log(st: _State, msg: str) -> None:
    if st.progress is not None:
        st.progress(msg)


def _estimate_s(st: _State, family: str) -> float:
    if family in st.family_s:
        return st.family_s[family]
    return max(st.family_s.values()) if st.family_s else 0.0


def _evaluate(st: _State, cand: Candidate) -> float | None:
    """Simulate ``cand`` if time allows; record it; keep it if best. Returns its value (None: error/skipped)."""
    if cand.name in st.seen:
        return None
    if _cannot_run(st, cand):
        return None
    same = _same_run(st, cand)
    if same is not None:
        return same
    now = time.perf_counter()
    # kept for the final replay and policy check of the best (`_finish`): twice its simulation, or, before any
    # schedule is known, 40% of what is left (a replay took 40-65% of its simulation's time; Sarathi and vLLM-ef,
    # 5,000 requests of I = O = 2,000)
    reserve = 2 * st.best[3] if st.best is not None else 0.4 * (st.deadline - now)
    if st.records and now + _estimate_s(st, cand.family) + reserve > st.deadline:
        st.skipped += 1
        return None
    st.seen.add(cand.name)
    rec = {"name": cand.name, "family": cand.family, "params": cand.params}
    t0 = time.perf_counter()
    value = None
    try:
        sched, lim = cand.build()
        result = simulate(st.requests, sched, lim if lim is not None else st.limits, st.cost_model,
                          deadline_s=st.deadline - reserve)  # a candidate that would overrun stops (an error below)
        value = st.objective.value(result)
        rec["value_s"] = value
    except Exception as exc:  # noqa: BLE001 — a failing candidate is recorded and skipped
        rec["error"] = f"{type(exc).__name__}: {exc}"
    elapsed = time.perf_counter() - t0
    rec["elapsed_s"] = elapsed
    st.records.append(rec)
    key = _rmax_free_key(cand)
    if key is not None and value is not None:
        peak = max(row[_RUNNING_PEAK] for row in result.batch_rows)
        st.peaks.setdefault(key, []).append((_effective_rmax(st, cand), peak, value, cand.name))
    st.family_s[cand.family] = max(st.family_s.get(cand.family, 0.0), elapsed)
    if value is not None and value == value:
        st.values.append((value, cand))
    if value is not None and value == value and (st.best is None or value < st.best[0]):
        st.best = (value, cand, result, elapsed)
        _log(st, f"{cand.name}: {value:.6g} s (best so far, {elapsed:.2f} s)")
    elif "error" in rec:
        _log(st, f"{cand.name}: {rec['error']}")
    else:  # (a NaN objective, say of a run that finished nothing, prints as nan)
        _log(st, f"{cand.name}: {value:.6g} s ({elapsed:.2f} s)")
    return value


def _cannot_run(st: _State, cand: Candidate) -> bool:
    """Whether ``cand`` prefills every prompt in one batch and a prompt exceeds what one of its batches can prefill: it
    would stop at that request's turn (InfeasibleRequestError), so it is not started, and is reported once for all
    such candidates rather than one error line each (azure-code's first 500 requests, whose longest prompt is 7,436
    tokens at C = 4,096: 139 of the 281 candidates of `better -s sarathi --objective latency`)."""
    if cand.whole_prompt_cap is None:
        return False
    longest = st.longest
    if longest.prompt_tokens <= cand.whole_prompt_cap:
        return False
    st.seen.add(cand.name)
    if not st.cannot_run:
        _log(st, f"not run: the candidates that prefill each prompt in one batch (vLLM-like, latest-start plans) "
                 f"with min(C, P) below request {longest.id}'s {longest.prompt_tokens}-token prompt")
    st.cannot_run += 1
    return True


_RUNNING_PEAK = BATCH_COLUMNS.index("running_peak")


def _rmax_free_key(cand: Candidate) -> tuple | None:
    """What a candidate is apart from its ``Rmax`` cap, for the families whose schedulers read ``Rmax`` only by comparing
    a count of KV holders with it (Algorithm 1, the work-ranked and the clairvoyant schedulers: `_same_run`); None for
    the others."""
    p = cand.params
    if cand.family == "template":
        return ("template", p["policy"], p.get("P"), p.get("C"))
    if cand.family == "registered" and _plain_algorithm1(p["scheduler"]):  # its template with no override
        return ("template", p["scheduler"], None, None)
    if cand.family == "work-ranked":  # (a candidate with decode room has P = C − Rmax: its own key per Rmax)
        return ("work-ranked", p["policy"], p.get("C"), p.get("P"))
    if cand.family == "clairvoyant":
        return ("clairvoyant", p["rank"], p["max_admit"], p["hybrid"], p.get("work_cap"), p.get("defer"))
    return None


@functools.lru_cache(maxsize=None)
def _plain_algorithm1(name: str) -> bool:
    """Whether registered scheduler ``name`` is `Algorithm1Scheduler` itself with its policy (no subclass), built as
    its template (`_template`) is: same policy and limits (its default P applied alike), and the cost model it is given
    is not read by Algorithm 1, so the two runs are the same."""
    try:
        return type(get_spec(name).factory(Limits(), None)) is Algorithm1Scheduler
    except Exception:  # noqa: BLE001 — schedulers that need more to build are not Algorithm 1
        return False


def _effective_rmax(st: _State, cand: Candidate) -> int | None:
    """The ``Rmax`` a candidate runs with: its own cap, never above the caller's."""
    own, caller = cand.params.get("Rmax"), st.limits.Rmax
    return caller if own is None else own if caller is None else min(own, caller)


def _same_run(st: _State, cand: Candidate) -> float | None:
    """The value of ``cand`` when a run already simulated is provably the same run, else None.

    Within its family and parameters, a candidate differs from a simulated sibling only in its ``Rmax``; the
    schedulers of those families read ``Rmax`` only as ``holders >= Rmax`` (a request may become a KV holder only while
    fewer hold KV), with ``holders`` at most the batch's KV holders, which the replayer records (``running_peak``).
    So if the sibling's holders stayed below its own cap and below ``cand``'s (either may be none) in every batch,
    every such test is false under both caps in every state the sibling's run passed through, and the two runs are
    identical, batch for batch (by induction over the batches). The shortest-first waves (``Rmax`` = B/2 … B/16) on
    an online trace are the usual case: on the whole azure-conv trace 10 of the 21 candidates `better -s sarathi
    --objective latency --time-limit 120` simulated were such repeats (23.2 s of its search)."""
    key = _rmax_free_key(cand)
    if key is None:
        return None
    rmax = _effective_rmax(st, cand)
    for sib_rmax, peak, value, name in st.peaks.get(key, ()):
        if (sib_rmax is None or peak < sib_rmax) and (rmax is None or peak < rmax):
            st.seen.add(cand.name)
            st.records.append({"name": cand.name, "family": cand.family, "params": cand.params, "value_s": value,
                               "elapsed_s": 0.0, "same_as": name})
            _log(st, f"{cand.name}: {value:.6g} s (the run of {name}: at most {peak} requests held KV)")
            return value
    return None


def _local_search(st: _State, rng: random.Random, patience: int = 2) -> None:
    """Hill-climbing from the best candidate, then, while time remains, from the best of every other
    family (a climb ends when its neighbours are all seen, or after ``patience`` rounds without improving
    its own start); the overall best is kept by `_evaluate` throughout."""
    if st.best is None:
        return
    starts = [st.best[1]]
    by_family: dict[str, tuple[float, Candidate]] = {}
    for value, cand in st.values:
        if cand.family != st.best[1].family and (cand.family not in by_family or value < by_family[cand.family][0]):
            by_family[cand.family] = (value, cand)
    starts += [c for _, c in sorted(by_family.values(), key=lambda vc: vc[0])]
    for start in starts:
        if time.perf_counter() >= st.deadline:
            return
        _climb(st, rng, start, patience)


def _climb(st: _State, rng: random.Random, cand: Candidate, patience: int) -> None:
    current = next(v for v, c in st.values if c is cand)
    idle = 0
    while idle < patience and time.perf_counter() < st.deadline:
        neighbours = [c for c in _neighbours(st, cand, rng) if c.name not in st.seen]
        if not neighbours:
            return
        improved = False
        for nb in neighbours:
            value = _evaluate(st, nb)
            if value is not None and value < current:
                current, cand, improved = value, nb, True
            if time.perf_counter() >= st.deadline:
                return
        idle = 0 if improved else idle + 1


def _has_random_neighbours(cand: Candidate, requests) -> bool:
    return cand.family == "plan" and len({(r.prompt_tokens, r.output_tokens) for r in requests}) > 1


def _neighbours(st: _State, cand: Candidate, rng: random.Random) -> list[Candidate]:
    p, lim = cand.params, st.limits
    out: list[Candidate] = []
    if cand.family == "plan":
        k, cap = p["start_every"], p["prefill_cap"]
        budget = min(lim.C, lim.prefill_budget)
        cap0 = cap if cap is not None else max(1, budget // 2)
        order = cand.order_ids if cand.order_ids is not None else p["order"]
        for k2 in {max(1, k // 2), k * 2, max(1, k - 1), k + 1} - {k}:
            out.append(_plan(st.requests, lim, p["hybrid"], order, k2, cap, p["order"]))
        for cap2 in {max(1, cap0 // 2), min(budget, cap0 * 3 // 2), budget} - {cap0}:
            out.append(_plan(st.requests, lim, p["hybrid"], order, k, cap2, p["order"]))
        if _has_random_neighbours(cand, st.requests):  # perturb the placement order: a few random swaps
            ids = list(order) if not isinstance(order, str) else _order_ids(st.requests, order)
            for _ in range(2):
                new = ids[:]
                for _ in range(max(1, len(new) // 50)):
                    i, j = rng.randrange(len(new)), rng.randrange(len(new))
                    new[i], new[j] = new[j], new[i]
                tag = f"{p['order'].split('+')[0]}+perturbed#{rng.randrange(1 << 30)}"
                out.append(_plan(st.requests, lim, p["hybrid"], new, k, cap, tag))
    elif cand.family == "first-token":
        budget = _token_capped(lim, p.get("C")).prefill_budget
        P = p["P"] or budget
        for P2 in (int(P * 0.7), int(P * 1.4)):
            if 1 <= P2 <= budget:
                out.append(_first_token(lim, p["hybrid"], P2, p["srpt"], p["defer"], p["lookahead"], st.cost_model,
                                        p.get("C")))
    elif cand.family == "clairvoyant":
        m, work_cap, defer = p["max_admit"], p.get("work_cap"), p.get("defer")

        def like(max_admit=m, rmax=p["Rmax"], cap=work_cap, weight=defer, rank=p["rank"]) -> Candidate:
            return _clairvoyant(lim, p["hybrid"], rank, max_admit, rmax, cap, weight, st.cost_model)
        n_fit = _fit_count(st.requests, lim)
        for m2 in ([max(1, n_fit // 64), max(1, n_fit // 16), max(1, n_fit // 4)] if m is None
                   else [max(1, m // 2), m * 2]):
            out.append(like(max_admit=m2))
        r = p["Rmax"] or n_fit
        for r2 in (int(r * 0.8), int(r * 1.25)):
            if r2 >= 1:
                out.append(like(rmax=r2))
        if work_cap:
            for w2 in (int(work_cap * 0.7), int(work_cap * 1.4)):
                out.append(like(cap=w2))
        if defer:
            out += [like(weight=defer / 3), like(weight=defer * 3)]
        elif st.objective.latency > 0:
            out.append(like(weight=0.1))
        # the two shortest-first orders of the waves, by total length or by KV area: with prompts held back, A.3
        # LILO+SILO B = 64 915.6 s by KV area against 921.9 s by length; LISO+SILO B = 128 1,104.5 against 1,114.9 s
        twin = {"short_total": "small_area", "small_area": "short_total"}.get(p["rank"])
        if twin is not None and defer:
            out.append(like(rank=twin))
    elif cand.family == "work-ranked":
        pol = _algorithm1_policy(p["policy"])
        r = p["Rmax"] or _fit_count(st.requests, lim)
        for r2 in {int(r * 0.85), int(r * 1.15)}:
            if r2 >= 1 and pol is not None:
                out.append(_work_ranked(lim, pol, cand.work_s, r2, p.get("C"), decode_room=p.get("P") is not None))
    else:
        name = p.get("policy", p.get("scheduler"))
        pol = _algorithm1_policy(name)
        if pol is None:
            return out
        n_fit = _fit_count(st.requests, lim)
        rmax = p.get("Rmax")
        for r2 in ([int(n_fit * 0.75), int(n_fit * 1.25)] if rmax is None else [int(rmax * 0.85), int(rmax * 1.15)]):
            if r2 >= 1:
                out.append(_template(name, pol, lim, Rmax=r2, **{k: p[k] for k in ("P", "C") if k in p}))
        capped = _token_capped(lim, p.get("C"))
        P = p.get("P", capped.prefill_budget if pol.default_P is None else min(pol.default_P, capped.C))
        for P2 in (P // 2, min(P * 2, capped.prefill_budget)):
            if 1 <= P2 != P:
                out.append(_template(name, pol, lim, P=P2, **({"Rmax": rmax} if rmax else {}),
                                     **({"C": p["C"]} if "C" in p else {})))
    return out


def _order_ids(requests, order: str) -> list[int]:
    from .search_policies import RANKS
    return [r.id for r in sorted(requests, key=RANKS[order])]


# --- the result -------------------------------------------------------------------------------------

def _finish(st: _State, t_start: float) -> SearchResult:
    best_sched, best_value, method = None, math.inf, "none"
    if st.best is not None:
        value, cand, result, _ = st.best
        sched = Schedule(list(st.requests), st.limits, list(result.schedule.batches),
                         {**result.schedule.meta, "search_method": cand.name})
        replayed = replay(sched, st.cost_model, limits=st.limits)
        check = st.objective.value(replayed)
        if abs(check - value) > REPLAY_RTOL * max(abs(value), 1e-300):
            raise RuntimeError(f"search: candidate {cand.name!r} simulated to {value!r} but replays to {check!r}")
        violations = policy_violations(sched, st.policies, st.cost_model) if st.policies.names() else []
        if violations:
            raise RuntimeError(f"search: candidate {cand.name!r} breaks the forced policies: {violations[:3]}")
        best_sched, best_value, method = sched, check, cand.name
    return SearchResult(best_sched, best_value, method, st.records, len(st.records),
                        time.perf_counter() - t_start, st.skipped, st.cannot_run)
