"""The one Schedule format: produced by schedulers and the solver, consumed by the replayer.

On disk (JSON)::

    {"format": "infermax.schedule/1",
     "limits": {"C": 4096, "P": 512, "M": 100000, "Rmax": null, "block_size": 1},
     "requests": [[id, arrival_s, prompt_tokens, output_tokens], ...],
     "batches": [{"items": [[id, c], ...], "evict": [id, ...], "swap_out": [[id, n], ...],
                  "swap_in": [[id, n], ...], "hidden": [id, ...], "not_before_s": 1.5}, ...],
     "meta": {"scheduler": "vllm", ...}}

``evict`` (recompute evictions applied before the batch), ``cache_hits`` (``[id, n]``: a request holding
no KV starts on ``n`` tokens of cached prefix; prefix caching), ``swap_out``/``swap_in`` (``n`` of the
request's cached tokens copied to / back from host memory before the batch), ``hidden`` (the items
processed with their cache in hidden form, Apt-Serve's hybrid cache) and ``not_before_s`` (the batch
waited for an arrival while the engine was idle) are omitted when empty. A request is written
``[id, arrival_s, prompt_tokens, output_tokens]``, with ``ttft_slo_s, tbt_slo_s`` appended (either
may be null) when it has only those targets, and as an object keyed by the `Request` field names
when it has any other optional field (TPOT target, class, predicted output length, closed-loop
group).
Files without these optional parts are read as before.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path

from .jsonio import plain_number, read_json
from .limits import Limits
from .request import Request

FORMAT = "infermax.schedule/1"


@dataclass
class ScheduledBatch:
    """One batch: ``(request id, tokens processed)`` pairs plus evictions and swaps applied before it.

    ``swap_out`` / ``swap_in``: ``(request id, tokens)`` moved from GPU to host memory / back.
    ``hidden``: ids of the items whose cache is in hidden form (half the memory; K/V recomputed).
    ``cache_hits``: ``(request id, tokens)``: the request, holding no KV, starts on that many tokens of
    cached prefix (`infermax.prefix_cache`) before its item is processed.
    """

    items: list[tuple[int, int]] = field(default_factory=list)
    evict: list[int] = field(default_factory=list)
    not_before_s: float | None = None
    hidden: frozenset[int] = frozenset()
    swap_out: list[tuple[int, int]] = field(default_factory=list)
    swap_in: list[tuple[int, int]] = field(default_factory=list)
    cache_hits: list[tuple[int, int]] = field(default_factory=list)

    def to_json(self) -> dict:
        out: dict = {"items": [[rid, c] for rid, c in self.items]}
        if self.evict:
            out["evict"] = list(self.evict)
        for name in ("swap_out", "swap_in", "cache_hits"):
            if getattr(self, name):
                out[name] = [[rid, n] for rid, n in getattr(self, name)]
        if self.hidden:
            out["hidden"] = sorted(self.hidden)
        if self.not_before_s is not None:
            out["not_before_s"] = self.not_before_s
        return out


def batch_shape_problem(batch: object) -> str | None:
    """What is wrong with the shape of a batch a scheduler returned, or None: a `ScheduledBatch` whose items, swaps
    and cache hits are (request id, tokens) pairs and whose evictions and hidden items are collections of ids. (The
    engine asks only after a batch failed to apply with a TypeError or ValueError: a custom scheduler's list of
    triples had ended in "too many values to unpack".)"""
    if not isinstance(batch, ScheduledBatch):
        return f"next_batch must return a ScheduledBatch, got {type(batch).__name__} {batch!r:.60}"
    for name in ("items", "swap_out", "swap_in", "cache_hits"):
        pairs = getattr(batch, name)
        if not isinstance(pairs, (list, tuple)):
            return f"its {name} must be a list of (request id, tokens) pairs, got {type(pairs).__name__} {pairs!r:.60}"
        bad = next((p for p in pairs if not isinstance(p, (list, tuple)) or len(p) != 2), None)
        if bad is not None:
            return f"its {name} must be (request id, tokens) pairs, got {bad!r:.60}"
    for name in ("evict", "hidden"):
        ids = getattr(batch, name)
        if not isinstance(ids, (list, tuple, set, frozenset)):
            return f"its {name} must be a collection of request ids, got {type(ids).__name__} {ids!r:.60}"
    return None


@dataclass
class Schedule:
    """An ordered list of batches for a set of requests under given limits."""

    requests: list[Request]
    limits: Limits
    batches: list[ScheduledBatch] = field(default_factory=list)
    meta: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "format": FORMAT,
            "limits": self.limits.to_dict(),
            "requests": [_request_json(r) for r in self.requests],
            "batches": [b.to_json() for b in self.batches],
            "meta": self.meta,
        }

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.to_json(), separators=(",", ":"), default=plain_number))
        return path

    @classmethod
    def from_json(cls, data: dict, source: str = "schedule") -> "Schedule":
        fmt = data.get("format") if isinstance(data, dict) else None
        if fmt != FORMAT:
            raise ValueError(f"{source}: not an InferMax schedule (format {fmt!r}, expected {FORMAT!r})")
        try:
            limits = Limits(**data["limits"])
            requests = [_request_from_json(row) for row in data["requests"]]
            batches = [_batch_from_json(b, j) for j, b in enumerate(data["batches"])]
            meta = data.get("meta", {})
            if not isinstance(meta, dict):
                raise TypeError(f"meta must be an object, got {type(meta).__name__}")
            if "swap_cost" in meta:  # the replayer times swaps with it (`replay.recorded_swap_cost`)
                from .costmodel.swap import SwapCost

                try:
                    SwapCost.from_dict(meta["swap_cost"])
                except ValueError as exc:
                    raise ValueError(f"meta.swap_cost: {exc}") from None
            seen: set[int] = set()
            for r in requests:
                if r.id in seen:
                    raise ValueError(f"duplicate request id {r.id}")
                seen.add(r.id)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{source}: malformed schedule: {exc}") from exc
        return cls(requests, limits, batches, dict(meta))

    @classmethod
    def load(cls, path: str | Path) -> "Schedule":
        return cls.from_json(read_json(path), source=str(path))


_OBJECT_ONLY = ("tpot_slo_s", "request_class", "predicted_output_tokens", "closed_loop_group", "content", "priority")


def _request_json(r: Request) -> list | dict:
    if any(getattr(r, name) is not None for name in _OBJECT_ONLY):
        out = {f.name: getattr(r, f.name) for f in fields(Request) if getattr(r, f.name) is not None}
        if r.content is not None:
            out["content"] = [list(pair) for pair in r.content]
        return out
    row = [r.id, r.arrival_s, r.prompt_tokens, r.output_tokens]
    return row + [r.ttft_slo_s, r.tbt_slo_s] if r.has_slo else row


_INTEGER_FIELDS = ("id", "prompt_tokens", "output_tokens", "predicted_output_tokens")  # (integral floats read as ints)


def _whole(value, what: str) -> int:
    """A JSON integer: an int, or a float without a fraction (another tool may write 4.0); a bool, a string or 1.5
    is refused rather than read as 1, 7 or 1 (``int()`` would)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or (isinstance(value, float) and not value.is_integer()):
        raise ValueError(f"{what} must be an integer, got {value!r}")
    return int(value)


