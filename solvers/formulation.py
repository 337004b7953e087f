"""The InferMax CSP (paper section 3.3) as a MILP over ``slots`` batch slots, built with PuLP.

Per request ``i`` and slot ``j`` (docs/design.md, solver section, has the full derivation):

* binaries ``e`` (evicted before the batch), ``cz`` (processed), ``g`` (generates a token), ``d``
  (decode phase before the batch), ``dg = d ∧ cz`` (decode item; the paper's ``d ∧ g``), ``fin``
  (finished after the batch), bits ``b_k`` of the prefill chunk ``cp = Σ 2^k b_k``;
* integer ``m`` (KV tokens after the batch, before a finished request frees them);
* expressions ``c = cp + dg`` and the paper's input size ``I_ij = I_i + G_ij`` (``G``: tokens
  generated so far), which equals the replayer's ``Icur`` whenever the request is in prefill phase.

Times are in milliseconds inside the model (``TIME_UNIT``); batch times come from the cost model's
``milp_terms()`` in epigraph form. Every objective is non-decreasing in every batch time, so batch
times, finish times and first-token times are bounded from below only and minimisation makes them
exact (``polish`` re-solves the LP with the integers fixed to make that hold for any incumbent).
A padded token count ``n_tokens_pad<q>`` (``⌈n/q⌉·q``) is ``q·k`` with an integer ``k`` held to
``n <= q·k <= n + q − 1``, so ``k = ⌈n/q⌉`` exactly for the integral ``n``: not left to minimisation,
which would not fix ``k`` in a batch the objective does not see (TTFT) nor in an incumbent that
``polish`` freezes (time limits, the ``better`` early stop).
The longest decode KV read capped at ``K``, ``decode_kv_max_cap<K>`` = ``min(max_i dkv_i, K)``, is concave
in the KV lengths; with a non-negative coefficient it is a continuous ``y ≥ K·β``, ``y ≥ dkv_i − (peak_i − K)·β``
per decode item, where ``β = max_i β_i`` and one binary per item and slot is pinned to ``β_i = [dkv_i ≥ K]``
by ``K·β_i ≤ dkv_i ≤ K − 1 + (peak_i − K + 1)·β_i`` (so a frozen incumbent never overstates it either).
A negative coefficient on it (or on ``decode_kv_max``) is rejected: the epigraph would not be exact.
A prefill chunk's capped context ``c·min(m̄, K)`` (feature ``prefill_ctx_cap<K>``, summed over chunks) is
``Σ 2^k (b_k·r)`` with ``r = min(m̄, K)`` pinned exactly by one binary ``[m̄ ≥ K]`` per request and slot
(``K·β ≤ m̄ ≤ K − 1 + (peak − K + 1)·β``, ``m̄ − (peak − K)·β ≤ r ≤ m̄``, ``K·β ≤ r ≤ K``), so any sign of its
coefficient is exact.
A step ``n_tokens_gt<t>`` = ``[n > t]`` is one binary per slot, constant 0 where no batch of the instance can exceed
``t`` tokens; a slot's steps are pinned together in the incremental form (``Formulation._staircase``), exact for
either sign of their coefficients.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import pulp

from infermax.costmodel.base import CostTerm, kv_cap, padding_quantum, prefill_ctx_cap, token_step
from infermax.limits import Limits
from infermax.request import Request

from .bounds import (ALWAYS_ZERO, DECODE_FEATURES, PREFILL_FEATURES, feature_bounds, max_batch_time_s, piece_range,
                     request_bounds, vanishes_with_gate)
from .objective import Objective
from .policy import Policies

TIME_UNIT = 1000.0  # model seconds -> milliseconds: keeps cost coefficients well above solver zero tolerances

BIN, INT, CONT = pulp.LpBinary, pulp.LpInteger, pulp.LpContinuous


def add_padding_constraints(prob: pulp.LpProblem, k, n, q: int, name: str) -> None:
    """Hold the integer ``k`` to ``⌈n/q⌉`` for an integral expression ``n``: ``n <= q·k <= n + q − 1``."""
    prob += q * k >= n, f"{name}_ge"
    prob += q * k <= n + q - 1, f"{name}_le"


LEX_SLOTS = 20  # symmetry tie-break over at most this many slots: weights up to 2^20 keep the row well scaled


def identical_classes(requests: list[Request]) -> list[list[int]]:
    """Indices of interchangeable requests, in index order, one list per class of two or more: equal in every
    field but the id (arrival, I, O, targets, class label, prediction, group, content)."""
    classes: dict = {}
    for i, r in enumerate(requests):
        classes.setdefault(dataclasses.replace(r, id=0), []).append(i)
    return [c for c in classes.values() if len(c) > 1]


@dataclass(frozen=True)
class KvMax:
    """Variables of a longest-decode-KV-read feature in one slot: ``y`` (the feature), ``cap`` (None:
    uncapped), ``beta`` = [some item reads ≥ cap] and ``items``: (request index, β_i = [dkv_i ≥ cap])."""

    y: pulp.LpVariable
    cap: int | None
    beta: pulp.LpVariable | None = None
    items: tuple = ()


class Cell:
    """The variables of one request in one slot."""

    __slots__ = ("e", "cz", "dg", "g", "d", "fin", "m", "bits", "cp", "c", "pz", "mbar", "sq", "ctx", "dkv", "kvb", "mz",
                 "u", "w", "ctx_cap", "cap_vars")


@dataclass(frozen=True)
class Strengthening:
    """Optional parts of the MILP that change its strength, not its optimum (docs/design.md, "Strengthening").

    ``symmetry``: how identical requests (`identical_classes`) are labelled — "none", "finish" (in finishing
    order, the default), "full" (finishing order, ties broken by the processed-slot pattern; not faster at
    B = 8 or 12 in benchmarks/milp_strength.py); see `Formulation._symmetry`. ``cuts``: gated batch-time pieces
    and the token staircase in perspective form instead of big-M (where the gate's features vanish with it)."""

    symmetry: str = "finish"
    cuts: bool = True

    def __post_init__(self):
        if self.symmetry not in ("none", "finish", "full"):
            raise ValueError(f"unknown symmetry breaking {self.symmetry!r}")


class Formulation:
    """The MILP for ``requests`` under ``limits``; ``prob`` is the PuLP problem, ``cells[i][j]`` the variables."""

    def __init__(self, requests: list[Request], limits: Limits, cost_model, slots: int, objective: Objective,
                 policies: Policies = Policies(), objective_cut_s: float | None = None,
                 strengthening: Strengthening = Strengthening(), finish_all: bool = True):
        """``objective_cut_s``: a valid lower bound on the objective over every schedule (solvers/lower_bound.py),
        added as the constraint ``objective >= cut`` so the solver's dual bound starts there. ``finish_all=False``
        leaves out the rows that make every request finish within the slots, for a model of a schedule's first
        batches (`benchmarks/window_milp.py` pins the state they reach instead); a request unfinished there counts
        the last slot's end as its finish and first-token time."""
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self.requests, self.limits, self.slots = list(requests), limits, slots
        self.objective, self.policies, self.objective_cut_s = objective, policies, objective_cut_s
        self.strength, self.finish_all = strengthening, finish_all
        self.terms: tuple[CostTerm, ...] = tuple(t for t in cost_model.milp_terms() if t.active_if not in ALWAYS_ZERO)
        self.rb = [request_bounds(r, limits, policies) for r in self.requests]
        self.fb = feature_bounds(self.rb, limits)
        used = {f for t in self.terms for p in t.pieces for f, c in p.coef_s.items() if c} | {t.active_if for t in self.terms}
        self.used_features = used
        for t in self.terms:
            for p in t.pieces:
                bad = [f for f, c in p.coef_s.items() if c < 0 and (f == "decode_kv_max" or kv_cap(f) is not None)]
                if bad:
                    raise ValueError(f"cost term {t.name!r}: negative coefficient on {', '.join(bad)}; the MILP represents "
                                     "the longest decode KV read only with non-negative coefficients (epigraph from below)")
        self.tmax = max_batch_time_s(self.terms, self.fb) * TIME_UNIT
        self.t_first = min(r.arrival_s for r in self.requests) * TIME_UNIT
        self.t_last = max(r.arrival_s for r in self.requests) * TIME_UNIT
        self.prob = pulp.LpProblem("infermax_csp", pulp.LpMinimize)
        self.cells: list[list[Cell]] = []
        self._build()

    # ----------------------------------------------------------------- variables and request constraints
    def _var(self, name: str, low=None, up=None, cat=CONT) -> pulp.LpVariable:
        if hasattr(self.prob, "add_variable"):  # PuLP >= 3.3 attaches variables to the model
            return self.prob.add_variable(name, low, up, cat=cat)
        return pulp.LpVariable(name, low, up, cat=cat)

    def _cell(self, i: int, j: int) -> Cell:
        rb, pol = self.rb[i], self.policies
        x = Cell()
        name = f"{i}_{j}"
        x.e = 0 if pol.eviction_free else self._var(f"e_{name}", cat=BIN)
        x.cz = self._var(f"cz_{name}", cat=BIN)
        x.dg = self._var(f"dg_{name}", cat=BIN)
        x.g = self._var(f"g_{name}", cat=BIN)
        x.d = 0 if j == 0 else self._var(f"d_{name}", cat=BIN)
        x.fin = self._var(f"fin_{name}", cat=BIN)
        x.m = self._var(f"m_{name}", 0, rb.peak, cat=INT)
        nbits = max(1, rb.chunk.bit_length())
        x.bits = [self._var(f"b_{name}_{k}", cat=BIN) for k in range(nbits)]
        x.cp = pulp.lpSum((1 << k) * b for k, b in enumerate(x.bits))
        x.c = x.cp + x.dg
        x.pz = x.cz - x.dg
        x.mbar = x.m - x.c
        x.sq = x.ctx = x.dkv = x.kvb = x.mz = None
        x.u, x.w, x.ctx_cap, x.cap_vars = [], [], {}, {}  # cap_vars: K -> (min(m̄, K), [m̄ >= K], bit products)
        return x

    def _build(self) -> None:
        K = self.slots
        for i, r in enumerate(self.requests):
            row = [self._cell(i, j) for j in range(K)]
            self.cells.append(row)
            self._request_constraints(i, r, row)
        self._symmetry()
        self.z = [self._var(f"z_{j}", cat=BIN) for j in range(K)]
        self.hy: list = [None] * K
        self.pads: list[dict] = [{} for _ in range(K)]  # per slot: feature -> (integer k, quantum q)
        self.steps: list[dict] = [{} for _ in range(K)]  # per slot: threshold t -> binary [n_tokens > t] (_staircase)
        self.kvmax: list[dict] = [{} for _ in range(K)]  # per slot: feature -> KvMax
        for j in range(K):
            col = [row[j] for row in self.cells]
            self._batch_constraints(j, col)
        self._timing()
        self._objective()

    def _request_constraints(self, i: int, r: Request, row: list[Cell]) -> None:
        prob, rb, pol = self.prob, self.rb[i], self.policies
        I, O, peak = r.prompt_tokens, r.output_tokens, rb.peak
        G_before = 0  # Σ g over earlier slots
        m_prev, fin_prev = 0, 0
        for j, x in enumerate(row):
            n = f"{i}_{j}"
            # processed items: decode (dg) iff decode phase; a prefill item processes 1..chunk tokens
            prob += x.dg <= x.cz, f"dg_le_cz_{n}"
            if j > 0:
                prob += x.dg <= x.d, f"dg_le_d_{n}"
                prob += x.dg >= x.d + x.cz - 1, f"dg_ge_{n}"
            else:
                prob += x.dg == 0, f"dg0_{n}"
            prob += x.cp >= x.pz, f"cp_ge_{n}"
            prob += x.cp <= rb.chunk * x.pz, f"cp_le_{n}"
            # generation (1): only processed items generate; every decode generates
            prob += x.g <= x.cz, f"g_le_cz_{n}"
            prob += x.g >= x.dg, f"g_ge_dg_{n}"
            # (2)-(3) with I_ij = I + G: m <= Icur - 1 unless the batch generates, then m = Icur
            prob += x.m <= I + G_before - 1 + x.g, f"m_le_input_{n}"
            prob += x.m >= I + G_before - (I + O - 1) * (1 - x.g), f"m_ge_input_{n}"
            # (3)-(4) memory: m = m_prev + c, or 0 when evicted (an evicted request is not processed)
            prob += x.m <= m_prev + x.c, f"m_le_{n}"
            if pol.eviction_free:
                prob += x.m >= m_prev + x.c, f"m_ge_{n}"
            else:
                prob += x.m >= m_prev + x.c - peak * x.e, f"m_ge_{n}"
                prob += x.m <= peak * (1 - x.e), f"m_evict_{n}"
                prob += x.cz + x.e <= 1, f"evict_not_processed_{n}"
                prob += x.e <= m_prev, f"evict_holds_kv_{n}"
                prob += x.e <= 1 - fin_prev, f"evict_unfinished_{n}"
            prob += x.cz <= 1 - fin_prev, f"done_{n}"
            # valid cuts: a generating item, and any request in decode phase after the batch, holds >= I tokens
            prob += x.m >= I * x.g, f"m_gen_{n}"
            # phase transition into the next slot
            if j + 1 < len(row):
                prob += x.m >= I * row[j + 1].d, f"m_decode_{n}"
                nxt = row[j + 1].d
                prob += nxt >= x.g, f"d_gen_{n}"
                prob += nxt <= 1 - x.e, f"d_evict_{n}"
                prob += nxt <= x.d + x.g, f"d_keep_up_{n}"
                prob += nxt >= x.d - x.e, f"d_keep_down_{n}"
            if pol.no_chunked_prefill:
                prob += x.pz <= x.g, f"no_chunk_{n}"
            G_before = G_before + x.g
            # finished after this slot iff G = O
            prob += O * x.fin <= G_before, f"fin_le_{n}"
            prob += x.fin >= G_before - O + 1, f"fin_ge_{n}"
            self._products(i, x, n)
            m_prev, fin_prev = x.m, x.fin
        if self.finish_all:
            prob += G_before == O, f"terminate_{i}"  # (1)

    def _symmetry(self) -> None:
        """Identical requests (`identical_classes`) are interchangeable: any schedule stays valid, with the same
        objective, when they swap labels, so the labels may follow any order of their trajectories. "finish":
        by finishing slot — the lower-index one has finished whenever the higher-index one has. "full": ties in
        finishing slot broken by the processed-slot pattern ``cz``, read as a binary number over the first
        ``LEX_SLOTS`` slots (earliest slot most significant; the lower index has the larger number). Both only
        label, so at least one optimal schedule satisfies them (docs/design.md, "Strengthening")."""
        mode = self.strength.symmetry
        if mode == "none":
            return
        K = self.slots
        L = min(K, LEX_SLOTS)
        for cls in identical_classes(self.requests):
            for i, twin in zip(cls, cls[1:]):
                a, b = self.cells[i], self.cells[twin]
                for j in range(K):
                    self.prob += a[j].fin >= b[j].fin, f"sym_{i}_{twin}_{j}"
                if mode == "full":
                    # Σ 2^(L−1−j)·(cz_a − cz_b) >= −2^L·(slots b finishes after a): binding only on a tie
                    later = pulp.lpSum(a[j].fin - b[j].fin for j in range(K))
                    self.prob += (pulp.lpSum((1 << (L - 1 - j)) * (a[j].cz - b[j].cz) for j in range(L))
                                  >= -(1 << L) * later), f"sym_lex_{i}_{twin}"

    def _product(self, name: str, b, x, bound: int):
        """``w = b·x`` for a binary ``b`` and ``0 <= x <= bound`` (McCormick, exact for a binary)."""
        w = self._var(name, 0, bound)
        self.prob += w <= bound * b, f"{name}_1"
        self.prob += w <= x, f"{name}_2"
        self.prob += w >= x - bound * (1 - b), f"{name}_3"
        return w

    def _products(self, i: int, x: Cell, n: str) -> None:
        """Exact linearisation of c², c·m and dg·m: ``cp² = Σ 2^k (b_k·cp)``, ``cp·m̄ = Σ 2^k (b_k·m̄)``."""
        rb, used = self.rb[i], self.used_features
        if "prefill_sq_tokens" in used:
            x.u = [self._product(f"u_{n}_{k}", b, x.cp, rb.chunk) for k, b in enumerate(x.bits)]
            x.sq = pulp.lpSum((1 << k) * u for k, u in enumerate(x.u))
        if "prefill_ctx_tokens" in used:
            x.w = [self._product(f"w_{n}_{k}", b, x.mbar, rb.peak) for k, b in enumerate(x.bits)]
            x.ctx = pulp.lpSum((1 << k) * w for k, w in enumerate(x.w))
        if "decode_kv_tokens" in used or any(f == "decode_kv_max" or kv_cap(f) is not None for f in used):
            x.dkv = self._product(f"v_{n}", x.dg, x.m, rb.peak)
        for cap in sorted(k for k in map(prefill_ctx_cap, used) if k is not None):
            r, beta = self._min_cap(x.mbar, cap, rb.peak, f"r{cap}_{n}")
            bound = min(cap, rb.peak)
            products = [self._product(f"w{cap}_{n}_{k}", b, r, bound) for k, b in enumerate(x.bits)]
            x.ctx_cap[cap] = pulp.lpSum((1 << k) * w for k, w in enumerate(products))
            x.cap_vars[cap] = (r, beta, products)

    def _at_least(self, v, cap: int, peak: int, name: str) -> pulp.LpVariable:
        """A binary pinned to ``[v >= cap]`` for an integral ``0 <= v <= peak`` (``peak >= cap``), whichever way an
        objective pushes it: ``cap·β <= v <= cap − 1 + (peak − cap + 1)·β``."""
        beta = self._var(name, cat=BIN)
        self.prob += cap * beta <= v, f"{name}_le"
        self.prob += v <= cap - 1 + (peak - cap + 1) * beta, f"{name}_ge"
        return beta

    def _min_cap(self, v, cap: int, peak: int, name: str):
        """``(min(v, cap), β)`` for an integral ``0 <= v <= peak``, exact: a binary ``β`` pinned to ``[v >= cap]``
        (module docstring); ``(v, None)`` when ``v`` cannot reach the cap."""
        if peak < cap:
            return v, None
        r, beta = self._var(name, 0, cap), self._at_least(v, cap, peak, f"{name}_b")
        self.prob += r <= v, f"{name}_le_v"
        self.prob += r >= v - (peak - cap) * beta, f"{name}_ge_v"
        self.prob += r >= cap * beta, f"{name}_ge_cap"
        return r, beta

    # ----------------------------------------------------------------- batch constraints (5)
    def _batch_constraints(self, j: int, col: list[Cell]) -> None:
        prob, lim, z = self.prob, self.limits, self.z
        for i, x in enumerate(col):
            prob += z[j] >= x.cz, f"z_ge_{i}_{j}"
            if not self.policies.eviction_free:
                prob += x.e <= z[j], f"evict_in_batch_{i}_{j}"
        prob += z[j] <= pulp.lpSum(x.cz for x in col), f"z_le_{j}"
        if j + 1 < self.slots:
            prob += z[j] >= z[j + 1], f"z_order_{j}"
        prob += pulp.lpSum(x.c for x in col) <= lim.C, f"C_{j}"
        prob += pulp.lpSum(x.cp for x in col) <= lim.prefill_budget, f"P_{j}"
        # valid cut: a generating request is unfinished and holds >= I tokens during the batch
        prob += pulp.lpSum(r.prompt_tokens * x.g for r, x in zip(self.requests, col)) <= lim.M * z[j], f"M_gen_{j}"
        held = []  # KV held during the batch: m, except by requests finished before it
        for i, x in enumerate(col):
            fin_prev = self.cells[i][j - 1].fin if j > 0 else 0
            held.append(x.m - self.rb[i].peak * fin_prev)
        b = lim.block_size
        if b == 1:
            prob += pulp.lpSum(held) <= lim.M, f"M_{j}"
        else:
            for i, (x, h) in enumerate(zip(col, held)):
                x.kvb = self._var(f"kvb_{i}_{j}", 0, math.ceil(self.rb[i].peak / b), cat=INT)
                prob += b * x.kvb >= h, f"kvb_{i}_{j}"
            prob += pulp.lpSum(b * x.kvb for x in col) <= lim.M, f"M_{j}"
        if lim.Rmax is not None and lim.Rmax < len(col):
            for i, (x, h) in enumerate(zip(col, held)):
                x.mz = self._var(f"mz_{i}_{j}", cat=BIN)
                prob += self.rb[i].peak * x.mz >= h, f"mz_{i}_{j}"
            prob += pulp.lpSum(x.mz for x in col) <= lim.Rmax, f"Rmax_{j}"
        if self.policies.no_hybrid:
            hy = self.hy[j] = self._var(f"hy_{j}", cat=BIN)  # 1: a decode batch
            for i, x in enumerate(col):
                prob += x.dg <= hy, f"hy_d_{i}_{j}"
                prob += x.pz <= 1 - hy, f"hy_p_{i}_{j}"

    # ----------------------------------------------------------------- cost model and timing
    def features(self, j: int) -> dict:
        col = [row[j] for row in self.cells]
        f = {
            "n_tokens": pulp.lpSum(x.c for x in col),
            "prefill_tokens": pulp.lpSum(x.cp for x in col),
            "n_prefill_seqs": pulp.lpSum(x.pz for x in col),
            "n_decode_seqs": pulp.lpSum(x.dg for x in col),
        }
        if "prefill_sq_tokens" in self.used_features:
            f["prefill_sq_tokens"] = pulp.lpSum(x.sq for x in col)
        if "prefill_ctx_tokens" in self.used_features:
            f["prefill_ctx_tokens"] = pulp.lpSum(x.ctx for x in col)
        if "decode_kv_tokens" in self.used_features:
            f["decode_kv_tokens"] = pulp.lpSum(x.dkv for x in col)
        for name in self.used_features:
            cap = prefill_ctx_cap(name)
            if cap is not None:
                f[name] = pulp.lpSum(x.ctx_cap[cap] for x in col)
        steps = {name: token_step(name) for name in self.used_features if token_step(name)}
        if steps and not self.steps[j]:
            self.steps[j] = self._staircase(j, sorted({t for count, t in steps.values() if count == "n_tokens"}),
                                            f["n_tokens"])
        for name, (count, t) in steps.items():
            f[name] = self.steps[j].get(t, 0) if count == "n_tokens" else 0
        for name in sorted(self.used_features):
            if name == "decode_kv_max" or kv_cap(name) is not None:
                if name not in self.kvmax[j]:
                    self.kvmax[j][name] = self._kv_max(j, col, kv_cap(name))
                f[name] = self.kvmax[j][name].y
            q = padding_quantum(name)
            if q is None:
                continue
            if name not in self.pads[j]:
                k = self._var(f"pad{q}_{j}", 0, -(-self.fb["n_tokens"] // q), cat=INT)
                add_padding_constraints(self.prob, k, f["n_tokens"], q, f"pad{q}_{j}")
                self.pads[j][name] = (k, q)
            f[name] = q * self.pads[j][name][0]
        return f

    def _staircase(self, j: int, thresholds: list[int], n_tokens) -> dict:
        """Binaries ``β_t = [n_tokens > t]`` in slot ``j`` for the thresholds below the instance's largest batch
        (``β`` is 0 above it), in the incremental form: ``β`` non-increasing in ``t``, and with ``t_1 < … < t_K``,
        ``u_k = t_{k+1}`` (``u_K`` = the largest batch), ``n ≤ t_1 + Σ (u_k − t_k)·β_k`` and
        ``n ≥ (t_1 + 1)·β_1 + Σ_{k≥2} (t_k − t_{k−1})·β_k``: so ``n ∈ [t_j + 1, t_{j+1}]`` exactly when the first ``j``
        binaries are 1 (pinned both ways), and the LP relaxation prices a fractional ``n`` on the staircase's
        lower convex envelope, not near 0 as one big-M pair per threshold would."""
        peak = self.fb["n_tokens"]
        ts = [t for t in thresholds if t < peak]
        if not ts:
            return {}
        beta = [self._var(f"gt{t}_{j}", cat=BIN) for t in ts]
        for k in range(1, len(ts)):
            self.prob += beta[k] <= beta[k - 1], f"gt{ts[k]}_{j}_order"
        upper = ts[1:] + [peak]
        first = ts[0] * self.z[j] if self.strength.cuts else ts[0]  # an empty slot has n = 0: perspective form
        self.prob += n_tokens <= first + pulp.lpSum((u - t) * b for t, u, b in zip(ts, upper, beta)), f"steps_{j}_le"
        lower = [ts[0] + 1] + [t - prev for prev, t in zip(ts, ts[1:])]
        self.prob += n_tokens >= pulp.lpSum(w * b for w, b in zip(lower, beta)), f"steps_{j}_ge"
        return dict(zip(ts, beta))

    def _kv_max(self, j: int, col: list[Cell], cap: int | None) -> "KvMax":
        """A continuous ``y`` with ``y ≥ min(max_i dkv_i, cap)`` exactly at its minimum (module docstring);
        ``cap`` None: ``y ≥ dkv_i`` for every item."""
        name = f"kvmax{cap or ''}_{j}"
        y = self._var(name, 0, cap)
        peaks = [self.rb[i].peak for i in range(len(col))]
        if cap is None or max(peaks) < cap:  # no item can reach the cap
            for i, x in enumerate(col):
                self.prob += y >= x.dkv, f"{name}_ge_{i}"
            return KvMax(y, cap)
        beta = self._var(f"{name}_b", cat=BIN)
        self.prob += y >= cap * beta, f"{name}_cap"
        items = []
        for i, (x, peak) in enumerate(zip(col, peaks)):
            if peak < cap:
                self.prob += y >= x.dkv, f"{name}_ge_{i}"
                continue
            b = self._at_least(x.dkv, cap, peak, f"{name}_b_{i}")
            self.prob += beta >= b, f"{name}_beta_ge_{i}"
            self.prob += y >= x.dkv - (peak - cap) * beta, f"{name}_ge_{i}"
            items.append((i, b))
        self.prob += beta <= pulp.lpSum(b for _, b in items), f"{name}_beta_le"
        return KvMax(y, cap, beta, tuple(items))

    def _gate(self, j: int, feature: str, feats: dict, cache: dict):
        """Binary equal to [feature > 0] in slot j (features are integral)."""
        col = [row[j] for row in self.cells]
        if feature == "n_tokens":
            return self.z[j]
        kind = "prefill" if feature in PREFILL_FEATURES else "decode" if feature in DECODE_FEATURES else feature
        if kind in cache:
            return cache[kind]
        a = self._var(f"a_{kind}_{j}", cat=BIN)
        if kind in ("prefill", "decode"):
            items = [x.pz if kind == "prefill" else x.dg for x in col]
            for i, it in enumerate(items):
                self.prob += a >= it, f"a_{kind}_ge_{i}_{j}"
            self.prob += a <= pulp.lpSum(items), f"a_{kind}_le_{j}"
        else:
            self.prob += self.fb[feature] * a >= feats[feature], f"a_{kind}_ge_{j}"
            self.prob += a <= feats[feature], f"a_{kind}_le_{j}"
        cache[kind] = a
        return a

    def _timing(self) -> None:
        prob, T = self.prob, TIME_UNIT
        self.tau: list[list] = []
        self.gates: list[dict] = []
        self.start, self.end = [], []
        prev_end = 0
        for j in range(self.slots):
            feats, cache, taus = self.features(j), {}, []
            for t_idx, term in enumerate(self.terms):
                a = self._gate(j, term.active_if, feats, cache)
                ranges = [piece_range(p, self.fb) for p in term.pieces]
                low = min(0.0, max(lo for lo, _ in ranges)) * T
                tau = self._var(f"tau_{t_idx}_{j}", low if low < 0 else 0)
                if low < 0:
                    prob += tau >= low * a, f"tau_low_{t_idx}_{j}"
                for p_idx, (p, (_, hi)) in enumerate(zip(term.pieces, ranges)):
                    slopes = pulp.lpSum(T * c * feats[f] for f, c in p.coef_s.items() if c)
                    if self.strength.cuts and all(vanishes_with_gate(f, term.active_if) for f, c in p.coef_s.items() if c):
                        prob += tau >= T * p.intercept_s * a + slopes, f"tau_{t_idx}_{p_idx}_{j}"
                    else:
                        big = max(0.0, hi) * T
                        prob += tau >= T * p.intercept_s + slopes - big * (1 - a), f"tau_{t_idx}_{p_idx}_{j}"
                taus.append(tau)
            self.tau.append(taus)
            self.gates.append(cache)
            start = self._var(f"start_{j}", 0)
            prob += start >= prev_end, f"start_after_{j}"
            for i, r in enumerate(self.requests):
                if r.arrival_s > 0:
                    prob += start >= r.arrival_s * T * self.cells[i][j].cz, f"start_arrival_{i}_{j}"
            end = start + pulp.lpSum(taus)
            # no gratuitous idle time: keeps the big-M values below valid (an optimum never waits longer)
            prob += end <= self.t_last + (j + 1) * self.tmax, f"end_cap_{j}"
            self.start.append(start)
            self.end.append(end)
            prev_end = end

    def _objective(self) -> None:
        prob, obj, T = self.prob, self.objective, TIME_UNIT
        parts = []
        if obj.makespan:
            parts.append(obj.makespan * (self.end[-1] - self.t_first))
        self.finish, self.first, self.seen = [], [], {}
        for i, r in enumerate(self.requests):
            arr = r.arrival_s * T
            if obj.latency:
                f = self._var(f"finish_{i}", arr)
                for j in range(self.slots):
                    big = self.t_last + (j + 1) * self.tmax - arr
                    done = self.cells[i][j - 1].fin if j > 0 else 0
                    prob += f >= self.end[j] - big * done, f"finish_{i}_{j}"
                self.finish.append(f)
                parts.append(obj.latency * (f - arr))
            if obj.ttft:
                ft = self._var(f"first_{i}", arr)
                G = 0
                for j in range(self.slots):
                    big = self.t_last + (j + 1) * self.tmax - arr
                    if j == 0:
                        prob += ft >= self.end[0], f"first_{i}_0"
                    else:
                        s = self._var(f"s_{i}_{j - 1}", 0, 1)  # <= [a token was generated by slot j-1]
                        prob += s <= G, f"s_{i}_{j - 1}"
                        self.seen[i, j - 1] = s
                        prob += ft >= self.end[j] - big * s, f"first_{i}_{j}"
                    G = G + self.cells[i][j].g
                self.first.append(ft)
                parts.append(obj.ttft / len(self.requests) * (ft - arr))
        prob += pulp.lpSum(parts)
        if self.objective_cut_s:
            prob += pulp.lpSum(parts) >= self.objective_cut_s * T, "objective_cut"

    # ----------------------------------------------------------------- evaluation helpers
    def objective_s(self) -> float:
        """The PuLP objective at the current variable values, in seconds."""
        return pulp.value(self.prob.objective) / TIME_UNIT

    def size(self) -> dict:
        vs = self.prob.variables()
        return {"variables": len(vs), "integer": sum(v.cat == INT for v in vs),
                "constraints": len(self.prob._constraints)}
