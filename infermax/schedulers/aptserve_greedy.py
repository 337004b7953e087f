"""Apt-Serve's selection rules as pure functions over candidates (tested against brute force in
``tests/test_aptserve_greedy.py``): the value-density greedy of the paper's appendix with its single-request check
(``greedy_select``, ``greedy_take``) and the FCFS ablation's queue-order rule (``fcfs_select``).

A request is a ``Candidate``: its KV option and, with the hybrid cache, its hidden-form option. The greedy splits each
into items (``marginal_items``: a hidden step and a KV upgrade, or one KV step), takes them by value density until the
first that does not fit, and compares the result with the best single request (the paper's 2-approximation). The
scheduler (``aptserve.py``) builds the candidates; ``aptserve_waiting.py`` feeds the greedy its items lazily, and
``aptserve_running.py`` computes the same decisions with numpy.
"""

from __future__ import annotations

from typing import Callable, Hashable, Iterable, NamedTuple, Sequence


class Candidate(NamedTuple):
    """One request's options: KV (``kv_value``, ``kv_size``) or hidden (``hidden_value``,
    ``hidden_size``; ``hidden_value`` None = not offered). A named tuple: one is built per request
    read, every batch, and a tuple is about 3x cheaper to build than a frozen dataclass."""

    key: Hashable
    kv_value: float
    kv_size: int
    hidden_value: float | None = None
    hidden_size: int = 0


class Selection(NamedTuple):
    """The greedy's decision: ``forms[key]`` is ``"kv"`` or ``"hidden"`` for selected requests. (A named tuple, as
    `Candidate`: one is built per plan.)"""

    forms: dict
    value: float
    used: int
    single: bool = False  # the best single request beat the greedy set (S')


def marginal_items(c: Candidate) -> list[tuple[float, int, str]]:
    """``(density θ, size Δm, step)`` items of a candidate, step ``hidden`` / ``upgrade`` / ``kv``.

    The hidden step and the KV upgrade are offered when the hidden option exists, is smaller, and
    its density is at least the KV-only density ``kv_value / kv_size`` (then ``θ_hidden ≥
    θ_upgrade``: the two steps are the concave hull of the request's options); otherwise one KV step.
    """
    kv_density = c.kv_value / c.kv_size
    hv, hs = c.hidden_value, c.hidden_size
    if hv is not None and 0 < hs < c.kv_size and 0 <= hv <= c.kv_value and hv / hs >= kv_density:
        upgrade = (c.kv_value - hv) / (c.kv_size - hs)
        # θ_upgrade ≤ θ_hidden holds exactly; rounding can break it when the two are equal, and an
        # upgrade sorted before its hidden step would be taken alone. The single KV step is worth
        # the same then.
        if upgrade <= hv / hs:
            return [(hv / hs, hs, "hidden"), (upgrade, c.kv_size - hs, "upgrade")]
    return [(kv_density, c.kv_size, "kv")]


def feasible_items(c: Candidate, capacity: int) -> list[tuple[float, int, str]]:
    if c.kv_size <= capacity:
        return marginal_items(c)
    if c.hidden_value is not None and 0 < c.hidden_size <= capacity and c.hidden_value >= 0:
        return [(c.hidden_value / c.hidden_size, c.hidden_size, "hidden")]
    return []


def greedy_select(candidates: Sequence[Candidate], capacity: int,
                  admit: Callable[[Hashable, int], bool] | None = None, double_check: bool = True) -> Selection:
    """The appendix's Algorithm 1 over ``candidates`` with memory ``capacity``.

    Items (``marginal_items``) are sorted by density, descending and stable (ties keep candidate
    order), and taken until the first that does not fit. A request whose first item is taken
    must pass ``admit(key, n_selected_before)`` (token and sequence budgets): the first refusal stops
    the greedy too. With ``double_check``, the best single feasible option of the request whose
    item did not fit (KV if it fits ``capacity``, else hidden) replaces the set when it is worth more.
    Options larger than ``capacity`` are dropped first (no solution can use them); the appendix's
    proof assumes this, and without it a request too big to fit could block every other one.
    """
    items = []
    for order, c in enumerate(candidates):
        for rank, (theta, size, step) in enumerate(feasible_items(c, capacity)):
            items.append((-theta, order, rank, size, step, c))
    items.sort(key=lambda t: (t[0], t[1], t[2]))
    return greedy_take(items, capacity, admit, double_check)


def greedy_take(items: Iterable[tuple], capacity: int, admit: Callable[[Hashable, int], bool] | None = None,
                double_check: bool = True) -> Selection:
    """``greedy_select``'s loop over items ``(−θ, order, rank, size, step, candidate)`` already in
    ascending order; it stops reading at the first item that does not fit or is refused, so a lazy
    iterator (``WaitingQueue.items``) is read only that far."""
    forms: dict = {}
    value, used = 0.0, 0
    blocked: Candidate | None = None
    for _, _, _, size, step, c in items:
        if used + size > capacity:
            blocked = c
            break
        if step != "upgrade":
            if admit is not None and not admit(c.key, len(forms)):
                break
            forms[c.key] = "hidden" if step == "hidden" else "kv"
            value += c.hidden_value if step == "hidden" else c.kv_value
        else:
            forms[c.key] = "kv"
            value += c.kv_value - c.hidden_value
        used += size
    if double_check and blocked is not None and (admit is None or admit(blocked.key, 0)):
        single = None
        if blocked.kv_size <= capacity:
            single = ("kv", blocked.kv_value, blocked.kv_size)
        elif blocked.hidden_value is not None and 0 < blocked.hidden_size <= capacity:
            single = ("hidden", blocked.hidden_value, blocked.hidden_size)
        if single is not None and single[1] > value:
            return Selection({blocked.key: single[0]}, single[1], single[2], single=True)
    return Selection(forms, value, used)


def fcfs_select(cands: Iterable[Candidate], capacity: int, admit) -> Selection:
    """Queue order: KV if it fits, else hidden if offered and it fits; stop at the first that fits neither."""
    forms: dict = {}
    value, used = 0.0, 0
    for c in cands:
        if used + c.kv_size <= capacity:
            form, v, size = "kv", c.kv_value, c.kv_size
        elif c.hidden_value is not None and used + c.hidden_size <= capacity:
            form, v, size = "hidden", c.hidden_value, c.hidden_size
        else:
            break
        if not admit(c.key, len(forms)):
            break
        forms[c.key] = form
        value, used = value + v, used + size
    return Selection(forms, value, used)