def _batch_from_json(b: dict, j: int) -> ScheduledBatch:
    if not isinstance(b, dict):
        raise ValueError(f"batch {j} must be an object, got {b!r}")
    return ScheduledBatch(
        items=_pairs(b, "items", j),
        evict=[_whole(rid, f"batch {j} evict") for rid in b.get("evict", [])],
        not_before_s=b.get("not_before_s"),
        hidden=frozenset(_whole(rid, f"batch {j} hidden") for rid in b.get("hidden", [])),
        swap_out=_pairs(b, "swap_out", j),
        swap_in=_pairs(b, "swap_in", j),
        cache_hits=_pairs(b, "cache_hits", j),
    )


def _pairs(batch: dict, key: str, j: int) -> list[tuple[int, int]]:
    """A batch's [request id, tokens] pairs under ``key`` (absent: none)."""
    pairs = []
    for pair in batch.get(key, []) if key != "items" else batch["items"]:
        if type(pair) is list and len(pair) == 2 and type(pair[0]) is int and type(pair[1]) is int:
            pairs.append((pair[0], pair[1]))  # (what json.loads gives for a well-formed entry: no call per value)
            continue
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise ValueError(f"batch {j} {key}: each entry is [request id, tokens], got {pair!r}")
        pairs.append((_whole(pair[0], f"batch {j} {key} request id"), _whole(pair[1], f"batch {j} {key} tokens")))
    return pairs


def _request_from_json(row: list | dict) -> Request:
    if isinstance(row, dict):
        whole = {k: _whole(row[k], f"request {row.get('id')} {k}") for k in _INTEGER_FIELDS if row.get(k) is not None}
        return Request(**{**row, **whole})
    if not isinstance(row, (list, tuple)) or len(row) not in (4, 6):
        raise ValueError(f"a request is [id, arrival_s, prompt_tokens, output_tokens(, ttft_slo_s, tbt_slo_s)], got {row!r}")
    slo = [None if v is None else float(v) for v in row[4:]]
    return Request(_whole(row[0], "request id"), float(row[1]), _whole(row[2], f"request {row[0]} prompt_tokens"),
                   _whole(row[3], f"request {row[0]} output_tokens"), *slo)
