"""Print the held-out error tables of every bundled profile as Markdown (the tables in profiles/README.md).

Usage: ``python benchmarks/costmodel_errors.py`` (reads ``profiles/<gpu>/<model>/tp<N>/profile.json``,
written by ``python -m infermax.costmodel.profile_import`` / ``infermax fit``).
"""

from __future__ import annotations

import json

from infermax.costmodel import available_combinations, profile_folder
from infermax.costmodel.fitting import TOKEN_RANGES

RANGES = ["all"] + [f"{lo}-{hi}" for lo, hi in TOKEN_RANGES]


def cell(table: dict, key: str) -> str:
    value = table.get(key, {}).get("mape_pct")
    return "–" if value is None else f"{value:.1f}%"


def main() -> None:
    by_group: dict[str, list[str]] = {}
    for gpu, model, tp in available_combinations():
        doc = json.loads((profile_folder(gpu, model, tp) / "profile.json").read_text())
        for group, families in doc["heldout_error"].items():
            for family, table in families.items():
                by_group.setdefault(group, []).append(
                    f"| {gpu} | {model} | {tp} | {family} | " + " | ".join(cell(table, r) for r in RANGES) + " |")
    for group, rows in by_group.items():
        print(f"\n### {group}\n")
        print("| gpu | model | tp | family | " + " | ".join(RANGES) + " |")
        print("|---" * (4 + len(RANGES)) + "|")
        print("\n".join(rows))


if __name__ == "__main__":
    main()
