"""Piecewise fitting, the MILP epigraph form, roofline terms and fitting an unseen Vidur-format folder."""

import json

import numpy as np
import pandas as pd
import pulp
import pytest

from solvers.formulation import add_padding_constraints
from infermax.costmodel import (AffinePiece, BatchFeatures, CostTerm, PiecewiseCostModel, available_combinations, load_cost_model,
                                profile_folder, roofline_model, terms_time_s)
from infermax.costmodel.base import features_frame, padded, padding_quantum, token_step
from infermax.costmodel.fitting import extend_past_grid, step_thresholds
from infermax.costmodel.hidden import kv_projection_share
from infermax.costmodel.maxaffine import MaxAffine, fit_max_affine, range_weights, select_model, select_pieces
from infermax.costmodel.measurements import NON_ATTENTION_OPS, read_measurements

PROFILE = profile_folder("a100", "llama-2-7b", 1)


def test_recovers_known_one_feature_pieces():
    # f(n) = max(9, 5 + 0.05 n, -20 + 0.07 n): a floor, then two slopes (kinks at n = 80 and 1250)
    n = np.arange(1, 4097, 7, dtype=float)
    y = np.maximum.reduce([np.full_like(n, 9.0), 5 + 0.05 * n, -20 + 0.07 * n])
    fitted = fit_max_affine(n, y, 3)
    order = np.argsort(fitted.slopes[:, 0])
    assert fitted.slopes[order, 0] == pytest.approx([0.0, 0.05, 0.07], abs=1e-9)
    assert fitted.intercepts[order] == pytest.approx([9.0, 5.0, -20.0], abs=1e-6)
    k, errors = select_pieces(n, y, np.ones(len(n)))
    assert k == 3 and errors[3] < 1e-6 < errors[2]


def test_recovers_known_two_feature_pieces():
    rng = np.random.default_rng(3)
    x = np.column_stack([rng.uniform(0, 1e5, 400), rng.integers(1, 512, 400)])
    y = np.maximum(0.2 + 0.001 * x[:, 1], 0.05 + 2e-5 * x[:, 0] + 0.0004 * x[:, 1])
    fitted = fit_max_affine(x, y, 2)
    order = np.argsort(fitted.slopes[:, 0])
    assert fitted.slopes[order] == pytest.approx(np.array([[0.0, 0.001], [2e-5, 0.0004]]), abs=1e-9)
    assert fitted.intercepts[order] == pytest.approx([0.2, 0.05], abs=1e-7)


def test_recovers_known_padded_pieces_and_cv_picks_padding_only_when_it_helps():
    # f(n) = max(6 + 0.001 n + 0.004 ⌈n/64⌉·64, 1 + 0.008 ⌈n/128⌉·128): 64-token steps, then a
    # steeper 128-token staircase (the pieces cross near n = 1650)
    n = np.arange(1, 4097, 3)
    x = np.column_stack([n, padded(n, 64), padded(n, 128)]).astype(float)
    y = np.maximum(6 + 0.001 * x[:, 0] + 0.004 * x[:, 1], 1 + 0.008 * x[:, 2])
    fitted = fit_max_affine(x, y, 2)
    order = np.argsort(fitted.intercepts)
    assert fitted.slopes[order] == pytest.approx(np.array([[0.0, 0.0, 0.008], [0.001, 0.004, 0.0]]), abs=1e-9)
    assert fitted.intercepts[order] == pytest.approx([1.0, 6.0], abs=1e-7)
    candidates = ((0,), (0, 1, 2))
    assert select_model(x, y, np.ones(len(n)), candidates).columns == (0, 1, 2)
    smooth = np.maximum(6 + 0.005 * x[:, 0], 1 + 0.008 * x[:, 0])  # no steps: the simpler subset wins
    assert select_model(x, smooth, np.ones(len(n)), candidates).columns == (0,)


def test_step_thresholds_follow_the_profiled_grid():
    """By hand: 32-token blocks hold 4 counts where the grid is every 8 tokens; where it is every 32, blocks
    widen to 128 tokens; the last block (896, 1024] has no 4 counts above it, so 1024 is no threshold."""
    grid = np.array([1, 2, 4] + list(range(8, 513, 8)) + list(range(544, 1025, 32)))
    assert step_thresholds(grid) == tuple(range(32, 513, 32)) + (640, 768, 896)
    assert step_thresholds(np.array([1, 2, 3])) == ()


