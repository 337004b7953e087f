"""Automatic prefix caching: KV blocks identified by content, kept after their request frees them.

The rule (``Limits.prefix_caching``; `docs/design.md`, "Automatic prefix caching"):

- **Identity.** A request's token content is its prompt (`Request.content`, or a segment of its own)
  followed by its generated tokens (`output_segment`). Full block ``k`` (tokens ``k·b … k·b+b−1``,
  ``b`` = ``block_size``) is identified by a hash chained over the content: ``h_k = hash((h_{k−1},
  pieces_k))``, where ``pieces_k`` lists the ``(segment, start, end)`` ranges the block covers. Two
  requests share block ``k`` exactly when their contents agree on the first ``(k+1)·b`` tokens (up to a
  64-bit hash collision, the risk vLLM's own block hashes accept). Partial blocks are never shared.
- **Registration.** When a batch fills a block of a request, the block is registered under its hash at
  the end of that batch (so a request admitted in the same batch cannot hit it yet). If the hash is
  already registered (two requests computed the same prefix side by side) the later block stays
  private and is not cached.
- **References.** A block is referenced by every request holding it; only referenced blocks count
  against ``M`` (the replayer's ``kv_tokens`` counts a shared block once).
- **Cached blocks.** When its last reference goes (the request finished or was evicted), a registered
  block stays cached, unreferenced; a request's blocks join the least-recently-used order tail first,
  so its prefix outlives its tail (as vLLM frees them). Unregistered blocks become empty.
- **Eviction.** Memory comes from empty blocks first; when none are left, the least recently used
  cached block is dropped (`evicted_blocks`). Referenced + cached blocks never exceed ``⌊M/b⌋``.
- **Hits.** A request holding no KV may start on the longest run of registered blocks at the start of
  its current input (``Icur`` tokens: its prompt, plus what it generated if it was evicted in decode
  phase), capped at ``Icur − 1`` tokens so that at least one token is computed (its logits give the
  next token). Taking a hit references those blocks (a cached one leaves the LRU order) and sets ``m``
  to the hit; the batch then computes only the rest, whose attention reads the cached context.

`PrefixCache` is owned by the replayer (`infermax.replay.Replayer`), which applies these rules to every
batch; schedulers read it through `hit_tokens`, `hit_new_blocks`, `free_tokens` and `held_blocks` only.
"""

from __future__ import annotations

from itertools import islice
from typing import Callable

from .limits import Limits
from .request import Request, output_segment, prompt_segment


class _Chain:
    """The block hashes of one request's content, computed as far as needed."""

    __slots__ = ("segments", "seg", "offset", "hashes")

    def __init__(self, req: Request):
        prompt = req.content if req.content is not None else ((prompt_segment(req.id), req.prompt_tokens),)
        self.segments = list(prompt) + [(output_segment(req.id), req.output_tokens)]
        self.seg = 0  # segment holding the next block's first token
        self.offset = 0  # that token's offset in the segment
        self.hashes: list[int] = []

    def hash_at(self, k: int, block_size: int) -> int:
        """The hash of full block ``k`` (blocks before it are computed first)."""
        hashes, segments = self.hashes, self.segments
        while len(hashes) <= k:
            seg_id, length = segments[self.seg]
            if length - self.offset > block_size:  # the common case: the block lies inside one segment
                off = self.offset
                hashes.append(hash((hashes[-1] if hashes else 0, ((seg_id, off, off + block_size),))))
                self.offset = off + block_size
                continue
            pieces = []
            need = block_size
            while need:
                seg_id, length = segments[self.seg]
                take = min(need, length - self.offset)
                pieces.append((seg_id, self.offset, self.offset + take))
                need -= take
                self.offset += take
                if self.offset == length:
                    self.seg, self.offset = self.seg + 1, 0
            hashes.append(hash((hashes[-1] if hashes else 0, tuple(pieces))))
        return hashes[k]


