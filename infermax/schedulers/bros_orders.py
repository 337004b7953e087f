"""BROS's real-time (RT) priority orders: per slack target, keys that are replaced, never removed.

An RT request has a slack target T (its TTFT target before its first token, its TPOT target after it) and a key
(reference time, arrival, id), so that its slack is ``T − (now − reference time)``; within one target, slack
order is key order (`BrosScheduler._ranked`). Per target, a request's key sits in one of three deques, each in
ascending key order:

- ``cand``: the budget's candidates (`BrosScheduler.budget` reads them from the front);
- ``late``: the requests the budget's scan found late (slack below the time of running them alone), which stay
  late until a batch runs them (slack only falls as time passes);
- ``held``: additionally, the KV holders as of the iteration's start (FindPreemptBlock's victims, read from the
  most-slack end).

A request gets a new key only when a batch runs it (its reference time becomes the batch's end, later than every key
filed: BROS never chunks a prefill, so every item yields a token) or when it arrives (its arrival time, the latest
filed so far). So keys enter at the end of a deque. The old key is not looked for and removed: it stays where it is
as a *stale* entry. An entry is live while it is the very key object its request holds now (``key[rid] is entry``;
for ``held``, ``holder[rid] is entry``), and every reader skips the others. Stale entries gather at the front of
``cand`` and ``late`` (the requests a batch runs are the most urgent) and at the back of ``held`` (the victims
dropped are those with the most slack), where readers pop them (and `file` pops them before it appends, so a batch's
victims do not end up under the next batch's new holders). A target's candidate and late deques are rebuilt from
their live entries once they hold more than twice its requests plus `COMPACT_SLACK` entries, and its holder deque
once it holds more than twice its holders plus `COMPACT_SLACK` (a target may keep thousands of requests while few of
them hold KV, and a reader from the holders' back must not pass the stale entries of all the others), so stale
entries cost O(1) amortised per re-filing and memory stays linear in the queued requests.

Exceptions to appending, kept exact: a key below the last entry (a target that is one request's TTFT target and
another's TPOT target, where an arrival is filed after a batch that ended later; direct calls) is put in place by
rebuilding its deque sorted. A candidate filed below a late key breaks "every late key precedes every candidate",
so `rank_keys` merges the two deques when their ends overlap.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from heapq import merge

COMPACT_SLACK = 64  # stale entries a target's deques may hold beyond twice its requests before a rebuild


def _append(by_target: dict[float, deque], target: float, keys: list) -> deque:
    """Add ``keys`` (ascending) to ``target``'s deque: appended when above its last entry, else in place. Returns
    the deque."""
    entries = by_target.get(target)
    if entries is None:
        entries = by_target[target] = deque(keys)
    elif not entries or keys[0] > entries[-1]:
        entries.extend(keys)
    else:
        entries = by_target[target] = deque(sorted([*entries, *keys]))
    return entries


class RtOrders:
    """The three per-target orders of BROS's RT requests; see the module docstring. Readers use the dicts
    directly: ``cand``, ``late``, ``held`` (target → deque of keys), ``key`` and ``holder`` (id → its live key)."""

    __slots__ = ("cand", "late", "held", "key", "holder", "target", "members", "holding")

    def __init__(self):
        self.cand: dict[float, deque] = {}
        self.late: dict[float, deque] = {}
        self.held: dict[float, deque] = {}
        self.key: dict[int, tuple] = {}  # every RT request's key (live in cand or late)
        self.holder: dict[int, tuple] = {}  # the KV holders' keys (live in held)
        self.target: dict[int, float] = {}
        self.members: dict[float, int] = {}  # RT requests per target
        self.holding: dict[float, int] = {}  # KV holders per target

    def file(self, filed: list[tuple[float, tuple, bool]]) -> None:
        """File RT requests under new keys, as (target, key, holds KV): each becomes a candidate (a request filed
        is not yet found late) and, holding KV, a holder; its previous key, if any, goes stale."""
        key_of, holder, target_of, members, holding = self.key, self.holder, self.target, self.members, self.holding
        by_target: dict[float, tuple[list, list]] = {}
        left: set[float] = set()  # other targets whose holders fell (their holder deques may need compacting)
        last = lists = None
        for target, key, holds in filed:
            rid = key[2]
            old = target_of.get(rid)
            was_holder = rid in holder
            if old != target:
                if was_holder:  # it leaves ``old``'s holders (and joins ``target``'s below if it holds KV)
                    holding[old] -= 1
                    left.add(old)
                    del holder[rid]
                    was_holder = False
                if old is not None:
                    self._leave_target(old)
                members[target] = members.get(target, 0) + 1
                target_of[rid] = target
            key_of[rid] = key
            if target != last:
                lists = by_target.get(target)
                if lists is None:
                    lists = by_target[target] = ([], [])
                last = target
            lists[0].append(key)
            if holds:
                holder[rid] = key
                if not was_holder:
                    holding[target] = holding.get(target, 0) + 1
                lists[1].append(key)
            elif was_holder:
                del holder[rid]
                holding[target] -= 1
        late = self.late
        for target, (keys, held_keys) in by_target.items():
            keys.sort()
            cand = _append(self.cand, target, keys)
            held = self.held.get(target)
            if held_keys:
                held_keys.sort()
                while held and holder.get(held[-1][2]) is not held[-1]:  # stale back entries (dropped victims)
                    held.pop()
                held = _append(self.held, target, held_keys)
            most = 2 * members[target] + COMPACT_SLACK  # `_compact`'s test, written out (once per target and batch)
            if (len(cand) > most or len(late.get(target, ())) > most
                    or held is not None and len(held) > 2 * holding.get(target, 0) + COMPACT_SLACK):
                self._compact(target)
        for target in left.difference(by_target):
            if target in self.members:
                self._compact(target)

    def forget(self, rid: int) -> None:
        """A finished request: its keys go stale."""
        del self.key[rid]
        self.stop_holding(rid)
        self._leave_target(self.target.pop(rid))

    def stop_holding(self, rid: int) -> None:
        """A request swapped out whole without running: it keeps its key (and its lateness), not its holder entry."""
        if self.holder.pop(rid, None) is not None:
            target = self.target[rid]
            self.holding[target] -= 1
            held = self.held.get(target)
            if held is not None and len(held) > 2 * self.holding[target] + COMPACT_SLACK:
                self._compact(target)

    def mark_late(self, target: float, keys: list) -> None:
        """Move ``keys`` (popped from the front of ``target``'s candidates, ascending) to its late order."""
        _append(self.late, target, keys)

    def unmark_late(self) -> None:
        """Every late request becomes a candidate again (time went back in direct calls)."""
        for target, late in self.late.items():
            self.cand[target] = deque(sorted([*self.cand.get(target, ()), *late]))
        self.late.clear()

    def rank_keys(self, target: float) -> list[deque] | Iterator[tuple]:
        """``target``'s live and stale keys in ascending order: the late ones, then the candidates. Usually a list
        of deques to read one after the other (the late deque ends below the candidates' first entry: see the
        module docstring); a merge of the two when they overlap. The late deque's stale front is dropped first."""
        late, cand = self.late.get(target), self.cand.get(target)
        if late is not None:
            key_of = self.key
            while late and key_of.get(late[0][2]) is not late[0]:
                late.popleft()
            if not late:
                del self.late[target]
                late = None
        if late is None:
            return [cand] if cand else []
        if not cand:
            return [late]
        return [late, cand] if late[-1] < cand[0] else merge(late, cand)

    def holder_groups(self) -> dict[float, deque]:
        """The holder deques, their stale back entries (victims dropped by earlier batches) popped."""
        holder = self.holder
        for target, held in list(self.held.items()):
            while held and holder.get(held[-1][2]) is not held[-1]:
                held.pop()
            if not held:
                del self.held[target]
        return self.held

    def _leave_target(self, target: float) -> None:
        left = self.members[target] - 1
        if left:
            self.members[target] = left
        else:  # nothing live is left under it
            del self.members[target]
            self.holding.pop(target, None)
            for by_target in (self.cand, self.late, self.held):
                by_target.pop(target, None)

    def _compact(self, target: float) -> None:
        """Rebuild ``target``'s deques from their live entries once they hold too many stale ones."""
        most_filed = 2 * self.members.get(target, 0) + COMPACT_SLACK
        most_held = 2 * self.holding.get(target, 0) + COMPACT_SLACK
        key_of, holder = self.key, self.holder
        for by_target, live, most in ((self.cand, key_of, most_filed), (self.late, key_of, most_filed),
                                      (self.held, holder, most_held)):
            entries = by_target.get(target)
            if entries is not None and len(entries) > most:
                kept = deque(entry for entry in entries if live.get(entry[2]) is entry)
                if kept:
                    by_target[target] = kept
                else:
                    del by_target[target]

    def live(self, which: str) -> list[tuple[float, tuple]]:
        """The live (target, key) entries of ``cand``, ``late`` or ``held`` (checks and tests)."""
        live = self.holder if which == "held" else self.key
        return [(target, entry) for target, entries in getattr(self, which).items() for entry in entries
                if live.get(entry[2]) is entry]

    def check(self) -> str | None:
        """What is wrong with the orders, or None: every deque ascending; every request's key live exactly once,
        in its target's candidates or late order; every holder's key live once in its target's holders."""
        for by_target in (self.cand, self.late, self.held):
            for entries in by_target.values():
                if list(entries) != sorted(entries):
                    return "an order is out of key order"
        if not self._each_once(self.live("cand") + self.live("late"), self.key):
            return "the candidates and late orders do not hold each RT request's key once"
        if not self._each_once(self.live("held"), self.holder):
            return "the holder order does not hold each holder's key once"
        if any(self.key.get(rid) is not key for rid, key in self.holder.items()):
            return "a holder's key is not its request's key"
        counts: dict[float, int] = {}
        for rid in self.holder:
            counts[self.target[rid]] = counts.get(self.target[rid], 0) + 1
        if {t: n for t, n in self.holding.items() if n} != counts:
            return "the holder counts per target are wrong"
        return None

    def _each_once(self, found: list[tuple[float, tuple]], keys: dict[int, tuple]) -> bool:
        """Whether the live entries ``found`` are exactly ``keys`` (id → key) under their targets, each entry once
        (as multisets: keys hold their request's id, so no two requests' keys are equal, and an entry found twice is
        one too many)."""
        return sorted(found) == sorted((self.target[rid], key) for rid, key in keys.items())
