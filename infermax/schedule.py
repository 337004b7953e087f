"""The one Schedule format: produced by schedulers and the solver, consumed by the replayer.

On disk (JSON)::

    {"format": "infermax.schedule/1",
     "limits": {"C": 4096, "P": 512, "M": 100000, "Rmax": null, "block_size": 1},
     "requests": [[id, arrival_s, prompt_tokens, output_tokens], ...],
     "batches": [{"items": [[id, c], ...], "evict": [id, ...], "not_before_s": 1.5}, ...],
     "meta": {"scheduler": "vllm", ...}}

``evict`` (recompute evictions applied before the batch) and ``not_before_s`` (the
batch waited for an arrival while the engine was idle) are omitted when empty.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from .jsonio import read_json
from .limits import Limits
from .request import Request

FORMAT = "infermax.schedule/1"


@dataclass
class ScheduledBatch:
    """One batch: ``(request id, tokens processed)`` pairs plus evictions applied before it."""

    items: list[tuple[int, int]] = field(default_factory=list)
    evict: list[int] = field(default_factory=list)
    not_before_s: float | None = None

    def to_json(self) -> dict:
        out: dict = {"items": [[rid, c] for rid, c in self.items]}
        if self.evict:
            out["evict"] = list(self.evict)
        if self.not_before_s is not None:
            out["not_before_s"] = self.not_before_s
        return out


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
            "requests": [[r.id, r.arrival_s, r.prompt_tokens, r.output_tokens] for r in self.requests],
            "batches": [b.to_json() for b in self.batches],
            "meta": self.meta,
        }

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.to_json(), separators=(",", ":")))
        return path

    @classmethod
    def from_json(cls, data: dict, source: str = "schedule") -> "Schedule":
        if data.get("format") != FORMAT:
            raise ValueError(f"{source}: not an InferMax schedule (format {data.get('format')!r}, expected {FORMAT!r})")
        try:
            limits = Limits(**data["limits"])
            requests = [Request(int(i), float(t), int(p), int(o)) for i, t, p, o in data["requests"]]
            batches = [
                ScheduledBatch(
                    items=[(int(rid), int(c)) for rid, c in b["items"]],
                    evict=[int(rid) for rid in b.get("evict", [])],
                    not_before_s=b.get("not_before_s"),
                )
                for b in data["batches"]
            ]
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{source}: malformed schedule: {exc}") from exc
        return cls(requests, limits, batches, dict(data.get("meta", {})))

    @classmethod
    def load(cls, path: str | Path) -> "Schedule":
        return cls.from_json(read_json(path), source=str(path))
