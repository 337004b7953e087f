"""A sorted multiset of comparable keys (tuples) whose insertion and removal do not grow with its size.

A plain sorted list moves every later entry on an insertion or a removal (a memmove of the list's tail):
with tens of thousands of queued requests re-filed several times per iteration (BROS's per-target orders),
that move is the cost. Here the keys sit in consecutive sorted pieces of at most ``2 * load`` keys, with
each piece's last key in ``_maxes``: a key is found by bisection over the pieces, then inside one piece, so
an update moves at most one piece's tail. Iteration (either direction) is in key order.
"""

from __future__ import annotations

from bisect import bisect_left, insort


class SortedKeys:
    """Keys kept sorted; ``add``, ``remove`` O(log n + load), ``remove_first(k)`` O(k + pieces)."""

    __slots__ = ("_pieces", "_maxes", "_len", "_load")

    def __init__(self, keys=(), load: int = 256):
        self._load = load
        self._pieces: list[list] = []
        self._maxes: list = []
        self._len = 0
        for key in sorted(keys):
            self._append_sorted(key)

    def _append_sorted(self, key) -> None:
        if not self._pieces or len(self._pieces[-1]) >= self._load:
            self._pieces.append([])
            self._maxes.append(key)
        self._pieces[-1].append(key)
        self._maxes[-1] = key
        self._len += 1

    def __len__(self) -> int:
        return self._len

    def __iter__(self):
        for piece in self._pieces:
            yield from piece

    def __reversed__(self):
        for piece in reversed(self._pieces):
            yield from reversed(piece)

    def add(self, key) -> None:
        pieces, maxes = self._pieces, self._maxes
        if not pieces:
            pieces.append([key])
            maxes.append(key)
        else:
            i = bisect_left(maxes, key)
            if i == len(maxes):  # above every key: the last piece (the common case, a fresh reference time)
                i -= 1
                pieces[i].append(key)
                maxes[i] = key
            else:
                insort(pieces[i], key)
            if len(pieces[i]) > 2 * self._load:  # split in halves
                piece = pieces[i]
                half = len(piece) // 2
                pieces[i:i + 1] = [piece[:half], piece[half:]]
                maxes[i:i + 1] = [piece[half - 1], piece[-1]]
        self._len += 1

    def add_sorted(self, keys: list) -> None:
        """Add ``keys`` (ascending). When all lie above every key (a batch's re-filed requests: their new
        reference time is the latest), they extend the last piece in one step."""
        pieces, maxes, load = self._pieces, self._maxes, self._load
        if not keys:
            return
        if pieces and keys[0] <= maxes[-1]:
            for key in keys:
                self.add(key)
            return
        if not pieces:
            pieces.append([])
            maxes.append(keys[-1])
        last = pieces[-1]
        last.extend(keys)
        maxes[-1] = last[-1]
        self._len += len(keys)
        if len(last) > 2 * load:  # re-cut the grown piece into pieces of ``load`` keys
            del pieces[-1], maxes[-1]
            for k in range(0, len(last), load):
                pieces.append(last[k:k + load])
                maxes.append(pieces[-1][-1])

    def remove_sorted(self, keys) -> None:
        """Remove one occurrence of each of ``keys`` (ascending; KeyError if one is absent): one pass over the
        pieces. A key in the current piece, or first in it (BROS removes the requests a batch ran, mostly the
        front of its orders), is found without a search."""
        pieces, maxes = self._pieces, self._maxes
        i = 0
        for key in keys:
            if i == len(maxes) or key > maxes[i]:
                i = bisect_left(maxes, key, i)
                if i == len(maxes):
                    raise KeyError(key)
            piece = pieces[i]
            j = 0 if piece[0] == key else bisect_left(piece, key)
            if j == len(piece) or piece[j] != key:
                raise KeyError(key)
            del piece[j]
            if piece:
                maxes[i] = piece[-1]
            else:
                del pieces[i], maxes[i]
            self._len -= 1

    def remove(self, key) -> None:
        """Remove one occurrence of ``key`` (KeyError if absent)."""
        self.remove_sorted((key,))

    def first(self, k: int) -> list:
        """The ``k`` smallest keys, ascending."""
        out: list = []
        for piece in self._pieces:
            if len(out) >= k:
                break
            out.extend(piece[:k - len(out)])
        return out

    def remove_first(self, k: int) -> None:
        """Remove the ``k`` smallest keys (``k <= len(self)``)."""
        pieces, maxes = self._pieces, self._maxes
        self._len -= k
        drop = 0
        while k and k >= len(pieces[drop]):
            k -= len(pieces[drop])
            drop += 1
        del pieces[:drop], maxes[:drop]
        if k:
            del pieces[0][:k]
