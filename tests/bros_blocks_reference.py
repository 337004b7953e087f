"""Reference block manager for the equivalence test of the vectorised one: infermax/schedulers/bros_blocks.py as of
commit 622b166 (per-block lists of a request's blocks, a numpy mask of free blocks, one Python step per
block on drop and release), verbatim below this docstring except for one fix applied to both managers: an undo no
longer gives an overwritten BE slot back to a request that was dropped after the overwrite with no GPU token left
(its ownership was cleared, so the slot came back ownerless). tests/test_bros_blocks_vectorised.py drives it and
the production manager through the same random operations and compares every observable. Do not optimise it.

Its own docstring, for the rules: see infermax/schedulers/bros_blocks.py."""

from __future__ import annotations

from heapq import heapify, heappop, heappush
from operator import itemgetter

import numpy as np

RT, BE = 0, 1


class BlockError(RuntimeError):
    """An internal inconsistency of the block manager (a bug, never a scheduling outcome)."""


class _Candidates:
    """A set of block ids with its lowest member in O(log n): the set and a min-heap of every id added
    since the last compaction (members leave the set only; stale heap entries are dropped at the top)."""

    __slots__ = ("members", "heap", "ordered")

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
            if len(self.heap) > 2 * len(self.members) + 64:
                self.heap = list(self.members)
                heapify(self.heap)

    def add_many(self, blks: list[int]) -> None:
        if not self.ordered:
            self.members.update(blks)
            return
        for blk in blks:
            self.add(blk)

    def discard(self, blk: int) -> None:
        self.members.discard(blk)

    def lowest(self) -> int | None:
        heap, members = self.heap, self.members
        while heap and heap[0] not in members:
            heappop(heap)
        return heap[0] if heap else None

    def ascending(self):
        """Members in ascending order (a copy: callers may change the set while iterating)."""
        return sorted(self.members)


class _FreeBlocks:
    """The wholly free blocks: a mask and a count. Every block below ``low`` is in use, so the lowest free
    blocks are found by scanning the mask (in C) from ``low``."""

    __slots__ = ("mask", "count", "low")

    def __init__(self, num_blocks: int):
        self.mask = np.ones(num_blocks, dtype=bool)
        self.count, self.low = num_blocks, 0

    def __len__(self) -> int:
        return self.count

    def __contains__(self, blk: int) -> bool:
        return bool(self.mask[blk])

    def __iter__(self):
        return iter(np.flatnonzero(self.mask).tolist())

    def add(self, blk: int) -> None:
        if not self.mask[blk]:
            self.mask[blk] = True
            self.count += 1
            if blk < self.low:
                self.low = blk

    def discard(self, blk: int) -> None:
        if self.mask[blk]:
            self.mask[blk] = False
            self.count -= 1

    def add_many(self, blks: list[int]) -> None:
        """Add blocks that are not free now."""
        if blks:
            self.mask[blks] = True
            self.count += len(blks)
            self.low = min(self.low, min(blks))

    def take_lowest(self, q: int) -> list[int]:
        """Remove and return the ``q`` lowest free blocks (``q <= len(self)``), ascending."""
        mask, lo, n = self.mask, self.low, len(self.mask)
        out: list[int] = []
        window = max(2 * q, 64)
        while len(out) < q:
            if lo >= n:
                raise BlockError(f"fewer than {q} free blocks (count {self.count} is wrong)")
            hi = min(n, lo + window)
            found = np.flatnonzero(mask[lo:hi])[:q - len(out)]
            out.extend((found + lo).tolist())
            lo, window = hi, 2 * window
        mask[out] = False
        self.count -= q
        self.low = out[-1] + 1
        return out


