"""EcoServe's PT and GT queues kept in priority order between batches, so planning a batch touches only the
requests it looks at, and never sorts a queue.

EcoServe orders prompts by (slack bucket, −⌊occupied KV/128⌋, −⌊length/128⌋, −length, arrival, id)
(``ordering``) or FCFS by (arrival, id). Of those fields only two change while a request waits:

- its cached tokens ``m`` and length ``input_tokens``, which only the batch that processes or evicts
  it changes: the scheduler calls ``rekey`` for exactly those requests in ``batch_done``;
- its slack bucket ``#{b ∈ (0.5 s, 2 s) : deadline − now ≥ b}``, which only falls as ``now`` grows:
  ``refresh(now)`` moves the requests whose ``deadline − now`` crossed a threshold, found in one
  deadline-ordered heap per bucket (each request moves at most twice).

``keys`` (sorted) is then the priority order the old per-batch sort produced; ``by_rem`` holds
(remaining prompt tokens, key) for the "closest-fitting PT" search. Keys end with the request id, so
they are unique and the order is total. The insertion order (``tasks``, a dict) is kept for the
deadlock breaking, which evicts the most recently queued holder first.

The GT queue (`GTQueue`) is kept the same way, in three orders: FCFS (arrival, id); with ``ordering``, the
admission order (slack bucket, −⌊GPU-resident KV/128⌋, −⌊allocation/128⌋, −allocation, arrival, id); and
the hosting pool's order (allocation, slack bucket, −id). A queued GT's allocation is set before it is
queued and its GPU-resident KV changes only when a swap-out planned in the batch that queued it is
applied (``rekey`` in ``batch_done``); its bucket falls with ``now`` (``refresh``).
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right, insort

SLACK_BUCKETS_S = (0.5, 2.0)  # specs §6.12
KV_BUCKET = LEN_BUCKET = 128


_LOW_S, _HIGH_S = SLACK_BUCKETS_S


def slack_bucket(deadline: float, now: float) -> int:
    """0 (slack < 0.5 s), 1 (< 2 s) or 2: the number of thresholds the slack reaches (two comparisons, not a
    generator: the GT ordering computes it for every queued GT at every admission)."""
    slack = deadline - now
    return 2 if slack >= _HIGH_S else (1 if slack >= _LOW_S else 0)


class _SlackBuckets:
    """Each member's slack bucket, which only falls as ``now`` grows, and ``refresh(now)``, which moves the
    members whose ``deadline − now`` crossed a threshold: found in one deadline-ordered heap per bucket
    (bucket 0 has none), so each member moves at most twice. Subclasses re-index a moved member in
    ``_moved``; members need ``s`` (a ``RequestState``) and ``deadline``."""

    def __init__(self) -> None:
        self.tasks: dict = {}  # rid -> task, insertion order
        self._bucket: dict[int, int] = {}
        self._heaps: tuple[list, list, list] = ([], [], [])  # per bucket: (deadline, rid); bucket 0 unused

    def __contains__(self, rid: int) -> bool:
        return rid in self.tasks

    def __len__(self) -> int:
        return len(self.tasks)

    def _enter(self, t, now: float) -> int:
        """Record ``t``'s bucket at ``now`` (a later ``now`` only lowers it; ``refresh`` catches up)."""
        bucket = slack_bucket(t.deadline, now)
        self._bucket[t.s.id] = bucket
        if bucket:
            heapq.heappush(self._heaps[bucket], (t.deadline, t.s.id))
        return bucket

    def _moved(self, t, new: int) -> None:
        raise NotImplementedError

    def refresh(self, now: float) -> None:
        """Move the members whose slack fell below a bucket threshold by ``now``."""
        for bucket in (2, 1):
            heap, threshold = self._heaps[bucket], SLACK_BUCKETS_S[bucket - 1]
            while heap and heap[0][0] - now < threshold:
                _, rid = heapq.heappop(heap)
                t = self.tasks.get(rid)
                if t is None or self._bucket[rid] != bucket:
                    continue  # left the queue or already moved
                new = self._enter(t, now)
                self._moved(t, new)


