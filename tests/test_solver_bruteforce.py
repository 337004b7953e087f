"""The MILP optimum equals an independent brute-force optimum on tiny instances.

The enumerator knows nothing of the formulation: from each reachable state it proposes every
combination of per-request actions (skip, evict, process c = 1..I+O−1 tokens), lets the project's
`Replayer` reject invalid batches and time the valid ones, and minimises the objective by dynamic
programming over (request states, clock, batches left). Policies are filtered on the replayer's own
state (phase = m < Icur before the batch).
"""

from __future__ import annotations

import itertools
import math
from functools import lru_cache

import pytest

from infermax.costmodel import AffinePiece, BatchFeatures, CostTerm, load_cost_model, terms_time_s
from infermax.limits import Limits
from infermax.replay import Replayer, ScheduleViolation
from infermax.request import Request
from infermax.schedule import ScheduledBatch
from solvers import Objective, Policies, SolveOptions, optimize
from tests.conftest import AffineCost


class ToyPiecewise:
    """A convex multi-piece cost model (hand-made): max of two lines in tokens, prefill attention and a
    two-piece decode term."""

    name = "toy-piecewise"

    def milp_terms(self):
        return (
            CostTerm("linear", "n_tokens", (AffinePiece(1.0, {"n_tokens": 0.5}), AffinePiece(-0.5, {"n_tokens": 1.25}))),
            CostTerm("prefill", "n_prefill_seqs", (AffinePiece(0.3, {"prefill_sq_tokens": 0.2, "prefill_ctx_tokens": 0.15}),)),
            CostTerm("decode", "n_decode_seqs", (AffinePiece(0.2, {"decode_kv_tokens": 0.1}),
                                                  AffinePiece(0.05, {"decode_kv_tokens": 0.2}))),
        )

    def batch_time_s(self, f: BatchFeatures) -> float:
        return terms_time_s(self.milp_terms(), f)


class ToyPadded:
    """Hand-made terms on padded token counts (``⌈n/q⌉·q``, quanta small enough to matter in tiny
    instances): a step-shaped non-attention term and a decode term, priced by the replayer through
    ``BatchFeatures``' derived features."""

    name = "toy-padded"

    def milp_terms(self):
        return (
            CostTerm("steps", "n_tokens", (AffinePiece(1.0, {"n_tokens": 0.1, "n_tokens_pad2": 0.4}),
                                           AffinePiece(0.2, {"n_tokens_pad4": 0.6}))),
            CostTerm("decode", "n_decode_seqs", (AffinePiece(0.2, {"decode_kv_tokens": 0.1}),)),
        )

    def batch_time_s(self, f: BatchFeatures) -> float:
        return terms_time_s(self.milp_terms(), f)


class ToyStepped:
    """Hand-made steps ``[n_tokens > t]`` at thresholds small enough to matter in tiny instances, one of them
    negative (a kernel switch that speeds a larger batch up): the solver must pin each binary both ways."""

    name = "toy-stepped"

    def milp_terms(self):
        return (CostTerm("steps", "n_tokens", (AffinePiece(1.0, {"n_tokens": 0.2, "n_tokens_gt1": 0.5, "n_tokens_gt3": -0.3,
                                                                  "n_tokens_gt5": 0.9, "n_tokens_gt99": 7.0}),)),
                CostTerm("decode", "n_decode_seqs", (AffinePiece(0.2, {"decode_kv_tokens": 0.1}),)))

    def batch_time_s(self, f: BatchFeatures) -> float:
        return terms_time_s(self.milp_terms(), f)


class ToyCapped:
    """Hand-made decode term on the longest decode KV read capped at 2 (``decode_kv_max_cap2``, concave in
    the KV lengths: the MILP needs a binary per decode item), small enough to bind in tiny instances."""

    name = "toy-capped"

    def milp_terms(self):
        return (
            CostTerm("linear", "n_tokens", (AffinePiece(1.0, {"n_tokens": 0.5}),)),
            CostTerm("decode", "n_decode_seqs", (AffinePiece(0.2, {"decode_kv_tokens": 0.1, "decode_kv_max_cap2": 0.7}),
                                                  AffinePiece(0.1, {"decode_kv_tokens": 0.3}))),
        )

    def batch_time_s(self, f: BatchFeatures) -> float:
        return terms_time_s(self.milp_terms(), f)