def test_recovers_known_steps_and_cv_picks_steps_only_when_they_help():
    # f(n) = 5 + 0.004 n + 1.5 [n > 64] + 0.8 [n > 96] + 3 [n > 512]: jumps of different heights at tile boundaries
    n = np.array([1, 2, 4] + list(range(8, 1025, 8)))
    thresholds = step_thresholds(n)
    x = np.column_stack([n] + [n > t for t in thresholds]).astype(float)
    heights = {64: 1.5, 96: 0.8, 512: 3.0}
    y = 5 + 0.004 * n + sum(h * (n > t) for t, h in heights.items())
    fitted = fit_max_affine(x, y, 1)
    assert fitted.intercepts == pytest.approx([5.0], abs=1e-7)
    assert fitted.slopes[0] == pytest.approx([0.004] + [heights.get(t, 0.0) for t in thresholds], abs=1e-8)
    candidates = ((0,), tuple(range(x.shape[1])))
    assert select_model(x, y, np.ones(len(n)), candidates).columns == candidates[1]
    smooth = 5 + 0.006 * n  # no steps: the simpler subset wins
    assert select_model(x, smooth, np.ones(len(n)), candidates).columns == (0,)


def test_steps_continue_past_the_profiled_grid_at_their_average_rate():
    """By hand: f(n) = 1 + 0.01 n + 2 [n > 32] + 2 [n > 64] on a grid up to 96 tokens. Over [48, 96] it rises
    2 + 0.48 = 2.48, i.e. 2.48 / 48 per token; the added piece continues from f(96) = 5.96 at that rate,
    so f(192) = 5.96 + 96 · 2.48 / 48 = 10.92, and nothing changes up to 96 tokens."""
    features = ("n_tokens", "n_tokens_gt32", "n_tokens_gt64")
    fitted = MaxAffine(np.array([1.0]), np.array([[0.01, 2.0, 2.0]]))
    extended = extend_past_grid(fitted, features, 96)
    x = lambda n: np.array([[n, n > 32, n > 64]], dtype=float)  # noqa: E731
    assert extended.pieces == 2
    assert [extended.predict(x(n))[0] for n in range(1, 97)] == pytest.approx([fitted.predict(x(n))[0] for n in range(1, 97)])
    assert extended.predict(x(192))[0] == pytest.approx(10.92)
    assert fitted.predict(x(192))[0] == pytest.approx(6.92)  # without it: the 0.01 slope only
    flat = MaxAffine(np.array([1.0]), np.array([[0.01, 0.0, 0.0]]))  # no steps above 48: nothing to continue
    assert extend_past_grid(flat, features, 96).pieces == 1


def test_bundled_step_fits_grow_past_the_profiled_grid():
    """Every bundled non-attention fit keeps growing past 4,096 tokens at its own 2,048-4,096 rate (the steps
    alone would stop at the last threshold)."""
    for combo in available_combinations():
        term = next(t for t in load_cost_model(*combo, kind="piecewise").milp_terms() if t.name == "non_attention")
        f = {n: term.value_s(BatchFeatures(n_tokens=n)) for n in (2048, 4096, 8192)}
        assert f[8192] - f[4096] == pytest.approx(2 * (f[4096] - f[2048]), rel=1e-6), combo


def test_steps_by_hand_in_features_model_and_hidden_recompute():
    assert (BatchFeatures(n_tokens=64).n_tokens_gt64, BatchFeatures(n_tokens=65).n_tokens_gt64) == (0, 1)
    assert BatchFeatures(hidden_recompute_tokens=200).hidden_recompute_tokens_gt128 == 1
    terms = (CostTerm("non_attention", "n_tokens", (AffinePiece(1e-3, {"n_tokens": 1e-6, "n_tokens_gt64": 2e-3,
                                                                      "n_tokens_gt128": 5e-4}),)),)
    model = PiecewiseCostModel.from_terms(terms, family="piecewise", gpu="a100", model="llama-2-7b", tp=1)
    # 64 tokens: 1e-3 + 64e-6; 65: + 65e-6 + 2e-3; 200: + 200e-6 + 2e-3 + 5e-4
    times = [model.batch_time_s(BatchFeatures(n_tokens=n)) for n in (64, 65, 200)]
    assert times == pytest.approx([1.064e-3, 3.065e-3, 3.7e-3])
    frame = features_frame([BatchFeatures(n_tokens=n) for n in (64, 65, 200)])
    assert model.predict_s(frame) == pytest.approx(times)
    # the derived hidden-recompute term is share × the same staircase in the recompute row count
    hidden = next(t for t in model.milp_terms() if t.name == "hidden_recompute")
    share = kv_projection_share("llama-2-7b")
    assert dict(hidden.pieces[0].coef_s) == pytest.approx({"hidden_recompute_tokens": share * 1e-6,
                                                           "hidden_recompute_tokens_gt64": share * 2e-3,
                                                           "hidden_recompute_tokens_gt128": share * 5e-4})
    with_hidden = BatchFeatures(n_tokens=1, hidden_recompute_tokens=100)
    assert model.batch_time_s(with_hidden) == pytest.approx(1.001e-3 + share * (1e-3 + 100e-6 + 2e-3))


