"""Apt-Serve's greedy against the exact hybrid-cache knapsack optimum (brute force over 3^n choices)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from infermax.schedulers.aptserve_greedy import Candidate, greedy_select, marginal_items


def brute_force(cands, capacity):
    """Best total value over every (none / hidden / KV) choice per request that fits ``capacity``."""
    best = 0.0
    for choice in itertools.product((None, "hidden", "kv"), repeat=len(cands)):
        size = value = 0
        ok = True
        for c, form in zip(cands, choice):
            if form == "kv":
                size, value = size + c.kv_size, value + c.kv_value
            elif form == "hidden":
                if c.hidden_value is None:
                    ok = False
                    break
                size, value = size + c.hidden_size, value + c.hidden_value
        if ok and size <= capacity:
            best = max(best, value)
    return best


@st.composite
def instances(draw):
    """Apt-Serve candidates: p >= 0, m >= 1, hidden = ceil(m/2) with value p - N*rho*m."""
    n_rho = draw(st.sampled_from([0.0, 0.001, 0.01, 0.05]))
    cands = []
    for i in range(draw(st.integers(1, 6))):
        m = draw(st.integers(1, 20))
        p = draw(st.floats(0.0, 5.0))
        cands.append(Candidate(i, p, m, p - n_rho * m, -(-m // 2)))
    return cands, draw(st.integers(1, 60))


def value_of(sel, cands):
    by_key = {c.key: c for c in cands}
    return sum(by_key[k].kv_value if f == "kv" else by_key[k].hidden_value for k, f in sel.forms.items())


@settings(max_examples=400, deadline=None)
@given(instances())
def test_greedy_is_feasible_and_within_2x_of_the_optimum(case):
    cands, capacity = case
    sel = greedy_select(cands, capacity)
    by_key = {c.key: c for c in cands}
    used = sum(by_key[k].kv_size if f == "kv" else by_key[k].hidden_size for k, f in sel.forms.items())
    assert used == sel.used <= capacity
    assert sel.value == pytest.approx(value_of(sel, cands))
    opt = brute_force(cands, capacity)
    assert sel.value <= opt + 1e-9
    assert 2 * sel.value >= opt - 1e-9


@settings(max_examples=200, deadline=None)
@given(instances())
@example(([Candidate(0, 0.45, 3, 0.3, 2)], 3))  # equal hidden/upgrade densities, rounded apart
def test_greedy_is_optimal_when_everything_fits(case):
    # Theorem 1's LP bound is tight when no item is cut: all requests fit in KV form.
    cands, _ = case
    capacity = sum(c.kv_size for c in cands)
    sel = greedy_select(cands, capacity)
    assert sel.forms == {c.key: "kv" for c in cands}
    assert sel.value == pytest.approx(brute_force(cands, capacity))


@settings(max_examples=300, deadline=None)
@given(instances())
# Found by Hypothesis: hidden and upgrade densities equal (0.3/2 and 0.15/1) but rounded apart, which
# once sorted the upgrade before its hidden step.
@example(([Candidate(0, 1.0, 1, 0.95, 1), Candidate(1, 1.0, 1, 0.95, 1), Candidate(2, 0.45, 3, 0.3, 2)], 1))
@example(([Candidate(0, 0.45, 3, 0.3, 2)], 1))
def test_greedy_is_optimal_when_it_fills_memory_before_the_first_cut(case):
    # Equality case of the proof: if the items taken before the first one that does not fit use the
    # capacity exactly, no item is fractional in the LP optimum, so greedy = LP = integer optimum.
    cands, _ = case
    items = sorted(((-t, i, r, size) for i, c in enumerate(cands) for r, (t, size, _) in enumerate(marginal_items(c))))
    prefix = 0
    for k, (_, _, _, size) in enumerate(items[:-1]):
        prefix += size
        sel = greedy_select(cands, prefix)
        if not sel.single:
            assert sel.used == prefix
            assert sel.value == pytest.approx(brute_force(cands, prefix))


def test_single_item_check_picks_the_big_request():
    # A (density 1.1) is taken first; B (density 1.0, worth 10) no longer fits: S' = {B} is optimal.
    cands = [Candidate("A", 1.1, 1), Candidate("B", 10.0, 10)]
    sel = greedy_select(cands, 10)
    assert sel.single and sel.forms == {"B": "kv"} and sel.value == 10.0
    without = greedy_select(cands, 10, double_check=False)
    assert without.forms == {"A": "kv"} and without.value == pytest.approx(1.1)


def test_marginal_items_hand_computed():
    # p = 4, m = 8, N*rho = 0.1: hidden value 4 - 0.8 = 3.2 on 4 units (theta 0.8), upgrade 0.8 on 4
    # units (theta 0.2 = 2*N*rho); KV-only density p/m = 0.5 <= 0.8, so hidden is offered.
    items = marginal_items(Candidate(0, 4.0, 8, 3.2, 4))
    assert [(round(t, 12), s, k) for t, s, k in items] == [(0.8, 4, "hidden"), (0.2, 4, "upgrade")]
    # p = 1: hidden value 0.2, density 0.05 < p/m = 0.125 -> KV only (p < 2*N*rho*m).
    assert marginal_items(Candidate(0, 1.0, 8, 0.2, 4)) == [(0.125, 8, "kv")]
    # m = 1: the hidden form is no smaller -> KV only.
    assert marginal_items(Candidate(0, 1.0, 1, 1.0, 1)) == [(1.0, 1, "kv")]


def test_hidden_form_when_only_half_fits():
    # Two requests p = 4, m = 8, hidden 4 units (N*rho = 0.1) and capacity 12: hidden steps (0.8)
    # first, one upgrade (0.2) fits -> one KV + one hidden, value 4 + 3.2 = 7.2 = optimum.
    cands = [Candidate(0, 4.0, 8, 3.2, 4), Candidate(1, 4.0, 8, 3.2, 4)]
    sel = greedy_select(cands, 12)
    assert sel.forms == {0: "kv", 1: "hidden"} and sel.value == pytest.approx(7.2)
    assert brute_force(cands, 12) == pytest.approx(7.2)


def test_admit_stops_the_greedy():
    cands = [Candidate(i, 1.0 + i, 1) for i in range(4)]
    sel = greedy_select(cands, 100, admit=lambda key, n: n < 2)
    assert sel.forms == {3: "kv", 2: "kv"}
