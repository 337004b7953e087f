"""Between Schedules and MILP variable values: a Schedule as a (warm-start) assignment, a solution as a
Schedule, and a constraint check of any assignment."""

from __future__ import annotations

import math

import pulp

from infermax.replay import Replayer
from infermax.schedule import Schedule, ScheduledBatch

import dataclasses

from .formulation import LEX_SLOTS, TIME_UNIT, Formulation, identical_classes


def _set(var, value) -> None:
    if isinstance(var, pulp.LpVariable):
        var.varValue = value


def _val(expr) -> float:
    v = pulp.value(expr)
    return 0.0 if v is None else float(v)


def label_identical(form: Formulation, schedule: Schedule) -> Schedule:
    """``schedule`` with the ids of identical requests permuted into the order the formulation's symmetry
    breaking asks for (finishing batch first, then the processed-batch pattern over the first ``LEX_SLOTS``
    batches, earlier batches first): the same schedule under other labels, so a warm start is never rejected
    for its labelling. Identical requests are equal in every field but the id, so the result is as valid."""
    if form.strength.symmetry == "none":
        return schedule
    where: dict[int, set[int]] = {}
    for j, batch in enumerate(schedule.batches):
        for rid, c in batch.items:
            if c > 0:
                where.setdefault(rid, set()).add(j)
    L = min(form.slots, LEX_SLOTS)

    def key(rid: int):
        seen = where.get(rid, set())
        return max(seen, default=-1), tuple(0 if j in seen else 1 for j in range(L))

    perm: dict[int, int] = {}
    for cls in identical_classes(form.requests):
        ids = [form.requests[i].id for i in cls]
        perm.update(zip(sorted(ids, key=key), ids))
    if all(a == b for a, b in perm.items()):
        return schedule

    def relabel(batch: ScheduledBatch) -> ScheduledBatch:
        p = lambda rid: perm.get(rid, rid)  # noqa: E731
        return dataclasses.replace(batch, items=[(p(r), c) for r, c in batch.items], evict=[p(r) for r in batch.evict],
                                   hidden=frozenset(p(r) for r in batch.hidden),
                                   swap_out=[(p(r), n) for r, n in batch.swap_out],
                                   swap_in=[(p(r), n) for r, n in batch.swap_in])
    return dataclasses.replace(schedule, batches=[relabel(b) for b in schedule.batches])


def set_from_schedule(form: Formulation, schedule: Schedule, cost_model) -> None:
    """Assign every variable from ``schedule`` (replayed to read each request's state); slots beyond the
    schedule's batches stay empty. Raises ValueError if the schedule has more batches than slots."""
    if len(schedule.batches) > form.slots:
        raise ValueError(f"the schedule has {len(schedule.batches)} batches, more than the {form.slots} slots")
    rp = Replayer(schedule.requests, schedule.limits, cost_model)
    index = {r.id: i for i, r in enumerate(form.requests)}
    if set(index) != set(rp.states):
        raise ValueError("the schedule's requests differ from the instance's")
    m = [0] * len(index)
    G = [0] * len(index)
    d = [0] * len(index)
    for j in range(form.slots):
        batch = schedule.batches[j] if j < len(schedule.batches) else ScheduledBatch()
        items, evicted = dict(batch.items), set(batch.evict)
        icur = {rid: s.input_tokens for rid, s in rp.states.items()}
        before = {rid: s.m for rid, s in rp.states.items()}
        if batch.items:
            rp.apply(batch)
        for rid, i in index.items():
            x = form.cells[i][j]
            e = int(rid in evicted)
            c = items.get(rid, 0)
            decode = int(d[i] == 1 and c > 0)
            gen = int(c > 0 and (decode or before[rid] + c == icur[rid]))
            m_after = (0 if e else m[i]) + c
            _set(x.e, e)
            _set(x.cz, int(c > 0))
            _set(x.dg, decode)
            _set(x.g, gen)
            _set(x.d, d[i])
            _set(x.m, m_after)
            cp = c - decode
            for k, b in enumerate(x.bits):
                _set(b, (cp >> k) & 1)
            G[i] += gen
            _set(x.fin, int(G[i] == form.requests[i].output_tokens))
            d[i] = 1 if gen else 0 if (e or c) else d[i]
            m[i] = m_after
        _set(form.z[j], int(bool(batch.items)))
    complete(form)