def brute_force(requests, limits, cost, objective: Objective, max_batches: int, policies=Policies()) -> float:
    """Minimum objective over all valid schedules of at most ``max_batches`` batches (inf if none)."""
    ids = [r.id for r in requests]
    by_id = {r.id: r for r in requests}
    t0 = min(r.arrival_s for r in requests)

    def restore(state, clock):
        rp = Replayer(requests, limits, cost)
        for rid, (m, icur, gen, first, done) in zip(ids, state):
            s = rp.states[rid]
            s.m, s.input_tokens, s.generated, s.first_token_s = m, icur, gen, first
            s.finish_s = 0.0 if done else None
        rp.kv_tokens = sum(limits.blocks(m) for m, _, _, _, done in state if not done)
        rp.holders = sum(1 for m, _, _, _, done in state if m > 0 and not done)
        rp.unfinished = sum(1 for *_, done in state if not done)
        rp.clock_s = clock
        return rp

    def actions(rid, st):
        m, icur, gen, first, done = st
        if done:
            return [None]
        r = by_id[rid]
        return [None, "evict", *range(1, r.prompt_tokens + r.output_tokens)]

    def allowed(state, batch):
        if policies.eviction_free and batch.evict:
            return False
        phases = {("prefill" if st[0] < st[1] else "decode") for rid, st in zip(ids, state) for i, c in batch.items if i == rid}
        if policies.no_hybrid and len(phases) > 1:
            return False
        if policies.no_chunked_prefill:
            for rid, st in zip(ids, state):
                for i, c in batch.items:
                    if i == rid and st[0] < st[1] and c != st[1] - st[0]:
                        return False
        return True

    @lru_cache(maxsize=None)
    def best(state, clock, left):
        if all(st[4] for st in state):
            return objective.makespan * (clock - t0)
        if left == 0:
            return math.inf
        result = math.inf
        for combo in itertools.product(*(actions(rid, st) for rid, st in zip(ids, state))):
            items = [(rid, a) for rid, a in zip(ids, combo) if isinstance(a, int)]
            if not items:
                continue
            batch = ScheduledBatch(items, [rid for rid, a in zip(ids, combo) if a == "evict"])
            if not allowed(state, batch):
                continue
            rp = restore(state, clock)
            try:
                rp.apply(batch)
            except ScheduleViolation:
                continue
            cost_now, nxt = 0.0, []
            for rid, st in zip(ids, state):
                s, r = rp.states[rid], by_id[rid]
                newly_done = s.finish_s is not None and not st[4]
                if s.first_token_s is not None and st[3] is None:
                    cost_now += objective.ttft * (s.first_token_s - r.arrival_s) / len(requests)
                if newly_done:
                    cost_now += objective.latency * (s.finish_s - r.arrival_s)
                done = st[4] or newly_done
                nxt.append((0 if done else s.m, s.input_tokens, s.generated, s.first_token_s, done))
            result = min(result, cost_now + best(tuple(nxt), rp.clock_s, left - 1))
        return result

    start = tuple((0, r.prompt_tokens, 0, None, False) for r in requests)
    return best(start, 0.0, max_batches)


LINEAR = load_cost_model(kind="linear")
FITTED_PIECEWISE = load_cost_model(kind="piecewise")  # the default (auto) family, several pieces per term
OBJECTIVES = [Objective(makespan=1), Objective(latency=1), Objective(ttft=1), Objective(makespan=1, latency=0.5, ttft=2)]
CASES = {
    # two requests that cannot both hold their peak KV: serialise or evict
    "tight-M": ([Request(0, 0, 2, 2), Request(1, 0, 1, 3)], Limits(C=8, M=4)),
    # three requests, mixed lengths
    "three": ([Request(0, 0, 1, 2), Request(1, 0, 2, 1), Request(2, 0, 1, 2)], Limits(C=8, M=4)),
    # C = 2 forces chunked prefill of the 3-token prompt
    "chunk": ([Request(0, 0, 3, 1), Request(1, 0, 1, 2)], Limits(C=2, M=8)),
    # the paper's section 4.5 in miniature: evicting a short request beats waiting (linear model)
    "evict-pays": ([Request(0, 0, 1, 3), Request(1, 0, 1, 3)], Limits(C=8, M=3)),
    # KV in blocks of 2 tokens, and at most 2 requests holding KV
    "blocks": ([Request(0, 0, 1, 2), Request(1, 0, 2, 2), Request(2, 0, 1, 1)], Limits(C=8, M=5, block_size=2)),
    "rmax": ([Request(0, 0, 1, 2), Request(1, 0, 2, 1), Request(2, 0, 1, 2)], Limits(C=8, M=8, Rmax=2)),
    # online: the second request arrives while the first runs
    "online": ([Request(0, 0.0, 2, 2), Request(1, 0.0035, 1, 2)], Limits(C=8, M=4)),
}
COSTS = {"linear": LINEAR, "fitted-piecewise": FITTED_PIECEWISE, "affine": AffineCost(), "piecewise": ToyPiecewise(),
         "padded": ToyPadded(), "capped": ToyCapped(), "stepped": ToyStepped()}
