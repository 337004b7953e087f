"""Lower bounds that scale: makespan, sum of latencies and mean TTFT over every schedule of an instance.

The MILP's dual bound closes only for a handful of requests. These bounds instead reason about
*aggregate* quantities that every complete schedule must produce (total tokens, prefill attention
work, decode KV reads, the number of batches, the KV memory–time area) and solve one small LP over
them (a few dozen variables, whatever the number of requests), so they run in seconds up to B = 20,000.
Every ingredient and its proof is in docs/design.md, "Lower bounds at scale"; the tests check the
bound against brute-force optima and against every registered scheduler on random workloads.

Scope: the semantics of docs/design.md with KV-form caches (recompute evictions and swapping
included). Apt-Serve's hidden-form caches hold half the memory; ``hidden_cache=True`` relaxes the
memory area accordingly (valid for those schedules too, and weaker).

This module combines the ingredients per objective (`LowerBounder`). The pieces it draws on: the demand every
schedule must do (`demand.py`), the aggregate LP over it (`aggregate_lp.py`, solved by `small_lp.py`), the cost
terms' floors and additive split (`cost_terms.py`), and the per-request bounds of the sibling ``*_bound.py``
modules (queued, pairwise, mean busy times, crowded service, work in progress).
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from infermax.costmodel.base import CostTerm
from infermax.engine import check_requests
from infermax.limits import Limits
from infermax.request import Request

from .aggregate_lp import busy_time_lb_s
from .busy_time_bound import chain_sums, kept_work_and_gap, phase_costs, phase_marginals, spt_mean_busy_times
from .cost_terms import BoundUnavailable, additive_split, monotone_terms, nonnegative_gated_terms, term_floor_s
from .crowding_bound import batch_marginal_cap_s, crowded_service_sum
from .demand import Demand, DemandArrays
from .objective import Objective
from .pairwise_bound import RequestClass, class_qp_bound, joint_qp_bound, lower_convex_envelope, step_lower
from .policy import Policies, check_policies_feasible
from .queue_bound import INTERCEPT_SHARES, fine_classes, srpt_finish_times
from .progress_bound import PhaseTerms, phase_terms, progress_sum
from .scale import checked_arguments, refuse_prefix_caching
from .small_lp import LP_SAFETY_RTOL, MIP_TIME_LIMIT_S

# The makespan's one MILP with every term priced per size bin (`_price_per_bin`) may take this long (--I 64 --O 4:
# B = 8 reaches the proven optimum in 6.7 s, 0.003% below it at 5 s; B = 16 takes 1.4 s).
BINNED_MIP_TIME_LIMIT_S = 20.0
# The pipelined-completions DP is exact over all groupings (cubic in the number of requests): up to this many.
PIPELINE_MAX_REQUESTS = 128
# The pairwise-completions QP (`pairwise_bound`): one per distinct (I, O), so only up to this many classes, within
# this time budget for all of them together (a budget cut short still yields a valid, weaker bound).
PAIRWISE_MAX_CLASSES = 16
PAIRWISE_TIME_LIMIT_S = 10.0
STATE_PATH_TIME_LIMIT_S = 30.0  # the state-path MILPs (identical requests): I = 512, O = 128, B = 16-64 in 9-23 s
STATE_PATH_STOP_SLACK_S = 1.5  # a state path that gave nothing this close to its budget ran out of time
# Several classes: one joint QP with cross-class blocks (`joint_qp_bound`); False: each class's QP on its own plus
# min(w) per cross pair (the earlier bound, kept to measure what the joint QP buys).
JOINT_PAIRWISE = True
# The per-request LPs of the queued-completions bound (online arrivals) together take at most this long by
# default; requests not reached keep their coarse-grid work (`LowerBounder._classes`).
QUEUE_TIME_LIMIT_S = 10.0
# Under a caller's time limit (`lower_bound_report`), the bound's optional ingredients stop past this share of the
# time left: 60 online Azure requests took 6.7 s for the sum of latencies (24 release times × a grid of busy LPs) and
# 10.9 s for latency + TTFT under `--time-limit 2`; the search and the MILP need the rest.
BOUND_SHARE_OF_TIME_LEFT = 0.5


# The parts that report each whole-sum ingredient of the latency and TTFT bounds (Σ finish − Σ arrival).
INGREDIENT_PARTS = {"grouped completions": "grouped_sum_s", "pipelined completions": "pipelined_sum_s",
                    "pairwise completions": "pairwise_sum_s", "mean busy times": "mean_busy_sum_s",
                    "work in progress": "work_in_progress_sum_s", "crowded service": "crowded_service_sum_s",
                    "state path": "state_path_sum_s"}


@dataclass
class LowerBound:
    """A valid lower bound on an objective over every schedule (seconds), with its parts."""

    objective: str
    value_s: float
    parts: dict
    elapsed_s: float = 0.0
    set_by: dict[str, str] = field(default_factory=dict)  # per component (makespan, latency, ttft): its ingredient


def _largest(values) -> float | None:
    """The largest of the values that are not None (None if there are none)."""
    return max((v for v in values if v is not None), default=None)


def _k_grid(n: int, dense: int = 64, ratio: float = 1.03) -> list[int]:
    """Counts 1..dense, then geometric steps up to n (n always included)."""
    ks = list(range(1, min(n, dense) + 1))
    k = float(ks[-1])
    while ks[-1] < n:
        k = max(k * ratio, ks[-1] + 1)
        ks.append(min(n, int(k)))
    return ks


class LowerBounder:
    """Bounds for one instance: ``makespan_s()``, ``latency_sum_s()``, ``mean_ttft_s()``, ``of(objective)``."""

    def __init__(self, requests: list[Request], limits: Limits, cost_model, policies: Policies = Policies(),
                 hidden_cache: bool = False, progress=None, pairwise_budget_s: float = PAIRWISE_TIME_LIMIT_S,
                 queue_budget_s: float = QUEUE_TIME_LIMIT_S, mip_budget_s: float = BINNED_MIP_TIME_LIMIT_S,
                 deadline_s: float | None = None, state_path_budget_s: float = STATE_PATH_TIME_LIMIT_S):
        """``deadline_s`` (``time.perf_counter()`` time, None: none): past it, the optional ingredients are skipped
        (release times after the first, rank grid points after the first, the arrival suffixes of the makespan, the
        grouped, pipelined and pairwise completion bounds), so the bound comes back sooner, valid and possibly weaker;
        what every bound needs (the whole demand's busy time, one grid point of the first release, the per-request
        work within its own budget) still runs.
        ``pairwise_budget_s``: the time the pairwise-completions QPs may take together (offline instances);
        ``queue_budget_s``: the time the queued-completions bound may spend on per-request LPs (online
        instances); ``state_path_budget_s``: the state-path MILP's (identical requests arriving
        together); ``mip_budget_s``: the time of the makespan's binned MILP (`_price_per_bin`; the plain one gets
        at most `MIP_TIME_LIMIT_S` of it). A shorter budget
        gives a valid, possibly weaker bound; callers under a time limit pass a share of what is left."""
        if not requests:
            raise ValueError("the workload has no requests")
        check_policies_feasible(requests, limits, policies)  # a bound over no schedule at all would mean nothing
        self.requests, self.limits, self.policies, self.hidden = list(requests), limits, policies, hidden_cache
        self.progress = progress
        self.arrivals = np.array([r.arrival_s for r in requests], dtype=float)
        self.t0 = float(self.arrivals.min())
        self.full = DemandArrays.of(self.requests, limits)
        # The whole instance's busy time prices the model itself (a term that can be negative has a free sum in the
        # LP); the bounds over subsets of the requests restrict batches to some of their items, which needs every
        # active term >= 0, so they price a lower model that has none (`nonnegative_gated_terms`), or refuse.
        self.cost_model = cost_model
        self.model_terms = cost_model.milp_terms()
        self.terms = nonnegative_gated_terms(self.model_terms, self.full.total())
        self.first = DemandArrays.of(self.requests, limits, first_token_only=True)
        self._monotone_problem = monotone_terms(self.terms)
        self._busy_cache: dict = {}
        self._alone_cache: dict = {}
        self._splits: list | None = None
        self.pairwise_budget_s, self.queue_budget_s, self.mip_budget_s = pairwise_budget_s, queue_budget_s, mip_budget_s
        self.state_path_budget_s = state_path_budget_s
        self.deadline_s = deadline_s
        self.cut_by_deadline: list[str] = []  # the ingredients skipped past the deadline or stopped by their time
        self.state_path = None  # (StatePathOutcome, the big-M's schedule sum) once the state path ran

    def _past_deadline(self, ingredient: str) -> bool:
        """Whether ``ingredient`` must be skipped (noted in ``cut_by_deadline``)."""
        if self.deadline_s is None or time.perf_counter() < self.deadline_s:
            return False
        self.cut_by_deadline.append(ingredient)
        return True

    def busy_s(self, d: Demand, integer_counts: bool = False, binned_terms: bool = False,
               time_limit_s: float | None = None, model_terms: bool = False) -> float:
        """`busy_time_lb_s` of ``d``, cached; a MILP gets ``time_limit_s`` (default: ``mip_budget_s``, at most
        `MIP_TIME_LIMIT_S` without ``binned_terms``). ``model_terms``: the cost model's own terms (only for the whole
        instance), not the lower model the subset bounds need (the same unless a term can be negative)."""
        key = (d.requests, d.prompt_tokens, d.decode_items, d.generated, d.prompt_sq, d.decode_read, d.kv_area,
               d.longest_chain, d.longest_output, tuple(sorted(d.prompt_sq_cap.items())), d.longest_read,
               tuple(sorted(d.longest_read_cap.items())), integer_counts, binned_terms, model_terms)
        if key not in self._busy_cache:
            self._busy_cache[key] = busy_time_lb_s(
                d, self.limits, self.model_terms if model_terms else self.terms, self.policies, self.hidden,
                integer_counts=integer_counts,
                binned_terms=binned_terms, time_limit_s=time_limit_s if time_limit_s is not None else
                self.mip_budget_s if binned_terms else min(MIP_TIME_LIMIT_S, self.mip_budget_s))
        return self._busy_cache[key]

    def _need_monotone(self, what: str) -> None:
        """Removing items from a batch never lengthens it: every slope ``>= 0`` and every active term ``>= 0`` in the
        lower model (`nonnegative_gated_terms`; only a model whose always-active term cannot absorb the others'
        negative floors fails that)."""
        for t in self.terms:
            if term_floor_s(t, self.full.total()) < 0:
                raise BoundUnavailable(f"{what} needs every active cost term to be >= 0; {t.name!r} can be negative")
        if self._monotone_problem:
            raise BoundUnavailable(f"{what} needs batch time non-decreasing in every feature: {self._monotone_problem}")

    # ---- makespan ------------------------------------------------------------------------------

    def makespan_s(self) -> LowerBound:
        """Makespan >= busy time of all the work; with arrivals also >= (T − T_min) + busy time of the
        work of requests arriving at or after T, for every T (those batches all run after T)."""
        t = time.perf_counter()
        # one call: worth the small MILP, and its terms priced bin by bin (the larger of the two, in case the binned
        # one stops at its time limit with a weaker dual bound)
        start = time.perf_counter()
        whole = self.busy_s(self.full.total(), integer_counts=True, model_terms=True)
        left = max(0.1, self.mip_budget_s - (time.perf_counter() - start))  # the two MILPs share the budget
        try:
            whole = max(whole, self.busy_s(self.full.total(), integer_counts=True, binned_terms=True,
                                           time_limit_s=left, model_terms=True))
        except RuntimeError:  # HiGHS can fail on the larger model's numerics (20,000 requests); the plain one stands
            pass
        best, best_at = whole, self.t0
        distinct = np.unique(self.arrivals)
        if len(distinct) > 1:
            self._need_monotone("the arrival-suffix makespan bound")
            order = np.argsort(self.arrivals, kind="stable")
            cuts = np.unique(np.linspace(0, len(order) - 1, num=min(len(order), 48)).astype(int))[1:]
            for c in cuts:
                if self._past_deadline("makespan arrival suffixes"):
                    break
                T = self.arrivals[order[c]]
                later = [self.requests[i] for i in order if self.arrivals[i] >= T]
                v = T - self.t0 + self.busy_s(DemandArrays.of(later, self.limits).total())
                if v > best:
                    best, best_at = v, T
        set_by = "busy time" if best_at == self.t0 else f"busy time after the arrival at {best_at - self.t0:.4g} s"
        return LowerBound("makespan", float(best), {"busy_time_lb_s": whole, "suffix_from_s": float(best_at - self.t0),
                                                    "set_by": set_by}, time.perf_counter() - t)

    # ---- sum of latencies and mean TTFT --------------------------------------------------------

    def _completion_sum(self, first_token_only: bool, what: str) -> tuple[float, dict]:
        """Σ over requests of (finish or first-token) time − arrival, bounded through order statistics. The
        k-th earliest completion is at least (a) the k-th smallest of T_r + solo_r, and (b) for every release
        time T among the arrivals: T + the busy time of the (k − n_T) least demanding requests arriving at or
        after T, where n_T requests arrive before T (at least k − n_T of the first k to complete arrived at or
        after T, and all their work runs after T); T = T_min gives T_min + busy time of the k least demanding."""
        self._need_monotone(what)
        arrays = self.first if first_token_only else self.full
        n = len(arrays)
        solo = self._solo_s(first_token_only)
        lower = np.sort(self.arrivals + solo)  # lower[k-1] bounds the k-th completion
        order = np.argsort(self.arrivals, kind="stable")
        sorted_arrivals = self.arrivals[order]
        releases = np.unique(sorted_arrivals[np.unique(np.linspace(0, n - 1, num=min(n, 24)).astype(int))])
        # The queued bound first: it has its own budget (`queue_budget_s`), and the release grid below runs until the
        # deadline, so in this order the two together stay within it (the other way round, the queued bound's budget
        # came on top: 9.6 s instead of 7.5 s for the whole Azure conversation trace's mean TTFT, same bound, under a
        # 7.5 s deadline).
        queued = self._queued_finish_times(arrays, first_token_only) if len(releases) > 1 else None
        # Crowded service next, before the release grid: it is cheap (a second or two on a whole trace) and under
        # load it is the strongest latency ingredient, while the grid runs until the deadline. Offline one window holds
        # every request and the queue bounds dominate (A.3 mixes), so it runs with online arrivals only.
        crowded = None
        if not first_token_only and len(releases) > 1:
            floor = max(float(lower.sum()), float(queued.sum()) if queued is not None else 0.0)
            crowded = _largest(self._crowded_service_sum(arrays, solo, sp, floor) for sp in self._additive_splits()
                               if not self._past_deadline("crowded service"))
        # With arrivals, mean busy times and work in progress next, also before the release grid: under load they are
        # the strongest (the whole azure-conv trace at C = 8,192, fitted model: 27.6 and 30.6 s per request against
        # 15.1 s queued), and the grid would spend a --time-limit deadline first (43 s of LPs there).
        busy_and_progress = (self._busy_and_progress(arrays, solo) if not first_token_only and len(releases) > 1
                             else None)
        reached = lower if queued is None else np.maximum(lower, queued)  # what the k-th completion has already
        points = self._raise_by_release_times(arrays, releases, order, lower, reached)
        arrival_sum = float(self.arrivals.sum())
        parts = {"sum_solo_s": float(solo.sum()), "lp_grid_points": points, "release_times": len(releases),
                 "order_statistic_sum_s": float(lower.sum()) - arrival_sum}
        per_rank = "order statistics"
        if queued is not None:
            parts["queued_sum_s"] = float(queued.sum()) - arrival_sum
            lower = np.maximum(lower, queued)
            per_rank = "order statistics and queued completions"
        # each ingredient's bound on Σ finish (None: not run), under its name in docs/design.md
        finish_sums = {per_rank: float(lower.sum())}
        splits = [] if self._past_deadline("grouped, pipelined and pairwise completions") else self._additive_splits()
        finish_sums["grouped completions"] = _largest(
            self._grouped_completion_sum(arrays, lower, first_token_only, sp) for sp in splits
            if not self._past_deadline("grouped completions"))
        if not first_token_only and splits:
            finish_sums["pipelined completions"] = _largest(
                self._pipelined_completion_sum(arrays, lower, sp) for sp in splits
                if not self._past_deadline("pipelined completions"))
            finish_sums["pairwise completions"] = _largest(
                self._pairwise_completion_sum(arrays, sp, self.pairwise_budget_s / len(splits)) for sp in splits
                if not self._past_deadline("pairwise completions"))
        if not first_token_only:
            if busy_and_progress is None:  # offline: after the grid, unless its deadline cut the split-based bounds
                busy_and_progress = self._busy_and_progress(arrays, solo) if splits else (None, None)
            finish_sums["mean busy times"], finish_sums["work in progress"] = busy_and_progress
        finish_sums["crowded service"] = crowded
        if not first_token_only:
            known = max((v for v in finish_sums.values() if v is not None), default=None)
            path = self._state_path_latency_s(None if known is None else known - arrival_sum)
            finish_sums["state path"] = None if path is None else path + arrival_sum
        found = {name: value for name, value in finish_sums.items() if value is not None}
        for name, value in found.items():
            if name in INGREDIENT_PARTS:
                parts[INGREDIENT_PARTS[name]] = value - arrival_sum
        set_by = max(found, key=found.get)  # (the first of equal ones)
        parts["set_by"] = set_by
        return found[set_by] - arrival_sum, parts

    def _raise_by_release_times(self, arrays: DemandArrays, releases: np.ndarray, order: np.ndarray,
                                lower: np.ndarray, reached: np.ndarray) -> int:
        """(b) of `_completion_sum`, in place: the k-th completion's bound ``lower`` (and ``reached``, what it has
        already, which the grid's pruning reads; it may be ``lower`` itself) raised to T + the busy time of the
        (k − n_T) least demanding requests arriving at or after T, for the first release time T and the later ones
        until the deadline. ``order``: the requests by arrival. Returns how many grid points were solved."""
        n = len(arrays)
        sorted_arrivals = self.arrivals[order]
        points = 0
        for T in releases:
            if T != releases[0] and self._past_deadline("release times after the first"):
                break
            before = int(np.searchsorted(sorted_arrivals, T, side="left"))  # n_T
            late = arrays if before == 0 else arrays.subset(order[before:])
            grid = _k_grid(n - before)
            values, computed = self._release_grid_values(T, late, grid, reached[before:])
            points += computed
            # completion k >= before + m gets T + busy(m') for the largest grid m' <= k − before
            idx = np.searchsorted(np.asarray(grid), np.arange(1, n - before + 1), side="right") - 1
            raised = values[idx]
            lower[before:] = np.maximum(lower[before:], raised)
            if reached is not lower:
                reached[before:] = np.maximum(reached[before:], raised)
            if self.progress:
                self.progress(int(T), n)
        return points

    def _state_path_latency_s(self, floor_s: float | None = None) -> float | None:
        """The state-path bound on Σ latency (`identical_bound`; identical requests arriving together, at most
        `identical_bound.MAX_REQUESTS`), within ``state_path_budget_s``; None where it does not apply. Its big-M
        needs the sum of latencies of some schedule: Sarathi's, else vLLM's. ``floor_s``: the other ingredients' best
        (its MILPs stop once they cannot beat it, `state_path_latency_bound`)."""
        from infermax.engine import simulate
        from infermax.schedulers.base import SchedulerError

        from .identical_bound import applicable, state_path_latency

        if applicable(self.requests, self.limits, self.cost_model, self.hidden) is not None \
                or self._past_deadline("state path"):
            return None
        for name in ("sarathi", "vllm"):
            try:
                result = simulate(self.requests, name, self.limits, self.cost_model)
            except (SchedulerError, ValueError):
                continue
            upper = float(result.requests["finish_s"].sum() - self.arrivals.sum())
            budget = self.state_path_budget_s
            if self.deadline_s is not None:  # (it skips itself when less than a second is left)
                budget = min(budget, self.deadline_s - time.perf_counter())
            started = time.perf_counter()
            outcome = state_path_latency(self.requests, self.limits, self.cost_model, upper, time_limit_s=budget,
                                         hidden_cache=self.hidden, floor_s=floor_s)
            self.state_path = (outcome, upper)
            if outcome.value_s is None and not outcome.stopped_at_floor \
                    and time.perf_counter() - started >= budget - STATE_PATH_STOP_SLACK_S:
                # it ran out of its time (it applies): say so, with the time it had, since more time gives a bound;
                # a stop at the floor is not one (no grouping could beat the other ingredients)
                self.cut_by_deadline.append(f"state path (no bound within its {max(budget, 0.0):.3g} s)")
            return outcome.value_s
        return None

    def release_grid_values_unpruned(self, T: float, late: DemandArrays, grid: list[int], reached: np.ndarray
                                     ) -> tuple[np.ndarray, int]:
        """`_release_grid_values` without its pruning: every grid point solved (the reference the tests and
        ``benchmarks/release_grid_pruning.py`` patch in to check and time the pruning)."""
        return np.array([T + self.busy_s(late.smallest(m)) for m in grid]), len(grid)

    def _release_grid_values(self, T: float, late: DemandArrays, grid: list[int], reached: np.ndarray
                             ) -> tuple[np.ndarray, int]:
        """``T + busy(m)`` (the busy time of the m least demanding of ``late``, the requests arriving at or after
        ``T``) at each rank-grid point m of ``grid``, and how many LPs that took. Grid point i bounds the
        completions of ranks grid[i] .. grid[i+1] − 1 among ``late`` (rank r: ``reached[r − 1]``, what those
        completions are known to reach already: ascending).

        Only the points that can raise a bound are solved. busy(m) does not decrease with m, so once the points i
        and j are solved, every point between them is at most ``values[j]``, and if that is no more than ``reached``
        over the ranks they bound, none of them raises any: they are not solved and take ``values[i]`` (at most
        their own value, so still a bound, and changing nothing). Otherwise the midpoint is solved and both halves
        are looked at, breadth first. So the result is that of solving every point, with the LPs of an online
        instance under load, where the earlier bounds already exceed most of a late release's points, mostly
        skipped (2,000 azure-conv requests: 213 LPs instead of 3,471). The first point is always solved; past the
        deadline no other is, and each unsolved point takes the value of the nearest solved one before it (valid)."""
        g = len(grid)
        values, solved = np.zeros(g), np.zeros(g, dtype=bool)

        def solve(i: int) -> None:
            values[i], solved[i] = T + self.busy_s(late.smallest(grid[i])), True

        solve(0)
        if g > 1 and not self._past_deadline("rank grid points"):
            solve(g - 1)
            pending = deque([(0, g - 1)])
            while pending:
                i, j = pending.popleft()
                if j - i < 2 or values[j] <= reached[grid[i + 1] - 1:grid[j] - 1].min():
                    continue
                if self._past_deadline("rank grid points"):
                    break
                mid = (i + j) // 2
                solve(mid)
                pending.extend(((i, mid), (mid, j)))
        at = np.flatnonzero(solved)  # starts with 0
        return values[at[np.searchsorted(at, np.arange(g), side="right") - 1]], len(at)

    def _busy_and_progress(self, arrays: DemandArrays, solo: np.ndarray) -> tuple[float | None, float | None]:
        """The mean-busy-times and work-in-progress bounds on Σ finish (the largest over the additive splits; None
        where the deadline cut an ingredient before any split gave a value)."""
        splits = self._additive_splits()
        busy = _largest(self._mean_busy_completion_sum(arrays, sp) for sp in splits
                        if not self._past_deadline("mean busy times"))
        progress = _largest(self._work_in_progress_sum(arrays, sp, self.arrivals + solo) for sp in splits
                            if not self._past_deadline("work in progress"))
        return busy, progress

    def _queued_finish_times(self, arrays: DemandArrays, first_token_only: bool) -> np.ndarray | None:
        """Ascending lower bounds on the k-th finish (or first token) with online arrivals: SRPT on one machine
        of rate 1 over each request's attributed work (`queue_bound`; docs/design.md, "Queued completions"),
        the per-rank maximum over the additive splits and the ways of sharing the batch intercept. The work:
        the request's marginal LP alone on the fine grid (while `queue_budget_s` lasts, else its coarse-grid
        value) plus its share of the intercept, which is the prefill gate's ``a_p`` for first tokens (every
        batch with a first-token item has a prefill item) and ``a0`` otherwise."""
        lim = self.limits
        start, splits = time.perf_counter(), self._additive_splits()
        kv = arrays.kv_area * (0.5 if self.hidden else 1.0)
        # first-token items are prefill items: at most min(C, P) of their tokens per batch; otherwise C tokens
        tokens_per_batch = min(lim.C, lim.prefill_budget) if first_token_only else lim.C
        tokens = arrays.prompt + arrays.decode_items
        best = None
        for i, (a0, a_p, marginal) in enumerate(splits):  # split i may use its share of the budget and what is left
            work = self._fine_work_s(arrays, first_token_only, marginal,
                                     start + self.queue_budget_s * (i + 1) / len(splits))
            gate = a_p if first_token_only else a0
            for l_kv, l_tok, l_item in INTERCEPT_SHARES:
                if l_item and lim.Rmax is None:
                    continue
                share = l_kv * kv / lim.M + l_tok * tokens / tokens_per_batch
                if l_item:
                    share = share + l_item * arrays.generated / lim.Rmax
                finish = srpt_finish_times(self.arrivals, work + gate * share)
                best = finish if best is None else np.maximum(best, finish)
        return None if best is None else best * (1 - LP_SAFETY_RTOL)

    def _mean_busy_completion_sum(self, arrays: DemandArrays, split) -> float | None:
        """Σ_r f_r >= Σ_r (M_r + G_r) (docs/design.md, "Mean busy times"; `busy_time_bound`): the least total mean
        busy time of the requests' kept work on one machine of rate 1 (preemptive SPT) plus each request's least
        distance from that mean to its last token, for the given `additive_split`, the largest over the ways of
        sharing the intercept. Each request keeps the work of its (I, O) rounded down as in `fine_classes` (keeping
        less work is still valid). None when the deadline passes first."""
        a0, _, marginal = split
        lim = self.limits
        classes, which = fine_classes(arrays.prompt, arrays.generated)
        refills = not self.policies.eviction_free
        chains, first = [], np.empty(len(classes))
        for c, (i, o) in enumerate(classes):
            if c % 64 == 0 and self._past_deadline("mean busy times"):
                return None
            chains.append(chain_sums(int(i), int(o), a0, marginal, refills))
            first[c] = self._work_alone_s(int(i), 1, marginal)
        prompt = classes[:, 0]
        prompt_blocks = -(-prompt // lim.block_size) * lim.block_size  # blocks(I), in tokens
        kv_factor = (0.5 if self.hidden else 1.0) / lim.M
        best = None
        for l_kv, l_tok, l_item in INTERCEPT_SHARES:
            if l_item and lim.Rmax is None:
                continue
            item = l_item / lim.Rmax if l_item else 0.0
            # the first token's items: the last chunk holds blocks(I), the chunks hold I tokens, one generates
            first_share = l_kv * kv_factor * prompt_blocks + l_tok * prompt / lim.C + item
            k, gap = kept_work_and_gap(chains, first, first_share, a0, l_kv * kv_factor, l_tok / lim.C + item)
            k, gap = k[which], gap[which]
            total = float((spt_mean_busy_times(self.arrivals, k) + gap).sum())
            best = total if best is None else max(best, total)
            if self._past_deadline("mean busy times"):
                break
        return None if best is None else best * (1 - LP_SAFETY_RTOL)

    def _work_in_progress_sum(self, arrays: DemandArrays, split, lower_s: np.ndarray) -> float | None:
        """Σ_r f_r >= the work-in-progress bound (docs/design.md, "Work in progress"; `progress_bound`) for the given
        `additive_split`: mean busy times with the batches' unused intercept priced and the crowding of every batch
        between a request's first piece and its last token. ``lower_s``: per request a lower bound on its finish.
        None past the deadline."""
        inputs = self._progress_inputs(arrays, split)
        if inputs is None:
            return None
        value = progress_sum(self.arrivals, lower_s, *inputs, split[0], lambda: self._past_deadline("work in progress"))
        return None if value is None else value * (1 - LP_SAFETY_RTOL)

    def _progress_inputs(self, arrays: DemandArrays, split) -> tuple[list[PhaseTerms], np.ndarray] | None:
        """The `PhaseTerms` of each (I, O) class and each request's class: its (I, O) rounded down as in
        `fine_classes` (less kept work: still valid). None past the deadline."""
        a0, _, marginal = split
        classes, which = fine_classes(arrays.prompt, arrays.generated)
        refills = not self.policies.eviction_free
        kv_factor = (0.5 if self.hidden else 1.0) / self.limits.M
        terms = []
        for c, (i, o) in enumerate(classes):
            if c % 64 == 0 and self._past_deadline("work in progress"):
                return None
            terms.append(phase_terms(self._work_alone_s(int(i), 1, marginal), phase_costs(int(i), int(o), marginal),
                                     int(i) + np.arange(1, max(int(o), 1), dtype=float), a0, kv_factor, refills))
        return terms, which

    def _crowded_service_sum(self, arrays: DemandArrays, solo: np.ndarray, split, floor: float) -> float | None:
        """Σ_r f_r >= Σ arrivals + the crowded-service bound on Σ latency (docs/design.md, "Crowded service";
        `crowding_bound`), for the given `additive_split`. ``floor``: the completion sum already found (the fine grid
        runs only when the coarse one comes near it). None past the deadline."""
        inputs = self._crowded_service_inputs(arrays, split)
        if inputs is None:
            return None
        work, root, w_cap = inputs
        arrivals = float(self.arrivals.sum())
        value = crowded_service_sum(self.arrivals, solo, np.asarray(arrays.generated), work, root, split[0], w_cap,
                                    floor - arrivals, lambda: self._past_deadline("crowded service"))
        return None if value is None else (value + arrivals) * (1 - LP_SAFETY_RTOL)

    def _crowded_service_inputs(self, arrays: DemandArrays, split) -> tuple[np.ndarray, np.ndarray, float] | None:
        """Per request: its marginal work ``w_r`` (first-token items, then one phase per later token) and ``q_r`` (the
        square roots of those parts, summed), at its (I, O) rounded down as in `fine_classes` (less work: still
        valid); and the largest marginal cost of one batch. None past the deadline."""
        _, _, marginal = split
        classes, which = fine_classes(arrays.prompt, arrays.generated)
        refills = not self.policies.eviction_free
        work, root = np.empty(len(classes)), np.empty(len(classes))
        for c, (i, o) in enumerate(classes):
            if c % 64 == 0 and self._past_deadline("crowded service"):
                return None
            first = self._work_alone_s(int(i), 1, marginal)
            phase = phase_marginals(int(i), int(o), marginal, refills)[0] if o > 1 else np.zeros(0)
            work[c] = first + float(phase.sum())
            root[c] = math.sqrt(first) + float(np.sqrt(phase).sum())
        w_cap = batch_marginal_cap_s(marginal, self.limits, int((arrays.prompt + arrays.generated).max()), self.hidden)
        return work[which], root[which], w_cap

    def _fine_work_s(self, arrays: DemandArrays, first_token_only: bool, marginal: tuple, deadline: float
                     ) -> np.ndarray:
        """Per request: its marginal work alone (`_work_alone_s`) at its (I, O) rounded down to the fine grid of
        `fine_classes`, the most populated grid points first until ``deadline`` (perf_counter); a request whose
        point is not reached keeps its coarse-grid value (`_marginal_work_s`). Both are lower bounds, so the
        larger is kept."""
        coarse = self._marginal_work_s(first_token_only, marginal)
        classes, which = fine_classes(arrays.prompt, arrays.generated)
        fine = np.zeros(len(classes))
        for c in np.argsort(-np.bincount(which, minlength=len(classes)), kind="stable"):
            if time.perf_counter() > deadline:
                break
            fine[c] = self._work_alone_s(*classes[c], marginal)
        return np.maximum(coarse, fine[which])

    def _additive_splits(self) -> list[tuple[float, float, tuple[CostTerm, ...]]]:
        """The additive splits the completion bounds try (each gives a valid bound; the largest is kept): token
        steps dropped, and linearised with none, half or all of their term's intercept moved into the slope.
        Computed once per instance (the marginal terms' identity keys `_work_alone_s`'s cache)."""
        if self._splits is None:
            self._splits = []
            totals = self._unchunked_totals()
            for sp in [additive_split(self.terms, self.limits.C, share, totals) for share in (0.0, 0.5, 1.0)] + [
                    additive_split(self.terms, totals=totals)]:
                if sp is not None and sp not in self._splits:
                    self._splits.append(sp)
        return self._splits

    def _unchunked_totals(self) -> dict[str, float]:
        """The instance's feature sums with every prompt prefilled in one chunk and every later token decoded: what
        `_kept_piece` ranks the pieces of a term on."""
        a = self.full
        return {"n_tokens": float(a.prompt.sum() + a.decode_items.sum()), "prefill_tokens": float(a.prompt.sum()),
                "prefill_sq_tokens": float(a.prompt_sq.sum()), "n_prefill_seqs": float(len(a)),
                "n_decode_seqs": float(a.decode_items.sum()), "decode_kv_tokens": float(a.decode_read.sum())}

    def _work_alone_s(self, I: int, O: int, marginal: tuple[CostTerm, ...]) -> float:
        """A lower bound on the intercept-free time of the items that give one request of prompt I its first O
        tokens: the busy LP of that request alone over ``marginal`` (0 for O <= 0). Cached per (I, O, terms):
        the completion bounds ask for the same values (``marginal`` is one of `_additive_splits`, which live as
        long as this object, so their ids are stable keys)."""
        if O <= 0:
            return 0.0
        key = (int(I), int(O), id(marginal))
        if key not in self._alone_cache:
            self._alone_cache[key] = busy_time_lb_s(DemandArrays.of([Request(0, 0.0, int(I), int(O))], self.limits)
                                                    .total(), self.limits, marginal, self.policies, self.hidden)
        return self._alone_cache[key]

    def _pairwise_completion_sum(self, arrays: DemandArrays, split, budget_s: float) -> float | None:
        """Σ_k f_(k) for an offline instance through every pair of completions (docs/design.md, "Pairwise
        completions"; `pairwise_bound`): a convex QP over the completion profiles of the distinct (I, O) classes,
        certified by Frank–Wolfe, joint across classes (`joint_qp_bound`; when that is unavailable, per class
        plus, for every two requests of different classes, the smaller of their marginal works). None with
        arrivals at different times, without an additive split, or above `PAIRWISE_MAX_CLASSES` classes."""
        if len(np.unique(self.arrivals)) > 1:
            return None
        a0, _, marginal = split
        keys = np.array([(r.prompt_tokens, r.output_tokens) for r in self.requests])
        classes, which = np.unique(keys, axis=0, return_inverse=True)
        which = np.ravel(which)
        if len(classes) > PAIRWISE_MAX_CLASSES:
            return None
        total, works, counts, parts = 0.0, [], [], []
        for c, (I, O) in enumerate(classes.tolist()):
            members = np.flatnonzero(which == c)
            grid = _k_grid(O - 1, dense=64, ratio=1.04) if O > 1 else []
            grid = [0, *grid, O]
            at = [self._work_alone_s(I, O - d, marginal) for d in grid]
            partial = step_lower(grid, at, O)
            kernel = lower_convex_envelope(partial)
            parts.append(RequestClass(len(members), kernel, partial, self._batches_needed(arrays.subset(members))))
        if len(parts) > 1 and JOINT_PAIRWISE:
            joint = joint_qp_bound(parts, a0, budget_s)
            if joint is not None:
                return (len(self.requests) * self.t0 + joint.lower_s) * (1 - LP_SAFETY_RTOL)
        for part in parts:
            qp = class_qp_bound(part.n, a0, part.kernel, part.ch, budget_s / len(classes))
            if qp is None:
                return None
            total += qp.lower_s
            works.append(float(part.kernel[0]))
            counts.append(part.n)
        cross = sum(counts[i] * counts[j] * min(works[i], works[j])
                    for i in range(len(counts)) for j in range(i + 1, len(counts)))
        return (len(self.requests) * self.t0 + total + cross) * (1 - LP_SAFETY_RTOL)

    def _pipelined_completion_sum(self, arrays: DemandArrays, lower: np.ndarray, split) -> float | None:
        """Σ_k f_(k) bounded with the work that requests finishing later must already have done
        (docs/design.md, "Pipelined completions"): a request finishing d batches after another has generated all
        but d of its tokens before it. Exact DP over every grouping of the completions (no grid), so only up
        to `PIPELINE_MAX_REQUESTS` requests; None beyond, without an additive split, or when some O = 1."""
        n = len(arrays)
        o_min = int(arrays.generated.min())
        if n > PIPELINE_MAX_REQUESTS or o_min < 2:
            return None
        a0, _, marginal = split
        work = np.sort(self._marginal_work_s(False, marginal))
        W = np.concatenate([[0.0], np.cumsum(work)])
        ch = self._batches_needed(arrays).astype(float)
        old = np.concatenate([[0.0], lower])
        # M(d): the least marginal work of any request's first O − d tokens, on a grid of d in [1, o_min − 1];
        # non-increasing in d, so a d between grid points g_{a−1} < d <= g_a gets M(g_a).
        classes = np.unique(np.array([(r.prompt_tokens, r.output_tokens) for r in self.requests]), axis=0)
        d_grid = sorted({1, o_min - 1, *np.geomspace(1, o_min - 1, 12).astype(int).tolist()})
        M = [min(self._work_alone_s(i, o - d, marginal) for i, o in classes) for d in d_grid]
        gaps = [(1, M[0])] + [(d_grid[a - 1] + 1, M[a]) for a in range(1, len(d_grid))] + [(o_min, 0.0)]
        k = np.arange(n + 1)
        best = 0.0
        for theta in (0.0, 0.25, 0.5, 0.75):
            for lam in (0.0, 0.5, 1.0):
                own = theta * k * old + (1 - theta) * k * (self.t0 + a0 * lam * ch + W)  # a group ending at k, per size
                V = np.full((n + 1, n + 1), math.inf)  # V[j, i]: groups up to the one covering (j, i]
                V[0, 1:] = own[1:] + (1 - theta) * a0 * (1 - lam) * ch[1:] * n  # β_1 >= ch(k_1), all n wait for it
                for i in range(1, n):
                    prev = V[:i, i]
                    s_prev = (i - np.arange(i)).astype(float)
                    s = k[i + 1:] - i
                    R = n - i
                    trans = np.full(len(s), math.inf)
                    for d, m in gaps:
                        val = (prev[:, None] + (1 - theta) * m * s_prev[:, None] * s[None, :]).min(axis=0)
                        trans = np.minimum(trans, val + (1 - theta) * a0 * (1 - lam) * d * R)
                    # the new group's own part: θ·s·old(k) + (1 − θ)·s·(T_min + a0·λ·ch(k) + W(k)) with k = i + s
                    V[i, i + 1:] = trans + theta * s * old[i + 1:] + (1 - theta) * s * (
                        self.t0 + a0 * lam * ch[i + 1:] + W[i + 1:])
                best = max(best, float(V[:, n].min()))
        return best * (1 - LP_SAFETY_RTOL)

    def _classes(self, first_token_only: bool, coarse: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Distinct (I, O) classes (O = 1 for first tokens) and each request's class. Above 400 classes (or
        ``coarse``) a request takes the point of a geometric (I, O) grid at most as demanding in both I and O (every
        per-request bound used is monotone in the demand)."""
        keys = np.array([(r.prompt_tokens, 1 if first_token_only else r.output_tokens) for r in self.requests])
        if coarse or len(np.unique(keys, axis=0)) > 400:
            gi = np.unique(np.concatenate([[1], np.geomspace(1, keys[:, 0].max(), 24).astype(int)]))
            go = np.unique(np.concatenate([[1], np.geomspace(1, keys[:, 1].max(), 16).astype(int)]))
            keys = np.stack([gi[np.searchsorted(gi, keys[:, 0], side="right") - 1],
                             go[np.searchsorted(go, keys[:, 1], side="right") - 1]], axis=1)
        return np.unique(keys, axis=0, return_inverse=True)

    def _solo_s(self, first_token_only: bool) -> np.ndarray:
        """Per request: a lower bound on (its finish or first-token time) − arrival, the busy time of its own
        work (monotonicity: a batch is at least as long as its items from this request alone), computed once
        per distinct (I, O) (`_classes`).

        Under a deadline, one LP per class (each about 20 ms) must not outlast it: after each class, when the mean
        time per class so far says the rest would, the requests of the classes not yet solved take the coarse
        grid's point below them instead (valid, possibly weaker), if that needs fewer LPs. The mean counts every
        class solved so far, so a first class found in the cache (no LP) cannot hide the cost of the rest."""
        classes, which = self._classes(first_token_only)
        which = np.ravel(which)

        def alone(i, o) -> float:
            return self.busy_s(DemandArrays.of([Request(0, 0.0, int(i), int(o))], self.limits).total())

        if self.deadline_s is None or len(classes) <= 1:
            return np.array([alone(i, o) for i, o in classes])[which]
        busy = np.empty(len(classes))
        grid = None
        start = time.perf_counter()
        for k, (i, o) in enumerate(classes):
            busy[k] = alone(i, o)
            rest = len(classes) - k - 1
            now = time.perf_counter()
            if rest and now + (now - start) / (k + 1) * rest > self.deadline_s:
                if grid is None:
                    grid, grid_which = self._classes(first_token_only, coarse=True)
                    grid_which = np.ravel(grid_which)
                unsolved = which > k
                needed = np.unique(grid_which[unsolved])
                if len(needed) < rest:
                    self.cut_by_deadline.append("exact (I, O) classes of the per-request solo times")
                    grid_busy = np.full(len(grid), np.nan)
                    for g in needed:
                        grid_busy[g] = alone(*grid[g])
                    return np.where(unsolved, grid_busy[grid_which], busy[np.minimum(which, k)])
        return busy[which]

    def _marginal_work_s(self, first_token_only: bool, marginal: tuple) -> np.ndarray:
        """Per request: a lower bound on the intercept-free time of its own items (the busy LP of the request
        alone over the `additive_split` terms), per distinct (I, O) class as in `_solo_s`."""
        classes, which = self._classes(first_token_only)
        work = np.array([self._work_alone_s(i, o, marginal) for i, o in classes])
        return work[np.ravel(which)]

    def _grouped_completion_sum(self, arrays: DemandArrays, lower: np.ndarray, first_token_only: bool, split
                                ) -> float | None:
        """Σ_k f_(k) bounded by grouping the completions by batch (docs/design.md, "Batched completions").

        Requests completing in the same batch share its finish time, so each is charged the bound of the last
        of them; completing in many batches instead costs a per-batch intercept ``a0`` in every batch up to
        each finish. For a schedule whose completion batches are β_1 < … < β_m with k_1 < … < k_m requests done
        by them, every request of group g finishes at >= max(lower[k_g], T_min + a0·β_g + (a_c − a0)·g +
        W(k_g)), with W(k) the k smallest per-request marginal works and β_g >= max(ch(k_g), g − 1 + ch(1)).
        The least such sum over all groupings (a DP over k, exact on a grid of group ends where every
        quantity takes its value at the grid point below) is a lower bound, for the given `additive_split`."""
        a0, a_c, marginal = split
        n = len(arrays)
        if first_token_only or int(arrays.generated.max()) == 1:
            a_c = max(a_c, a0)  # the completing item is a prefill: its batch pays the prefill gate
        else:
            a_c = a0  # a last token may come from a decode or a refill: only the cheaper gate is sure
        work = np.sort(self._marginal_work_s(first_token_only, marginal))
        W = np.concatenate([[0.0], np.cumsum(work)])  # W[k]: the k smallest works
        ch = self._batches_needed(arrays)  # ch[k]: batches before any k requests can all be done (k >= 1)
        grid = np.asarray(_k_grid(n, dense=128, ratio=1.01))
        ends = np.concatenate([[0], grid[1:] - 1, [n]])  # group ends: the last k of each grid interval
        q = grid - 1  # 0-based index of each interval's first k
        base = self.t0 + W[grid]
        low = lower[q]
        size_end = ends[1:]
        G = len(grid)
        best = math.inf
        prev = np.full(G + 1, math.inf)
        prev[0] = 0.0
        later = np.tril_indices(G, -1)  # (j, i) with j after i
        for g in range(1, G + 1):
            beta = np.maximum(ch[grid], g - 1 + ch[1])
            h = np.maximum(low, base + a0 * beta + (a_c - a0) * g)  # per member of a group ending in interval i
            # cur[i] = min_{j < i} prev[j] + (ends[i] − ends[j])·h[i − 1]
            cand = prev[:-1, None] + (size_end[None, :] - ends[:-1, None]) * h[None, :]
            cand[later] = math.inf  # j must precede i
            cur = np.full(G + 1, math.inf)
            cur[1:] = cand.min(axis=0)
            best = min(best, cur[G])
            if not np.isfinite(cur).any() or cur[1:].min() >= best:
                break
            prev = cur
        return best * (1 - LP_SAFETY_RTOL) if math.isfinite(best) else None

    def _batches_needed(self, arrays: DemandArrays) -> np.ndarray:
        """ch[k] (k = 1..n, ch[0] = 0): batches any schedule needs before k requests can all be done: the
        k-th smallest chain, and the k smallest requests' tokens over C, prompts over min(C, P), KV area over
        M and generated tokens over Rmax."""
        lim = self.limits

        def cum(a):
            return np.concatenate([[0], np.cumsum(np.sort(a))])

        ch = np.concatenate([[0], np.sort(arrays.chain)])
        ch = np.maximum(ch, -(-cum(arrays.prompt + arrays.decode_items) // lim.C))
        ch = np.maximum(ch, -(-cum(arrays.prompt) // min(lim.C, lim.prefill_budget)))
        area = cum(arrays.kv_area)
        ch = np.maximum(ch, np.ceil((area * 0.5 if self.hidden else area) / lim.M).astype(np.int64))
        if lim.Rmax is not None:
            ch = np.maximum(ch, -(-cum(arrays.generated) // lim.Rmax))
        return ch

    def latency_sum_s(self) -> LowerBound:
        t = time.perf_counter()
        v, parts = self._completion_sum(False, "the latency bound")
        return LowerBound("latency", v, parts, time.perf_counter() - t)

    def mean_ttft_s(self) -> LowerBound:
        t = time.perf_counter()
        v, parts = self._completion_sum(True, "the TTFT bound")
        return LowerBound("ttft", v / len(self.requests), parts, time.perf_counter() - t)

    def of(self, objective: Objective) -> LowerBound:
        """The weighted sum of the component bounds (each is a lower bound of its component)."""
        t = time.perf_counter()
        total, parts, set_by = 0.0, {}, {}
        for name, w in objective.weights().items():
            lb = {"makespan": self.makespan_s, "latency": self.latency_sum_s, "ttft": self.mean_ttft_s}[name]()
            total += w * lb.value_s
            parts[f"{name}_lower_bound_s"] = lb.value_s
            parts[f"{name}_set_by"] = set_by[name] = lb.parts["set_by"]
        if self.cut_by_deadline:
            parts["cut_by_deadline"] = sorted(set(self.cut_by_deadline))
        return LowerBound(str(objective), total, parts, time.perf_counter() - t, set_by)


def lower_bound(requests: list[Request], limits: Limits, cost_model, objective: Objective = Objective(makespan=1),
                policies: Policies = Policies(), hidden_cache: bool = False) -> LowerBound:
    """A valid lower bound on ``objective`` over every schedule of the instance (docs/design.md)."""
    refuse_prefix_caching(limits)
    return LowerBounder(requests, limits, cost_model, policies, hidden_cache).of(objective)


@dataclass(frozen=True)
class LatencyRefinement:
    """What `refine_bound` needs to go on with the state-path bound of identical requests (`identical_bound`) after
    a first call gave ``latency_lb_s`` as the sum-of-latencies component: the instance, the big-M's schedule sum
    ``upper_s``, the next (narrower) cells' ``width``, the last MILP's time, its batch-shape table, and the
    objective's weight on the sum of latencies."""

    requests: list
    limits: Limits
    cost_model: object
    hidden: bool
    upper_s: float
    width: int
    last_milp_s: float
    times: dict | None = field(repr=False)  # (None: the first call did not finish it)
    latency_weight: float
    latency_lb_s: float


@dataclass(frozen=True)
class BoundReport:
    """`lower_bound_report`'s answer: the bound, how it was obtained, and what a caller with time to spare after its
    search may still tighten (`refine_bound`; None: nothing)."""

    value_s: float
    method: str
    refinable: LatencyRefinement | None = None


# `refine_bound` tries the next cells only when the time left is at least this many times the last MILP's (each
# narrowing took 1.5-3x the time of the one before: B = 64, I = 512, O = 128 in 13, 19, 32 and 97 s for cells of
# 8, 7, 6 and 5 on the 2-core machine).
REFINE_TIME_FACTOR = 2.0
# A caller refining after its search (`better`, `analyse`: no MILP ran) keeps this much of its time for what follows.
REFINE_RESERVE_S = 1.0


def refine_bound(report: BoundReport, time_left_s: float, progress=None) -> BoundReport:
    """``report`` with its sum-of-latencies component raised by the state path with narrower cells than the first
    call reached, within ``time_left_s``; ``report`` itself when nothing can be gained (nothing to refine, too
    little time for the next cells, or the narrower MILPs do not beat the component's bound). Valid for the same
    reason as the first call (docs/design.md, "The state-path bound": every width gives a bound), and the
    objective's other components are unchanged, so the weighted sum stays a bound. ``progress(message)``: told when
    the MILPs start."""
    from .identical_bound import state_path_latency

    r = report.refinable
    if r is None or time_left_s < max(REFINE_TIME_FACTOR * r.last_milp_s, 2.0):
        return report
    if progress is not None:
        progress(f"raising the lower bound in the {time_left_s:.0f} s left (state path, cells of {r.width} and narrower)")
    started = time.perf_counter()
    outcome = state_path_latency(r.requests, r.limits, r.cost_model, r.upper_s, time_limit_s=time_left_s,
                                 hidden_cache=r.hidden, floor_s=r.latency_lb_s, start_width=r.width, times=r.times)
    if outcome.value_s is None or outcome.value_s <= r.latency_lb_s:
        return BoundReport(report.value_s, report.method)
    value = report.value_s + r.latency_weight * (outcome.value_s - r.latency_lb_s)
    method = (f"{report.method}; raised after the search by the state path with cells of {outcome.width} "
              f"({time.perf_counter() - started:.1f} s)")
    more = None
    if outcome.width is not None and outcome.width > 1:
        more = LatencyRefinement(r.requests, r.limits, r.cost_model, r.hidden, r.upper_s, outcome.width - 1,
                                 outcome.milp_s, outcome.times, r.latency_weight, outcome.value_s)
    return BoundReport(value, method, more)


def lower_bound_report(requests, limits, cost_model, objective: Objective, policies: Policies = Policies(),
                       time_left_s: float | None = None) -> BoundReport:
    """The bound and how it was obtained; 0 (the trivial bound) with the reason when the cost model does not
    allow one (`BoundUnavailable`) or an LP fails in HiGHS (a `RuntimeError`, seen once at O = 10^8).
    ``time_left_s``: the caller's remaining time; the pairwise QPs or the queued bound's LPs, the makespan's
    binned MILP and the state-path MILP get at most a quarter of it each, and past half of it the optional
    ingredients are skipped (`LowerBounder`'s ``deadline_s``; the method string says which). Where the state path
    can still gain (cells wider than one request, or no value within its budget), the report says how to go on
    (`refine_bound`). ``objective``: an `Objective` or its text; the arguments' types are checked first
    (`checked_arguments`) and the requests (`check_requests`)."""
    objective = checked_arguments(limits, cost_model, objective, None)
    check_requests(requests)
    budget = PAIRWISE_TIME_LIMIT_S if time_left_s is None else min(PAIRWISE_TIME_LIMIT_S, 0.25 * max(time_left_s, 0.0))
    try:  # (the pairwise QPs run offline only, the queued bound's LPs online only: one budget serves both)
        mip = BINNED_MIP_TIME_LIMIT_S if time_left_s is None else min(BINNED_MIP_TIME_LIMIT_S,
                                                                      0.25 * max(time_left_s, 0.0))
        deadline = None if time_left_s is None else time.perf_counter() + BOUND_SHARE_OF_TIME_LEFT * max(time_left_s, 0.0)
        path = STATE_PATH_TIME_LIMIT_S if time_left_s is None else min(STATE_PATH_TIME_LIMIT_S,
                                                                       0.25 * max(time_left_s, 0.0))
        bounder = LowerBounder(requests, limits, cost_model, policies, pairwise_budget_s=budget,
                               queue_budget_s=budget, mip_budget_s=max(mip, 0.1), deadline_s=deadline,
                               state_path_budget_s=path)
        lb = bounder.of(objective)
        cut = lb.parts.get("cut_by_deadline")
        by = "; ".join(f"{name}: {how}" for name, how in lb.set_by.items()) if len(lb.set_by) > 1 else \
            next(iter(lb.set_by.values()))
        return BoundReport(lb.value_s, f"aggregate LP bound, set by {by} ({lb.elapsed_s:.1f} s"
                           + (f"; skipped for time: {', '.join(cut)})" if cut else ")"),
                           _refinable(bounder, objective, lb))
    except BoundUnavailable as exc:
        return BoundReport(0.0, f"no aggregate bound: {exc}")
    except RuntimeError as exc:  # HiGHS failing on an LP's numerics (seen at O = 10^8): the trivial bound stands
        return BoundReport(0.0, f"no aggregate bound: {exc}")


def _refinable(bounder: LowerBounder, objective: Objective, lb: LowerBound) -> LatencyRefinement | None:
    """How `refine_bound` can go on after ``bounder`` gave ``lb``: where its state path ran and did not stop at its
    floor (then no grouping was worth trying), with the next narrower cells when some MILP gave a value at cells
    wider than one request (a MILP stopped by its time limit counts: its dual bound is one; under the default 60 s,
    B = 64 at I = 512, O = 128 stops so at cells of 8, below the other ingredients), or from its first cells when it
    ran out of time before any MILP gave a value."""
    from .identical_bound import default_width

    if bounder.state_path is None or "latency" not in objective.weights():
        return None
    outcome, upper = bounder.state_path
    if outcome.stopped_at_floor:
        return None
    if outcome.width is None:  # out of time before any value
        width, last_s = default_width(len(bounder.requests)), 0.0
    elif outcome.width > 1:
        width, last_s = outcome.width - 1, outcome.milp_s
    else:
        return None
    return LatencyRefinement(bounder.requests, bounder.limits, bounder.cost_model, bounder.hidden, upper, width,
                             last_s, outcome.times, objective.weights()["latency"], lb.parts["latency_lower_bound_s"])