def test_recovers_known_capped_decode_pieces_and_cv_picks_the_cap():
    # decode batches of b sequences with m KV each: f = max(0.3 + 0.002 b + 0.0005 min(m, 512), 0.1 + 2e-5 b·m):
    # a floor that rises to a knee at 512 KV (split-KV), then bandwidth-bound in the total KV read
    b, m = (a.ravel().astype(float) for a in np.meshgrid([1, 2, 4, 8, 16, 32, 64, 128], np.arange(32, 5121, 160)))
    caps = (256, 512, 1024)
    x = np.column_stack([b * m, b] + [np.minimum(m, k) for k in caps])
    y = np.maximum(0.3 + 0.002 * b + 0.0005 * np.minimum(m, 512), 0.1 + 2e-5 * b * m)
    fitted = fit_max_affine(x[:, [0, 1, 3]], y, 2, nonneg_intercept=True)
    order = np.argsort(fitted.intercepts)
    assert fitted.slopes[order] == pytest.approx(np.array([[2e-5, 0.0, 0.0], [0.0, 0.002, 0.0005]]), abs=1e-9)
    assert fitted.intercepts[order] == pytest.approx([0.1, 0.3], abs=1e-7)
    candidates = ((0, 1), (0, 1, 2), (0, 1, 3), (0, 1, 4))
    assert select_model(x, y, np.ones(len(y)), candidates, nonneg_intercept=True).columns == (0, 1, 3)


def test_recovers_known_capped_prefill_context_and_cv_picks_the_cap():
    # prefill chunks c after m cached tokens: f = max(0.02 + 1e-5 c + 4e-7 c·min(m, 512), 5e-8 c² + 1e-7 c·m):
    # a small-chunk regime whose context cost stops growing at 512, then the quadratic attention work
    c, m = (a.ravel().astype(float) for a in np.meshgrid([32, 64, 128, 256, 512, 1024, 2048, 4096], np.arange(0, 8193, 256)))
    caps = (256, 512, 1024)
    x = np.column_stack([c * c, c * m, c] + [c * np.minimum(m, k) for k in caps])
    y = np.maximum(0.02 + 1e-5 * c + 4e-7 * c * np.minimum(m, 512), 5e-8 * c * c + 1e-7 * c * m)
    fitted = fit_max_affine(x[:, [0, 1, 2, 4]], y, 2, nonneg_intercept=True)
    order = np.argsort(fitted.intercepts)
    assert fitted.slopes[order] == pytest.approx(np.array([[5e-8, 1e-7, 0.0, 0.0], [0.0, 0.0, 1e-5, 4e-7]]), abs=1e-12)
    assert fitted.intercepts[order] == pytest.approx([0.0, 0.02], abs=1e-8)
    candidates = ((0, 1, 2), (0, 1, 2, 3), (0, 1, 2, 4), (0, 1, 2, 5))
    assert select_model(x, y, np.ones(len(y)), candidates, nonneg_intercept=True).columns == (0, 1, 2, 4)


def test_prefill_context_caps_by_hand_and_in_the_replayer():
    """Σ c·min(m, K): chunks (c=3, m=300) and (c=2, m=0): K=256 -> 3·256 = 768, K=512/1024/2048 -> 3·300 = 900.
    The replayer's hand-inlined sums agree with ``BatchFeatures.add_prefill`` on the same chunks."""
    from infermax.limits import Limits
    from infermax.replay import Replayer
    from infermax.request import Request
    from infermax.schedule import ScheduledBatch

    f = BatchFeatures()
    f.add_prefill(3, 300)
    f.add_prefill(2, 0)
    assert (f.prefill_ctx_cap256, f.prefill_ctx_cap512, f.prefill_ctx_cap1024, f.prefill_ctx_cap2048) == (768, 900, 900, 900)
    assert f.prefill_ctx_tokens == 900

    seen = []

    class Recording:
        name = "recording"

        def batch_time_s(self, features):
            seen.append(features)
            return 1.0

    replayer = Replayer([Request(0, 0.0, 303, 2), Request(1, 0.0, 2, 2)], Limits(C=400, M=1000, block_size=1), Recording())
    replayer.apply(ScheduledBatch(((0, 300),)))
    replayer.apply(ScheduledBatch(((0, 3), (1, 2))))
    assert seen[1] == f