SLOTS = 5


def _check(requests, limits, cost, objective, policies=Policies()):
    expected = brute_force(requests, limits, cost, objective, SLOTS, policies)
    got = optimize(requests, limits, cost, objective, policies, slots=SLOTS, options=SolveOptions(mip_gap=0))
    if math.isinf(expected):
        assert got.status == "infeasible"
        return got
    assert got.status == "optimal"
    assert got.value_s == pytest.approx(expected, rel=1e-6)
    return got


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("cost", list(COSTS))
def test_milp_optimum_equals_brute_force_makespan(case, cost):
    requests, limits = CASES[case]
    _check(requests, limits, COSTS[cost], Objective(makespan=1))


@pytest.mark.parametrize("objective", OBJECTIVES[1:], ids=str)
@pytest.mark.parametrize("case", ["tight-M", "online"])
def test_milp_optimum_equals_brute_force_other_objectives(case, objective):
    requests, limits = CASES[case]
    _check(requests, limits, LINEAR, objective)


@pytest.mark.parametrize("objective", OBJECTIVES[1:], ids=str)
@pytest.mark.parametrize("case", ["tight-M", "online", "chunk"])
def test_milp_optimum_equals_brute_force_padded_other_objectives(case, objective):
    """Padded token counts stay exact where the objective does not push every batch time down (TTFT)."""
    requests, limits = CASES[case]
    _check(requests, limits, ToyPadded(), objective)


@pytest.mark.parametrize("objective", OBJECTIVES[1:], ids=str)
@pytest.mark.parametrize("case", ["tight-M", "three", "online"])
def test_milp_optimum_equals_brute_force_capped_other_objectives(case, objective):
    """The capped longest KV read stays exact where the objective does not push every batch time down (TTFT)."""
    requests, limits = CASES[case]
    _check(requests, limits, ToyCapped(), objective)


@pytest.mark.parametrize("objective", OBJECTIVES[1:], ids=str)
@pytest.mark.parametrize("case", ["tight-M", "online", "chunk"])
def test_milp_optimum_equals_brute_force_stepped_other_objectives(case, objective):
    """Token-count steps stay exact where the objective does not push every batch time down (TTFT)."""
    requests, limits = CASES[case]
    _check(requests, limits, ToyStepped(), objective)


def test_stepped_toy_by_hand():
    """1 + 0.2n + 0.5[n > 1] − 0.3[n > 3] + 0.9[n > 5] for n = 1..7 (the step at 99 never fires here)."""
    times = [ToyStepped().batch_time_s(BatchFeatures(n_tokens=n)) for n in range(1, 8)]
    assert times == pytest.approx([1.2, 1.9, 2.1, 2.0, 2.2, 3.3, 3.5])


def test_capped_toy_caps():
    """By hand: one decode at m = 2 cached tokens reads 3 (capped to 2): 1 + 0.5 + max(0.2 + 0.3 + 1.4, 0.1 + 0.9) = 3.4;
    decodes at m = 0 and 2 read 1 + 3 = 4, longest 3 -> 2: 1 + 1 + max(0.2 + 0.4 + 1.4, 0.1 + 1.2) = 4.0."""
    one, two = BatchFeatures(), BatchFeatures()
    one.add_decode(2)
    two.add_decode(0), two.add_decode(2)
    assert (one.decode_kv_max_cap2, two.decode_kv_max, two.decode_kv_max_cap2) == (2, 3, 2)
    assert [ToyCapped().batch_time_s(f) for f in (one, two)] == pytest.approx([3.4, 4.0])


def test_negative_coefficient_on_capped_read_is_rejected():
    class Concave(ToyCapped):
        def milp_terms(self):
            return (CostTerm("decode", "n_decode_seqs", (AffinePiece(1.0, {"decode_kv_max_cap2": -0.1}),)),)

    with pytest.raises(ValueError, match="negative coefficient on decode_kv_max_cap2"):
        optimize(*CASES["tight-M"], Concave(), Objective(makespan=1), slots=SLOTS)


