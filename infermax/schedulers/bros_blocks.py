"""BROS's bidirectional KV block manager (specs/bros.md §3.1 option A, block-faithful).

GPU KV memory is ``num_blocks`` blocks of ``block_size`` slots. A block holds the KV of at most one
real-time (RT) request, filling slots from the left, and one best-effort (BE) request, filling from
the right; ``rt_n + be_n <= block_size``. Per request the manager knows its blocks (in fill order)
and its GPU-resident token count.

Allocation rules (``alloc_be`` / ``alloc_rt``, one slot at a time):

- BE uses empty slots only: its own last block first, then the block without a BE owner that has
  the most empty slots (wholly free blocks first, then RT-owned blocks with a free right side).
- RT: (1) an empty slot of its own last block; (2) a wholly free block; (3) overwrite its BE peer
  in its own last block; (4) take the left side of a BE-only block with the most empty slots. Steps
  3–4 skip BE requests in ``protected`` (those selected for the batch). Overwriting a BE token is a
  lazy checkpoint: the token's KV is copied to host memory (``checkpointed``) in this batch.
- ``drop`` swaps out all of a request's GPU tokens (the scheduler picks the victims).

RT allocations return a receipt that ``undo_rt`` reverses (BROS's replacement step removes an
already selected RT request). Undo is exact in any order: an RT slot is given back and, for an
overwrite, the BE token is restored in that same slot (unless the BE was dropped meanwhile; then
the slot stays empty). To keep that valid, a BE owner whose count falls to 0 keeps its ownership
until ``end_iteration`` clears it.

Ties (the paper is silent): among candidate blocks of equal rank the one with the lowest id is
taken. Each candidate set keeps a min-heap beside it (stale entries are skipped when they reach
the top), so a pick costs O(log blocks), and allocation works in runs: one step per block (several
free blocks in one loop), never one step per slot. The result equals the slot-by-slot rules: a run
ends exactly where the slot-by-slot rule would switch (design.md, BROS decision 13).
"""

from __future__ import annotations

from bisect import bisect_left
from heapq import heapify, heappop, heappush

RT, BE = 0, 1


class BlockError(RuntimeError):
    """An internal inconsistency of the block manager (a bug, never a scheduling outcome)."""


class _Candidates:
    """A set of block ids with its lowest member in O(log n): the set and a min-heap of every id added
    since the last compaction (members leave the set only; stale heap entries are dropped at the top)."""

    __slots__ = ("members", "heap", "ordered")
    tracked = True

    def __init__(self, ordered: bool = True):
        self.members: set[int] = set()
        self.heap: list[int] = []
        self.ordered = ordered  # False: never asked for its lowest member (no heap kept)

    def __len__(self) -> int:
        return len(self.members)

    def __iter__(self):
        return iter(self.members)

    def __contains__(self, blk: int) -> bool:
        return blk in self.members

    def add(self, blk: int) -> None:
        self.members.add(blk)
        if self.ordered:
            heappush(self.heap, blk)
            self._compact()

    def add_range(self, first: int, end: int) -> None:
        """Add blocks ``first .. end − 1``."""
        self.members.update(range(first, end))
        if self.ordered:
            heap = self.heap
            if end - first > len(heap):
                heap.extend(range(first, end))
                heapify(heap)
            else:
                for blk in range(first, end):
                    heappush(heap, blk)
            self._compact()

    def _compact(self) -> None:
        if len(self.heap) > 2 * len(self.members) + 64:
            self.heap = list(self.members)
            heapify(self.heap)

    def discard(self, blk: int) -> None:
        self.members.discard(blk)

    def discard_range(self, first: int, end: int) -> None:
        self.members.difference_update(range(first, end))

    def lowest(self) -> int | None:
        heap, members = self.heap, self.members
        while heap and heap[0] not in members:
            heappop(heap)
        return heap[0] if heap else None

    def ascending(self):
        """Members in ascending order (a copy: callers may change the set while iterating)."""
        return sorted(self.members)


