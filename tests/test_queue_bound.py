"""The queued-completions bound for online arrivals (solvers/queue_bound.py, docs/design.md).

Checked independently of the code under test: SRPT's k-th finish against the earliest time any k jobs can be
done, found by enumerating every subset (Schrage's theorem, which the bound relies on); the grid rounding
against its definition; and the whole bound against simulated schedules and searched schedules on bursty
online workloads, where it must also be what lifts the bound above the other ingredients."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infermax.costmodel import load_cost_model
from infermax.engine import simulate
from infermax.limits import Limits
from infermax.request import Request
from solvers import Objective
from solvers.lower_bound import LowerBounder
from solvers.queue_bound import fine_classes, srpt_finish_times


def _earliest_all_done_s(release: list[float], work: list[float]) -> float:
    """One machine of rate 1 doing exactly these jobs: with no idling while work is released, it is done at
    max over release times t of (t + the work released at or after t) (independent of the order)."""
    return max(t + sum(w for r, w in zip(release, work) if r >= t) for t in release)


@st.composite
def jobs(draw):
    n = draw(st.integers(1, 7))
    release = [float(draw(st.integers(0, 12))) for _ in range(n)]
    work = [float(draw(st.integers(0, 6))) + draw(st.sampled_from([0.0, 0.5])) for _ in range(n)]
    return release, work


@given(jobs())
@settings(max_examples=200, deadline=None)
def test_srpt_kth_finish_is_the_earliest_any_k_jobs_can_be_done(case):
    release, work = case
    finish = srpt_finish_times(np.array(release), np.array(work))
    n = len(release)
    assert (np.diff(finish) >= 0).all()
    for k in range(1, n + 1):
        best = min(_earliest_all_done_s([release[i] for i in subset], [work[i] for i in subset])
                   for subset in itertools.combinations(range(n), k))
        assert finish[k - 1] == pytest.approx(best, abs=1e-9), f"k={k}"


def test_srpt_hand_case():
    # job 0 (work 10) at 0; job 1 (work 1) at 2 preempts it: finishes at 3, job 0 at 11
    assert srpt_finish_times(np.array([0.0, 2.0]), np.array([10.0, 1.0])).tolist() == [3.0, 11.0]


@given(st.lists(st.tuples(st.integers(1, 20_000), st.integers(1, 5_000)), min_size=1, max_size=50))
@settings(max_examples=100, deadline=None)
def test_fine_classes_round_down_by_at_most_the_grid_step(pairs):
    prompt, output = (np.array(x) for x in zip(*pairs))
    classes, which = fine_classes(prompt, output, exact_up_to=0)
    got = classes[which]
    assert (got[:, 0] <= prompt).all() and (got[:, 1] <= output).all()
    assert (got >= 1).all()
    for values, rounded in ((prompt, got[:, 0]), (output, got[:, 1])):
        exact = values <= 64
        assert (rounded[exact] == values[exact]).all()
        assert (values <= np.floor(rounded * (1 + 1 / 64)) + 1).all()  # within one grid step
    assert len(np.unique(classes, axis=0)) == len(classes)
    classes, which = fine_classes(prompt, output)  # at most EXACT_CLASSES_MAX distinct pairs: each its own
    assert (classes[which] == np.stack([prompt, output], axis=1)).all()
    assert len(np.unique(classes, axis=0)) == len(classes)


COST = load_cost_model(kind="linear")


def _burst(n: int, gap_s: float, seed: int) -> list[Request]:
    rng = np.random.default_rng(seed)
    return [Request(i, i * gap_s, int(rng.integers(16, 400)), int(rng.integers(2, 120))) for i in range(n)]


@pytest.mark.parametrize("seed", [0, 1])
def test_queued_bound_lifts_an_overloaded_online_instance(seed):
    """Arrivals faster than the machine can serve them: the queue grows, and the queued bound (not the
    per-request or release-cut order statistics) sets the latency bound; it stays below every schedule."""
    reqs = _burst(200, 0.02, seed)
    limits = Limits(C=512, M=6000)
    lb = LowerBounder(reqs, limits, COST).latency_sum_s()
    parts = lb.parts
    assert parts["queued_sum_s"] > 1.2 * parts["order_statistic_sum_s"]
    assert lb.value_s >= parts["queued_sum_s"] * (1 - 1e-6)
    for name in ("vllm", "sarathi", "sarathi-pc", "rank-i-ef"):
        got = Objective(latency=1).value(simulate(reqs, name, limits, COST))
        assert lb.value_s <= got, name


def test_queued_bound_without_budget_is_smaller_and_still_a_bound():
    reqs = _burst(200, 0.02, 2)
    limits = Limits(C=512, M=6000)
    full = LowerBounder(reqs, limits, COST).latency_sum_s()
    rushed = LowerBounder(reqs, limits, COST, queue_budget_s=0.0).latency_sum_s()
    assert rushed.parts["queued_sum_s"] <= full.parts["queued_sum_s"] * (1 + 1e-9)
    assert rushed.value_s <= Objective(latency=1).value(simulate(reqs, "sarathi", limits, COST))


@st.composite
def bursty(draw):
    n = draw(st.integers(2, 24))
    gap = draw(st.sampled_from([0.0005, 0.002, 0.01, 0.05]))
    reqs = [Request(i, i * gap * draw(st.sampled_from([0, 1, 1, 3])), draw(st.integers(1, 300)),
                    draw(st.integers(1, 60))) for i in range(n)]
    reqs = [Request(i, t, I, O) for i, (t, I, O) in enumerate(sorted((r.arrival_s, r.prompt_tokens,
                                                                     r.output_tokens) for r in reqs))]
    peak = max(r.peak_kv_tokens for r in reqs)
    block = draw(st.sampled_from([1, 16]))
    M = draw(st.integers(-(-peak // block) * block, 4 * peak))
    Rmax = draw(st.one_of(st.none(), st.integers(1, 8)))
    return reqs, Limits(C=draw(st.integers(peak, 1024)), M=M, Rmax=Rmax, block_size=block)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bursty(), st.sampled_from(["vllm", "sarathi", "sarathi-pc-ef", "rank-o", "vllm-v1"]))
def test_bound_below_schedulers_on_bursty_arrivals(case, scheduler):
    reqs, limits = case
    result = simulate(reqs, scheduler, limits, COST)
    bounder = LowerBounder(reqs, result.schedule.limits, COST)
    for objective in (Objective(latency=1), Objective(ttft=1)):
        assert bounder.of(objective).value_s <= objective.value(result) * (1 + 1e-9) + 1e-12, objective