def test_nonneg_intercepts_keep_batch_sums_subadditive():
    # f(x) = max(1 + 0.01 x, -5 + 0.02 x): the free fit recovers the negative intercept, the constrained one
    # keeps every intercept >= 0, so a piece on a sum never exceeds the sum of the pieces on its parts
    x = np.arange(1, 2001, 5, dtype=float)
    y = np.maximum(1 + 0.01 * x, -5 + 0.02 * x)
    assert fit_max_affine(x, y, 2).intercepts.min() == pytest.approx(-5.0, abs=1e-6)
    constrained = fit_max_affine(x, y, 2, nonneg_intercept=True)
    assert constrained.intercepts.min() >= 0.0
    parts = np.array([[512.0]] * 8)
    assert constrained.predict(parts.sum(axis=0)).item() <= constrained.predict(parts).sum()
    # the bundled prefill kernel term too: eight 512-token chunks in one batch cost no more than one by one
    prefill = next(t for t in load_cost_model(kind="piecewise").milp_terms() if t.name == "prefill_attention_kernel")
    assert all(p.intercept_s >= 0 for p in prefill.pieces)
    one, eight = BatchFeatures(), BatchFeatures()
    one.add_prefill(512, 0)
    for _ in range(8):
        eight.add_prefill(512, 0)
    assert prefill.value_s(eight) <= 8 * prefill.value_s(one)


def test_range_weights_balance_ranges():
    w = range_weights(np.array([1, 2, 100, 2000, 3000, 4000]), ((1, 16), (17, 128), (129, 1024), (1025, 4096)))
    # three non-empty ranges share 6 rows: each range's weights sum to 2
    assert w == pytest.approx([1, 1, 2, 2 / 3, 2 / 3, 2 / 3])
    with pytest.raises(ValueError, match="outside"):
        range_weights(np.array([5000.0]), ((1, 16),))


def random_batches(seed: int, count: int = 40) -> list[BatchFeatures]:
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(count):
        f = BatchFeatures()
        for c, m in rng.integers(1, 3000, (rng.integers(0, 3), 2)):
            f.add_prefill(int(c), int(m))
        for m in rng.integers(0, 8000, rng.integers(0, 60)):
            f.add_decode(int(m))
        batches.append(f)
    return batches


def epigraph_time_s(terms, f: BatchFeatures) -> float:
    """Minimise Σ t_term subject to t_term ≥ piece(f) for each piece of each active term (HiGHS); a
    padded token count is ``q·k`` with the solver's integer ``k`` and constraints, not ``⌈n/q⌉·q`` itself."""
    problem = pulp.LpProblem("epigraph", pulp.LpMinimize)
    value = {}
    for name in {name for term in terms for piece in term.pieces for name in piece.coef_s}:
        q = padding_quantum(name)
        if q is None:
            value[name] = getattr(f, name)
        else:
            k = problem.add_variable(f"k{q}", 0, cat=pulp.LpInteger)
            add_padding_constraints(problem, k, f.n_tokens, q, f"pad{q}")
            value[name] = q * k
    variables = []
    for i, term in enumerate(terms):
        if getattr(f, term.active_if) <= 0:
            continue
        t = problem.add_variable(f"t{i}")
        variables.append(t)
        for piece in term.pieces:
            problem += t >= piece.intercept_s + pulp.lpSum(c * value[name] for name, c in piece.coef_s.items())
    if not variables:
        return 0.0
    problem += pulp.lpSum(variables)
    problem.solve(pulp.HiGHS(msg=False))
    assert pulp.LpStatus[problem.status] == "Optimal"
    return pulp.value(problem.objective)


PADDED_TERMS = (  # hand-made: a step every 64 and 128 tokens under a floor, and a padded-only piece
    CostTerm("non_attention", "n_tokens", (AffinePiece(4e-3, {"n_tokens": 1e-6, "n_tokens_pad64": 2e-6}),
                                           AffinePiece(1e-3, {"n_tokens_pad128": 9e-6}),
                                           AffinePiece(6e-3, {}))),
    CostTerm("decode_attention", "n_decode_seqs", (AffinePiece(1e-5, {"decode_kv_tokens": 3e-8}),)),
)


@pytest.mark.parametrize("name", ["piecewise", "roofline", "padded"])
def test_epigraph_lp_equals_direct_evaluation(name):
    if name == "padded":
        model = PiecewiseCostModel.from_terms(PADDED_TERMS, family="piecewise", gpu="a100", model="llama-2-7b", tp=1)
    else:
        model = load_cost_model(kind=name) if name == "piecewise" else roofline_model("a100", "llama-2-70b", 8)
    terms = model.milp_terms()
    for f in random_batches(7, 25):
        direct = model.batch_time_s(f)
        assert terms_time_s(terms, f) == pytest.approx(direct, rel=1e-12)  # steps: one prefix sum in batch_time_s
        assert epigraph_time_s(terms, f) == pytest.approx(direct, rel=1e-7, abs=1e-9)


