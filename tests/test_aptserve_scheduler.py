"""Apt-Serve's per-iteration decisions on hand-worked states, its variants, and end-to-end validity."""

from __future__ import annotations

import pytest
from conftest import AffineCost

from infermax.costmodel import load_cost_model
from infermax.engine import simulate
from infermax.limits import Limits
from infermax.replay import Replayer, replay
from infermax.request import Request
from infermax.schedule import ScheduledBatch
from infermax.schedulers import make_scheduler
from infermax.schedulers.aptserve import AptServeOptions, AptServeScheduler, rho_from_cost_model
from infermax.workload import sampled, with_arrivals


def waiting_pair(options=AptServeOptions(), name="aptserve"):
    # A (I=8) and B (I=2) waiting since t=0; M = 8, so A in KV and B cannot both fit.
    limits = Limits(C=16, M=8)
    rp = Replayer([Request(0, 0.0, 8, 2), Request(1, 0.0, 2, 2)], limits, AffineCost())
    sch = AptServeScheduler(limits, AffineCost(), options, name)
    sch.add_arrivals(list(rp.states.values()))
    return sch.next_batch(4.0)


def test_adaptive_hybrid_prefill_by_hand():
    # rho = 0 (the affine model charges no recompute); p = 4 for both. Items by density, ties in queue
    # order: B hidden (4/1), A hidden (4/4), A upgrade (0/4: 1+4+4 > 8, stop). V = 4 + 4 > V' = 4.
    batch = waiting_pair()
    assert batch.items == [(1, 2), (0, 8)] and batch.hidden == frozenset({0, 1})


def test_adaptive_with_rho_by_hand():
    # rho = 0.1, N = 2: A hidden value 4 - 2*0.1*8 = 2.4 (density 0.6 >= p/m = 0.5, offered), B hidden
    # 4 - 0.4 = 3.6; upgrades both 0.4 dense, A's first (queue order) and it does not fit (1+4+4 > 8):
    # both hidden, V = 6.0 > A alone in KV (4).
    batch = waiting_pair(AptServeOptions(rho=0.1))
    assert batch.items == [(1, 2), (0, 8)] and batch.hidden == frozenset({0, 1})
    # rho = 0.3: A hidden 4 - 4.8 < 0 -> KV only (density 0.5); B hidden 2.8 (2.8/1 >= 2): B hidden,
    # B upgrade (1.2), then A (8 units) does not fit: V = 4 vs A alone 4 -> keep {B in KV}.
    assert waiting_pair(AptServeOptions(rho=0.3)).items == [(1, 2)]


def test_kv_only_and_fcfs_ablations_by_hand():
    kv = waiting_pair(AptServeOptions(hybrid=False))  # B (density 2) then A does not fit; V = 4 = V'
    assert kv.items == [(1, 2)] and not kv.hidden
    fcfs = waiting_pair(AptServeOptions(adaptive=False))  # queue order: A fits in KV, B fits in neither form
    assert fcfs.items == [(0, 8)] and not fcfs.hidden


def test_decode_iteration_preempts_unselected_and_form_changes():
    # A and B hold 4 KV tokens each (decode phase); M = 9 cannot hold both at 5. Last tokens at 1 and
    # 2, now 3: p = 2 and 1, running urgency 3 > 0 waiting -> decode. rho = 0: hidden steps A (2/3),
    # B (1/3), A upgrade (0/2), B upgrade does not fit: A stays KV and decodes, B was chosen hidden, a
    # form change: preempted (recompute), as the authors' code does.
    limits = Limits(C=16, M=9)
    rp = Replayer([Request(0, 0.0, 4, 3), Request(1, 0.0, 4, 3)], limits, AffineCost())
    rp.apply(ScheduledBatch(items=[(0, 4), (1, 4)]))
    sch = AptServeScheduler(limits, AffineCost())
    states = list(rp.states.values())
    sch.add_arrivals(states)
    sch.batch_done(rp.batches[-1], [])
    for s, t in zip(states, (1.0, 2.0)):
        s.last_token_s = t
    batch = sch.next_batch(3.0)
    assert batch.items == [(0, 1)] and batch.evict == [1]


