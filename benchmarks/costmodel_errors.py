"""Print the held-out error tables of every bundled profile as Markdown (the tables in profiles/README.md).

Usage: ``PYTHONPATH=. python benchmarks/costmodel_errors.py`` (reads ``profiles/<gpu>/<model>/tp<N>/profile.json``,
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


def attention_sample_rows() -> list[str]:
    """Both fits (held-out) and the roofline on the measured A100 Llama-3-8B attention sample itself."""
    from infermax.costmodel import profiles_dir, roofline_model
    from infermax.costmodel.fitting import ProfileSpec, build_groups, fit_group, heldout_errors
    from infermax.costmodel.measurements import import_vidur_attention
    from infermax.costmodel.profile_import import ATTENTION_SAMPLE, SAMPLE_PROVENANCE

    rows = import_vidur_attention(profiles_dir() / "_sources" / ATTENTION_SAMPLE, 1, SAMPLE_PROVENANCE)
    spec = ProfileSpec("a100", "llama-3-8b", 1, 32, 4096)
    roofline = roofline_model("a100", "llama-3-8b", 1)
    errors = heldout_errors({g.name: fit_group(g, roofline) for g in build_groups(rows, spec)}, roofline)
    return [f"| {group} | {family} | " + " | ".join(cell(table, r) for r in RANGES) + " |"
            for group, families in errors.items() for family, table in families.items()]


def main() -> None:
    print("### attention, measured A100 Llama-3-8B sample (not scaled)\n")
    print("| group | family | " + " | ".join(RANGES) + " |")
    print("|---" * (2 + len(RANGES)) + "|")
    print("\n".join(attention_sample_rows()))
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
