"""Policy constraints the solver can force, and a replay-based check that a Schedule obeys them.

Definitions (docs/design.md, solver section), in the replayer's terms:

* ``no_hybrid``: no batch holds both a prefill-phase item (``m < Icur`` before the batch) and a
  decode-phase item.
* ``no_chunked_prefill``: every prefill-phase item processes all its remaining input
  (``c = Icur − m``), i.e. a prefill always completes in one batch and generates a token.
* ``eviction_free``: no batch evicts.
"""

from __future__ import annotations

from dataclasses import dataclass

from infermax.limits import Limits
from infermax.replay import Replayer, recorded_swap_cost
from infermax.request import Request
from infermax.schedule import Schedule

_WITHOUT = {"no_hybrid": "hybrid batches", "no_chunked_prefill": "chunked prefills", "eviction_free": "evictions"}


@dataclass(frozen=True)
class Policies:
    no_hybrid: bool = False
    no_chunked_prefill: bool = False
    eviction_free: bool = False

    def names(self) -> list[str]:
        return [n for n in ("no_hybrid", "no_chunked_prefill", "eviction_free") if getattr(self, n)]

    def scope(self) -> str:
        """"every schedule" + this: the schedules the forced policies leave (empty when none is forced)."""
        names = [_WITHOUT[n] for n in self.names()]
        if not names:
            return ""
        return " without " + (names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1])


def check_policies_feasible(requests: list[Request], limits: Limits, policies: Policies) -> None:
    """Raise ValueError when no schedule obeys the forced policies. Only ``no_chunked_prefill`` can exclude every
    schedule: each prompt must then be prefilled in one batch, so it must fit ``min(C, P)`` (a refill after an
    eviction is longer, but a schedule need not evict). Hybrid-free and eviction-free schedules exist whenever any
    schedule does (one request at a time, each alone within the limits: `check_fits`)."""
    if not policies.no_chunked_prefill:
        return
    cap = min(limits.C, limits.prefill_budget)
    for r in requests:
        if r.prompt_tokens > cap:
            raise ValueError(
                f"request {r.id}: its {r.prompt_tokens}-token prompt exceeds min(C, P) = {cap}, and no chunked prefill "
                f"requires every prefill to complete in one batch: no schedule obeys the forced policies; raise C/P or "
                f"allow chunked prefills")


def policy_violations(schedule: Schedule, policies: Policies, cost_model) -> list[str]:
    """Replay ``schedule`` (its swaps timed by the swap model it records) and list every batch that breaks a forced
    policy (empty: it obeys them)."""
    rp = Replayer(schedule.requests, schedule.limits, cost_model, recorded_swap_cost(schedule))
    problems = []
    for j, batch in enumerate(schedule.batches):
        if policies.eviction_free and batch.evict:
            problems.append(f"batch {j}: evicts {batch.evict} (eviction_free)")
        phases = set()
        for rid, c in batch.items:  # a request evicted in a batch is not processed in it (replay rejects it)
            s = rp.states[rid]
            m, icur = s.m, s.input_tokens
            if m < icur:
                phases.add("prefill")
                if policies.no_chunked_prefill and c != icur - m:
                    problems.append(f"batch {j}: request {rid} prefills {c} of {icur - m} remaining tokens (no_chunked_prefill)")
            else:
                phases.add("decode")
        if policies.no_hybrid and len(phases) == 2:
            problems.append(f"batch {j}: mixes prefill and decode items (no_hybrid)")
        rp.apply(batch)
    return problems
