"""Workloads: request lengths and arrival times.

- :func:`fixed` — the paper's ``(I, O, B)`` grid point: ``B`` identical requests arriving at once.
- :func:`heterogeneous_mix` — appendix A.3's mixes of SISO/SILO/LISO/LILO request groups.
- :func:`sampled` — lengths drawn from parametric distributions (:func:`parse_length_dist` specs).
- :func:`load_trace` — real request traces, e.g. the bundled Azure LLM inference traces 2023, or
  length-only traces (``num_prefill_tokens,num_decode_tokens``) that take an arrival process.
- :func:`dataset_like` — ShareGPT-, HumanEval- and LongBench-like lengths (Apt-Serve's evaluation),
  with :data:`DATASET_SLOS` (the paper's Table 3) and :func:`with_slo` to attach latency targets.
- :func:`with_arrivals` — an arrival process (offline, Poisson, Gamma, trace replay) applied to
  any list of requests.

Every generator returns requests with ids ``0..n-1`` and is deterministic given ``seed``.
"""

from __future__ import annotations

import csv
import math
import os
from dataclasses import dataclass, replace
from numbers import Integral, Real
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:  # numpy only where lengths or arrivals are drawn: a fixed, offline or trace workload needs none
    import numpy as np

from infermax.jsonio import not_utf8_message
from infermax.request import Request

TRACE_DIR = Path(__file__).parent / "data" / "traces"
BUNDLED_TRACES = {"azure-code": "azure_code.csv", "azure-conv": "azure_conv.csv"}
TRACE_COLUMNS = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")
LENGTH_COLUMNS = TRACE_COLUMNS[1:]
MIX_GROUPS = ("SISO", "SILO", "LISO", "LILO")
ARRIVAL_PROCESSES = ("offline", "poisson", "gamma", "trace")


def _check_int(name: str, value: object, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _check_positive(name: str, value: object) -> float:
    if value is None or isinstance(value, bool) or not isinstance(value, Real) \
            or not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)


# Peak resident memory a simulated request costs: its Request objects, the engine's state and the result tables
# and Schedule. Measured with `simulate` on fixed workloads (peak RSS, 1,000 vs 100,000 / 200,000 requests,
# O = 1..512): 1.1-1.4 KB per request, nearly independent of O; rounded up.
BYTES_PER_REQUEST = 1500
# And each simulated batch (the Schedule keeps it, the result table has its row): `simulate --I 1 --O 400000 --B 1`
# peaks 295 MB above `--O 1` (754 bytes per batch; 2026-11-28), rounded up.
BYTES_PER_BATCH = 800