class _Untracked:
    """The full RT-only blocks: never a candidate (no empty slot, no BE token to overwrite), so no set is
    kept; a block's ``_where`` entry alone says it is one. Saves a set insertion per decoded token."""

    __slots__ = ()
    tracked = False

    def __len__(self) -> int:
        return 0

    def add(self, blk: int) -> None:
        pass

    def discard(self, blk: int) -> None:
        pass

    def add_range(self, first: int, end: int) -> None:
        pass

    def discard_range(self, first: int, end: int) -> None:
        pass


class _FreeRuns:
    """The wholly free blocks as maximal runs of consecutive ids. ``_neg[j]`` is minus the first block of run
    ``j`` and ``_end[j]`` its end (exclusive), ``_neg`` ascending: the lowest run is the last entry, so
    taking the lowest blocks pops from the end. Taking ``q`` blocks costs O(runs taken); giving back a run
    O(log runs) plus a list insertion (C memmove)."""

    __slots__ = ("_neg", "_end", "count")
    tracked = True

    def __init__(self, num_blocks: int):
        self._neg, self._end = [0], [num_blocks]
        self.count = num_blocks

    def __len__(self) -> int:
        return self.count

    def runs(self) -> list[tuple[int, int]]:
        """(first, end) of every run, ascending."""
        return [(-n, e) for n, e in zip(reversed(self._neg), reversed(self._end))]

    def __iter__(self):
        for first, end in self.runs():
            yield from range(first, end)

    def __contains__(self, blk: int) -> bool:
        p = bisect_left(self._neg, -blk)  # the run with the largest first block <= blk
        return p < len(self._neg) and blk < self._end[p]

    def add(self, blk: int) -> None:
        self.add_run(blk, blk + 1)

    def add_run(self, first: int, end: int) -> None:
        """Give back blocks ``first .. end − 1`` (none of them free now), merged with adjacent runs."""
        neg, ends = self._neg, self._end
        p = bisect_left(neg, -first)  # runs >= p start at or below first, runs < p above it
        if (p < len(neg) and ends[p] > first) or (p and -neg[p - 1] < end):
            raise BlockError(f"blocks {first}..{end - 1} are already partly free")
        low = p < len(neg) and ends[p] == first
        high = p > 0 and -neg[p - 1] == end
        if low and high:
            ends[p] = ends[p - 1]
            del neg[p - 1], ends[p - 1]
        elif low:
            ends[p] = end
        elif high:
            neg[p - 1] = -first
        else:
            neg.insert(p, -first)
            ends.insert(p, end)
        self.count += end - first

    def discard(self, blk: int) -> None:
        neg, ends = self._neg, self._end
        p = bisect_left(neg, -blk)
        if p == len(neg) or ends[p] <= blk:
            return
        first, end = -neg[p], ends[p]
        if first == blk and end == blk + 1:
            del neg[p], ends[p]
        elif first == blk:
            neg[p] = -(blk + 1)
        elif end == blk + 1:
            ends[p] = blk
        else:
            ends[p] = blk
            neg.insert(p, -(blk + 1))
            ends.insert(p, end)
        self.count -= 1

    def take_lowest(self, q: int) -> list[tuple[int, int]]:
        """Remove the ``q`` lowest free blocks (``q <= len(self)``); return them as ascending runs."""
        neg, ends = self._neg, self._end
        out: list[tuple[int, int]] = []
        left = q
        while left:
            if not neg:
                raise BlockError(f"fewer than {q} free blocks (count {self.count} is wrong)")
            first, end = -neg[-1], ends[-1]
            if end - first <= left:
                neg.pop()
                ends.pop()
                out.append((first, end))
                left -= end - first
            else:
                neg[-1] = -(first + left)
                out.append((first, first + left))
                left = 0
        self.count -= q
        return out


def _expand(runs) -> list[int]:
    return [blk for first, end in runs for blk in range(first, end)]


