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
until ``end_iteration`` clears it, and a BE request dropped in an iteration gets no slots again in it
(`alloc_be` refuses with `BlockError`; BROS never selects it, see bros.py): "dropped meanwhile" is then
"dropped this iteration", which is what undo checks.

Ties (the paper is silent): among candidate blocks of equal rank the one with the lowest id is
taken. Each candidate set keeps a min-heap beside it (stale entries are skipped when they reach
the top), so a pick costs O(log blocks), and allocation works in runs: one step per block (several
free blocks in one loop), never one step per slot. The result equals the slot-by-slot rules: a run
ends exactly where the slot-by-slot rule would switch (design.md, BROS decision 13).

Representation (decision 14): the per-block owners and counts are numpy arrays (owner −1: none), a
request's blocks a list of numpy chunks in fill order, the free blocks a mask. Taking free blocks,
dropping and releasing a request, and undoing a free-block step touch their blocks by vectorised
indexing (a few ns per block, no Python step per block): at block size 1 BROS moves thousands of
single-slot blocks per iteration, scattered over memory by the lowest-id rule. Full RT-only blocks
(never a candidate) are in no set. Scalar reads use ``.item`` so every count handed out is a Python int.
"""

from __future__ import annotations

from heapq import heapify, heappop, heappush

import numpy as np

RT, BE = 0, 1
_NONE = -1  # "no owner" in the owner arrays


class BlockError(RuntimeError):
    """An internal inconsistency of the block manager (a bug, never a scheduling outcome)."""


class _Candidates:
    """A set of block ids with its lowest member in O(log n): the set and a min-heap of every id added
    since the last compaction (members leave the set only; stale heap entries are dropped at the top)."""

    __slots__ = ("members", "heap")
    tracked = True

    def __init__(self):
        self.members: set[int] = set()
        self.heap: list[int] = []

    def __len__(self) -> int:
        return len(self.members)

    def __iter__(self):
        return iter(self.members)

    def __contains__(self, blk: int) -> bool:
        return blk in self.members

    def add(self, blk: int) -> None:
        self.members.add(blk)
        heappush(self.heap, blk)
        self._compact()

    def add_array(self, blks: np.ndarray) -> None:
        if not len(blks):
            return
        ids = blks.tolist()
        self.members.update(ids)
        if len(ids) > len(self.heap):
            self.heap.extend(ids)
            heapify(self.heap)
        else:
            for blk in ids:
                heappush(self.heap, blk)
        self._compact()

    def _compact(self) -> None:
        if len(self.heap) > 2 * len(self.members) + 64:
            self.heap = list(self.members)
            heapify(self.heap)

    def discard(self, blk: int) -> None:
        self.members.discard(blk)

    def discard_array(self, blks: np.ndarray) -> None:
        self.members.difference_update(blks.tolist())

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

    def add_array(self, blks: np.ndarray) -> None:
        pass

    def discard_array(self, blks: np.ndarray) -> None:
        pass


class _FreeBlocks:
    """The wholly free blocks: a mask, the free count of every chunk of ``CHUNK`` blocks, and a count. Every
    block below ``low`` is in use. One block is found by scanning the mask (in C) from ``low``; many by
    listing the chunks above ``low`` that hold free blocks, locating the q-th lowest (cumulative counts) and
    scanning those chunks only. At block size 1 the free blocks after a drop lie in a few dozen chunks spread
    over most of the memory: scanning the mask over that span (in growing windows, as before) read ~200,000
    entries per swap-in on azure-conv."""

    __slots__ = ("mask", "rows", "chunk_free", "count", "low", "n")
    tracked = True
    CHUNK = 64

    def __init__(self, num_blocks: int):
        chunks = -(-num_blocks // self.CHUNK)
        self.mask = np.zeros(chunks * self.CHUNK, dtype=bool)  # padded with blocks that are never free
        self.mask[:num_blocks] = True
        self.rows = self.mask.reshape(chunks, self.CHUNK)  # a view: row c is chunk c
        self.chunk_free = self.rows.sum(axis=1)
        self.count, self.low, self.n = num_blocks, 0, num_blocks

    def __len__(self) -> int:
        return self.count

    def __contains__(self, blk: int) -> bool:
        return bool(self.mask[blk])

    def __iter__(self):
        return iter(np.flatnonzero(self.mask).tolist())

    def add(self, blk: int) -> None:
        if not self.mask[blk]:
            self.mask[blk] = True
            self.chunk_free[blk // self.CHUNK] += 1
            self.count += 1
            if blk < self.low:
                self.low = blk

    def discard(self, blk: int) -> None:
        if self.mask[blk]:
            self.mask[blk] = False
            self.chunk_free[blk // self.CHUNK] -= 1
            self.count -= 1

    def add_array(self, blks: np.ndarray) -> None:
        """Add blocks that are not free now."""
        if len(blks):
            self.mask[blks] = True
            np.add.at(self.chunk_free, blks // self.CHUNK, 1)
            self.count += len(blks)
            self.low = min(self.low, blks.min().item())

    def take_lowest(self, q: int) -> np.ndarray:
        """Remove and return the ``q`` lowest free blocks (``0 < q <= len(self)``), ascending."""
        if q > self.count:
            raise BlockError(f"{q} free blocks asked for, {self.count} free")
        mask, lo, C = self.mask, self.low, self.CHUNK
        if q == 1:  # a decode step: the first free block at or above low (argmax stops at the first True)
            blk = lo + mask[lo:].argmax().item()
            if not mask[blk]:
                raise BlockError(f"no free block (count {self.count} is wrong)")
            mask[blk] = False
            self.chunk_free[blk // C] -= 1
            out = np.array([blk], dtype=np.int64)
        else:
            c0 = lo // C
            above = self.chunk_free[c0:]
            chunks = np.flatnonzero(above != 0)  # the chunks holding free blocks (relative to c0), ascending
            cum = np.cumsum(above[chunks])
            k = int(np.searchsorted(cum, q))  # chunk k holds the q-th lowest free block
            chunks = chunks[:k + 1] + c0
            found = np.flatnonzero(self.rows[chunks].ravel())[:q]  # scan those chunks only
            out = chunks[found // C] * C + found % C
            mask[out] = False
            self.chunk_free[chunks[:-1]] = 0
            self.chunk_free[chunks[-1]] = cum[k] - q
        self.count -= q
        self.low = out.item(-1) + 1
        return out


def _fill(where: np.ndarray, blks: np.ndarray, value) -> None:
    """``where[blks] = value`` for an object that numpy would otherwise probe as a sequence."""
    box = np.empty((), dtype=object)
    box[()] = value
    where[blks] = box


def _single(blk: int) -> np.ndarray:
    return np.array([blk], dtype=np.int64)


class BiBlockManager:
    """Two-owner KV blocks; see the module docstring. ``cls[rid]`` is ``RT`` or ``BE``; request ids are
    non-negative. ``rt_owner``, ``rt_n``, ``be_owner``, ``be_n`` and ``blocks`` are list views built on
    access (inspection, tests)."""

    def __init__(self, num_blocks: int, block_size: int = 16):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need at least one block of at least one slot, got {num_blocks} x {block_size}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self._rto = np.full(num_blocks, _NONE, dtype=np.int64)  # RT owner per block
        self._beo = np.full(num_blocks, _NONE, dtype=np.int64)
        self._rtn = np.zeros(num_blocks, dtype=np.int64)  # RT slots per block
        self._ben = np.zeros(num_blocks, dtype=np.int64)
        self._own: dict[int, list[np.ndarray]] = {}  # request -> its blocks in fill order, as non-empty chunks
        self.gpu: dict[int, int] = {}  # request -> GPU-resident tokens
        self.holders: set[int] = set()  # requests with GPU-resident tokens (gpu > 0)
        self.be_holders: set[int] = set()  # the BE requests among them
        self.cls: dict[int, int] = {}
        # Candidate sets, kept in step with the block state by _file():
        self.free = _FreeBlocks(num_blocks)  # no owner at all
        # by empty slots: RT owner, no BE owner (full ones are never candidates: not tracked)
        self.rt_only: list[_Candidates | _Untracked] = [_Untracked()] + [_Candidates() for _ in range(block_size)]
        self.be_only = [_Candidates() for _ in range(block_size + 1)]  # by empty slots: BE owner, no RT owner
        # The tracked candidate set each block is in (None: free, full RT-only or shared; the free ones are the
        # mask's). Free blocks becoming full RT blocks and back, the bulk of the traffic, never write it.
        self._where = np.full(num_blocks, None, dtype=object)
        # Per iteration:
        self.checkpointed: dict[int, int] = {}  # BE request -> tokens checkpointed (overwritten) this iteration
        self.dropped: dict[int, int] = {}  # request -> tokens swapped out by a drop this iteration
        self._touched: set[int] = set()  # blocks whose count fell this iteration (owners left with 0 slots)

    # --- views (inspection, tests) ----------------------------------------------------------------

    @property
    def rt_owner(self) -> list[int | None]:
        return [None if o == _NONE else o for o in self._rto.tolist()]

    @property
    def be_owner(self) -> list[int | None]:
        return [None if o == _NONE else o for o in self._beo.tolist()]

    @property
    def rt_n(self) -> list[int]:
        return self._rtn.tolist()

    @property
    def be_n(self) -> list[int]:
        return self._ben.tolist()

    @property
    def blocks(self) -> dict[int, list[int]]:
        """Every registered request's blocks in fill order."""
        return {rid: [blk for chunk in own for blk in chunk.tolist()] for rid, own in self._own.items()}

    # --- bookkeeping ----------------------------------------------------------------------------

    def register(self, rid: int, cls: int) -> None:
        if rid < 0:
            raise ValueError(f"request ids must be non-negative, got {rid}")
        self.cls[rid] = cls
        self._own.setdefault(rid, [])
        self.gpu.setdefault(rid, 0)

    def _add_gpu(self, rid: int, n: int) -> None:
        g = self.gpu[rid] = self.gpu[rid] + n
        if g:
            self.holders.add(rid)
            if self.cls[rid] == BE:
                self.be_holders.add(rid)
        else:
            self.holders.discard(rid)
            self.be_holders.discard(rid)

    def empty_slots(self, blk: int) -> int:
        return self.block_size - self._rtn.item(blk) - self._ben.item(blk)

    def _target(self, blk: int) -> _Candidates | _Untracked | _FreeBlocks | None:
        """The candidate set ``blk`` belongs in (None: shared by an RT and a BE owner)."""
        rt, be = self._rto.item(blk), self._beo.item(blk)
        if rt == _NONE and be == _NONE:
            return self.free
        if be == _NONE:
            return self.rt_only[self.empty_slots(blk)]
        if rt == _NONE:
            return self.be_only[self.empty_slots(blk)]
        return None

    def _file(self, blk: int) -> None:
        """Move ``blk`` to the candidate set matching its owners and empty slots."""
        target = self._target(blk)
        if target is self.free:
            self.free.add(blk)
            target = None
        else:
            self.free.discard(blk)
            if target is not None and not target.tracked:
                target = None
        old = self._where[blk]
        if old is not target:
            if old is not None:
                old.discard(blk)
            if target is not None:
                target.add(blk)
            self._where[blk] = target

    def _take(self, blk: int, rid: int, side: int) -> None:
        (self._rto if side == RT else self._beo)[blk] = rid
        self._own[rid].append(_single(blk))

    def last_block(self, rid: int, side: int) -> int | None:
        """The request's last block if it still owns that block's ``side``."""
        own = self._own.get(rid)
        if not own:
            return None
        blk = own[-1].item(-1)
        return blk if (self._rto if side == RT else self._beo).item(blk) == rid else None

    def _pop_last(self, rid: int, blk: int) -> None:
        own = self._own[rid]
        if not own or own[-1].item(-1) != blk:
            raise BlockError(f"block {blk} is not request {rid}'s last block")
        if len(own[-1]) == 1:
            own.pop()
        else:
            own[-1] = own[-1][:-1]

    def _take_free(self, rid: int, side: int, n: int) -> tuple[np.ndarray | None, int]:
        """Take free blocks, lowest id first, for up to ``n`` slots of ``rid``'s ``side`` (all of them but
        the last filled); return (the blocks, ascending, slots placed). Equal to taking them one at a time."""
        S = self.block_size
        q = min(-(-n // S), self.free.count)
        if not q:
            return None, 0
        taken = self.free.take_lowest(q)
        placed = min(n, q * S)
        owner, count = (self._rto, self._rtn) if side == RT else (self._beo, self._ben)
        full_set = (self.rt_only if side == RT else self.be_only)[0]
        owner[taken] = rid
        count[taken] = S
        self._own[rid].append(taken)
        last_n = placed - (q - 1) * S
        full = taken[:-1] if last_n < S else taken
        if full_set.tracked:  # full BE-only blocks (rule 4's candidates); full RT-only ones are in no set
            _fill(self._where, full, full_set)
            full_set.add_array(full)
        if last_n < S:
            last = taken.item(-1)
            count[last] = last_n
            self._file(last)
        self._add_gpu(rid, placed)
        return taken, placed

    # --- allocation -----------------------------------------------------------------------------

    def be_capacity(self, rid: int) -> int:
        """Empty slots a BE request could get now (its last block's plus every block without a BE owner)."""
        total = len(self.free) * self.block_size + sum(e * len(s) for e, s in enumerate(self.rt_only))
        last = self.last_block(rid, BE)
        return total + (self.empty_slots(last) if last is not None else 0)

    def alloc_be(self, rid: int, n: int, own_blocks: bool = False) -> bool:
        """Give BE request ``rid`` ``n`` slots from empty slots; all or nothing (False: not enough).

        ``own_blocks``: after its last block, also the empty slots of its earlier blocks, latest first (an RT
        peer that overwrote BE slots there and then finished leaves them empty, and no other rule reaches them:
        the block still has this BE owner). Only BROS's guard for an otherwise empty batch asks for them (design.md,
        BROS decision 16)."""
        if rid in self.dropped:
            raise BlockError(f"BE request {rid} was dropped in this iteration and cannot get slots in it")
        earlier = self._earlier_be_blocks_with_room(rid) if own_blocks else []
        if n > self.be_capacity(rid) + sum(map(self.empty_slots, earlier)):
            return False
        left = n
        blk = self.last_block(rid, BE)
        for blk in ([blk] if blk is not None else []) + earlier:
            if not left:
                break
            if self.empty_slots(blk):
                k = min(left, self.empty_slots(blk))
                self._ben[blk] += k
                left -= k
                self._add_gpu(rid, k)
                self._file(blk)
        if left:
            left -= self._take_free(rid, BE, left)[1]
        while left:
            blk = self._most_empty_rt_only()
            self._take(blk, rid, BE)
            k = min(left, self.empty_slots(blk))
            self._ben[blk] += k
            left -= k
            self._add_gpu(rid, k)
            self._file(blk)
        return True

    def _earlier_be_blocks_with_room(self, rid: int) -> list[int]:
        """The BE side of ``rid``'s blocks before its last one that have empty slots, latest first."""
        own = self._own.get(rid)
        if not own:
            return []
        blocks = np.concatenate(own)[:-1][::-1]
        keep = (self._beo[blocks] == rid) & (self.block_size - self._rtn[blocks] - self._ben[blocks] > 0)
        return blocks[keep].tolist()

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
            if not self.free.count and self._ben.item(last) and self._beo.item(last) not in protected:
                total += self._ben.item(last)
        be_only = sum(len(c) for c in self.be_only)
        if protected and be_only:
            be_only = sum(1 for c in self.be_only for blk in c if self._beo.item(blk) not in protected)
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
        if last is not None and self._ben.item(last) and self._beo.item(last) not in protected:  # (3) the peer
            return self._rt_overwrite(rid, last, False, min(left, self._ben.item(last)))
        for e in range(self.block_size, -1, -1):  # (4) a BE-only block, most empty slots first, lowest id
            cands = self.be_only[e]
            if not cands.members:
                continue
            blk = cands.lowest()
            if self._beo.item(blk) in protected:
                blk = next((b for b in cands.ascending() if self._beo.item(b) not in protected), None)
                if blk is None:
                    continue
            if e:
                return self._rt_put(rid, blk, True, min(left, e))
            return self._rt_overwrite(rid, blk, True, min(left, self._ben.item(blk)))
        return None

    def _rt_put(self, rid: int, blk: int, new: bool, k: int) -> tuple:
        if new:
            self._take(blk, rid, RT)
        self._rtn[blk] += k
        self._add_gpu(rid, k)
        self._file(blk)
        return ("put", blk, new, None, k)

    def _rt_overwrite(self, rid: int, blk: int, new: bool, k: int) -> tuple:
        be = self._beo.item(blk)
        if new:
            self._take(blk, rid, RT)
        self._ben[blk] -= k
        self._add_gpu(be, -k)
        self.checkpointed[be] = self.checkpointed.get(be, 0) + k
        self._rtn[blk] += k
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
                self._undo_step(rid, taken.item(-1), True, None, k - S * (len(taken) - 1))
                if len(taken) > 1:
                    self._free_tail(rid, taken[:-1])
            else:
                _, blk, new, be, k = step
                self._undo_step(rid, blk, new, be, k)
        receipt.clear()

    def _undo_step(self, rid: int, blk: int, new: bool, be: int | None, k: int) -> None:
        self._rtn[blk] -= k
        self._add_gpu(rid, -k)
        # the overwritten BE slot goes back to its request unless that request lost the block since (dropped:
        # a drop clears its ownership even when it had no GPU token left, as after this overwrite)
        if be is not None and be not in self.dropped and self._beo.item(blk) == be:
            self._ben[blk] += k
            self._add_gpu(be, k)
            self.checkpointed[be] -= k
            if not self.checkpointed[be]:
                del self.checkpointed[be]
        if new:
            if self._rtn.item(blk):
                raise BlockError(f"undo of request {rid}'s block {blk} out of order")
            self._pop_last(rid, blk)
            self._rto[blk] = _NONE
        self._file(blk)
        self._touched.add(blk)

    def _free_tail(self, rid: int, blks: np.ndarray) -> None:
        """Undo RT request ``rid``'s full blocks ``blks``, taken free by its receipt and its last blocks now:
        they become free again. Equal to undoing them one by one: no other request can have changed a full
        RT-only block (BE takes empty slots only, RT overwrites BE tokens only), and a block left without an
        owner is not changed by ``end_iteration`` (so it is not marked touched)."""
        own, n = self._own[rid], len(blks)
        if (not own or len(own[-1]) != n or not (own[-1] == blks).all() or not (self._rto[blks] == rid).all()
                or not (self._rtn[blks] == self.block_size).all() or not (self._beo[blks] == _NONE).all()):
            raise BlockError(f"undo of request {rid}'s blocks {blks.tolist()}: not its last full blocks")
        own.pop()
        self._rto[blks] = _NONE
        self._rtn[blks] = 0
        self.free.add_array(blks)
        self._add_gpu(rid, -n * self.block_size)

    def _clear(self, rid: int) -> None:
        """Give up all of ``rid``'s slots (owners cleared, blocks re-filed). Its full blocks without another
        owner (the common case) are freed by vectorised indexing; others one by one."""
        own = self._own[rid]
        if own:
            rt = self.cls[rid] == RT
            owner, count, other = (self._rto, self._rtn, self._beo) if rt else (self._beo, self._ben, self._rto)
            blks = own[0] if len(own) == 1 else np.concatenate(own)
            if not (owner[blks] == rid).all():
                raise BlockError(f"request {rid} lists blocks whose side it does not own")
            full = (other[blks] == _NONE) & (count[blks] == self.block_size)  # filed in the full set
            rest = None
            if not full.all():
                rest, blks = blks[~full], blks[full]
            owner[blks] = _NONE
            count[blks] = 0
            full_set = (self.rt_only if rt else self.be_only)[0]
            if full_set.tracked:
                self._where[blks] = None
                full_set.discard_array(blks)
            self.free.add_array(blks)
            if rest is not None:
                for blk in rest.tolist():
                    count[blk] = 0
                    owner[blk] = _NONE
                    self._file(blk)
        self._own[rid] = []
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
        if rid in self._own:
            self._clear(rid)
        self._own.pop(rid, None)
        self.gpu.pop(rid, None)
        self.holders.discard(rid)
        self.be_holders.discard(rid)
        self.cls.pop(rid, None)

    def end_iteration(self) -> dict[int, int]:
        """Close the iteration: clear owners left with no slot; return ``{request: tokens swapped out}``."""
        gone: dict[int, list[int]] = {}
        for blk in self._touched:
            for owner, count in ((self._rto, self._rtn), (self._beo, self._ben)):
                rid = owner.item(blk)
                if rid != _NONE and not count.item(blk):
                    owner[blk] = _NONE
                    gone.setdefault(rid, []).append(blk)
            self._file(blk)
        for rid, blks in gone.items():
            own = self._own[rid]
            kept = np.concatenate(own)
            kept = kept[~np.isin(kept, blks)]
            self._own[rid] = [kept] if len(kept) else []
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
        rt_owner, be_owner, rt_n, be_n, blocks = self.rt_owner, self.be_owner, self.rt_n, self.be_n, self.blocks
        counted: dict[int, int] = {rid: 0 for rid in self.gpu}
        for blk in range(self.num_blocks):
            r, b = rt_n[blk], be_n[blk]
            if r < 0 or b < 0 or r + b > S:
                raise BlockError(f"block {blk}: {r} RT + {b} BE slots of {S}")
            for owner, n, side in ((rt_owner[blk], r, RT), (be_owner[blk], b, BE)):
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
            side_owner = rt_owner if self.cls[rid] == RT else be_owner
            if len(set(own)) != len(own) or any(side_owner[blk] != rid for blk in own):
                raise BlockError(f"request {rid}'s block list {own} disagrees with the owners")
            if any(not len(chunk) or chunk.dtype != np.int64 for chunk in self._own[rid]):
                raise BlockError(f"request {rid} has an empty or mistyped block chunk")
        for rid, n in counted.items():
            if n != self.gpu[rid]:
                raise BlockError(f"request {rid}: {n} slots in blocks, {self.gpu[rid]} recorded")
        free = self.free
        if free.count != int(free.mask.sum()) or free.mask[:free.low].any() or free.mask[free.n:].any() \
                or (free.chunk_free != free.rows.sum(axis=1)).any():
            raise BlockError(f"free-block count {free.count}, hint {free.low} or chunk counts disagree with the mask")
        if self.holders != {rid for rid, n in self.gpu.items() if n} or \
                self.be_holders != {rid for rid in self.holders if self.cls[rid] == BE}:
            raise BlockError("the KV-holder sets disagree with the GPU token counts")
        for blk in range(self.num_blocks):
            target = self._target(blk)
            if (target is free) != (blk in free):
                raise BlockError(f"block {blk}: the free mask disagrees with its owners")
            tracked = target if target is not None and target is not free and target.tracked else None
            if self._where[blk] is not tracked or (tracked is not None and blk not in tracked):
                raise BlockError(f"block {blk} filed in the wrong candidate set")
        for cands in (*self.rt_only, *self.be_only):
            if cands.tracked and any(self._where[blk] is not cands for blk in cands):
                raise BlockError(f"a candidate set holds a block filed elsewhere: {sorted(cands)}")

    def used_slots(self) -> int:
        return int(self._rtn.sum() + self._ben.sum())
