"""Score committed gpu-replay measurements against the current fits of a profile, beside the scores committed with
them (issue 20): what a change of the fitting moved, on the same measured batches, without a GPU.

For every ``<model>/<case>/`` under a replay folder (``sim/schedule.json``, ``replay/batches.csv``, and the
``score-<family>/summary.json`` written when it was measured), this applies the schedule through a ``Replayer``
with ``PROFILE/<model>/tp1/infermax_<family>.json`` (``scoring.rescore``, as ``gpu-replay --measured`` does) and
prints the per-batch MAPE and end-to-end latency error before (the committed score) and now. Writes nothing.

    python benchmarks/gpu_rescore.py profiles/h200-graphs/replays/2026-11-30 profiles/h200-graphs
    python benchmarks/gpu_rescore.py profiles/h200/replays/2026-11-29 profiles/h200
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from infermax.profiling.scoring import FAMILIES, rescore_records


def rows(replays: Path, profiles: Path) -> list[dict]:
    out = []
    for model, case, family, check in rescore_records(replays, profiles):
        before = replays / model / case / f"score-{family}" / "summary.json"
        if not before.is_file():
            continue
        old, new = json.loads(before.read_text()), check.summary
        out.append({"model": model, "case": case, "family": family, "batches": new["batches"],
                    "MAPE before %": old["per_batch_mape_pct"], "MAPE now %": new["per_batch_mape_pct"],
                    "e2e before %": old["e2e_latency_error_pct"], "e2e now %": new["e2e_latency_error_pct"]})
    if not out:
        raise SystemExit(f"{replays}: no <model>/<case>/ folders with sim/schedule.json, replay/ and score-<family>/ "
                         f"({', '.join(FAMILIES)})")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("replays", type=Path, help="a folder of <model>/<case>/ replay records")
    ap.add_argument("profiles", type=Path, help="the folder holding <model>/tp1/infermax_<family>.json")
    args = ap.parse_args()
    pd.set_option("display.width", 200)
    print(pd.DataFrame(rows(args.replays, args.profiles)).round(1).to_string(index=False))


if __name__ == "__main__":
    main()
