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
"""

from __future__ import annotations

RT, BE = 0, 1


class BlockError(RuntimeError):
    """An internal inconsistency of the block manager (a bug, never a scheduling outcome)."""


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
        self.cls: dict[int, int] = {}
        # Candidate sets, kept in step with the block state by _file():
        self.free: set[int] = set(range(num_blocks))  # no owner at all
        self.rt_only = [set() for _ in range(block_size + 1)]  # by empty slots: RT owner, no BE owner
        self.be_only = [set() for _ in range(block_size + 1)]  # by empty slots: BE owner, no RT owner
        self._where: list[set | None] = [self.free] * num_blocks
        # Per iteration:
        self.checkpointed: dict[int, int] = {}  # BE request -> tokens checkpointed (overwritten) this iteration
        self.dropped: dict[int, int] = {}  # request -> tokens swapped out by a drop this iteration
        self._touched: set[int] = set()

    # --- bookkeeping ----------------------------------------------------------------------------

    def register(self, rid: int, cls: int) -> None:
        self.cls[rid] = cls
        self.blocks.setdefault(rid, [])
        self.gpu.setdefault(rid, 0)

    def empty_slots(self, blk: int) -> int:
        return self.block_size - self.rt_n[blk] - self.be_n[blk]

    def _target(self, blk: int) -> set | None:
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
        self._touched.add(blk)

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
        while left:
            if blk is None or self.empty_slots(blk) == 0:
                blk = self._most_empty_without_be()
                self._take(blk, rid, BE)
            k = min(left, self.empty_slots(blk))
            self.be_n[blk] += k
            left -= k
            self._file(blk)
        self.gpu[rid] += n
        return True

    def _most_empty_without_be(self) -> int:
        if self.free:
            return next(iter(self.free))
        for e in range(self.block_size - 1, 0, -1):
            if self.rt_only[e]:
                return next(iter(self.rt_only[e]))
        raise BlockError("no block without a BE owner has an empty slot (capacity was checked)")

    def alloc_rt(self, rid: int, n: int, protected: set[int] | frozenset = frozenset()) -> list | None:
        """Give RT request ``rid`` ``n`` slots (rules 1–4); return the receipt, or None (nothing changed)."""
        receipt: list[tuple] = []
        for _ in range(n):
            step = self._rt_slot(rid, protected)
            if step is None:
                self.undo_rt(rid, receipt)
                return None
            receipt.append(step)
        return receipt

    def _rt_slot(self, rid: int, protected) -> tuple | None:
        S = self.block_size
        last = self.last_block(rid, RT)
        if last is not None and self.empty_slots(last):  # (1) own last block
            return self._rt_put(rid, last, new=False)
        if self.free:  # (2) a wholly free block
            return self._rt_put(rid, next(iter(self.free)), new=True)
        if last is not None and self.be_n[last] and self.be_owner[last] not in protected:  # (3) overwrite the peer
            return self._rt_overwrite(rid, last, new=False)
        for e in range(S, -1, -1):  # (4) a BE-only block, most empty slots first
            for blk in self.be_only[e]:
                if self.be_owner[blk] not in protected:
                    if e:
                        return self._rt_put(rid, blk, new=True)
                    return self._rt_overwrite(rid, blk, new=True)
        return None

    def _rt_put(self, rid: int, blk: int, new: bool) -> tuple:
        if new:
            self._take(blk, rid, RT)
        self.rt_n[blk] += 1
        self.gpu[rid] += 1
        self._file(blk)
        return ("put", blk, new, None)

    def _rt_overwrite(self, rid: int, blk: int, new: bool) -> tuple:
        be = self.be_owner[blk]
        if new:
            self._take(blk, rid, RT)
        self.be_n[blk] -= 1
        self.gpu[be] -= 1
        self.checkpointed[be] = self.checkpointed.get(be, 0) + 1
        self.rt_n[blk] += 1
        self.gpu[rid] += 1
        self._file(blk)
        return ("overwrite", blk, new, be)

    def undo_rt(self, rid: int, receipt: list) -> None:
        """Reverse ``alloc_rt``'s receipt (latest step first)."""
        for kind, blk, new, be in reversed(receipt):
            self.rt_n[blk] -= 1
            self.gpu[rid] -= 1
            if kind == "overwrite" and be not in self.dropped:
                self.be_n[blk] += 1
                self.gpu[be] += 1
                self.checkpointed[be] -= 1
                if not self.checkpointed[be]:
                    del self.checkpointed[be]
            if new:
                if self.blocks[rid][-1] != blk or self.rt_n[blk]:
                    raise BlockError(f"undo of request {rid}'s block {blk} out of order")
                self.blocks[rid].pop()
                self.rt_owner[blk] = None
            self._file(blk)
        receipt.clear()

    def drop(self, rid: int) -> int:
        """Swap out all of ``rid``'s GPU tokens (its slots become empty); return how many."""
        side_n = self.rt_n if self.cls[rid] == RT else self.be_n
        owner = self.rt_owner if self.cls[rid] == RT else self.be_owner
        moved = self.gpu[rid]
        for blk in self.blocks[rid]:
            if owner[blk] == rid:
                side_n[blk] = 0
                owner[blk] = None
                self._file(blk)
        self.blocks[rid] = []
        self.gpu[rid] = 0
        if moved:
            self.dropped[rid] = self.dropped.get(rid, 0) + moved
        return moved

    def release(self, rid: int) -> None:
        """Free a finished request's slots and forget it."""
        side_n = self.rt_n if self.cls[rid] == RT else self.be_n
        owner = self.rt_owner if self.cls[rid] == RT else self.be_owner
        for blk in self.blocks.pop(rid, []):
            if owner[blk] == rid:
                side_n[blk] = 0
                owner[blk] = None
                self._file(blk)
        self.gpu.pop(rid, None)
        self.cls.pop(rid, None)

    def end_iteration(self) -> dict[int, int]:
        """Close the iteration: clear owners left with no slot; return ``{request: tokens swapped out}``."""
        for blk in self._touched:
            for owner, count in ((self.rt_owner, self.rt_n), (self.be_owner, self.be_n)):
                rid = owner[blk]
                if rid is not None and not count[blk]:
                    owner[blk] = None
                    self.blocks[rid].remove(blk)
            self._file(blk)
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
        for blk in range(self.num_blocks):
            target = self._target(blk)
            if self._where[blk] is not target or (target is not None and blk not in target):
                raise BlockError(f"block {blk} filed in the wrong candidate set")

    def used_slots(self) -> int:
        return sum(self.rt_n) + sum(self.be_n)
