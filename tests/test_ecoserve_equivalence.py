"""EcoServe's incremental queues plan exactly the batches of the scheduler as it was at fc1abe4, which
re-sorted its queues and walked every waiting request each batch (kept as ``ecoserve_reference.py``, with
the deadlock breaking's livelock guard added since, a deliberate rule).

Random workloads and options (every registered variant's component switches and every §6 choice),
block sizes, Rmax and tight KV; arrivals spread so that slack buckets change while requests wait.
Batches (items, evictions, swaps), the ledger's allocation per iteration and the preemption counts
must be identical; the JCT decomposition equal up to float rounding (it is now summed per state
change instead of per batch)."""

from __future__ import annotations

import numpy as np
from conftest import AffineCost
from ecoserve_reference import EcoServeOptions as RefOptions
from ecoserve_reference import EcoServeScheduler as RefScheduler
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infermax.costmodel.swap import SwapCost
from infermax.engine import simulate
from infermax.limits import Limits
from infermax.request import Request
from infermax.schedulers.ecoserve import EcoServeOptions, EcoServeScheduler

SWAP = SwapCost(per_token_s=1e-4)
COST = AffineCost(0.01, 0.001)
# the registered variants' component switches
VARIANT_SWITCHES = [dict(sync=False, ordering=False, pipelining=False), dict(ordering=False, pipelining=False),
                    dict(pipelining=False), {}, dict(oracle=True, padding=0.0)]


@st.composite
def _cases(draw):
    n = draw(st.integers(2, 40))
    reqs, t = [], 0.0
    for i in range(n):
        t += draw(st.sampled_from([0.0, 0.0, 0.01, 0.05, 0.2, 0.5, 1.5]))
        reqs.append(Request(i, t, draw(st.integers(1, 300)), draw(st.integers(1, 300)),
                            predicted_output_tokens=draw(st.one_of(st.none(), st.integers(1, 400)))))
    peak = max(r.peak_kv_tokens for r in reqs)
    block = draw(st.sampled_from([1, 1, 16, 32]))
    C = draw(st.integers(8, 700))
    limits = Limits(C=C, P=draw(st.one_of(st.none(), st.integers(4, C))), M=draw(st.integers(peak + block, peak * 6 + 64)),
                    block_size=block, Rmax=draw(st.one_of(st.none(), st.integers(2, 8))))
    opts = dict(draw(st.sampled_from(VARIANT_SWITCHES)))
    for name, values in (("regroup", ["repredict", "pad"]), ("release", ["eos", "group"]), ("admit_on", ["group", "free"]),
                         ("group_by", ["blocks", "tokens"]), ("overrun", ["swap", "recompute"]), ("pt_kv", ["free", "queue"]),
                         ("reserve", [0.0, 0.03, 0.2]), ("padding", [0.0, 0.15, 0.5])):
        if draw(st.booleans()):
            opts[name] = draw(st.sampled_from(values))
    opts["predictor_seed"] = draw(st.integers(0, 3))
    return reqs, limits, opts


def _run(cls, opts_cls, reqs, limits, opts):
    sch = cls(limits, COST, opts_cls(**opts))
    return simulate(reqs, sch, limits, COST, swap_cost=SWAP), sch


DEADLOCK = "cannot grow and nothing can be evicted"


def _same_plans(case):
    reqs, limits, opts = case
    try:
        old, ref = _run(RefScheduler, RefOptions, reqs, limits, opts)
    except AssertionError as exc:
        if DEADLOCK not in str(exc):
            raise
        # fc1abe4 deadlocked here (release="group" held finished members' allocations); the new scheduler
        # gives them back (`_release_held`) and must complete every request
        new, sch = _run(EcoServeScheduler, EcoServeOptions, reqs, limits, opts)
        assert (new.requests["generated_tokens"] == new.requests["output_tokens"]).all()
        return sch
    new, sch = _run(EcoServeScheduler, EcoServeOptions, reqs, limits, opts)
    plans = [(b.items, b.evict, b.swap_out, b.swap_in) for b in new.schedule.batches]
    assert plans == [(b.items, b.evict, b.swap_out, b.swap_in) for b in old.schedule.batches]
    assert sch.stats.ledger_per_iteration == ref.stats.ledger_per_iteration
    assert sch.stats.preemptions == ref.stats.preemptions
    a, b = sch.stats.jct_parts(), ref.stats.jct_parts()
    assert list(a.index) == list(b.index)
    assert np.allclose(a.to_numpy(), b[a.columns].to_numpy(), rtol=1e-9, atol=1e-9)
    return sch


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_cases())
def test_plans_equal_the_reference(case):
    _same_plans(case)