class PromptQueue(_SlackBuckets):
    """The PT queue: insertion order (``tasks``) plus the priority index (see the module docstring).

    Tasks need ``s`` (a ``RequestState``) and ``deadline``; the queue keeps their keys itself."""

    def __init__(self, ordering: bool, block_size: int):
        super().__init__()
        self.ordering, self.block_size = ordering, block_size
        self.keys: list[tuple] = []  # priority order
        self.by_rem: list[tuple] = []  # (remaining prompt tokens, key), ordering only
        self.task_of: dict[tuple, object] = {}  # key -> task
        self._key: dict[int, tuple] = {}
        self._rem: dict[int, int] = {}  # remaining prompt tokens and m when last keyed
        self._m: dict[int, int] = {}
        self.partial = 0  # members whose cached tokens end inside a block (m % block_size != 0)
        self.started = 0  # members with m > 0

    def _make_key(self, t, bucket: int) -> tuple:
        s = t.s
        if not self.ordering:
            return (s.req.arrival_s, s.id)
        return (bucket, -(s.m // KV_BUCKET), -(s.input_tokens // LEN_BUCKET), -s.input_tokens, s.req.arrival_s, s.id)

    def _index(self, t, bucket: int) -> None:
        s = t.s
        key = self._make_key(t, bucket)
        self._key[s.id] = key
        self.task_of[key] = t
        insort(self.keys, key)
        if self.ordering:
            insort(self.by_rem, (s.remaining_prefill, key))
        self.partial += s.m % self.block_size != 0
        self.started += s.m > 0

    def _unindex(self, t) -> None:
        s = t.s
        key = self._key.pop(s.id)
        del self.task_of[key]
        del self.keys[bisect_left(self.keys, key)]
        if self.ordering:
            i = bisect_left(self.by_rem, (self._rem[s.id], key))
            del self.by_rem[i]
        self.partial -= self._m[s.id] % self.block_size != 0
        self.started -= self._m[s.id] > 0

    def add(self, t, now: float) -> None:
        """Append ``t`` (keyed by its current ``m``, length and slack bucket at ``now``)."""
        self.tasks[t.s.id] = t
        if self.ordering:
            bucket = self._enter(t, now)
        else:
            bucket = self._bucket[t.s.id] = 0
        self._snapshot(t)
        self._index(t, bucket)

    def remove(self, t) -> None:
        rid = t.s.id
        del self.tasks[rid]
        self._unindex(t)
        del self._bucket[rid], self._rem[rid], self._m[rid]

    def rekey(self, t) -> None:
        """``t``'s ``m`` or length changed (its batch was applied)."""
        self._moved(t, self._bucket[t.s.id])

    def _moved(self, t, new: int) -> None:
        self._unindex(t)
        self._snapshot(t)
        self._index(t, new)

    def _snapshot(self, t) -> None:
        # the fields a key and the counters were made from, to find the entries again after they change
        self._rem[t.s.id], self._m[t.s.id] = t.s.remaining_prefill, t.s.m

    def refresh(self, now: float) -> None:
        if self.ordering:
            super().refresh(now)

    def closest_fit(self, budget: int, head_key: tuple, skip, dead: "DeadEntries | None" = None,
                    pass_over=None) -> object | None:
        """Among members at or after ``head_key`` in priority order and not ``skip(task)``: one with
        the largest remaining prompt ``≤ budget``, the first in priority order among equals.

        ``dead`` (optional, one per walk over the queue): entries found not to qualify are remembered
        and jumped over by the later calls of the same walk. Valid while, within the walk, ``head_key``
        only grows, ``skip`` stays true once true and the queue does not change (a PT walk: the head
        advances, the tasks looked at join ``skip``); then each entry is read at most twice per walk
        instead of once per call (a walk that passes over thousands of PTs calls this for each).

        ``pass_over(task)`` (optional): the caller would pass over an unstarted answer (``m == 0``) and
        ask again, the task then counting as ``skip``; such answers are handed to ``pass_over`` here and
        the search goes on, so one call returns what the last of those calls would."""
        by_rem, task_of = self.by_rem, self.task_of
        dead = dead if dead is not None else DeadEntries()

        def qualifies(j: int) -> bool:
            key = by_rem[j][1]
            if key >= head_key and not skip(task_of[key]):
                return True
            dead.kill(j)
            return False

        i = dead.left(bisect_right(by_rem, (budget, (float("inf"),))) - 1)
        while True:
            while i >= 0 and not qualifies(i):
                i = dead.left(i - 1)
            if i < 0:
                return None
            j = dead.right(bisect_left(by_rem, (by_rem[i][0],)))
            while not qualifies(j):  # ends at i at the latest
                j = dead.right(j + 1)
            t = task_of[by_rem[j][1]]
            if pass_over is None or t.s.m > 0:
                return t
            pass_over(t)
            dead.kill(j)
            i = dead.left(i)


class DeadEntries:
    """Indexes known not to qualify, with jumps to the nearest live index on either side (path-halving
    union-find in each direction; sparse: only dead indexes have entries)."""

    def __init__(self) -> None:
        self._left: dict[int, int] = {}
        self._right: dict[int, int] = {}

    def kill(self, j: int) -> None:
        self._left[j], self._right[j] = j - 1, j + 1

    @staticmethod
    def _find(jump: dict[int, int], j: int) -> int:
        while j in jump:
            nxt = jump[j]
            if nxt in jump:
                jump[j] = jump[nxt]
            j = nxt
        return j

    def left(self, j: int) -> int:
        """The largest live index ``≤ j`` (−1 or below: none)."""
        return self._find(self._left, j)

    def right(self, j: int) -> int:
        """The smallest live index ``≥ j``."""
        return self._find(self._right, j)


class GTQueue(_SlackBuckets):
    """The GT queue: insertion order (``tasks``, the deadlock breaking's victims, most recent first), FCFS
    order (``fcfs``: (arrival, id), sorted) and, when ``indexed`` (EcoServe's ordering or pipelining), the
    admission order (``keys``) and the hosting pool's order (``pool``), as in the module docstring. Tasks need
    ``s``, ``deadline`` and ``gen_alloc`` (the allocation for the remaining generation)."""

    def __init__(self, indexed: bool):
        super().__init__()
        self.indexed = indexed
        self.fcfs: list[tuple[float, int]] = []
        self.keys: list[tuple] = []  # admission order; a key's last field is the id
        self.pool: list[tuple[int, int, int]] = []  # (allocation, bucket, −id)
        self._keys: dict[int, tuple[tuple, tuple]] = {}  # rid -> (admission key, pool key)

    def __getitem__(self, rid: int):
        return self.tasks[rid]

    def values(self):
        return self.tasks.values()

    def _index(self, t, bucket: int) -> None:
        s = t.s
        key = (bucket, -((s.m - s.cpu_tokens) // KV_BUCKET), -(t.gen_alloc // LEN_BUCKET), -t.gen_alloc,
               s.req.arrival_s, s.id)
        pool_key = (t.gen_alloc, bucket, -s.id)
        self._keys[s.id] = key, pool_key
        insort(self.keys, key)
        insort(self.pool, pool_key)

    def _unindex(self, rid: int) -> None:
        key, pool_key = self._keys.pop(rid)
        del self.keys[bisect_left(self.keys, key)]
        del self.pool[bisect_left(self.pool, pool_key)]

    def add(self, t, now: float) -> None:
        """Append ``t`` (at the end of the insertion order; keyed by its current GPU KV, allocation and slack
        bucket at ``now``)."""
        rid = t.s.id
        if rid in self.tasks:
            self.remove(t)
        self.tasks[rid] = t
        insort(self.fcfs, (t.s.req.arrival_s, rid))
        if self.indexed:
            self._index(t, self._enter(t, now))

    def remove(self, t) -> None:
        rid = t.s.id
        del self.tasks[rid]
        del self.fcfs[bisect_left(self.fcfs, (t.s.req.arrival_s, rid))]
        if self.indexed:
            self._unindex(rid)
            del self._bucket[rid]

    def rekey(self, t) -> None:
        """``t``'s GPU-resident KV changed (a swap-out was applied)."""
        if self.indexed:
            self._moved(t, self._bucket[t.s.id])

    def _moved(self, t, new: int) -> None:
        self._unindex(t.s.id)
        self._index(t, new)

    def refresh(self, now: float) -> None:
        if self.indexed:
            super().refresh(now)

    def by_priority(self):
        """Members in admission order (``indexed``; ``refresh`` first)."""
        tasks = self.tasks
        return [tasks[key[-1]] for key in self.keys]

    def by_allocation(self):
        """Members in the hosting pool's order (``indexed``; ``refresh`` first)."""
        tasks = self.tasks
        return [tasks[-key[2]] for key in self.pool]

    def in_fcfs_order(self):
        tasks = self.tasks
        return [tasks[rid] for _, rid in self.fcfs]
