"""Per-batch limits shared by the simulator, the validator and the solver."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from numbers import Integral


# Largest block size accepted: the replayer keeps a count per offset in a block (a list that long).
MAX_BLOCK_SIZE = 1 << 20


@dataclass(frozen=True)
class Limits:
    """The paper's batch limits.

    ``C``: tokens per batch; ``P``: prefill tokens per batch (``None``: the
    scheduler's default, see ``resolve_prefill_budget``); ``M``: KV-cache capacity
    in tokens; ``Rmax``: requests holding KV (``None``: unlimited); ``block_size``:
    KV allocation granularity (1 = the paper's token accounting, 16 = vLLM paging);
    ``prefix_caching``: automatic prefix caching (`infermax.prefix_cache`): full KV blocks are
    identified by their content, kept cached after their request frees them, and a request holding no
    KV may start on a cached prefix instead of computing it (a batch's ``cache_hits``).
    """

    C: int = 4096
    P: int | None = None
    M: int = 100_000
    Rmax: int | None = None
    block_size: int = 1
    prefix_caching: bool = False

    def __post_init__(self) -> None:
        _require_int(self, "C", 1)
        _require_int(self, "M", 1)
        _require_int(self, "block_size", 1)
        if self.block_size > MAX_BLOCK_SIZE:  # the replayer keeps a count per offset in a block
            raise ValueError(f"block_size = {self.block_size} is above {MAX_BLOCK_SIZE:,} tokens (servers use 1-256)")
        if self.P is not None:
            _require_int(self, "P", 1)
            if self.P > self.C:
                raise ValueError(f"P (prefill tokens per batch) = {self.P} must not exceed C = {self.C}")
        if self.Rmax is not None:
            _require_int(self, "Rmax", 1)
        flag = self.prefix_caching
        if not isinstance(flag, bool) and type(flag).__module__ == "numpy" and isinstance(flag.item(), bool):
            object.__setattr__(self, "prefix_caching", flag.item())  # np.True_ (a results table's value)
        elif not isinstance(flag, bool):
            raise ValueError(f"prefix_caching must be true or false, got {flag!r}")

    @property
    def prefill_budget(self) -> int:
        """Prefill tokens allowed per batch (``P``, or ``C`` when unset)."""
        return self.C if self.P is None else self.P

    def blocks(self, tokens: int) -> int:
        """KV tokens occupied by ``tokens`` cached tokens, rounded up to whole blocks."""
        b = self.block_size
        return tokens if b == 1 else -(-tokens // b) * b

    def to_dict(self) -> dict:
        """The fields as a dict; ``prefix_caching`` only when on (files written before it read the same)."""
        out = asdict(self)
        if not self.prefix_caching:
            del out["prefix_caching"]
        return out


def _require_int(limits: Limits, name: str, minimum: int) -> None:
    """Field ``name`` must be an integer >= ``minimum``; one from numpy or pandas (a results table's np.int64) is
    stored as a plain int (it was refused as "C must be an integer, got np.int64(512)")."""
    value = getattr(limits, name)
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if type(value) is not int:
        object.__setattr__(limits, name, int(value))