def test_plans_equal_the_reference_under_kv_pressure_with_many_waiting():
    # Long prompts, a small cache and a burst: PTs pile up, free KV runs out, slack buckets fall while
    # requests wait, and deadlock breaking evicts; every variant.
    rng = np.random.default_rng(0)
    reqs = [Request(i, float(i // 8) * 0.3, int(rng.integers(200, 600)), int(rng.integers(1, 200)),
                    predicted_output_tokens=int(rng.integers(1, 250))) for i in range(80)]
    for switches in VARIANT_SWITCHES:
        for block in (1, 16):
            _same_plans((reqs, Limits(C=512, M=2500, block_size=block), switches))


def test_group_release_deadlock_is_broken():
    """Found by the equivalence test: with release="group", the finished members' allocations fill the ledger,
    the lone running GT (request 13, I=1, O=115) cannot grow and no waiting request holds KV. fc1abe4 raised
    here; the held allocations are now given back and every request finishes."""
    spec = [(1, 1, None)] * 12 + [(62, 98, None), (1, 115, None)] + [(1, 1, None)] * 13 + [(1, 1, 1)] + [(1, 1, None)] * 4
    reqs = [Request(i, 0.0, a, b, predicted_output_tokens=p) for i, (a, b, p) in enumerate(spec)]
    limits = Limits(C=8, M=304)
    opts = {"ordering": False, "pipelining": False, "release": "group", "predictor_seed": 2}
    try:
        _run(RefScheduler, RefOptions, reqs, limits, opts)
        raise AssertionError("the reference no longer deadlocks: this regression case lost its point")
    except AssertionError as exc:
        assert DEADLOCK in str(exc)
    new, _ = _run(EcoServeScheduler, EcoServeOptions, reqs, limits, opts)
    assert (new.requests["generated_tokens"] == new.requests["output_tokens"]).all()


class _Fc1abe4DeadlockRule(RefScheduler):
    livelock_guard = False


def test_plans_equal_the_reference_where_the_livelock_guard_fires():
    """Found by the equivalence test (session 8): here the PT deadlock breaking's livelock guard (f32cc2a) fires, and
    at plan 403 it evicts three residents where fc1abe4's rule evicted one. The reference carries the guard
    (ecoserve_reference.py), so the plans agree; with the guard off they differ, so the case keeps exercising it."""
    rows = [(0.0, 87, 58, None), (0.2, 176, 185, 303), (0.7, 99, 222, 64), (1.2, 100, 127, 1), (1.7, 147, 300, None),
            (1.7, 100, 167, None), (1.7, 56, 144, None), (1.7, 111, 69, 235), (1.9, 216, 242, None), (1.95, 13, 8, None),
            (2.15, 48, 5, None), (2.15, 298, 88, None), (2.15, 271, 2, None), (2.65, 267, 185, None),
            (2.65, 203, 101, 316), (2.65, 2, 181, None), (2.6599999999999997, 147, 94, 187),
            (3.1599999999999997, 213, 84, 372), (3.36, 5, 116, None), (3.4099999999999997, 51, 258, 292),
            (4.91, 100, 208, None), (4.92, 17, 39, None), (4.93, 223, 243, None), (5.13, 72, 27, None),
            (5.13, 1, 159, 162), (5.13, 228, 99, None), (5.63, 47, 246, None), (5.63, 144, 164, None),
            (5.83, 4, 48, None), (5.83, 169, 125, None), (5.84, 26, 181, 30), (6.34, 196, 145, None),
            (6.34, 108, 1, None), (6.84, 111, 52, None), (8.34, 65, 216, None), (8.34, 47, 68, 256),
            (8.84, 148, 230, None), (8.84, 139, 147, 16), (8.84, 191, 171, None)]
    reqs = [Request(i, a, p, o, predicted_output_tokens=pred) for i, (a, p, o, pred) in enumerate(rows)]
    limits = Limits(C=241, M=502, Rmax=6)
    opts = {"pipelining": False, "regroup": "pad", "release": "group", "admit_on": "free", "reserve": 0.03,
            "predictor_seed": 1}
    _same_plans((reqs, limits, opts))
    new, _ = _run(EcoServeScheduler, EcoServeOptions, reqs, limits, opts)
    old, _ = _run(_Fc1abe4DeadlockRule, RefOptions, reqs, limits, opts)
    assert [b.evict for b in new.schedule.batches] != [b.evict for b in old.schedule.batches]