class PrefixCache:
    """The block pool of automatic prefix caching (rules in the module docstring).

    Counters for metrics: ``hit_tokens`` / ``hit_blocks`` (taken from the cache), ``admitted_tokens`` /
    ``admitted_blocks`` (``Icur`` and ``⌊(Icur−1)/b⌋`` of every admission, hit or not: what could have
    hit), ``restart_hit_tokens`` (hits of requests restarting after an eviction: refill not recomputed),
    ``evicted_blocks`` (cached blocks dropped to make room).
    """

    def __init__(self, limits: Limits, used_tokens: Callable[[], int]):
        self.block_size = limits.block_size
        self.capacity_blocks = limits.M // limits.block_size
        self._used_tokens = used_tokens  # the referenced KV, block-rounded (the replayer's ``kv_tokens``)
        self._by_hash: dict[int, int] = {}  # content hash -> the block registered for it
        self._hash_of: dict[int, int] = {}  # registered block -> its hash
        self._refs: dict[int, int] = {}  # block -> requests referencing it (full blocks only)
        self._lru: dict[int, None] = {}  # cached, unreferenced registered blocks, least recently used first
        self._tables: dict[int, list[int]] = {}  # request id -> its full blocks, in order
        self._chains: dict[int, _Chain] = {}
        self._next_block = 0
        self.hit_tokens_total = self.hit_blocks_total = 0
        self.restart_hit_tokens = 0  # of them, taken by requests restarting after an eviction
        self.admitted_tokens = self.admitted_blocks = 0
        self.evicted_blocks = 0

    # -- what schedulers read ------------------------------------------------------------------

    def hit_tokens(self, s) -> int:
        """The longest cached prefix of ``s``'s current input, in tokens: a multiple of ``block_size``, at
        most ``Icur − 1``; 0 if none. Meaningful for a request holding no KV (``m = 0``)."""
        b, by_hash = self.block_size, self._by_hash
        chain = self._chain(s.req)
        k, most = 0, (s.input_tokens - 1) // b
        while k < most and chain.hash_at(k, b) in by_hash:
            k += 1
        return k * b

    def hit_new_blocks(self, s, tokens: int) -> int:
        """Of the first ``tokens / block_size`` blocks of ``s``'s input (all registered), how many are
        cached but unreferenced: taking the hit moves them out of the free pool."""
        b, chain, lru, by_hash = self.block_size, self._chain(s.req), self._lru, self._by_hash
        return sum(by_hash[chain.hash_at(k, b)] in lru for k in range(tokens // b))

    def free_tokens(self) -> int:
        """KV tokens not referenced by any request: empty blocks plus cached, unreferenced ones (those are
        evicted when memory is needed)."""
        return self.capacity_blocks * self.block_size - self._used_tokens()

    def held_blocks(self, s) -> list[tuple[int, int]]:
        """``(block, requests referencing it)`` for each full block ``s`` holds, in order: a block with more
        than one reference stays in use when ``s`` drops its KV (a scheduler choosing a preemption victim
        reads how much it would free)."""
        refs = self._refs
        return [(block, refs[block]) for block in self._tables.get(s.id, ())]

    @property
    def cached_blocks(self) -> int:
        """Registered blocks no request references (kept for future hits)."""
        return len(self._lru)

    # -- what the replayer applies -------------------------------------------------------------

    def missing_block(self, s, tokens: int) -> int | None:
        """The first of the first ``tokens / block_size`` blocks of ``s``'s input that is not cached, or
        None when all are (the replayer's check of a hit)."""
        b, chain, by_hash = self.block_size, self._chain(s.req), self._by_hash
        for k in range(tokens // b):
            if chain.hash_at(k, b) not in by_hash:
                return k
        return None

    def admit(self, s, tokens: int) -> int:
        """``s`` (holding no KV) starts with ``tokens`` cached tokens (0: no hit); returns how many blocks
        this newly references (they were cached, unreferenced)."""
        b, chain, by_hash, refs, lru = self.block_size, self._chain(s.req), self._by_hash, self._refs, self._lru
        self.admitted_tokens += s.input_tokens
        self.admitted_blocks += (s.input_tokens - 1) // b
        table = self._tables[s.id] = []
        s.cache_blocks = tokens // b
        newly = 0
        for k in range(tokens // b):
            block = by_hash[chain.hash_at(k, b)]
            if refs[block] == 0:
                del lru[block]
                newly += 1
            refs[block] += 1
            table.append(block)
        self.hit_tokens_total += tokens
        self.hit_blocks_total += tokens // b
        if s.evictions:
            self.restart_hit_tokens += tokens
        return newly

    def fill(self, s) -> None:
        """Register the blocks ``s`` filled since the last call (its ``m`` cached tokens are computed)."""
        b = self.block_size
        table = self._tables.setdefault(s.id, [])
        full = s.m // b
        if len(table) >= full:
            return
        s.cache_blocks = full
        chain, by_hash, refs = self._chain(s.req), self._by_hash, self._refs
        for k in range(len(table), full):
            block = self._next_block
            self._next_block += 1
            refs[block] = 1
            h = chain.hash_at(k, b)
            if h not in by_hash:
                by_hash[h] = block
                self._hash_of[block] = h
            table.append(block)

    def release(self, s) -> int:
        """``s`` drops its KV (finished or evicted; ``s.m`` still its cached tokens): returns the blocks no
        request references any more (its partial tail block included). Registered ones stay cached."""
        self.fill(s)
        refs, lru, hash_of = self._refs, self._lru, self._hash_of
        freed = 1 if s.m % self.block_size else 0
        s.cache_blocks = 0
        for block in reversed(self._tables.pop(s.id, ())):
            refs[block] -= 1
            if refs[block] == 0:
                freed += 1
                if block in hash_of:
                    lru[block] = None
                else:
                    del refs[block]
        if s.finish_s is not None:
            self._chains.pop(s.id, None)
        return freed

    def make_room(self) -> None:
        """Drop least-recently-used cached blocks until referenced + cached blocks fit ``⌊M/b⌋``."""
        over = self._used_tokens() // self.block_size + len(self._lru) - self.capacity_blocks
        if over <= 0:
            return
        lru, refs, by_hash, hash_of = self._lru, self._refs, self._by_hash, self._hash_of
        victims = list(islice(lru, over))
        for block in victims:
            del lru[block], refs[block], by_hash[hash_of.pop(block)]
        self.evicted_blocks += len(victims)

    def _chain(self, req: Request) -> _Chain:
        chain = self._chains.get(req.id)
        if chain is None:
            chain = self._chains[req.id] = _Chain(req)
        return chain
