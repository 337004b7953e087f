"""EcoServe's KV allocation model: up-front allocations, a reserve, and KV pipelining.

The ledger charges every request that holds or reserves KV:

- a waiting request (PT chunks, queued or preempted GTs): ``blocks(GPU-resident tokens)``;
- a running GT: ``blocks(limit)``, ``limit`` = the largest ``m`` its allocation allows (admitted at
  ``m0`` with ``gen`` generation tokens: ``limit = m0 + gen``).

``used`` = Σ charges. Every request keeps ``m ≤ limit`` and ``blocks`` is monotone, so ``used ≤ M``
implies the replayer's KV check. Group admission keeps ``used ≤ M − R`` (the reserve ``R``); PT
chunks and GTs that outgrow their allocation may use all of ``M``.

**Pipelining** (``lend``): a writer (a running GT) lends the top ``size`` tokens of its own region to
a guest GT; the writer's limit and charge drop by ``size``, the guest's rise by ``size`` (``size`` a
multiple of the physical block, so ``blocks(x + size) = blocks(x) + size`` and lending is
ledger-neutral). Each writer keeps a stack of its guests, the lowest slot (adjacent to its own
region) on top. When a writer needs a token beyond its limit (``need``) it first takes back the
lowest slot: a guest still holding KV there must leave (``swap`` event: its tokens written since it
was hosted are swapped out, or it is evicted), a guest that finished already returned the slot. The
slot's own part joins the writer's region and the guest's own guests become the writer's. With no
guest left, the writer grows into free KV (the reserve) by ``grow_step`` tokens, or by one token
when that is all that fits, or fails (the scheduler then preempts it).

A guest that finishes while its slot's writer chain still runs becomes a *zombie* charging its own
part until the writer reaches it; otherwise the space is freed.
"""

from __future__ import annotations

from typing import Callable


class Alloc:
    """One request's entry in the ledger."""

    __slots__ = ("rid", "running", "m0", "limit", "charge", "own", "guests", "lender", "holds_slot")

    def __init__(self, rid: int):
        self.rid = rid
        self.running = False
        self.m0 = 0  # m when admitted (a guest's tokens beyond m0 are in its slot)
        self.limit = 0
        self.charge = 0
        self.own = 0  # a guest's share of its slot, returned to the lender when it leaves
        self.guests: list[Alloc] = []  # slots lent, lowest (adjacent to the own region) last
        self.lender: Alloc | None = None
        self.holds_slot = False  # a guest whose KV still sits in its lender's region