def test_padded_toy_has_steps():
    """The toy's padded features matter on these instances. By hand, max(1 + 0.1n + 0.4·⌈n/2⌉·2,
    0.2 + 0.6·⌈n/4⌉·4) for n = 1..8: (1.9, 2.6), (2.0, 2.6), (2.9, 2.6), (3.0, 2.6), (3.9, 5.0), (4.0, 5.0),
    (4.9, 5.0), (5.0, 5.0)."""
    times = [ToyPadded().batch_time_s(BatchFeatures(n_tokens=n)) for n in range(1, 9)]
    assert times == pytest.approx([2.6, 2.6, 2.9, 3.0, 5.0, 5.0, 5.0, 5.0])


@pytest.mark.parametrize("policies", [Policies(eviction_free=True), Policies(no_hybrid=True),
                                      Policies(no_chunked_prefill=True),
                                      Policies(no_hybrid=True, no_chunked_prefill=True, eviction_free=True)],
                         ids=lambda p: "+".join(p.names()))
def test_milp_optimum_equals_brute_force_with_policies(policies):
    requests, limits = CASES["tight-M"]
    _check(requests, limits, LINEAR, Objective(makespan=1), policies)
    _check(*CASES["chunk"][:1], Limits(C=3, M=8), LINEAR, Objective(latency=1), policies)


def test_optimum_evicts_where_brute_force_says_eviction_pays():
    requests, limits = CASES["evict-pays"]
    free = brute_force(requests, limits, LINEAR, Objective(makespan=1), SLOTS, Policies(eviction_free=True))
    got = _check(requests, limits, LINEAR, Objective(makespan=1))
    assert got.value_s < free * 0.95
    assert got.result.summary["evictions"] >= 1
    _check(requests, limits, LINEAR, Objective(makespan=1), Policies(eviction_free=True))


def test_brute_force_hand_case():
    """Sanity of the enumerator on a hand case (AffineCost: batch = 1 s + 1 s/token): with M = 4, the
    best eviction-free makespan is 10 s (prefill both, then decodes one at a time), and no schedule
    with evictions beats it here, as refilling costs tokens."""
    requests, limits = CASES["tight-M"]
    assert brute_force(requests, limits, AffineCost(), Objective(makespan=1), SLOTS) == pytest.approx(10.0)
    assert brute_force(requests, limits, AffineCost(), Objective(makespan=1), SLOTS, Policies(eviction_free=True)) == pytest.approx(10.0)


class ToyPrefillCap:
    """One batch costs 1 s plus ``a`` times Σ c·min(m, 256) over its prefill chunks (``prefill_ctx_cap256``)."""

    name = "toy-prefill-cap"

    def __init__(self, a: float):
        self.a = a

    def milp_terms(self):
        return (CostTerm("base", "n_tokens", (AffinePiece(1.0, {}),)),
                CostTerm("ctx", "n_prefill_seqs", (AffinePiece(0.0, {"prefill_ctx_cap256": self.a}),)))

    def batch_time_s(self, f: BatchFeatures) -> float:
        return terms_time_s(self.milp_terms(), f)


@pytest.mark.parametrize("a", [1e-5, -1e-5])
def test_capped_prefill_context_is_exact_in_the_milp(a):
    """A 600-token prompt (O = 1) in 3 batches of at most 256 tokens: chunks c1 + c2 + c3 = 600 cost
    3 + a·(c2·min(c1, 256) + c3·min(c1 + c2, 256)). Enumerating every split gives the optimum for either sign
    of ``a`` (a negative one pushes min(m, 256) up, so it must be pinned, not left to minimisation)."""
    values = [c2 * min(c1, 256) + (600 - c1 - c2) * min(c1 + c2, 256)
              for c1 in range(1, 257) for c2 in range(1, 257) if 1 <= 600 - c1 - c2 <= 256]
    expected = 3 + a * (min(values) if a > 0 else max(values))
    got = optimize([Request(0, 0.0, 600, 1)], Limits(C=256, M=1000, block_size=1), ToyPrefillCap(a),
                   Objective(makespan=1), slots=3, options=SolveOptions(mip_gap=0))
    assert got.status == "optimal"
    assert got.value_s == pytest.approx(expected, rel=1e-9)