def physical_memory_bytes() -> int | None:
    """This machine's physical memory (``os.sysconf``), or None where the platform does not say."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def check_fits_in_memory(num_requests: int, name: str = "num_requests", batches: int = 0) -> None:
    """Refuse a workload whose simulation cannot fit in physical memory, before allocating anything.

    The estimate is ``num_requests × BYTES_PER_REQUEST + batches × BYTES_PER_BATCH`` (``batches``: a lower bound on
    the run's batch count, such as the longest output: each token of a request comes from a batch of its own); a
    workload over the machine's physical memory would only swap, grow and be killed, so it is an input error, not a
    run. ``name``: how the message names the count ("" for none).
    """
    total = physical_memory_bytes()
    need = num_requests * BYTES_PER_REQUEST + batches * BYTES_PER_BATCH
    if total is not None and need > total:
        per_batch = (f" and at least {batches:,} batches (~{BYTES_PER_BATCH:,} bytes each: the Schedule and the batch "
                     f"table keep every one)") if batches else ""
        subject = f"{name} = {num_requests:,} requests" if name else f"{num_requests:,} requests"
        raise ValueError(f"{subject}{per_batch} need about {need / 2**30:,.0f} GiB to "
                         f"simulate (~{BYTES_PER_REQUEST:,} bytes per request for the requests, the engine state and "
                         f"the result tables); this machine has {total / 2**30:,.1f} GiB of physical memory")


def _check_count(value: object, name: str = "num_requests") -> int:
    n = _check_int(name, value)
    check_fits_in_memory(n, name)
    return n


def fixed(prompt_tokens: int, output_tokens: int, num_requests: int) -> list[Request]:
    """``num_requests`` requests of ``prompt_tokens`` in and ``output_tokens`` out, all arriving at 0."""
    prompt_tokens = _check_int("prompt_tokens", prompt_tokens)
    output_tokens = _check_int("output_tokens", output_tokens)
    n = _check_count(num_requests)
    return [Request(i, 0.0, prompt_tokens, output_tokens) for i in range(n)]


def heterogeneous_mix(groups: Sequence[str] | str, num_requests: int, seed: int = 0,
                      short: Sequence[int] = (8, 16), long: Sequence[int] = (512, 1024)) -> list[Request]:
    """Appendix A.3 mix: requests split evenly over ``groups``, shuffled, all arriving at 0.

    A group is ``SISO``, ``SILO``, ``LISO`` or ``LILO`` (short/long input, short/long output);
    a string such as ``"LILO+SILO"`` is split on ``+``. Earlier groups get the remainder of the
    split. Each length is drawn uniformly from the ``short`` or ``long`` set of values.
    """
    names = [g.strip().upper() for g in (groups.split("+") if isinstance(groups, str) else groups)]
    if not names:
        raise ValueError(f"groups must name at least one of {', '.join(MIX_GROUPS)}")
    unknown = [g for g in names if g not in MIX_GROUPS]
    if unknown:
        raise ValueError(f"unknown mix group(s) {unknown}; valid groups: {', '.join(MIX_GROUPS)}")
    n = _check_count(num_requests)
    if n < len(names):  # (a group named but given no request would be absent from the workload without a word)
        raise ValueError(f"{n} request(s) for the {len(names)} groups of mix {'+'.join(names)}: every group needs at "
                         f"least one (B >= {len(names)})")
    sets = {"S": short, "L": long}
    for label, values in (("short", short), ("long", long)):
        if len(values) == 0:
            raise ValueError(f"{label} must list at least one length")
        for v in values:
            _check_int(f"{label} length", v)
    import numpy as np

    rng = np.random.default_rng(seed)
    base, extra = divmod(n, len(names))
    lengths: list[tuple[int, int]] = []
    for k, group in enumerate(names):
        count = base + (k < extra)
        prompts, outputs = rng.choice(sets[group[0]], count), rng.choice(sets[group[2]], count)
        lengths += zip(prompts.tolist(), outputs.tolist())
    order = rng.permutation(n)
    return [Request(i, 0.0, *lengths[j]) for i, j in enumerate(order)]


_DIST_FORMS = {  # kind -> (parameter names, accepts an optional :MAX)
    "const": (("N",), False),
    "uniform": (("LO", "HI"), False),
    "lognormal": (("MEDIAN", "SIGMA"), True),
    "exponential": (("MEAN",), True),
    "normal": (("MEAN", "STD"), True),
}
_DIST_HELP = ", ".join(
    ":".join((kind, *params)) + ("[:MAX]" if has_max else "") for kind, (params, has_max) in _DIST_FORMS.items()
)


# The longest prompt or output a length distribution draws (and the largest parameter it takes): far above any
# model's context, and within the integers numpy draws and stores.
MAX_LENGTH_TOKENS = 2**31 - 1


@dataclass(frozen=True)
class LengthDist:
    """A token-length distribution; samples are rounded and clipped to ``[1, max_tokens]``."""

    kind: str
    params: tuple[float, ...]
    max_tokens: int | None = None

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` integer lengths drawn with ``rng``."""
        import numpy as np

        p = self.params
        if self.kind == "const":
            x = np.full(n, p[0])
        elif self.kind == "uniform":
            x = rng.integers(int(p[0]), int(p[1]) + 1, n)
        elif self.kind == "lognormal":
            x = rng.lognormal(math.log(p[0]), p[1], n)
        elif self.kind == "exponential":
            x = rng.exponential(p[0], n)
        else:
            x = rng.normal(p[0], p[1], n)
        # (a very wide lognormal draws inf: clipped like any other long sample, before the cast to integers)
        return np.clip(np.rint(x), 1, min(self.max_tokens or MAX_LENGTH_TOKENS, MAX_LENGTH_TOKENS)).astype(np.int64)


def parse_length_dist(spec: str) -> LengthDist:
    """Parse ``const:N``, ``uniform:LO:HI`` (inclusive), ``lognormal:MEDIAN:SIGMA[:MAX]``,
    ``exponential:MEAN[:MAX]`` or ``normal:MEAN:STD[:MAX]``."""

    def bad(reason: str) -> ValueError:
        return ValueError(f"bad length distribution {spec!r}: {reason}; expected one of {_DIST_HELP}")

    if not isinstance(spec, str):
        raise bad("not a string")
    kind, *args = spec.strip().lower().split(":")
    if kind not in _DIST_FORMS:
        raise bad(f"unknown kind {kind!r}")
    names, has_max = _DIST_FORMS[kind]
    if not len(names) <= len(args) <= len(names) + has_max:
        raise bad(f"wrong number of parameters for {kind}")
    try:
        values = [float(a) for a in args]
    except ValueError:
        raise bad("parameters must be numbers") from None
    if not all(math.isfinite(v) for v in values):
        raise bad("parameters must be finite")
    params, max_tokens = tuple(values[: len(names)]), None
    if len(values) > len(names):
        if not (values[-1].is_integer() and values[-1] >= 1):
            raise bad("MAX must be an integer >= 1")
        max_tokens = int(values[-1])
    if any(v > MAX_LENGTH_TOKENS for v in values):
        raise bad(f"lengths above {MAX_LENGTH_TOKENS:,} tokens are not supported")
    if kind in ("const", "uniform") and not all(v.is_integer() and v >= 1 for v in params):
        raise bad(f"{'/'.join(names)} must be integers >= 1")
    if kind == "uniform" and params[0] > params[1]:
        raise bad("LO must be <= HI")
    if kind in ("lognormal", "exponential") and params[0] <= 0:
        raise bad(f"{names[0]} must be > 0")
    if kind in ("lognormal", "normal") and params[1] < 0:
        raise bad(f"{names[1]} must be >= 0")
    return LengthDist(kind, params, max_tokens)


def sampled(num_requests: int, input_dist: str | LengthDist, output_dist: str | LengthDist,
            seed: int = 0) -> list[Request]:
    """Requests whose prompt and output lengths are drawn independently, all arriving at 0."""
    n = _check_count(num_requests)
    dists = [d if isinstance(d, LengthDist) else parse_length_dist(d) for d in (input_dist, output_dist)]
    import numpy as np

    rng = np.random.default_rng(seed)
    prompts, outputs = (d.sample(rng, n).tolist() for d in dists)
    return [Request(i, 0.0, p, o) for i, (p, o) in enumerate(zip(prompts, outputs))]


class TraceFormatError(ValueError):
    """A trace file that cannot be read as requests; the message names the file and line."""


def trace_path(source: str | Path) -> Path:
    """Path of a trace file, or of the bundled trace named ``azure-code`` / ``azure-conv``."""
    if isinstance(source, str) and source.strip().lower() in BUNDLED_TRACES:
        return TRACE_DIR / BUNDLED_TRACES[source.strip().lower()]
    path = Path(source)
    if not path.is_file():
        raise FileNotFoundError(
            f"trace {str(source)!r} is neither a file nor a bundled trace ({', '.join(BUNDLED_TRACES)})"
        )
    return path


def load_trace(source: str | Path, limit: int | None = None) -> list[Request]:
    """Requests from a CSV trace with columns ``num_prefill_tokens``, ``num_decode_tokens`` and optionally
    ``arrived_at`` (s); see :func:`read_trace`. A length-only trace's requests all arrive at 0.0 s."""
    return read_trace(source, limit)[0]


def read_trace(source: str | Path, limit: int | None = None) -> tuple[list[Request], bool]:
    """``(requests, has_arrivals)`` from a CSV trace; ``has_arrivals``: the header has ``arrived_at``.

    Columns ``num_prefill_tokens`` and ``num_decode_tokens`` are required, ``arrived_at`` (seconds,
    ascending) is optional: many public length datasets, and Vidur's length traces, ship only the two
    token counts, so such a trace is a list of lengths (every request at 0.0 s) and the caller supplies
    the arrival process (``with_arrivals``). Extra columns are ignored (a row with more values than the header has
    columns is refused, as is a header naming a used column twice); ``limit`` keeps the first rows only. Arrival
    times are shifted so that the first request arrives at 0.0 s. Malformed input raises :class:`TraceFormatError`
    naming the file and the 1-based line.
    """
    if limit is not None:
        limit = _check_int("limit", limit)
    path = trace_path(source)
    try:  # utf-8-sig: a byte-order mark (spreadsheets write one) is not part of the first column's name
        with path.open(newline="", encoding="utf-8-sig") as f:
            return _read_rows(path, csv.reader(f), limit)
    except UnicodeDecodeError as exc:
        raise TraceFormatError(not_utf8_message(path, exc)) from None


def _read_rows(path: Path, reader, limit: int | None) -> tuple[list[Request], bool]:
    """`read_trace` on an open CSV reader."""
    header = [h.strip() for h in next(reader, [])]
    missing = [c for c in LENGTH_COLUMNS if c not in header]
    if missing:
        raise TraceFormatError(f"{path}, line 1: header lacks column(s) {', '.join(missing)}; expected "
                               f"{','.join(LENGTH_COLUMNS)} (and optionally arrived_at), found "
                               f"{','.join(header) or 'nothing'}")
    columns = TRACE_COLUMNS if "arrived_at" in header else LENGTH_COLUMNS
    twice = [c for c in columns if header.count(c) > 1]
    if twice:  # (which of the two to read is a guess)
        raise TraceFormatError(f"{path}, line 1: column {twice[0]} appears more than once in the header")
    index = [header.index(c) for c in columns]
    rows: list[tuple[float, int, int]] = []
    for row in reader:
        if limit is not None and len(rows) >= limit:
            break
        if not any(cell.strip() for cell in row):
            continue
        if any(cell.strip() for cell in row[len(header):]):  # e.g. "1,024" unquoted: every value after it shifts
            raise TraceFormatError(f"{path}, line {reader.line_num}: {len(row)} values for a header of {len(header)} "
                                   f"columns (a comma inside a value, such as a thousands separator, needs quotes)")
        rows.append(_parse_trace_row(path, reader.line_num, row, columns, index, rows[-1][0] if rows else None))
    if not rows:
        raise TraceFormatError(f"{path}: trace has no requests")
    start_s = rows[0][0]
    return [Request(i, t - start_s, p, o) for i, (t, p, o) in enumerate(rows)], columns == TRACE_COLUMNS


def _parse_trace_row(path: Path, line: int, row: list[str], columns: Sequence[str], index: list[int],
                     previous_s: float | None) -> tuple[float, int, int]:
    values = {"arrived_at": 0.0}
    for column, k in zip(columns, index):
        where = f"{path}, line {line}, column {column}"
        if k >= len(row) or not row[k].strip():
            raise TraceFormatError(f"{where}: missing value")
        try:
            value = float(row[k])
        except ValueError:
            raise TraceFormatError(f"{where}: not a number: {row[k]!r}") from None
        if not math.isfinite(value):
            raise TraceFormatError(f"{where}: not finite: {row[k]!r}")
        if column == "arrived_at":
            if value < 0:
                raise TraceFormatError(f"{where}: negative arrival time {value}")
            if previous_s is not None and value < previous_s:
                raise TraceFormatError(f"{where}: arrivals not sorted ascending ({value} after {previous_s})")
        elif not (value.is_integer() and value >= 1):
            raise TraceFormatError(f"{where}: token count must be an integer >= 1, got {row[k]!r}")
        elif value > MAX_LENGTH_TOKENS:  # (read through a float: beyond 2^53 it would not even be the number written)
            raise TraceFormatError(f"{where}: token counts above {MAX_LENGTH_TOKENS:,} are not supported, got {row[k]!r}")
        values[column] = value
    return values["arrived_at"], int(values["num_prefill_tokens"]), int(values["num_decode_tokens"])


def with_arrivals(requests: Sequence[Request], process: str = "offline", rate_per_s: float | None = None,
                  cv: float | None = None, time_scale: float = 1.0, seed: int = 0) -> list[Request]:
    """``requests`` (same ids and lengths) with arrival times from ``process``: copies, or the request itself where
    its arrival time does not change.

    - ``offline``: everything arrives at 0.
    - ``poisson``: exponential inter-arrival times with rate ``rate_per_s``.
    - ``gamma``: Gamma inter-arrival times with mean ``1/rate_per_s`` and coefficient of
      variation ``cv`` (``cv=1`` is Poisson; larger is burstier).
    - ``trace``: each request's own ``arrival_s`` times ``time_scale`` (0.5 replays twice as fast).

    Poisson and Gamma arrivals are assigned in list order, the first at 0. A parameter the
    process does not use (``rate_per_s``, ``cv``, ``time_scale != 1``) is an error, not ignored.
    """
    if process not in ARRIVAL_PROCESSES:
        raise ValueError(f"unknown arrival process {process!r}; valid: {', '.join(ARRIVAL_PROCESSES)}")
    uses = {"rate_per_s": process in ("poisson", "gamma"), "cv": process == "gamma"}
    for name, value in (("rate_per_s", rate_per_s), ("cv", cv)):
        if uses[name]:
            if value is None:
                raise ValueError(f"arrival process {process!r} needs {name}")
            _check_positive(name, value)
        elif value is not None:
            raise ValueError(f"{name} does not apply to arrival process {process!r}")
    _check_positive("time_scale", time_scale)
    if time_scale != 1.0 and process != "trace":
        raise ValueError(f"time_scale only applies to arrival process 'trace', not {process!r}")

    n = len(requests)
    if process == "offline":
        arrivals = [0.0] * n
    elif process == "trace":
        arrivals = [r.arrival_s * time_scale for r in requests]
    else:
        import numpy as np

        rng = np.random.default_rng(seed)
        if process == "poisson":
            gaps = rng.exponential(1.0 / rate_per_s, max(n - 1, 0))
        else:
            try:
                shape = 1.0 / cv**2
            except (OverflowError, ZeroDivisionError):  # cv² overflows or underflows to 0
                shape = math.nan
            if not (math.isfinite(shape) and math.isfinite(rate_per_s * shape) and rate_per_s * shape > 0):
                raise ValueError(f"cv = {cv!r} is too extreme for Gamma inter-arrival times (1/cv² = {shape!r}); "
                                 "use a cv between about 1e-100 and 1e100")
            gaps = rng.gamma(shape, 1.0 / (rate_per_s * shape), max(n - 1, 0))
        arrivals = np.concatenate([[0.0], np.cumsum(gaps)])[:n]
        if not np.isfinite(arrivals).all():
            raise ValueError(f"the {process} arrival times overflow (rate {rate_per_s!r} per second is too small)")
    # a request that already arrives then is kept as it is (requests are frozen): offline arrivals for a million fixed
    # requests took 9 s of `dataclasses.replace`
    return [r if r.arrival_s == t else replace(r, arrival_s=float(t)) for r, t in zip(requests, arrivals)]


@dataclass(frozen=True)
class DatasetProfile:
    """Length distributions of one of Apt-Serve's evaluation datasets (our approximation, see below)."""

    input_dist: str
    output_dist: str
    ttft_slo_s: float
    tbt_slo_s: float


# Apt-Serve (SIGMOD 2025) shows its datasets' lengths only as plots (Figure 7), so these are our
# approximations of what the paper says about them, not the data: ShareGPT high variance in both,
# the highest mean output (lognormal means ~161 in / ~338 out, the vLLM paper's ShareGPT means);
# HumanEval short prompts and solutions, low variance; LongBench long, highly varied prompts and long
# outputs. Every dataset keeps the authors' filter (prompt and output >= 4 tokens, prompt + output
# <= 2048, OPT's context) by rejection. SLOs: Table 3's OPT-13B-on-one-A100 column (TTFT, P99 TBT).
DATASETS: dict[str, DatasetProfile] = {
    "sharegpt": DatasetProfile("lognormal:98:1.0", "lognormal:205:1.0", 1.0, 1.0),
    "humaneval": DatasetProfile("lognormal:130:0.4", "lognormal:55:0.6", 0.5, 0.5),
    "longbench": DatasetProfile("lognormal:1200:0.5", "lognormal:200:0.8", 4.0, 1.0),
}
DATASET_MAX_TOKENS = 2048


def dataset_like(name: str, num_requests: int, seed: int = 0) -> list[Request]:
    """``num_requests`` requests with ``name``'s lengths (``DATASETS``), arriving at 0, deterministic in ``seed``.

    Pairs are drawn until ``num_requests`` pass the filter (prompt, output >= 4; sum <= 2048).
    """
    profile = DATASETS.get(str(name).lower())
    if profile is None:
        raise ValueError(f"unknown dataset {name!r}; known: {', '.join(DATASETS)}")
    n = _check_count(num_requests)
    dists = [parse_length_dist(d) for d in (profile.input_dist, profile.output_dist)]
    import numpy as np

    rng = np.random.default_rng(seed)
    prompts: list[int] = []
    outputs: list[int] = []
    while len(prompts) < n:
        ins, outs = (d.sample(rng, 2 * n) for d in dists)
        keep = (ins >= 4) & (outs >= 4) & (ins + outs <= DATASET_MAX_TOKENS)
        prompts += ins[keep].tolist()
        outputs += outs[keep].tolist()
    return [Request(i, 0.0, p, o) for i, (p, o) in enumerate(zip(prompts[:n], outputs[:n]))]


def with_slo(requests: Sequence[Request], ttft_slo_s: float | None, tbt_slo_s: float | None) -> list[Request]:
    """Copies of ``requests`` carrying the given TTFT and P99-TBT targets (None: no target)."""
    return [replace(r, ttft_slo_s=ttft_slo_s, tbt_slo_s=tbt_slo_s) for r in requests]
