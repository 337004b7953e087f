"""An order whose keys enter at its end: an append-only queue with lazy removal.

BROS's per-target RT orders (the requests found late, the budget's candidates, the KV holders) are sorted by
(reference time, arrival, id), one key per request. A request gets a new key only when a batch runs it, with
the batch's end as its reference time, later than every key already filed; an arrival enters with its arrival
time, the latest so far. So keys enter at the end of an order and leave from anywhere. A sorted list (or
``SortedKeys``' pieces) moves entries on every removal; here a removal blanks the key's slot (None), found
through the member's position, and blank slots are dropped when they reach either end or, once they outnumber
the keys, all at once (O(1) amortised per removal). Reading skips the blanks in C (``filter``). A key that does
not belong at the end (a target that is one request's TTFT and another's TPOT target: an arrival filed after a
batch that ended later; time going back in direct calls) is inserted in place by rebuilding the queue: O(n),
but the order stays exact.
"""

from __future__ import annotations

from bisect import insort
from collections import deque


class AppendKeys:
    """Keys (tuples whose last element is a member id, one key per member) in ascending order, read from either
    end. ``add`` / ``add_sorted`` O(1) per key above every key, ``remove_all`` O(1) amortised per key (plus reaching
    its slot: a deque is indexed from its nearer end), ``pop_first(k)`` O(k). Reads must not overlap changes."""

    __slots__ = ("_keys", "_base", "_at")

    def __init__(self, keys=()):
        self._keys: deque = deque()  # ascending, with removed keys blanked (None); both ends are keys
        self._base = 0  # slots dropped from the front so far: a member's slot is _keys[_at[member] - _base]
        self._at: dict = {}  # member id -> absolute position of its key
        self.add_sorted(sorted(keys))

    def __len__(self) -> int:
        return len(self._at)

    def __contains__(self, member) -> bool:
        return member in self._at

    def first(self) -> tuple:
        """The smallest key (the order must not be empty)."""
        return self._keys[0]

    def last(self) -> tuple:
        """The largest key (the order must not be empty)."""
        return self._keys[-1]

    def __iter__(self):
        return filter(None, self._keys)

    def __reversed__(self):
        return filter(None, reversed(self._keys))

    def add(self, key: tuple) -> None:
        """File ``key``, whose member has none: appended when above every key, else inserted in place."""
        member, keys = key[-1], self._keys
        if member in self._at:
            raise KeyError(f"member {member!r} already has a key")
        if keys and not key > keys[-1]:
            live = list(self)
            insort(live, key)
            self._rebuild(live)
        else:
            self._at[member] = self._base + len(keys)
            keys.append(key)

    def add_sorted(self, keys: list) -> None:
        """File ``keys`` (ascending; distinct members without a key, else KeyError and nothing filed): one extend
        when they lie above every key (a batch's re-filed requests), else by rebuilding the queue with them."""
        mine, at = self._keys, self._at
        if not keys:
            return
        start = position = self._base + len(mine)
        for key in keys:
            member = key[-1]
            if member in at:
                for filed in keys:  # undo: the members given positions from ``start`` on
                    if at.get(filed[-1], -1) >= start:
                        del at[filed[-1]]
                raise KeyError(f"member {member!r} already has a key")
            at[member] = position
            position += 1
        if mine and not keys[0] > mine[-1]:
            self._rebuild(sorted([*self, *keys]))
        else:
            mine.extend(keys)

    def remove_all(self, keys) -> None:
        """Remove each of ``keys`` (KeyError at the first that is not its member's key, the ones before it removed):
        its slot is blanked; then the blanks at either end are dropped, and all of them once they outnumber the
        keys."""
        mine, at, base = self._keys, self._at, self._base
        try:
            for key in keys:
                i = at.pop(key[-1]) - base
                if mine[i] != key:
                    at[key[-1]] = i + base
                    raise KeyError(key)
                mine[i] = None
        finally:
            self._trim()
            if len(mine) > 2 * len(at):
                self._rebuild(list(self))

    def pop_first(self, k: int) -> list:
        """Remove and return the ``k`` smallest keys (``k <= len(self)``)."""
        keys, at, out = self._keys, self._at, []
        popped = 0
        while len(out) < k:
            key = keys.popleft()
            popped += 1
            if key is not None:
                del at[key[-1]]
                out.append(key)
        self._base += popped
        self._trim()
        if len(keys) > 2 * len(at):
            self._rebuild(list(self))
        return out

    def _trim(self) -> None:
        """Drop the blanks at either end: both ends are keys."""
        keys = self._keys
        while keys and keys[-1] is None:
            keys.pop()
        front = 0
        while keys and keys[0] is None:
            keys.popleft()
            front += 1
        self._base += front

    def _rebuild(self, live: list) -> None:
        """Hold exactly ``live`` (ascending keys), without blanks."""
        self._keys = deque(live)
        self._base = 0
        self._at = {key[-1]: i for i, key in enumerate(live)}
