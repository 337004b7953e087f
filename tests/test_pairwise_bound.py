"""The pairwise-completions bound on the sum of latencies (solvers/pairwise_bound.py, docs/design.md).

Checked independently of the code under test: the linear minimisation against SciPy's LP solver, the
QP's certified value against the pair sum itself minimised by enumeration over every integer completion
profile, Pólya's criterion numerically, and the whole bound against simulated schedules."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

from infermax.costmodel import load_cost_model
from infermax.engine import simulate
from infermax.limits import Limits
from infermax.workload import fixed
from solvers.lower_bound import LowerBounder
from solvers.pairwise_bound import (FW_RELATIVE_GAP, RequestClass, class_qp_bound, cheapest_profile, joint_qp_bound,
                                    lower_convex_envelope, step_lower)


@st.composite
def costs_and_earliest(draw):
    J = draw(st.integers(1, 9))
    n = draw(st.integers(1, 6))
    cost = np.array(draw(st.lists(st.floats(-5, 5, allow_nan=False), min_size=J, max_size=J)))
    earliest = np.sort(np.array(draw(st.lists(st.integers(0, J - 1), min_size=n, max_size=n))))
    return cost, earliest


@given(costs_and_earliest())
@example((np.array([0.0, 0.0, 1e-9]), np.array([0, 0])))  # HiGHS answered 2e-9 here (within its tolerance)
@settings(max_examples=150, deadline=None)
def test_cheapest_profile_is_the_lp_optimum(case):
    """min cost·x over {x >= 0, Σx = n, prefix sums X_j <= #{k : earliest[k] <= j}}: the greedy equals HiGHS."""
    cost, earliest = case
    J, n = len(cost), len(earliest)
    x = cheapest_profile(cost, earliest)
    caps = np.array([np.sum(earliest <= j) for j in range(J)])
    assert x.sum() == n and (x >= 0).all()
    assert (np.cumsum(x) <= caps + 1e-9).all()
    lp = linprog(cost, A_ub=np.tril(np.ones((J, J))), b_ub=caps, A_eq=np.ones((1, J)), b_eq=[n], bounds=(0, None),
                 method="highs")
    assert lp.status == 0
    # HiGHS stops within its optimality tolerance (1e-7 per unit of mass), so its value may sit that far above
    # the exact minimum: a drawn cost of 1e-9 once gave 2e-9 against the exact 0.
    assert float(cost @ x) == pytest.approx(lp.fun, abs=1e-7 * n * max(1.0, float(np.abs(cost).max())))


@given(st.lists(st.floats(0, 100, allow_nan=False), min_size=2, max_size=40))
@settings(max_examples=150, deadline=None)
def test_lower_convex_envelope_is_convex_and_below(values):
    v = np.array(values)
    env = lower_convex_envelope(v)
    assert (env <= v + 1e-12).all()
    assert (np.diff(env, 2) >= -1e-9).all()


@given(st.lists(st.floats(0, 10, allow_nan=False), min_size=1, max_size=30), st.integers(1, 60))
@settings(max_examples=100, deadline=None)
def test_polya_kernel_is_positive_semidefinite(increments, size):
    """A convex non-increasing kernel ending at 0 gives a PSD Toeplitz matrix g(|i − j|): the QP is convex."""
    slopes = np.sort(np.array(increments))[::-1]  # decrements shrinking with d: convex
    kernel = np.concatenate([np.cumsum(slopes[::-1])[::-1], [0.0]])
    O = len(kernel) - 1
    d = np.abs(np.subtract.outer(np.arange(size), np.arange(size)))
    K = np.where(d <= O, kernel[np.minimum(d, O)], 0.0)
    assert np.linalg.eigvalsh(K).min() >= -1e-9 * max(1.0, kernel[0]) * size


def _pair_sum(beta: tuple, a0: float, kernel: np.ndarray) -> float:
    """The pairwise bound's right-hand side for completion batches beta, straight from its definition: per
    request a0·β_r, and per ordered pair (r, r') the work of r done by min(β_r, β_r'): all of it (kernel[0]) if
    r' finishes no earlier, else at least kernel[β_r − β_r'] (0 beyond the kernel)."""
    O = len(kernel) - 1
    total = a0 * sum(beta)
    for r, r2 in itertools.product(beta, beta):
        total += kernel[0] if r2 >= r else kernel[min(r - r2, O)]
    return total


@pytest.mark.parametrize("n,O,a0,ch", [
    (3, 4, 0.3, [0, 4, 4, 4]),
    (4, 3, 0.4, [0, 3, 3, 4, 5]),
    (5, 6, 1.0, [0, 6, 6, 6, 7, 8]),
    (4, 2, 0.5, [0, 2, 2, 2, 2]),
])
def test_qp_bound_below_every_integer_profile(n, O, a0, ch):
    """The certified QP value never exceeds the pair sum at any integer completion profile respecting ch (all
    of them enumerated up to the horizon the QP itself argues is enough, and a few batches more)."""
    marginal = np.linspace(1.0, 2.0, O) / O  # per-token work growing with the context: a convex M(d)
    kernel = np.concatenate([[marginal.sum()], [marginal[:O - d].sum() for d in range(1, O)], [0.0]])
    qp = class_qp_bound(n, a0, kernel, np.array(ch), budget_s=10)
    assert qp is not None and qp.lower_s <= qp.upper_s * (1 + 1e-9)
    horizon = qp.horizon + 3
    best = min(_pair_sum(beta, a0, kernel)
               for beta in itertools.combinations_with_replacement(range(1, horizon + 1), n)
               if all(b >= ch[k] for k, b in enumerate(sorted(beta), 1)))
    assert qp.lower_s <= best * (1 + 1e-9)
    assert qp.lower_s >= 0.8 * best  # the continuous relaxation is not far below the integer optimum here


def test_step_lower_takes_the_grid_point_above():
    assert step_lower([0, 2, 5], [9.0, 4.0, 0.0], 5).tolist() == [9.0, 4.0, 4.0, 0.0, 0.0, 0.0]


def test_pairwise_bound_certifies_decode_heavy_schedules():
    """Fig. 12's I = 1, O = 1,024, B = 32 (paper's linear model): the earlier bounds left 35% between the best
    schedule found and the bound; the pairwise bound is below every simulated schedule and within 5% of the best."""
    cost, limits = load_cost_model(kind="linear"), Limits(C=4096, M=100_000)
    reqs = fixed(1, 1024, 32)
    lb = LowerBounder(reqs, limits, cost).latency_sum_s()
    sums = {s: simulate(reqs, s, limits, cost).summary["mean_latency_s"] * len(reqs)
            for s in ("vllm", "vllm-ef", "sarathi")}
    assert lb.value_s <= min(sums.values())
    assert lb.parts["pairwise_sum_s"] == pytest.approx(lb.value_s, rel=1e-12)
    assert min(sums.values()) / lb.value_s - 1 <= 0.05
    assert lb.parts["pipelined_sum_s"] < 0.8 * lb.value_s


@given(st.lists(st.tuples(st.integers(1, 200), st.floats(0, 1, allow_nan=False)), min_size=1, max_size=8),
       st.integers(1, 256), st.floats(0, 2, allow_nan=False))
@settings(max_examples=200, deadline=None)
def test_linearised_steps_stay_below_the_step_sum(steps, max_tokens, shift):
    """α·n − β never exceeds Σ s_t·[n > t] for any n in 1..max_tokens, and no larger α would do."""
    from solvers.cost_terms import _linearised_steps

    alpha = _linearised_steps(steps, max_tokens, shift)
    S = [sum(s for t, s in steps if n > t) for n in range(1, max_tokens + 1)]
    slack = [S[n - 1] - (alpha * n - shift) for n in range(1, max_tokens + 1)]
    assert min(slack) >= -1e-9
    assert min(slack) <= 1e-9 * max(1.0, max(S) + shift)  # tight somewhere: α is the largest such slope


def test_step_model_latency_bound_below_schedules():
    """The default (fitted, step) cost model: linearising its token steps raises the latency bound, which stays
    below every simulated schedule."""
    cost, limits = load_cost_model(), Limits(C=4096, M=100_000)
    reqs = fixed(512, 128, 64)
    lb = LowerBounder(reqs, limits, cost).latency_sum_s()
    sums = [simulate(reqs, s, limits, cost).summary["mean_latency_s"] * len(reqs)
            for s in ("vllm", "sarathi", "vllm-ef")]
    assert lb.value_s <= min(sums)
    assert lb.parts["pairwise_sum_s"] > 1.05 * lb.parts["order_statistic_sum_s"]


def test_a_spent_budget_still_gives_a_bound():
    """With no time for Frank–Wolfe, one certificate is still a valid bound, no larger than the full one."""
    cost, limits = load_cost_model(kind="linear"), Limits(C=4096, M=100_000)
    reqs = fixed(1, 512, 64)
    full = LowerBounder(reqs, limits, cost).latency_sum_s().parts["pairwise_sum_s"]
    rushed = LowerBounder(reqs, limits, cost, pairwise_budget_s=0.0).latency_sum_s().parts["pairwise_sum_s"]
    found = simulate(reqs, "vllm-ef", limits, cost).summary["mean_latency_s"] * len(reqs)
    assert rushed <= full * (1 + 1e-9) <= found


def _request_class(n: int, per_token: list[float], ch: list[int]) -> RequestClass:
    """n identical requests whose tokens cost ``per_token`` marginal work each (a convex, growing per-token cost
    keeps the envelope close to the partial sums), completing by ``ch``."""
    O = len(per_token)
    partial = np.array([sum(per_token[:O - d]) for d in range(O + 1)])
    return RequestClass(n, lower_convex_envelope(partial), partial, np.array(ch))


def _mixed_pair_sum(beta: list[tuple[int, int]], a0: float, classes: list[RequestClass]) -> float:
    """The pairwise right-hand side for requests (class, completion batch), straight from its definition: per
    request a0·β_r; per ordered pair (r, r') the work of r done by min(β_r, β_r'): all of it if r' finishes no
    earlier, else at least partial_r[β_r − β_r'] (0 beyond O_r)."""
    total = a0 * sum(b for _, b in beta)
    for (c, b), (c2, b2) in itertools.product(beta, beta):
        partial = classes[c].partial
        total += partial[0] if b2 >= b else partial[min(b - b2, len(partial) - 1)]
    return total


MIXES = [  # (a0, classes as (n, per-token work, ch))
    (0.3, [(2, [1.0, 0.1, 0.1], [0, 3, 3]), (2, [0.1, 0.1, 0.1], [0, 3, 3])]),
    (0.5, [(2, [2.0, 0.2, 0.2, 0.3], [0, 4, 4]), (1, [0.2, 0.1], [0, 2]), (1, [0.5, 0.5, 0.5], [0, 3])]),
    (0.2, [(3, [1.0, 0.3], [0, 2, 2, 3]), (2, [0.1, 0.1, 0.1, 0.1], [0, 4, 4])]),
    (1.0, [(1, [3.0, 1.0, 1.0], [0, 3]), (1, [1.0, 1.0, 1.0], [0, 3]), (2, [0.4, 0.4], [0, 2, 2])]),
]


@pytest.mark.parametrize("a0,spec", MIXES)
def test_joint_qp_below_every_integer_profile(a0, spec):
    """Several classes: the certified joint value never exceeds the pair sum at any integer assignment of
    completion batches respecting each class's ch (enumerated up to a few batches past the QP's own horizon),
    and it is at least the separate classes' QPs plus min(w) per cross pair (the cross kernels only add)."""
    classes = [_request_class(*c) for c in spec]
    joint = joint_qp_bound(classes, a0, budget_s=10)
    assert joint is not None and joint.lower_s <= joint.upper_s * (1 + 1e-9)
    horizon = min(joint.horizon + 2, 9)
    choices = []
    for c in classes:  # every sorted completion tuple of the class respecting its ch
        choices.append([beta for beta in itertools.combinations_with_replacement(range(1, horizon + 1), c.n)
                        if all(b >= c.ch[k] for k, b in enumerate(beta, 1))])
    best = min(_mixed_pair_sum([(c, b) for c, betas in enumerate(combo) for b in betas], a0, classes)
               for combo in itertools.product(*choices))
    assert joint.lower_s <= best * (1 + 1e-9)
    separate = sum(class_qp_bound(c.n, a0, c.kernel, c.ch, budget_s=10).lower_s for c in classes)
    separate += sum(a.n * b.n * min(a.kernel[0], b.kernel[0]) for a, b in itertools.combinations(classes, 2))
    assert joint.lower_s >= separate - 2 * FW_RELATIVE_GAP * joint.upper_s  # both stop at that certified gap


def test_joint_operator_is_positive_semidefinite():
    """The block operator the bound minimised (diagonal blocks: the classes' kernels; off-diagonal: the cross
    kernels it reports), built densely over its horizon, has no eigenvalue below the round-off margin, and every
    cross kernel stays below the pair's excess over min(w) from the definition: when a's request finishes d
    batches after b's, b's whole work plus a's work of all but d tokens (both whole at d = 0)."""
    positive = 0
    for a0, spec in MIXES + [(0.6, [(3, [2.0] * 6, [0, 6, 6, 6]), (3, [0.05] * 2, [0, 2, 2, 2]),
                                     (2, [1.0, 0.2, 0.2, 0.2], [0, 4, 4])])]:
        classes = [_request_class(*c) for c in spec]
        joint = joint_qp_bound(classes, a0, budget_s=1)
        J, C = joint.horizon, len(classes)
        d = np.subtract.outer(np.arange(J), np.arange(J))
        Q = np.zeros((C * J, C * J))
        for i in range(C):
            kernel = classes[i].kernel
            Q[i * J:(i + 1) * J, i * J:(i + 1) * J] = np.where(np.abs(d) < len(kernel),
                                                                 kernel[np.minimum(np.abs(d), len(kernel) - 1)], 0)
        for (i, j), q in joint.cross_kernels.items():
            pi, pj = classes[i].partial, classes[j].partial
            wi, wj = pi[0], pj[0]
            for t in range(-(J - 1), J):
                if t > 0:
                    excess = (pi[t] if t < len(pi) else 0.0) + wj
                elif t < 0:
                    excess = wi + (pj[-t] if -t < len(pj) else 0.0)
                else:
                    excess = wi + wj
                assert q[t + J - 1] <= excess - min(wi, wj) + 1e-9 * max(wi, wj)
            block = q[d + J - 1]
            Q[i * J:(i + 1) * J, j * J:(j + 1) * J] = block
            Q[j * J:(j + 1) * J, i * J:(i + 1) * J] = block.T
            positive += joint.cross_share[i, j] > 0 and q.max() > 0
        assert np.linalg.eigvalsh(Q).min() >= -max(0.0, -joint.min_eigenvalue) - 1e-9 * np.abs(Q).max() * J
    assert positive >= 4  # the cross kernels are not all switched off


def test_joint_bound_lifts_a_mixed_instance():
    """A.3's LISO+SISO mix at B = 16 (seven (I, O) classes, paper's linear model): taking the cross pairs' early
    work into account raises the pairwise bound by more than 5%, and it stays below every registered
    Algorithm-1 scheduler's sum of latencies."""
    import solvers.lower_bound as lower_bound
    from infermax.workload import heterogeneous_mix

    cost, limits = load_cost_model(kind="linear"), Limits(C=4096, M=100_000)
    reqs = heterogeneous_mix("LISO+SISO", 16, seed=0)
    joint = LowerBounder(reqs, limits, cost).latency_sum_s()
    try:
        lower_bound.JOINT_PAIRWISE = False
        separate = LowerBounder(reqs, limits, cost).latency_sum_s()
    finally:
        lower_bound.JOINT_PAIRWISE = True
    assert joint.parts["pairwise_sum_s"] > 1.05 * separate.parts["pairwise_sum_s"]
    for s in ("vllm", "vllm-ef", "sarathi", "sarathi-pc", "rank-i-ef", "rank-o"):
        assert joint.value_s <= simulate(reqs, s, limits, cost).summary["mean_latency_s"] * len(reqs)