def test_padded_features_by_hand_and_exact_in_milp():
    f = BatchFeatures(n_tokens=129)
    assert (f.n_tokens_pad64, f.n_tokens_pad128, f.n_tokens_pad7) == (192, 256, 133)
    assert BatchFeatures().n_tokens_pad64 == 0
    model = PiecewiseCostModel.from_terms(PADDED_TERMS, family="piecewise", gpu="a100", model="llama-2-7b", tp=1)
    # 129 tokens: max(4e-3 + 129e-6 + 2e-6 * 192, 1e-3 + 9e-6 * 256, 6e-3) = max(4.513e-3, 3.304e-3, 6e-3)
    assert model.batch_time_s(f) == pytest.approx(6e-3)
    # 1000 tokens: max(4e-3 + 1e-3 + 2e-6 * 1024, 1e-3 + 9e-6 * 1024) = max(7.048e-3, 10.216e-3)
    assert model.batch_time_s(BatchFeatures(n_tokens=1000)) == pytest.approx(10.216e-3)
    # the integer k is pinned to ceil(n/q) whichever way an objective pushes it
    for n, q in [(0, 64), (1, 64), (64, 64), (65, 64), (4095, 128), (7, 3)]:
        for sense in (pulp.LpMinimize, pulp.LpMaximize):
            problem = pulp.LpProblem("pad", sense)
            k = problem.add_variable("k", 0, 10_000, cat=pulp.LpInteger)
            add_padding_constraints(problem, k, n, q, "pad")
            problem += k
            problem.solve(pulp.HiGHS(msg=False))
            assert k.value() == -(-n // q)


def test_piecewise_predict_and_terms_match_scalar():
    from infermax.costmodel import features_frame

    model = PiecewiseCostModel.from_json(PROFILE / "infermax_piecewise.json")
    assert any(token_step(f) for p in model.milp_terms()[0].pieces for f in p.coef_s)  # token-count steps fitted
    batches = random_batches(11) + [BatchFeatures()]
    scalar = [model.batch_time_s(f) for f in batches]
    assert model.predict_s(features_frame(batches)) == pytest.approx(scalar, rel=1e-12)
    assert [terms_time_s(model.milp_terms(), f) for f in batches] == pytest.approx(scalar, rel=1e-12)
    assert scalar[-1] == 0.0


def test_roofline_hand_computed_decode_and_communication():
    # Llama-2-7B on A100, tp=2: per layer 2 * 16 KV heads * 128 * 2 bytes = 8192 bytes per KV token;
    # 32 layers at 2039e9 * 0.8 B/s. Communication: 2 all-reduces * 2*(2-1)/2 * 4096 * 2 bytes per token
    # per layer at 300e9 * 0.8 B/s.
    model = roofline_model("a100", "llama-2-7b", 2)
    terms = {t.name: t for t in model.milp_terms()}
    f = BatchFeatures()
    for _ in range(10):
        f.add_decode(999)
    assert terms["decode_attention"].value_s(f) == pytest.approx(32 * 8192 * 10_000 / (2039e9 * 0.8))
    assert terms["communication"].value_s(f) == pytest.approx(32 * 2 * 4096 * 2 * 10 / (300e9 * 0.8))
    with pytest.raises(ValueError, match="unknown gpu 'tpu'"):
        roofline_model("tpu", "llama-2-7b")


def test_kinds_and_file_loading(tmp_path):
    assert load_cost_model(kind="linear").name.startswith("infermax-linear:")
    assert load_cost_model(kind="piecewise").name == "piecewise:a100/llama-2-7b/tp1"
    auto = json.loads((PROFILE / "profile.json").read_text())["auto"]
    assert load_cost_model().name.split(":")[0] in {"linear": ("infermax-linear",), "piecewise": ("piecewise",)}[auto]
    assert load_cost_model(path=PROFILE / "infermax_piecewise.json").name == "piecewise:a100/llama-2-7b/tp1"
    with pytest.raises(ValueError, match="holds a piecewise model, not linear"):
        load_cost_model(path=PROFILE / "infermax_piecewise.json", kind="linear")
    with pytest.raises(ValueError, match="unknown cost-model kind"):
        load_cost_model(kind="cubic")
    bad = json.loads((PROFILE / "infermax_piecewise.json").read_text())
    bad["terms"][0]["pieces"][0]["coef_s"] = {"n_tokenz": 1.0}
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="bad.json: terms\\[0\\].pieces\\[0\\]: unknown feature"):
        load_cost_model(path=tmp_path / "bad.json")