class BiBlockManager:
    """Two-owner KV blocks; see the module docstring. ``cls[rid]`` is ``RT`` or ``BE``."""

    def __init__(self, num_blocks: int, block_size: int = 16):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need at least one block of at least one slot, got {num_blocks} x {block_size}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.rt_owner: list[int | None] = [None] * num_blocks
        self.be_owner: list[int | None] = [None] * num_blocks
        self.rt_n = [0] * num_blocks
        self.be_n = [0] * num_blocks
        self.blocks: dict[int, list[int]] = {}  # request -> its blocks in fill order
        self.gpu: dict[int, int] = {}  # request -> GPU-resident tokens
        self.holders: set[int] = set()  # requests with GPU-resident tokens (gpu > 0)
        self.cls: dict[int, int] = {}
        # Candidate sets, kept in step with the block state by _file():
        self.free = _FreeBlocks(num_blocks)  # no owner at all
        # by empty slots: RT owner, no BE owner (full ones are never candidates: no heap)
        self.rt_only = [_Candidates(ordered=e > 0) for e in range(block_size + 1)]
        self.be_only = [_Candidates() for _ in range(block_size + 1)]  # by empty slots: BE owner, no RT owner
        self._where: list[_Candidates | _FreeBlocks | None] = [self.free] * num_blocks
        # Per iteration:
        self.checkpointed: dict[int, int] = {}  # BE request -> tokens checkpointed (overwritten) this iteration
        self.dropped: dict[int, int] = {}  # request -> tokens swapped out by a drop this iteration
        self._touched: set[int] = set()  # blocks whose count fell this iteration (owners left with 0 slots)

    # --- bookkeeping ----------------------------------------------------------------------------

    def register(self, rid: int, cls: int) -> None:
        self.cls[rid] = cls
        self.blocks.setdefault(rid, [])
        self.gpu.setdefault(rid, 0)

    def _add_gpu(self, rid: int, n: int) -> None:
        g = self.gpu[rid] = self.gpu[rid] + n
        if g:
            self.holders.add(rid)
        else:
            self.holders.discard(rid)

    def empty_slots(self, blk: int) -> int:
        return self.block_size - self.rt_n[blk] - self.be_n[blk]

    def _target(self, blk: int) -> _Candidates | _FreeBlocks | None:
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

    def _take(self, blk: int, rid: int, side: int) -> None:
        if side == RT:
            self.rt_owner[blk] = rid
        else:
            self.be_owner[blk] = rid
        self.blocks[rid].append(blk)

    def last_block(self, rid: int, side: int) -> int | None:
        """The request's last block if it still owns that block's ``side``."""
        own = self.blocks.get(rid)
        if not own:
            return None
        blk = own[-1]
        return blk if (self.rt_owner if side == RT else self.be_owner)[blk] == rid else None

    def _take_free(self, rid: int, side: int, n: int) -> tuple[list[int], int]:
        """Take free blocks, lowest id first, for up to ``n`` slots of ``rid``'s ``side`` (all of them but
        the last filled); return (the blocks, slots placed). Equal to taking them one at a time."""
        S = self.block_size
        q = min(-(-n // S), self.free.count)
        if not q:
            return [], 0
        taken = self.free.take_lowest(q)
        placed = min(n, q * S)
        owner, count = (self.rt_owner, self.rt_n) if side == RT else (self.be_owner, self.be_n)
        full_set = (self.rt_only if side == RT else self.be_only)[0]
        where = self._where
        for blk in taken:
            owner[blk] = rid
            count[blk] = S
            where[blk] = full_set
        self.blocks[rid].extend(taken)
        last_n = placed - (q - 1) * S
        if last_n < S:
            count[taken[-1]] = last_n
            where[taken[-1]] = None
            self._file(taken[-1])
            full_set.add_many(taken[:-1])
        else:
            full_set.add_many(taken)
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
                for i in range(len(taken) - 1, -1, -1):
                    blk = taken[i]
                    n = k - S * i if i == len(taken) - 1 else S
                    self._undo_step(rid, blk, True, None, n)
            else:
                _, blk, new, be, k = step
                self._undo_step(rid, blk, new, be, k)
        receipt.clear()

    def _undo_step(self, rid: int, blk: int, new: bool, be: int | None, k: int) -> None:
        self.rt_n[blk] -= k
        self._add_gpu(rid, -k)
        # the overwritten BE slot goes back to its request unless that request lost the block since (dropped:
        # a drop clears its ownership even when it had no GPU token left, as after this overwrite)
        if be is not None and be not in self.dropped and self.be_owner[blk] == be:
            self.be_n[blk] += k
            self._add_gpu(be, k)
            self.checkpointed[be] -= k
            if not self.checkpointed[be]:
                del self.checkpointed[be]
        if new:
            if self.blocks[rid][-1] != blk or self.rt_n[blk]:
                raise BlockError(f"undo of request {rid}'s block {blk} out of order")
            self.blocks[rid].pop()
            self.rt_owner[blk] = None
        self._file(blk)
        self._touched.add(blk)

    def _clear(self, rid: int) -> None:
        """Give up all of ``rid``'s slots (owners cleared, blocks re-filed)."""
        rt = self.cls[rid] == RT
        side_n, owner = (self.rt_n, self.rt_owner) if rt else (self.be_n, self.be_owner)
        other = self.be_owner if rt else self.rt_owner
        where = self._where
        freed: list[int] = []
        full = (self.rt_only if rt else self.be_only)[0]
        own = self.blocks[rid]
        if len(own) > 1:  # the common case in C: the request owns its side of every block, alone, all full
            get = itemgetter(*own)
            if get(owner).count(rid) == len(own) and get(other).count(None) == len(own) \
                    and get(where).count(full) == len(own):
                for blk in own:
                    owner[blk] = None
                for blk in own:
                    side_n[blk] = 0
                free = self.free
                for blk in own:
                    where[blk] = free
                full.members.difference_update(own)
                free.add_many(own)
                self.blocks[rid] = []
                self._add_gpu(rid, -self.gpu[rid])
                return
        for blk in own:
            if owner[blk] == rid:
                side_n[blk] = 0
                owner[blk] = None
                if other[blk] is None:  # now wholly free
                    if where[blk] is not full:
                        where[blk].discard(blk)
                    where[blk] = self.free
                    freed.append(blk)
                else:
                    self._file(blk)
        full.members.difference_update(freed)
        self.free.add_many(freed)
        self.blocks[rid] = []
        self._add_gpu(rid, -self.gpu[rid])

    def drop(self, rid: int) -> int:
        """Swap out all of ``rid``'s GPU tokens (its slots become empty); return how many."""
        moved = self.gpu[rid]
        self._clear(rid)
        if moved:
            self.dropped[rid] = self.dropped.get(rid, 0) + moved
        return moved

    def release(self, rid: int) -> None:
        """Free a finished request's slots and forget it."""
        if rid in self.blocks:
            self._clear(rid)
        self.blocks.pop(rid, None)
        self.gpu.pop(rid, None)
        self.holders.discard(rid)
        self.cls.pop(rid, None)

    def end_iteration(self) -> dict[int, int]:
        """Close the iteration: clear owners left with no slot; return ``{request: tokens swapped out}``."""
        gone: dict[int, set[int]] = {}
        for blk in self._touched:
            for owner, count in ((self.rt_owner, self.rt_n), (self.be_owner, self.be_n)):
                rid = owner[blk]
                if rid is not None and not count[blk]:
                    owner[blk] = None
                    gone.setdefault(rid, set()).add(blk)
            self._file(blk)
        for rid, blks in gone.items():
            self.blocks[rid] = [b for b in self.blocks[rid] if b not in blks]
        self._touched = set()
        out = dict(self.checkpointed)
        for rid, n in self.dropped.items():
            out[rid] = out.get(rid, 0) + n
        self.checkpointed, self.dropped = {}, {}
        return out

    # --- checks (tests) ---------------------------------------------------------------------------

    def check(self) -> None:
        """Raise BlockError unless every invariant holds (owners, counts, candidate sets)."""
        S = self.block_size
        counted: dict[int, int] = {rid: 0 for rid in self.gpu}
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
                if blk not in self.blocks[owner]:
                    raise BlockError(f"block {blk} missing from request {owner}'s block list")
                counted[owner] += n
        for rid, own in self.blocks.items():
            side_owner = self.rt_owner if self.cls[rid] == RT else self.be_owner
            if len(set(own)) != len(own) or any(side_owner[blk] != rid for blk in own):
                raise BlockError(f"request {rid}'s block list {own} disagrees with the owners")
        for rid, n in counted.items():
            if n != self.gpu[rid]:
                raise BlockError(f"request {rid}: {n} slots in blocks, {self.gpu[rid]} recorded")
        free = self.free
        if free.count != int(free.mask.sum()) or free.mask[:free.low].any():
            raise BlockError(f"free-block count {free.count} or hint {free.low} disagrees with the mask")
        if self.holders != {rid for rid, n in self.gpu.items() if n}:
            raise BlockError("the KV-holder set disagrees with the GPU token counts")
        for blk in range(self.num_blocks):
            target = self._target(blk)
            if self._where[blk] is not target or (target is not None and blk not in target):
                raise BlockError(f"block {blk} filed in the wrong candidate set")

    def used_slots(self) -> int:
        return sum(self.rt_n) + sum(self.be_n)
