"""Sweep specifications: a base configuration and axes, read from TOML.

A spec file::

    name = "fig5_6"                    # optional; default: the file's stem
    description = "..."                # optional
    kind = "simulate"                  # the point kind (see ``points.POINT_KINDS``)

    [base]                             # fields shared by every point
    B = 1024
    cost_model = "linear"

    [axes]                             # the grid: the Cartesian product of these lists,
    scheduler = ["vllm", "sarathi"]    # first axis varying slowest
    I = [1, 2, 4]

    [[plot]]                           # optional figures drawn after the sweep (see ``infermax.plot``)
    kind = "lines"
    metrics = ["tps"]
    x = "I"
    file = "tps.png"

Every key of ``base`` and ``axes`` must be a field of the kind's configuration (``RunConfig`` for
``simulate``) with a value of that field's type; anything else is an error naming the key. TOML has
no null: write ``"none"`` for an optional field's default (e.g. ``Rmax = [32, 64, "none"]``).
"""

from __future__ import annotations

import itertools
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from ..jsonio import read_utf8
from .points import get_kind


TOP_LEVEL_KEYS = ("name", "description", "kind", "base", "axes", "plot")


class SpecError(ValueError):
    """A sweep spec is malformed; the message names the file and the offending key."""


@dataclass(frozen=True)
class SweepSpec:
    """A parsed, validated sweep: ``points()`` lists the full configuration of every point."""

    name: str
    kind: str
    base: dict
    axes: dict[str, list]
    description: str = ""
    plots: list[dict] = field(default_factory=list)
    source: Path | None = None

    def points(self) -> list[dict]:
        """Every point's full configuration (base, overridden by the axes), in grid order."""
        names = list(self.axes)
        defaults = get_kind(self.kind).defaults()
        out = []
        for values in itertools.product(*(self.axes[n] for n in names)):
            out.append({**defaults, **self.base, **dict(zip(names, values))})
        return out

    def default_out_dir(self) -> Path:
        """``results/<name>`` next to the spec file (or in the current directory)."""
        parent = self.source.parent if self.source is not None else Path(".")
        return parent / "results" / self.name


def load_spec(path: str | Path) -> SweepSpec:
    """Read and validate a TOML spec file."""
    path = Path(path)
    if not path.is_file():
        raise SpecError(f"{path}: no such spec file")
    try:
        text = read_utf8(path)
    except ValueError as exc:  # (not UTF-8 text)
        raise SpecError(str(exc)) from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{path}: not valid TOML ({exc})") from exc
    return parse_spec(doc, source=path)


def parse_spec(doc: dict, source: str | Path | None = None) -> SweepSpec:
    """Validate a spec given as a mapping (the parsed TOML)."""
    where = str(source) if source is not None else "spec"

    def bad(message: str) -> SpecError:
        return SpecError(f"{where}: {message}")

    unknown = sorted(set(doc) - set(TOP_LEVEL_KEYS))
    if unknown:
        raise bad(f"unknown top-level key(s) {', '.join(unknown)}; known: {', '.join(TOP_LEVEL_KEYS)}")
    kind_name = doc.get("kind", "simulate")
    try:
        kind = get_kind(kind_name)
    except ValueError as exc:
        raise bad(str(exc)) from None
    base, axes = doc.get("base", {}), doc.get("axes", {})
    for section, value in (("base", base), ("axes", axes)):
        if not isinstance(value, dict):
            raise bad(f"'{section}' must be a table ([{section}])")
    known = kind.field_types()
    for section, keys in (("base", base), ("axes", axes)):
        unknown = sorted(set(keys) - set(known))
        if unknown:
            raise bad(f"unknown {kind_name} field(s) in [{section}]: {', '.join(unknown)}; known: {', '.join(known)}")
    both = sorted(set(base) & set(axes))
    if both:
        raise bad(f"field(s) {', '.join(both)} appear in both [base] and [axes]; give each in one place")
    base = {key: _typed(bad, f"base.{key}", value, known[key]) for key, value in base.items()}
    for key, values in axes.items():
        if not isinstance(values, list) or not values:
            raise bad(f"axes.{key} must be a non-empty list of values, got {values!r}")
    axes = {key: [_typed(bad, f"axes.{key}", v, known[key]) for v in values] for key, values in axes.items()}
    for key, values in axes.items():
        if len(set(map(repr, values))) != len(values):
            raise bad(f"axes.{key} lists a value twice: {values!r}")
    plots = doc.get("plot", [])
    if not isinstance(plots, list) or not all(isinstance(p, dict) for p in plots):
        raise bad("'plot' must be an array of tables ([[plot]])")
    from ..plot import check_figure_file, check_options

    for i, options in enumerate(plots):
        try:
            check_options(options, complete=False)
            check_figure_file(options.get("file"))
            check_options(options)
        except ValueError as exc:
            raise bad(f"plot {i}: {exc}") from None
    name = doc.get("name", Path(source).stem if source is not None else "sweep")
    if not isinstance(name, str) or not name or "/" in name:
        raise bad(f"'name' must be a non-empty string without '/', got {name!r}")
    spec = SweepSpec(name=name, kind=kind_name, base=dict(base), axes={k: list(v) for k, v in axes.items()},
                     description=str(doc.get("description", "")), plots=[dict(p) for p in plots],
                     source=Path(source) if source is not None else None)
    for i, config in enumerate(spec.points()):
        try:
            kind.check(config)
        except ValueError as exc:
            raise bad(f"point {i} ({_describe(spec, config)}): {exc}") from None
    return spec


def _describe(spec: SweepSpec, config: dict) -> str:
    return ", ".join(f"{k}={config[k]!r}" for k in spec.axes) or "the base configuration"


def _typed(bad, key: str, value: Any, types: tuple[type, ...]) -> Any:
    """``value`` checked against a field's types; ``"none"`` stands for None where None is allowed."""
    if type(None) in types and (value is None or value == "none"):
        return None
    ok = any(isinstance(value, t) and not (isinstance(value, bool) and t is not bool) for t in types)
    if float in types and isinstance(value, int) and not isinstance(value, bool):
        ok = True
    if not ok:
        names = " or ".join(t.__name__ for t in types if t is not type(None))
        raise bad(f"{key} must be {names}, got {value!r}")
    if isinstance(value, int) and not isinstance(value, bool) and not -2**63 <= value < 2**63:
        # (the results table stores integers in 64 bits: pyarrow's OverflowError, found by a fuzz of specs)
        raise bad(f"{key} = {value} is outside the 64-bit integer range of a results table")
    return float(value) if float in types and int not in types else value