def test_derived_attention_rows_are_scaled_by_hand():
    """H100 Llama-2-70B tp=4 decode rows: KV lengths x 8 / (8 / 4) ... i.e. kv_scale = (8/4 * 128) / (8 * 128)
    = 0.25, so KV lengths / 0.25; times x A100/H100 bandwidth 2039/3350. Prefill: q_scale (64/4)/32 = 0.5,
    times x 312/989."""
    table = read_measurements(profile_folder("h100", "llama-2-70b", 4) / "measurements.csv")
    sample = pd.read_csv(profile_folder("a100", "llama-2-7b", 1).parent.parent.parent / "_sources"
                         / "a100_llama3_8b_attention_sample.csv")
    dec = sample[~sample.is_prefill].iloc[5]
    rows = table[(table.operator == "attn_decode") & (table.batch_size == dec.batch_size)
                 & np.isclose(table.kv_cache_size, dec.kv_cache_size / 0.25)]
    assert rows.median_ms.iloc[0] == pytest.approx(dec.attn_decode_median_ms * 2039 / 3350, rel=1e-5)
    pre = sample[sample.is_prefill].iloc[40]
    rows = table[(table.operator == "attn_prefill") & (table.prefill_chunk_size == pre.prefill_chunk_size)
                 & (table.kv_cache_size == pre.kv_cache_size)]
    assert rows.median_ms.iloc[0] == pytest.approx(pre.attn_prefill_median_ms * 0.5 * 312 / 989, rel=1e-5)
    assert rows.derivation.iloc[0].startswith("scaled from llama-3-8b")
    assert (table[table.operator == "add"].derivation.fillna("") == "").all()


def vidur_mlp_from_profile(folder) -> pd.DataFrame:
    """Rebuild a Vidur-format mlp.csv (one TP) from a bundled profile's measurements."""
    table = read_measurements(folder / "measurements.csv")
    ops = table[table.operator.isin(("emb",) + NON_ATTENTION_OPS)]
    wide = {}
    for stat in ("median", "mean", "std"):
        pivot = ops.pivot_table(index="num_tokens", columns="operator", values=f"{stat}_ms", aggfunc="first")
        for op in pivot:
            wide[f"time_stats.{op}.{stat}"] = pivot[op]
    frame = pd.DataFrame(wide)
    for op in ("emb",) + NON_ATTENTION_OPS:  # min/max are not used by the importer
        frame[f"time_stats.{op}.min"] = frame[f"time_stats.{op}.max"] = frame[f"time_stats.{op}.median"]
    frame = frame.assign(n_head=32, n_kv_head=32, n_embd=4096, n_expanded_embd=11008, vocab_size=32768,
                         use_gated_mlp=True, num_tensor_parallel_workers=1).reset_index()
    return frame


def assert_same_numbers(got, want, path: str = "", rel: float = 1e-9) -> None:
    """``got`` has ``want``'s structure, strings and integers, and its floats within ``rel`` of ``want``'s: a fit
    repeated on another CPU differs in the last bits (1e-14 relative, measured on an AMD EPYC against the shipped
    fit), from the linear algebra's kernels, not from the method."""
    assert type(got) is type(want), path
    if isinstance(want, dict):
        assert got.keys() == want.keys(), path
        for k in want:
            assert_same_numbers(got[k], want[k], f"{path}.{k}", rel)
    elif isinstance(want, list):
        assert len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same_numbers(g, w, f"{path}[{i}]", rel)
    elif isinstance(want, float):
        assert got == pytest.approx(want, rel=rel, abs=1e-300), path
    else:
        assert got == want, path


