"""A hypothesis strategy shared by the online latency-bound tests: online workloads under load."""

from __future__ import annotations

import random

from hypothesis import strategies as st

from infermax.limits import Limits
from infermax.request import Request


@st.composite
def loaded_online(draw, sizes=(10, 40), gaps=(0.005, 0.02, 0.06), min_output=2, m_factors=(2, 8)):
    """``(requests, limits)``: between ``sizes`` requests with Poisson gaps of a mean drawn from ``gaps``, prompts of
    8-256 and outputs of ``min_output``-48 tokens; block size 1 or 16; ``M`` a factor from ``m_factors`` times the
    largest request's peak KV (1: evictions likely), or 100K; ``Rmax`` none, 4 or 16; C = 2,048."""
    rng = random.Random(draw(st.integers(0, 10**6)))
    n = draw(st.integers(*sizes))
    gap = draw(st.sampled_from(list(gaps)))
    t, reqs = 0.0, []
    for i in range(n):
        t += rng.expovariate(1 / gap)
        reqs.append(Request(i, t, rng.randint(8, 256), rng.randint(min_output, 48)))
    block = draw(st.sampled_from([1, 16]))
    peak = max(-(-r.peak_kv_tokens // block) * block for r in reqs)
    M = draw(st.sampled_from([peak * f for f in m_factors] + [100_000]))
    Rmax = draw(st.sampled_from([None, 4, 16]))
    return reqs, Limits(C=2048, M=max(M, peak), Rmax=Rmax, block_size=block)