class BiBlockManager:
    """Two-owner KV blocks; see the module docstring. ``cls[rid]`` is ``RT`` or ``BE``.

    A request's blocks, in fill order, are kept as runs ``[first, end)`` of consecutive ids (``runs``;
    ``blocks`` expands them); the per-block owner and count lists are written a run at a time (slice
    assignment), so taking, dropping and releasing cost one Python step per run, not per slot."""

    def __init__(self, num_blocks: int, block_size: int = 16):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need at least one block of at least one slot, got {num_blocks} x {block_size}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.rt_owner: list[int | None] = [None] * num_blocks
        self.be_owner: list[int | None] = [None] * num_blocks
        self.rt_n = [0] * num_blocks
        self.be_n = [0] * num_blocks
        self.runs: dict[int, list[list[int]]] = {}  # request -> its blocks in fill order, as [first, end) runs
        self.gpu: dict[int, int] = {}  # request -> GPU-resident tokens
        self.holders: set[int] = set()  # requests with GPU-resident tokens (gpu > 0)
        self.cls: dict[int, int] = {}
        # Candidate sets, kept in step with the block state by _file():
        self.free = _FreeRuns(num_blocks)  # no owner at all
        # by empty slots: RT owner, no BE owner (full ones are never candidates: not tracked)
        self.rt_only: list[_Candidates | _Untracked] = [_Untracked()] + [_Candidates() for _ in range(block_size)]
        self.be_only = [_Candidates() for _ in range(block_size + 1)]  # by empty slots: BE owner, no RT owner
        self._where: list[_Candidates | _Untracked | _FreeRuns | None] = [self.free] * num_blocks
        # Per iteration:
        self.checkpointed: dict[int, int] = {}  # BE request -> tokens checkpointed (overwritten) this iteration
        self.dropped: dict[int, int] = {}  # request -> tokens swapped out by a drop this iteration
        self._touched: set[int] = set()  # blocks whose count fell this iteration (owners left with 0 slots)

    # --- bookkeeping ----------------------------------------------------------------------------

    @property
    def blocks(self) -> dict[int, list[int]]:
        """Every registered request's blocks in fill order (expanded from the runs; inspection, tests)."""
        return {rid: _expand(runs) for rid, runs in self.runs.items()}

    def register(self, rid: int, cls: int) -> None:
        self.cls[rid] = cls
        self.runs.setdefault(rid, [])
        self.gpu.setdefault(rid, 0)

    def _add_gpu(self, rid: int, n: int) -> None:
        g = self.gpu[rid] = self.gpu[rid] + n
        if g:
            self.holders.add(rid)
        else:
            self.holders.discard(rid)

    def empty_slots(self, blk: int) -> int:
        return self.block_size - self.rt_n[blk] - self.be_n[blk]

    def _target(self, blk: int) -> _Candidates | _Untracked | _FreeRuns | None:
        """The candidate set ``blk`` belongs in (None: shared by an RT and a BE owner)."""
        rt, be = self.rt_owner[blk], self.be_owner[blk]
        if rt is None and be is None:
            return self.free
        if be is None:
            return self.rt_only[self.empty_slots(blk)]
        if rt is None:
            return self.be_only[self.empty_slots(blk)]
        return None

    def _file(self, blk: int) -> None:
        """Move ``blk`` to the candidate set matching its owners and empty slots."""
        target = self._target(blk)
        old = self._where[blk]
        if old is not target:
            if old is not None:
                old.discard(blk)
            if target is not None:
                target.add(blk)
            self._where[blk] = target

    def _append(self, rid: int, first: int, end: int) -> None:
        """Blocks ``first .. end − 1`` follow the request's blocks (extending its last run when adjacent)."""
        runs = self.runs[rid]
        if runs and runs[-1][1] == first:
            runs[-1][1] = end
        else:
            runs.append([first, end])

    def _take(self, blk: int, rid: int, side: int) -> None:
        if side == RT:
            self.rt_owner[blk] = rid
        else:
            self.be_owner[blk] = rid
        self._append(rid, blk, blk + 1)

    def last_block(self, rid: int, side: int) -> int | None:
        """The request's last block if it still owns that block's ``side``."""
        runs = self.runs.get(rid)
        if not runs:
            return None
        blk = runs[-1][1] - 1
        return blk if (self.rt_owner if side == RT else self.be_owner)[blk] == rid else None

    def _take_free(self, rid: int, side: int, n: int) -> tuple[list[tuple[int, int]], int]:
        """Take free blocks, lowest id first, for up to ``n`` slots of ``rid``'s ``side`` (all of them but
        the last filled); return (the blocks as ascending runs, slots placed). Equal to taking them one at
        a time."""
        S = self.block_size
        q = min(-(-n // S), self.free.count)
        if not q:
            return [], 0
        taken = self.free.take_lowest(q)
        placed = min(n, q * S)
        owner, count = (self.rt_owner, self.rt_n) if side == RT else (self.be_owner, self.be_n)
        full_set = (self.rt_only if side == RT else self.be_only)[0]
        where = self._where
        for first, end in taken:
            k = end - first
            owner[first:end] = [rid] * k
            count[first:end] = [S] * k
            where[first:end] = [full_set] * k
            self._append(rid, first, end)
        last = taken[-1][1] - 1
        last_n = placed - (q - 1) * S
        for first, end in taken:
            full_set.add_range(first, last if end == last + 1 and last_n < S else end)
        if last_n < S:
            count[last] = last_n
            where[last] = None
            self._file(last)
        self._add_gpu(rid, placed)
        return taken, placed

    # --- allocation -----------------------------------------------------------------------------

    def be_capacity(self, rid: int) -> int:
        """Empty slots a BE request could get now (its last block's plus every block without a BE owner)."""
        total = len(self.free) * self.block_size + sum(e * len(s) for e, s in enumerate(self.rt_only))
        last = self.last_block(rid, BE)
        return total + (self.empty_slots(last) if last is not None else 0)

    def alloc_be(self, rid: int, n: int) -> bool:
        """Give BE request ``rid`` ``n`` slots from empty slots; all or nothing (False: not enough)."""
        if n > self.be_capacity(rid):
            return False
        left = n
        blk = self.last_block(rid, BE)
        if blk is not None and self.empty_slots(blk):
            k = min(left, self.empty_slots(blk))
            self.be_n[blk] += k
            left -= k
            self._add_gpu(rid, k)
            self._file(blk)
        if left:
            left -= self._take_free(rid, BE, left)[1]
        while left:
            blk = self._most_empty_rt_only()
            self._take(blk, rid, BE)
            k = min(left, self.empty_slots(blk))
            self.be_n[blk] += k
            left -= k
            self._add_gpu(rid, k)
            self._file(blk)
        return True

    def _most_empty_rt_only(self) -> int:
        for e in range(self.block_size - 1, 0, -1):
            blk = self.rt_only[e].lowest()
            if blk is not None:
                return blk
        raise BlockError("no block without a BE owner has an empty slot (capacity was checked)")

    def alloc_rt(self, rid: int, n: int, protected: set[int] | frozenset = frozenset()) -> list | None:
        """Give RT request ``rid`` ``n`` slots (rules 1–4); return the receipt, or None (nothing changed)."""
        if n > self.rt_capacity(rid, protected):
            return None  # the slot-by-slot allocation would fail and undo every step
        receipt: list[tuple] = []
        left = n
        while left:
            step = self._rt_run(rid, left, protected)
            if step is None:
                self.undo_rt(rid, receipt)
                return None
            receipt.append(step)
            left -= step[-1]
        return receipt

    def rt_capacity(self, rid: int, protected: set[int] | frozenset = frozenset()) -> int:
        """Slots rules 1–4 can give RT request ``rid`` now: its last block's empty slots, every free block,
        its last block's BE tokens when no free block is taken (once rule 2 has taken one, the last block is
        that one, which has no BE peer), and all of every BE-only block whose owner is not protected (rule 4
        fills its empty slots, then rule 3 overwrites its BE tokens)."""
        S = self.block_size
        total = self.free.count * S
        last = self.last_block(rid, RT)
        if last is not None:
            total += self.empty_slots(last)
            if not self.free.count and self.be_n[last] and self.be_owner[last] not in protected:
                total += self.be_n[last]
        be_only = sum(len(c) for c in self.be_only)
        if protected and be_only:
            be_only = sum(1 for c in self.be_only for blk in c if self.be_owner[blk] not in protected)
        return total + S * be_only

    def _rt_run(self, rid: int, left: int, protected) -> tuple | None:
        """Up to ``left`` slots by the first rule that applies, as far as that rule keeps applying slot by
        slot; a receipt step whose last field is the slots placed."""
        last = self.last_block(rid, RT)
        if last is not None and self.empty_slots(last):  # (1) own last block
            return self._rt_put(rid, last, False, min(left, self.empty_slots(last)))
        if self.free.count:  # (2) wholly free blocks, lowest id first
            taken, k = self._take_free(rid, RT, left)
            return ("free", taken, k)
        if last is not None and self.be_n[last] and self.be_owner[last] not in protected:  # (3) overwrite the peer
            return self._rt_overwrite(rid, last, False, min(left, self.be_n[last]))
        for e in range(self.block_size, -1, -1):  # (4) a BE-only block, most empty slots first, lowest id
            cands = self.be_only[e]
            if not cands.members:
                continue
            blk = cands.lowest()
            if self.be_owner[blk] in protected:
                blk = next((b for b in cands.ascending() if self.be_owner[b] not in protected), None)
                if blk is None:
                    continue
            if e:
                return self._rt_put(rid, blk, True, min(left, e))
            return self._rt_overwrite(rid, blk, True, min(left, self.be_n[blk]))
        return None

    def _rt_put(self, rid: int, blk: int, new: bool, k: int) -> tuple:
        if new:
            self._take(blk, rid, RT)
        self.rt_n[blk] += k
        self._add_gpu(rid, k)
        self._file(blk)
        return ("put", blk, new, None, k)

    def _rt_overwrite(self, rid: int, blk: int, new: bool, k: int) -> tuple:
        be = self.be_owner[blk]
        if new:
            self._take(blk, rid, RT)
        self.be_n[blk] -= k
        self._add_gpu(be, -k)
        self.checkpointed[be] = self.checkpointed.get(be, 0) + k
        self.rt_n[blk] += k
        self._add_gpu(rid, k)
        self._file(blk)
        self._touched.add(blk)
        return ("overwrite", blk, new, be, k)

    def undo_rt(self, rid: int, receipt: list) -> None:
        """Reverse ``alloc_rt``'s receipt (latest step first)."""
        S = self.block_size
        for step in reversed(receipt):
            if step[0] == "free":
                _, taken, k = step
                last = taken[-1][1] - 1
                self._undo_step(rid, last, True, None, k - S * (sum(e - f for f, e in taken) - 1))
                for first, end in reversed(taken):  # the full blocks before it, latest first, a run at a time
                    self._free_tail(rid, first, min(end, last))
            else:
                _, blk, new, be, k = step
                self._undo_step(rid, blk, new, be, k)
        receipt.clear()

    def _undo_step(self, rid: int, blk: int, new: bool, be: int | None, k: int) -> None:
        self.rt_n[blk] -= k
        self._add_gpu(rid, -k)
        if be is not None and be not in self.dropped:
            self.be_n[blk] += k
            self._add_gpu(be, k)
            self.checkpointed[be] -= k
            if not self.checkpointed[be]:
                del self.checkpointed[be]
        if new:
            runs = self.runs[rid]
            if not runs or runs[-1][1] - 1 != blk or self.rt_n[blk]:
                raise BlockError(f"undo of request {rid}'s block {blk} out of order")
            self._pop_tail(runs, blk, blk + 1)
            self.rt_owner[blk] = None
        self._file(blk)
        self._touched.add(blk)

    @staticmethod
    def _pop_tail(runs: list[list[int]], first: int, end: int) -> None:
        """Remove blocks ``first .. end − 1`` from the end of a request's runs (they must be its last blocks)."""
        last = runs[-1]
        if last[1] != end or last[0] > first:
            raise BlockError(f"blocks {first}..{end - 1} are not the request's last blocks")
        if last[0] == first:
            runs.pop()
        else:
            last[1] = first

    def _free_tail(self, rid: int, first: int, end: int) -> None:
        """Undo of RT request ``rid``'s full blocks ``first .. end − 1`` taken free by its receipt, the last of
        its blocks now: they become free again. Equal to undoing them one by one: no other request can have
        changed a full RT-only block (BE takes empty slots only, RT overwrites BE tokens only), and a block
        left with no owner is not changed by ``end_iteration`` (so it is not marked touched)."""
        if first >= end:
            return
        n, S = end - first, self.block_size
        full = self.rt_only[0]
        if (self.rt_owner[first:end].count(rid) != n or self.rt_n[first:end].count(S) != n
                or self._where[first:end].count(full) != n):
            raise BlockError(f"undo of request {rid}'s blocks {first}..{end - 1}: not its full blocks")
        self._pop_tail(self.runs[rid], first, end)
        self.rt_owner[first:end] = [None] * n
        self.rt_n[first:end] = [0] * n
        self._where[first:end] = [self.free] * n
        self.free.add_run(first, end)
        self._add_gpu(rid, -n * S)

    def _clear(self, rid: int) -> None:
        """Give up all of ``rid``'s slots (owners cleared, blocks re-filed). The full, unshared blocks of a run
        (the common case: all of it, or all but its last block) are cleared by slice assignment and freed as
        one run; other blocks one by one."""
        rt = self.cls[rid] == RT
        owner = self.rt_owner if rt else self.be_owner
        for first, end in self.runs[rid]:
            if end - first > 1:
                if self._free_full_run(rt, first, end):
                    continue
                if end - first > 2 and self._free_full_run(rt, first, end - 1):
                    first = end - 1
            for blk in range(first, end):
                if owner[blk] != rid:
                    raise BlockError(f"request {rid} lists block {blk} without owning its side")
                (self.rt_n if rt else self.be_n)[blk] = 0
                owner[blk] = None
                self._file(blk)
        self.runs[rid] = []
        self._add_gpu(rid, -self.gpu[rid])

    def _free_full_run(self, rt: bool, first: int, end: int) -> bool:
        """Free blocks ``first .. end − 1`` of one request's side if all are full and have no other owner (filed
        as full); False (nothing changed) otherwise."""
        n, where = end - first, self._where
        full = (self.rt_only if rt else self.be_only)[0]
        if (self.be_owner if rt else self.rt_owner)[first:end].count(None) != n or where[first:end].count(full) != n:
            return False
        (self.rt_owner if rt else self.be_owner)[first:end] = [None] * n
        (self.rt_n if rt else self.be_n)[first:end] = [0] * n
        where[first:end] = [self.free] * n
        full.discard_range(first, end)
        self.free.add_run(first, end)
        return True

    def drop(self, rid: int) -> int:
        """Swap out all of ``rid``'s GPU tokens (its slots become empty); return how many."""
        moved = self.gpu[rid]
        self._clear(rid)
        if moved:
            self.dropped[rid] = self.dropped.get(rid, 0) + moved
        return moved

    def release(self, rid: int) -> None:
        """Free a finished request's slots and forget it."""
        if rid in self.runs:
            self._clear(rid)
        self.runs.pop(rid, None)
        self.gpu.pop(rid, None)
        self.holders.discard(rid)
        self.cls.pop(rid, None)

    def end_iteration(self) -> dict[int, int]:
        """Close the iteration: clear owners left with no slot; return ``{request: tokens swapped out}``."""
        gone: dict[int, list[int]] = {}
        for blk in self._touched:
            for owner, count in ((self.rt_owner, self.rt_n), (self.be_owner, self.be_n)):
                rid = owner[blk]
                if rid is not None and not count[blk]:
                    owner[blk] = None
                    gone.setdefault(rid, []).append(blk)
            self._file(blk)
        for rid, blks in gone.items():
            self.runs[rid] = _without(self.runs[rid], sorted(blks))
        self._touched = set()
        out = dict(self.checkpointed)
        for rid, n in self.dropped.items():
            out[rid] = out.get(rid, 0) + n
        self.checkpointed, self.dropped = {}, {}
        return out

    # --- checks (tests) ---------------------------------------------------------------------------

    def check(self) -> None:
        """Raise BlockError unless every invariant holds (owners, counts, runs, candidate sets)."""
        S = self.block_size
        counted: dict[int, int] = {rid: 0 for rid in self.gpu}
        blocks = self.blocks
        for blk in range(self.num_blocks):
            r, b = self.rt_n[blk], self.be_n[blk]
            if r < 0 or b < 0 or r + b > S:
                raise BlockError(f"block {blk}: {r} RT + {b} BE slots of {S}")
            for owner, n, side in ((self.rt_owner[blk], r, RT), (self.be_owner[blk], b, BE)):
                if owner is None:
                    if n:
                        raise BlockError(f"block {blk}: {n} slots without an owner")
                    continue
                if self.cls.get(owner) != side:
                    raise BlockError(f"block {blk}: request {owner} owns the wrong side")
                if blk not in blocks[owner]:
                    raise BlockError(f"block {blk} missing from request {owner}'s block list")
                counted[owner] += n
        for rid, own in blocks.items():
            side_owner = self.rt_owner if self.cls[rid] == RT else self.be_owner
            if len(set(own)) != len(own) or any(side_owner[blk] != rid for blk in own):
                raise BlockError(f"request {rid}'s block list {own} disagrees with the owners")
            if any(first >= end for first, end in self.runs[rid]):
                raise BlockError(f"request {rid} has an empty run: {self.runs[rid]}")
        for rid, n in counted.items():
            if n != self.gpu[rid]:
                raise BlockError(f"request {rid}: {n} slots in blocks, {self.gpu[rid]} recorded")
        runs = self.free.runs()
        if any(f >= e for f, e in runs) or any(e >= f for (_, e), (f, _) in zip(runs, runs[1:])) \
                or self.free.count != sum(e - f for f, e in runs):
            raise BlockError(f"free runs {runs} not disjoint, separated and ascending, or count {self.free.count}")
        if self.holders != {rid for rid, n in self.gpu.items() if n}:
            raise BlockError("the KV-holder set disagrees with the GPU token counts")
        for blk in range(self.num_blocks):
            target = self._target(blk)
            if self._where[blk] is not target or (target is not None and target.tracked and blk not in target):
                raise BlockError(f"block {blk} filed in the wrong candidate set")
        for cands in (*self.rt_only, *self.be_only):
            if cands.tracked and any(self._where[blk] is not cands for blk in cands):
                raise BlockError(f"a candidate set holds a block filed elsewhere: {sorted(cands)}")
        free_blocks = [blk for blk in range(self.num_blocks) if self._where[blk] is self.free]
        if free_blocks != list(self.free):
            raise BlockError("the free runs disagree with the blocks filed as free")

    def used_slots(self) -> int:
        return sum(self.rt_n) + sum(self.be_n)


def _without(runs: list[list[int]], gone: list[int]) -> list[list[int]]:
    """``runs`` less the blocks ``gone`` (ascending), adjacent pieces merged."""
    out: list[list[int]] = []
    for first, end in runs:
        i, j = bisect_left(gone, first), bisect_left(gone, end)
        pieces, at = [], first
        for blk in gone[i:j]:
            if blk > at:
                pieces.append([at, blk])
            at = blk + 1
        if at < end:
            pieces.append([at, end])
        for piece in pieces:
            if out and out[-1][1] == piece[0]:
                out[-1][1] = piece[1]
            else:
                out.append(piece)
    return out
