"""EcoServe's deadlock breaking between prompts (ours: the paper does not say) must not livelock."""

from __future__ import annotations

import pytest
from conftest import AffineCost
from ecoserve_reference import EcoServeScheduler as RefScheduler

from infermax.costmodel.swap import SwapCost
from infermax.engine import simulate
from infermax.limits import Limits
from infermax.request import Request
from infermax.schedulers.ecoserve import EcoServeScheduler


def test_pt_deadlock_breaking_does_not_livelock():
    """Found on the full Azure conversation trace (EcoServe, from plan ~270,000 on: nothing running, the
    cache full of partial prompts, two PTs evicting each other forever, each given a chunk too small to
    finish its prompt) and reproduced here on 12 requests: fc1abe4's deadlock breaking (kept in
    ecoserve_reference.py) livelocks, and the engine stops it after as many token-less plans as the
    workload has tokens. When a plan's deadlock breaking would evict the PT the previous one rescued
    without it having progressed, residents are evicted until a prompt completes (or the chunks fill
    the token budget); every request then finishes."""
    rows = [(0.0, 50, 10, 21), (0.1, 118, 18, 37), (1.0, 54, 28, 39), (0.3, 111, 17, 25), (0.0, 78, 14, 13),
            (0.0, 62, 40, 40), (3.0, 43, 26, 3), (3.5, 101, 30, 30), (0.0, 110, 30, 40), (4.5, 26, 33, 38),
            (5.0, 60, 30, 34), (0.0, 24, 27, 15)]
    reqs = [Request(i, a, p, o, predicted_output_tokens=pred) for i, (a, p, o, pred) in enumerate(rows)]
    limits, cost, swap = Limits(C=117, M=140), AffineCost(0.01, 0.001), SwapCost(per_token_s=1e-4)
    old_rule = RefScheduler(limits, cost)
    old_rule.livelock_guard = False
    with pytest.raises(Exception, match="livelocked"):
        simulate(reqs, old_rule, limits, cost, swap_cost=swap)
    result = simulate(reqs, EcoServeScheduler(limits, cost), limits, cost, swap_cost=swap)
    assert (result.requests["generated_tokens"] == result.requests["output_tokens"]).all()