def test_fit_an_unseen_vidur_folder(tmp_path):
    """`infermax fit` on a Vidur-format folder it has never seen: imports, fits, writes models, plots and the
    table; the result equals the bundled fit of the same measurements."""
    from typer.testing import CliRunner

    from infermax.cli import app

    vidur = tmp_path / "somewhere" / "a100" / "My-Llama-hf"
    vidur.mkdir(parents=True)
    vidur_mlp_from_profile(PROFILE).to_csv(vidur / "mlp.csv", index=False)
    result = CliRunner().invoke(app, ["fit", str(vidur), "--out", str(tmp_path / "out")], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "non_attention" in result.output and "piecewise" in result.output
    out = tmp_path / "out" / "tp1"
    assert {p.name for p in out.glob("fit_*.png")} == {"fit_non_attention.png", "fit_prefill_attention_kernel.png",
                                                        "fit_prefill_kv_save.png", "fit_decode_attention.png"}
    new, shipped = (json.loads((f / "infermax_piecewise.json").read_text()) for f in (out, PROFILE))
    assert new["model"] == "llama-2-7b" and new["gpu"] == "a100"
    assert_same_numbers(new["terms"], shipped["terms"])
    bad = CliRunner().invoke(app, ["fit", str(tmp_path / "nowhere")], env={"COLUMNS": "200"})
    assert bad.exit_code == 2 and "not a folder" in bad.output


def test_costmodel_show_prints_terms_and_errors():
    from typer.testing import CliRunner

    from infermax.cli import app

    result = CliRunner().invoke(app, ["costmodel", "show", "--cost-model", "piecewise"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "non_attention" in result.output and "decode_attention" in result.output and "1025-4096" in result.output
    # the default A100 Llama-2-7B fit uses token-count steps, printed on one line as "t: height"
    first = load_cost_model(kind="piecewise").milp_terms()[0].pieces[0].coef_s
    assert "steps 'n_tokens > t' (t: height): 32: " + f"{first['n_tokens_gt32']:.3g}" in result.output.replace("\n", "")
    missing = CliRunner().invoke(app, ["costmodel", "show", "--gpu", "h200", "--model", "llama-2-70b"],
                                 env={"COLUMNS": "200"})
    assert missing.exit_code == 2 and "--cost-model roofline" in missing.output


@pytest.mark.parametrize("nonneg_intercept", [False, True])
def test_max_affine_fits_each_group_once_and_reusing_changes_nothing(monkeypatch, nonneg_intercept):
    """`_refine` reuses the piece fits of groups it has fitted before (within one `_fit_scaled`): no group is fitted
    twice, and the fits equal those made with every piece fitted afresh."""
    from infermax.costmodel import maxaffine

    rng = np.random.default_rng(3)
    x = rng.uniform(1, 100, (240, 2))
    y = np.maximum(1 + x @ [0.3, 0.1], 5 + x @ [0.05, 0.4]) * rng.uniform(0.95, 1.05, 240)
    fitted_groups, fit_piece = [], maxaffine._fit_piece

    def counting(x1, yy, w, nn):
        fitted_groups.append((yy.tobytes(), nn))
        return fit_piece(x1, yy, w, nn)

    monkeypatch.setattr(maxaffine, "_fit_piece", counting)
    cached = maxaffine.fit_max_affine_all(x, y, 4, nonneg_intercept=nonneg_intercept)
    assert len(fitted_groups) == len(set(fitted_groups)) > 4

    class Forgetful(dict):  # a cache that keeps nothing: every piece fitted afresh, as before the reuse
        def __setitem__(self, key, value):
            pass

    refine = maxaffine._refine
    monkeypatch.setattr(maxaffine, "_refine", lambda *a, **k: refine(*a[:5], Forgetful()))
    fresh = maxaffine.fit_max_affine_all(x, y, 4, nonneg_intercept=nonneg_intercept)
    assert len(fitted_groups) > 2 * len(set(fitted_groups))  # (afresh, groups come back)
    for a, b in zip(cached, fresh, strict=True):
        assert np.array_equal(a.intercepts, b.intercepts) and np.array_equal(a.slopes, b.slopes)


def test_a_measurements_file_that_is_not_a_csv_is_refused_by_name(tmp_path):
    """`infermax fit` on a folder whose measurements.csv is binary, or broken by a stray quote, said only what the
    codec or the tokenizer said, without the file."""
    from infermax.costmodel.measurements import read_measurements

    for body, what in ((b"\x15\x04\x15\xb8\x01\xff\xfe", "not a UTF-8 text file"), (b'a,b\n1,"2\n', "not a readable CSV")):
        path = tmp_path / "measurements.csv"
        path.write_bytes(body)
        with pytest.raises(ValueError, match=what) as e:
            read_measurements(path)
        assert str(path) in str(e.value)


@pytest.mark.parametrize("operator, column, value, message", [
    ("mlp_up_proj", "num_tokens", "-5", "num_tokens must be a non-negative integer, got -5"),
    ("mlp_up_proj", "num_tokens", "1.5", "num_tokens must be a non-negative integer, got 1.5"),
    ("attn_decode", "kv_cache_size", "-100", "kv_cache_size must be a non-negative integer, got -100"),
    ("attn_decode", "batch_size", "2.5", "batch_size must be a non-negative integer, got 2.5"),
    ("mlp_up_proj", "tp", "x", "tp must be an integer >= 1, got 'x'"),
    ("mlp_up_proj", "tp", "2", "tp 2, but line 2 has tp 1; a profile holds one TP degree"),
    ("mlp_up_proj", "operator", "mlp_up_projX", "unknown operator 'mlp_up_projX'; known: emb, input_layernorm"),
    ("mlp_up_proj", "median_ms", "-1", "median_ms must be a non-negative number, got -1.0"),
])
def test_a_measurement_row_with_a_bad_shape_or_operator_is_refused_with_its_line(tmp_path, operator, column, value,
                                                                                message):
    """Probing `infermax fit` with hand-edited tables (2026-12-01): a negative or fractional count, a row of another TP
    degree and an unknown operator were fitted or dropped without a word (and a bad time was shown as
    np.float64(-1.0)). Each is refused with its line. An all-reduce's fractional token count stays valid."""
    import csv

    from infermax.costmodel.measurements import read_measurements

    rows = list(csv.DictReader((PROFILE / "measurements.csv").open()))
    i = next(k for k, r in enumerate(rows) if r["operator"] == operator)
    rows[i][column] = value
    path = tmp_path / "measurements.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    with pytest.raises(ValueError) as e:
        read_measurements(path)
    assert f"{path}: line {i + 2}: {message}" in str(e.value)
    reduce = read_measurements(profile_folder("a100", "llama-2-7b", 2) / "measurements.csv")
    assert (reduce.num_tokens[reduce.operator == "all_reduce"] % 1 != 0).any()


def test_a_profile_folder_without_its_profile_json_is_refused_by_name(tmp_path):
    """`infermax fit` on a folder holding measurements.csv alone said "[Errno 2] No such file or directory: .../profile.json"
    (after copying the CSV to --out); now it says what is missing and what writes it, before anything is copied. A
    broken measurements.csv is named where the user keeps it, not as its copy in --out."""
    from infermax.costmodel.profile_import import prepare

    (tmp_path / "measurements.csv").write_text((PROFILE / "measurements.csv").read_text())
    with pytest.raises(ValueError, match="has measurements.csv but no profile.json"):
        prepare(tmp_path, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    (tmp_path / "profile.json").write_text((PROFILE / "profile.json").read_text())
    (tmp_path / "measurements.csv").write_bytes(b"\x15\x04\x15\xb8\x01\xff\xfe")
    with pytest.raises(ValueError, match=f"{tmp_path / 'measurements.csv'}: not a UTF-8 text file"):
        prepare(tmp_path, tmp_path / "out")  # (named where the user keeps it, not as the copy in out/)
    assert not (tmp_path / "out").exists()


def test_a_vidur_mlp_csv_is_checked_before_anything_is_written(tmp_path):
    """Found by probing `infermax fit` by hand (2026-12-02): a header without rows ended in an IndexError traceback,
    another CSV in a bare "error: 'n_head'", a TP degree of −5 in a folder `tp-5` written before the failure."""
    from typer.testing import CliRunner

    from infermax.cli import app

    good = vidur_mlp_from_profile(PROFILE)
    cases = {
        "header only": (good.iloc[:0], "a header without rows"),
        "other csv": (pd.DataFrame({"a": [1], "b": [2]}), "not a Vidur mlp.csv: no column(s) n_head, n_kv_head"),
        "tp": (good.assign(num_tensor_parallel_workers=[1] * 2 + [-5] + [1] * (len(good) - 3)),
               "row 3 after the header: num_tensor_parallel_workers must be an integer >= 1, got -5"),
        "median": (good.astype({"time_stats.mlp_up_proj.median": object}).assign(
            **{"time_stats.mlp_up_proj.median": ["x"] + list(good["time_stats.mlp_up_proj.median"][1:])}),
            "row 1 after the header: time_stats.mlp_up_proj.median must be a finite time >= 0 (ms), got 'x'"),
        "std": (good.astype({"time_stats.emb.std": object}).assign(
            **{"time_stats.emb.std": [good["time_stats.emb.std"].iloc[0], "?"] + list(good["time_stats.emb.std"][2:])}),
            "row 2 after the header: time_stats.emb.std must be a number, got '?'"),
    }
    for name, (frame, message) in cases.items():
        vidur = tmp_path / name / "a100" / "Llama-2-7b-hf"
        vidur.mkdir(parents=True)
        frame.to_csv(vidur / "mlp.csv", index=False)
        out = tmp_path / name / "out"
        result = CliRunner().invoke(app, ["fit", str(vidur), "--model", "llama-2-7b", "--out", str(out), "--no-plots"],
                                    env={"COLUMNS": "300"})
        assert result.exit_code == 2 and message in " ".join(result.output.split()), (name, result.output)
        assert not out.exists(), name