def test_slo_violators_are_demoted():
    # As above with rho = 0.1, but B's TTFT target (1 s) is already missed at t=4, so N = 1. B gets a
    # near-zero KV-only value; A: hidden 4 - 0.8 = 3.2 (density 0.8), upgrade 0.8/4 = 0.2, then B (2
    # units) no longer fits: A in KV, V = 4 > B alone (~0).
    limits = Limits(C=16, M=8)
    rp = Replayer([Request(0, 0.0, 8, 2), Request(1, 0.0, 2, 2, ttft_slo_s=1.0)], limits, AffineCost())
    sch = AptServeScheduler(limits, AffineCost(), AptServeOptions(rho=0.1))
    sch.add_arrivals(list(rp.states.values()))
    batch = sch.next_batch(4.0)
    assert batch.items == [(0, 8)] and not batch.hidden
    # Decay 0.4: B's KV value 1.6, hidden 0.4 * (4 - 0.2) = 1.52 (density 1.52 >= 0.8): B hidden, A
    # hidden (0.8), A's upgrade does not fit (1+4+4 > 8): V = 1.52 + 3.2 > A alone (4).
    decay = AptServeScheduler(limits, AffineCost(), AptServeOptions(rho=0.1, demotion="decay"))
    decay.add_arrivals(list(rp.states.values()))
    batch = decay.next_batch(4.0)
    assert batch.items == [(1, 2), (0, 8)] and batch.hidden == frozenset({0, 1})


def test_rho_from_the_fitted_model():
    linear = load_cost_model(kind="linear")
    a = linear.doc["per_layer_ms"]["non_attention"]["per_token"]
    share = 2 * 4096 / (4 * 4096 + 3 * 11008)
    assert rho_from_cost_model(linear) == pytest.approx(share * 32 * a / 1000)
    # The authors' value: the QKV projection (3/2 of K/V for multi-head attention) divided by 5.
    assert rho_from_cost_model(linear, "authors") == pytest.approx(share * 32 * a / 1000 * 1.5 / 5)
    assert rho_from_cost_model(AffineCost()) == 0.0


def test_grouped_query_models_are_refused_for_the_hybrid_cache():
    cm = load_cost_model("a100", "llama-2-70b", 4, kind="linear")
    with pytest.raises(ValueError, match="grouped-query attention"):
        make_scheduler("aptserve", Limits(), cm)
    make_scheduler("aptserve-kv", Limits(), cm)


@pytest.mark.parametrize("name", ["aptserve", "aptserve-kv", "aptserve-fcfs", "aptserve-decay", "aptserve-code",
                                  "aptserve-paper", "aptserve-authors-rho"])
def test_variants_replay_on_the_fitted_model(name):
    reqs = with_arrivals(sampled(60, "lognormal:200:1.0:1500", "lognormal:150:1.0:1000", seed=2), "gamma",
                         rate_per_s=12.0, cv=5.0, seed=2)
    reqs = [Request(r.id, r.arrival_s, r.prompt_tokens, r.output_tokens, 1.0, 0.2) for r in reqs]
    res = simulate(reqs, name, Limits(M=6000, block_size=16))
    again = replay(res.schedule, load_cost_model())
    assert again.summary == res.summary
    assert (res.requests.generated_tokens == res.requests.output_tokens).all()
    if name in ("aptserve-code", "aptserve-authors-rho"):
        assert res.summary["hidden_item_share"] > 0  # this load uses the hidden form


def test_a_request_whose_refill_would_exceed_c_is_not_preempted():
    # C = 8, M = 13, affine time 1 + tokens. B (I=1, O=4) arrives at 1 and is prefilled (t=3); A (I=7, O=4)
    # is prefilled at 3 (t=11); both decode at 11 and 14 (needs 2+8, 3+9 <= 13). At 17 they need 4 + 10 > 13
    # and both have p = 0 (density 0, running order): B fits, A is cut. Preempted, A would have to refill
    # 7 + 3 = 10 > C tokens, which no later batch can hold (no chunking): the plain greedy (the reference,
    # fc1abe4) fails there. A keeps its cache instead; B, refill 4 tokens, is preempted.
    from aptserve_reference import AptServeScheduler as Reference

    from infermax.schedulers.base import InfeasibleRequestError

    reqs = [Request(0, 2.0, 7, 4), Request(1, 1.0, 1, 4)]
    limits = Limits(C=8, M=13)
    res = simulate(reqs, AptServeScheduler(limits, AffineCost()), limits, AffineCost())
    batches = [(b.items, b.evict) for b in res.schedule.batches]
    assert batches == [([(1, 1)], []), ([(0, 7)], []), ([(1, 1), (0, 1)], []), ([(1, 1), (0, 1)], []),
                       ([(0, 1)], [1]), ([(1, 4)], [])]
    assert (res.requests.generated_tokens == res.requests.output_tokens).all()
    with pytest.raises(InfeasibleRequestError, match="refill after preemption"):
        simulate(reqs, Reference(limits, AffineCost()), limits, AffineCost())