def complete(form: Formulation) -> None:
    """Given the decision variables (e, cz, dg, g, d, fin, m, bits, z), set every auxiliary variable
    to the value its definition implies: products, KV blocks, gates, term times, natural start times
    (previous end or latest member arrival), finish and first-token times."""
    lim = form.limits
    for j in range(form.slots):
        for i, row in enumerate(form.cells):
            x = row[j]
            cp, mbar, m = _val(x.cp), _val(x.mbar), _val(x.m)
            for k, b in enumerate(x.bits):
                bit = _val(b)
                if x.u:
                    _set(x.u[k], bit * cp)
                if x.w:
                    _set(x.w[k], bit * mbar)
            for cap, (r, beta, products) in x.cap_vars.items():
                _set(r, min(mbar, cap))
                _set(beta, int(round(mbar) >= cap))
                for b, w in zip(x.bits, products):
                    _set(w, _val(b) * min(mbar, cap))
            if x.dkv is not None:
                _set(x.dkv, _val(x.dg) * m)
            held = m - form.rb[i].peak * (_val(row[j - 1].fin) if j > 0 else 0)
            if x.kvb is not None:
                _set(x.kvb, math.ceil(round(held) / lim.block_size))
            if x.mz is not None:
                _set(x.mz, int(round(held) > 0))
        if form.hy[j] is not None:
            _set(form.hy[j], int(any(_val(row[j].dg) > 0.5 for row in form.cells)))
    prev_end = 0.0
    for j in range(form.slots):
        feats = form.features(j)
        for k, q in form.pads[j].values():
            _set(k, math.ceil(round(_val(feats["n_tokens"])) / q))
        for t, beta in form.steps[j].items():
            _set(beta, int(round(_val(feats["n_tokens"])) > t))
        dkv = [round(_val(row[j].dkv)) if row[j].dkv is not None else 0 for row in form.cells]
        for kv in form.kvmax[j].values():
            longest = max(dkv)
            _set(kv.y, longest if kv.cap is None else min(longest, kv.cap))
            for i, b in kv.items:
                _set(b, int(dkv[i] >= kv.cap))
            if kv.beta is not None:
                _set(kv.beta, int(longest >= kv.cap))
        for kind, a in form.gates[j].items():
            f = "n_prefill_seqs" if kind == "prefill" else "n_decode_seqs" if kind == "decode" else kind
            _set(a, int(round(_val(feats[f])) > 0))
        for t_idx, term in enumerate(form.terms):
            active = _val(feats[term.active_if]) > 0.5
            value = max(p.intercept_s + sum(c * _val(feats[f]) for f, c in p.coef_s.items() if c) for p in term.pieces)
            _set(form.tau[j][t_idx], value * TIME_UNIT if active else 0.0)
        arrivals = [r.arrival_s * TIME_UNIT for i, r in enumerate(form.requests) if _val(form.cells[i][j].cz) > 0.5]
        _set(form.start[j], max([prev_end, *arrivals]))
        prev_end = _val(form.end[j])
    ends = [_val(e) for e in form.end]
    for i, f in enumerate(form.finish):
        _set(f, next((ends[j] for j in range(form.slots) if _val(form.cells[i][j].fin) > 0.5), ends[-1]))
    for i, ft in enumerate(form.first):
        G = 0.0
        for j in range(form.slots):
            if j > 0:
                _set(form.seen[i, j - 1], min(1.0, G))
            G += _val(form.cells[i][j].g)
        _set(ft, next((ends[j] for j in range(form.slots) if sum(_val(form.cells[i][k].g) for k in range(j + 1)) > 0.5),
                      ends[-1]))


def violations(prob: pulp.LpProblem, tol: float = 1e-6) -> list[str]:
    """Constraints (and variable bounds/integrality) the current values break, by name."""
    out = []
    for v in prob.variables():
        x = v.varValue
        if x is None:
            out.append(f"{v.name}: unset")
            continue
        if (v.lowBound is not None and x < v.lowBound - tol) or (v.upBound is not None and x > v.upBound + tol):
            out.append(f"{v.name}={x} outside [{v.lowBound}, {v.upBound}]")
        if v.cat == pulp.LpInteger and abs(x - round(x)) > tol:
            out.append(f"{v.name}={x} not integral")
    for name, con in prob._constraints.items():  # PuLP's own backends read this too
        lhs = con.value()  # expression − rhs
        if lhs is None:  # a variable in it is unset (reported above)
            continue
        scale = tol * max(1.0, abs(con.constant))
        if (con.sense == pulp.LpConstraintLE and lhs > scale) or (con.sense == pulp.LpConstraintGE and lhs < -scale) \
                or (con.sense == pulp.LpConstraintEQ and abs(lhs) > scale):
            out.append(f"{name}: residual {lhs:.6g}")
    return out


def to_schedule(form: Formulation, meta: dict) -> Schedule:
    """The current (integral) solution as a Schedule. Empty slots are dropped; a batch that starts after
    the previous one ended (it waited for an arrival) carries ``not_before_s``."""
    batches = []
    prev_end = 0.0
    for j in range(form.slots):
        items, evict = [], []
        for i, r in enumerate(form.requests):
            x = form.cells[i][j]
            c = round(_val(x.c))
            if c > 0:
                items.append((r.id, c))
            if round(_val(x.e)):
                evict.append(r.id)
        start = _val(form.start[j])
        if not items:
            if evict:
                raise ValueError(f"slot {j} evicts {evict} but processes nothing")
            continue
        wait = start > prev_end * (1 + 1e-12) + 1e-9
        batches.append(ScheduledBatch(items, evict, start / TIME_UNIT if wait else None))
        prev_end = _val(form.end[j])
    return Schedule(form.requests, form.limits, batches, dict(meta))
