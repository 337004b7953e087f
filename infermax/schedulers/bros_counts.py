"""BROS's block manager for runs without best-effort requests: counts instead of block ids.

With real-time (RT) requests only, no rule of the bidirectional manager (`bros_blocks`) ever looks at a
block id (design.md, BROS decision 15):

- every block is free or RT-only (a BE owner is the only way to share a block), and an RT request's
  blocks are all full except its last: rule 1 fills the last block before rule 2 takes a free one, and
  rule 2 fills every free block it takes but the last. So a request with ``g`` GPU tokens holds
  ``ceil(g / S)`` blocks, its last with ``ceil(g / S)·S − g`` empty slots;
- rules 3 and 4 need a BE token or a BE-only block: they never apply. Which free blocks rule 2 takes
  (the lowest ids) decides only where tokens lie, never how many fit: the capacity of a request is its
  last block's empty slots plus ``S`` per free block;
- a drop, a release and an undo give back exactly the blocks the counts say (undo in any order: an
  RT-only block is never changed by another request), and nothing is checkpointed.

So the GPU tokens per request and the number of free blocks are the whole state, and every operation is
O(1) instead of one step (or one vectorised index) per block: at block size 1 BROS swaps ~2,200
single-slot blocks each way per iteration on the Azure traces. The interface is `BiBlockManager`'s, less
the BE side; registering a BE request raises `BlockError` (the scheduler picks this manager only when
the run has none). ``tests/test_bros_counts.py`` drives both managers through random RT operations and
compares every count, capacity and return value.
"""

from __future__ import annotations

from types import MappingProxyType

from .bros_blocks import BE, RT, BlockError


class CountBlockManager:
    """`BiBlockManager` for RT requests only, as counts; see the module docstring. A receipt is one step
    ``("count", n)`` (the slots placed last, as in `BiBlockManager`'s receipts)."""

    be_holders: frozenset = frozenset()  # no BE request is ever registered
    checkpointed = MappingProxyType({})  # nothing is ever overwritten (rules 3-4 never apply)

    def __init__(self, num_blocks: int, block_size: int = 16):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need at least one block of at least one slot, got {num_blocks} x {block_size}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.free_blocks = num_blocks
        self.gpu: dict[int, int] = {}  # request -> GPU-resident tokens
        self.holders: set[int] = set()  # requests with GPU-resident tokens
        self.cls: dict[int, int] = {}
        self.dropped: dict[int, int] = {}  # request -> tokens swapped out by a drop this iteration

    def register(self, rid: int, cls: int) -> None:
        if rid < 0:
            raise ValueError(f"request ids must be non-negative, got {rid}")
        if cls != RT:
            raise BlockError(f"request {rid} is best-effort: the count-only block manager serves RT requests only")
        self.cls[rid] = cls
        self.gpu.setdefault(rid, 0)

    def _blocks(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def rt_capacity(self, rid: int, protected=frozenset()) -> int:
        """Slots RT request ``rid`` could get now: its last block's empty slots and every free block."""
        g = self.gpu[rid]
        return self.free_blocks * self.block_size + self._blocks(g) * self.block_size - g

    def alloc_rt(self, rid: int, n: int, protected=frozenset()) -> list | None:
        """Give ``rid`` ``n`` slots; return the receipt, or None (not enough room; nothing changed). Fits iff
        ``n <= rt_capacity``, i.e. the blocks ``g + n`` tokens need beyond those ``g`` hold are free."""
        S, g = self.block_size, self.gpu[rid]
        more = -(-(g + n) // S) + (g // -S) if S > 1 else n  # ceil((g + n) / S) − ceil(g / S)
        if more > self.free_blocks:
            return None
        self.free_blocks -= more
        self.gpu[rid] = g + n
        if n and not g:
            self.holders.add(rid)
        return [("count", n)]

    def alloc_be(self, rid: int, n: int) -> bool:
        raise BlockError(f"the count-only block manager has no BE side (request {rid})")

    def undo_rt(self, rid: int, receipt: list) -> None:
        """Reverse ``alloc_rt``'s receipt (any order among requests)."""
        for _, n in receipt:
            self._set(rid, self.gpu[rid] - n)
        receipt.clear()

    def _set(self, rid: int, tokens: int) -> None:
        if tokens < 0:
            raise BlockError(f"request {rid} would hold {tokens} GPU tokens")
        self.free_blocks -= self._blocks(tokens) - self._blocks(self.gpu[rid])
        if self.free_blocks < 0:
            raise BlockError(f"{-self.free_blocks} blocks more than there are")
        self.gpu[rid] = tokens
        if tokens:
            self.holders.add(rid)
        else:
            self.holders.discard(rid)

    def drop(self, rid: int) -> int:
        """Swap out all of ``rid``'s GPU tokens; return how many."""
        moved = self.gpu[rid]
        if moved:
            self.free_blocks += -(-moved // self.block_size)
            self.gpu[rid] = 0
            self.holders.discard(rid)
            self.dropped[rid] = self.dropped.get(rid, 0) + moved
        return moved

    def release(self, rid: int) -> None:
        """Free a finished request's slots and forget it."""
        if rid in self.gpu:
            self._set(rid, 0)
        self.gpu.pop(rid, None)
        self.cls.pop(rid, None)

    def end_iteration(self) -> dict[int, int]:
        """Close the iteration; return ``{request: tokens swapped out}`` (drops only)."""
        out, self.dropped = self.dropped, {}
        return out

    def check(self) -> None:
        """Raise BlockError unless the free blocks, holders and counts agree."""
        used = sum(self._blocks(g) for g in self.gpu.values())
        if used + self.free_blocks != self.num_blocks or any(g < 0 for g in self.gpu.values()):
            raise BlockError(f"{used} blocks in use and {self.free_blocks} free, of {self.num_blocks}")
        if self.holders != {rid for rid, g in self.gpu.items() if g}:
            raise BlockError("the KV-holder set disagrees with the GPU token counts")
        if any(cls == BE for cls in self.cls.values()) or self.checkpointed:
            raise BlockError("a BE request in the count-only block manager")

    def used_slots(self) -> int:
        return sum(self.gpu.values())