class KVLedger:
    """The allocation model (see the module docstring); ``blocks`` is the physical block rounding."""

    def __init__(self, M: int, blocks: Callable[[int], int], grow_step: int = 32):
        self.M, self.blocks, self.grow_step = M, blocks, grow_step
        self.used = 0
        self.allocs: dict[int, Alloc] = {}
        self.zombies: dict[int, Alloc] = {}  # finished guests whose own part awaits their lender

    def _get(self, rid: int) -> Alloc:
        a = self.allocs.get(rid)
        if a is None:
            a = self.allocs[rid] = Alloc(rid)
        return a

    def charge_of(self, rid: int) -> int:
        a = self.allocs.get(rid)
        return 0 if a is None else a.charge

    def set_resident(self, rid: int, gpu_tokens: int) -> None:
        """A waiting request holding ``gpu_tokens`` on the GPU (a PT after a chunk, a queued GT)."""
        a = self._get(rid)
        new = self.blocks(gpu_tokens)
        self.used += new - a.charge
        a.charge, a.limit, a.running = new, gpu_tokens, False

    def admission_cost(self, rid: int, m: int, gen: int) -> int:
        """Extra KV charged by admitting a GT with ``m`` cached tokens and ``gen`` generation tokens."""
        return self.blocks(m + gen) - self.charge_of(rid)

    def admit(self, rid: int, m: int, gen: int) -> Alloc:
        """Start a GT: ``limit = m + gen``, charge ``blocks(limit)``."""
        a = self._get(rid)
        new = self.blocks(m + gen)
        self.used += new - a.charge
        a.running, a.m0, a.limit, a.charge = True, m, m + gen, new
        a.guests, a.lender, a.own, a.holds_slot = [], None, 0, False
        return a

    def lend(self, owner: Alloc, size: int, guest_rid: int, guest_m: int) -> Alloc:
        """``owner`` lends the top ``size`` tokens of its own region to a queued GT (charge-neutral)."""
        g = self.allocs[guest_rid]
        if not owner.running or size <= 0 or owner.limit - size < 0:
            raise ValueError(f"request {owner.rid} cannot lend {size} tokens")
        owner.limit -= size
        owner.charge -= size
        if owner.holds_slot:
            owner.own -= size
        g.running, g.m0, g.limit, g.charge = True, guest_m, guest_m + size, g.charge + size
        g.own, g.lender, g.holds_slot, g.guests = size, owner, True, []
        owner.guests.append(g)
        return g

    def need(self, rid: int, m_next: int) -> tuple[bool, list[Alloc]]:
        """Make room for the running GT ``rid`` to hold ``m_next`` tokens.

        Returns (ok, guests that must leave their slot now: swap them out or evict them, then call
        ``vacate``). ``ok`` False: no guest left and no free KV; nothing was changed beyond the slots
        taken back."""
        a = self.allocs[rid]
        leaving: list[Alloc] = []
        while m_next > a.limit and a.guests:
            g = a.guests.pop()
            a.limit += g.own
            a.charge += g.own  # ledger-neutral: taken off the guest (here if finished, else by vacate)
            if a.holds_slot:
                a.own += g.own  # the guest's part is now part of a's own region (returned with it)
            if g.holds_slot:
                leaving.append(g)
            else:  # a finished guest's remaining charge was exactly its own part
                self.zombies.pop(g.rid, None)
                g.charge = 0
            a.guests.extend(g.guests)  # the guest's guests sit right above its own part
            for gg in g.guests:
                gg.lender = a
            g.guests, g.lender = [], None
        if m_next <= a.limit:
            return True, leaving
        for step in (max(self.grow_step, m_next - a.limit), m_next - a.limit):
            delta = self.blocks(a.limit + step) - a.charge
            if self.used + delta <= self.M:
                self.used += delta
                a.limit += step
                a.charge += delta
                return True, leaving
        return False, leaving

    def vacate(self, rid: int, gpu_tokens: int) -> None:
        """A guest taken back by ``need`` keeps ``gpu_tokens`` on the GPU (0 if evicted)."""
        g = self.allocs[rid]
        new = self.blocks(gpu_tokens)
        self.used += new - (g.charge - g.own)
        g.charge, g.limit, g.running, g.holds_slot, g.own = new, gpu_tokens, False, False, 0
        if gpu_tokens == 0:
            del self.allocs[rid]

    def preempt(self, rid: int, gpu_tokens: int) -> None:
        """A running GT stops, keeping its KV resident. A guest still in its slot keeps its whole
        charge (its lender will take the slot back); otherwise the unused allocation is freed."""
        a = self.allocs[rid]
        a.running = False
        if not a.holds_slot:
            new = self.blocks(gpu_tokens)
            self.used += new - a.charge
            a.charge, a.limit = new, gpu_tokens

    def release(self, rid: int) -> None:
        """A request finished or was evicted. A guest still in its slot keeps only its own part
        charged (a *zombie*) until its lender's writer takes the slot back and inherits its guests;
        any other request frees its charge, and its guests (and their zombies) own their slots."""
        a = self.allocs.pop(rid, None)
        if a is None:
            return
        a.running = False
        if a.holds_slot:
            self.used -= a.charge - a.own
            a.charge, a.holds_slot = a.own, False
            self.zombies[rid] = a
        else:
            self.used -= a.charge
            a.charge = 0
            self._orphan(a)

    def _orphan(self, a: Alloc) -> None:
        """Nobody will take ``a``'s slots back: live guests own their slots, zombies are freed."""
        for g in a.guests:
            g.lender, g.holds_slot = None, False
            if self.zombies.pop(g.rid, None) is not None:
                self.used -= g.charge
                g.charge = 0
                self._orphan(g)
        a.guests = []

    def check(self) -> None:
        """Raise unless ``used`` equals the sum of charges and stays within ``M``."""
        total = sum(a.charge for a in self.allocs.values()) + sum(a.charge for a in self.zombies.values())
        if total != self.used or self.used > self.M:
            raise AssertionError(f"ledger used={self.used}, sum of charges={total}, M={self.M}")


def hosting_plan(owner_own: int, region: int, unit: int, buffer: float,
                 pick: Callable[[int], tuple[int, int] | None]) -> list[tuple[int, int, int, int]]:
    """KV pipelining for one host: which guests go where, level by level (Fig. 9b, specs §6.7-6.8).

    The host may still write ``owner_own`` tokens, the top ``region`` of which (a multiple of
    ``unit``) may be lent. At each level every writer with a lendable region ``r ≥ 2·unit`` offers its
    top ``r − half`` tokens, ``half = unit·⌊r/(2·unit)⌋``; the writer reaches that slot after its own
    remaining tokens, so a guest must need at most ``⌊(1 − buffer)·min(deadline, slot)⌋`` tokens.
    ``pick(cap)`` returns ``(guest id, guest own tokens)`` or None; a filled slot becomes a writer
    (region = slot) at the next level; an unfilled one ends its writer's recursion. Returns
    ``(writer index, guest id, slot size, deadline)`` with writer index 0 = the host, ``i`` = the
    i-th guest placed (1-based).
    """
    plan = []
    own = {0: owner_own}
    level = [(0, region)]
    while level:
        nxt = []
        for w, r in level:
            if r < 2 * unit:
                continue
            half = unit * (r // (2 * unit))
            slot = r - half
            deadline = own[w] - slot
            cap = int((1 - buffer) * min(deadline, slot))
            choice = pick(cap) if cap >= 1 else None
            if choice is None:
                continue
            rid, _ = choice
            plan.append((w, rid, slot, deadline))
            own[w] -= slot
            own[len(plan)] = slot
            nxt += [(w, half), (len(plan), slot)]
        level = nxt
    return plan
