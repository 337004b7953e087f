"""A random campaign against the lower bounds at mid scale: instances larger and more varied than the test suite's
hypothesis draws (which stay at 1-8 requests of at most 40 prompt tokens, so that each example runs in a second),
each checked for ``bound ≤ objective`` against every registered scheduler and against the schedule search, for
makespan, the sum of latencies and mean TTFT, and each search result's Schedule, through JSON and replayed on its
own, for the value the search reported.

    PYTHONPATH=. python benchmarks/bound_campaign.py --seed 1 --runs 200
    PYTHONPATH=. python benchmarks/bound_campaign.py --seed 1 --runs 1 --first 17   # replay run 17 of seed 1

Why: the per-request bounds (queued, pairwise, crowding, work in progress, state path) bind only on instances with
queues, mixed lengths and memory pressure, which the tests' tiny draws rarely have; a bound above a schedule there
is a wrong proof, the worst error this project can ship. What is drawn (per run, from ``Random(seed·1,000,003 +
run)``): 4-300 requests; prompts and outputs from uniform, lognormal, the Azure conversation trace's own pairs, 2-3
classes or one (I, O) for all; offline, Poisson or bursty (gamma, shape 0.2) arrivals at a rate drawn around the
instance's own service rate; block size 1 or 16; C, P, M (from the largest request's peak up to all of them), Rmax;
the default A100 Llama-2-7B model (piecewise), its linear fit, the H100 Llama-2-7B linear fit (a prefill term that
can be negative) or the A100 Llama-2-70B TP4 model; the A100 host link for swaps.

Per run it prints one line: the instance, how many schedulers ran and how many refused it, by exception (a prompt
over ``min(C, P)`` for a scheduler that does not chunk, the hybrid Apt-Serve on a grouped-query model, an Apt-Serve
refill that cannot fit), the tightest ratio best ÷ bound per objective, and the seconds; a ``VIOLATION`` line (and
the instance as JSON under ``--out``) when a bound exceeds a schedule. The last lines list every distinct refusal
message of a plain ``ValueError`` seen (the other refusals have their own classes), so that an input check a bug
trips, which a blanket count would hide among the refusals, can be read there. Writes nothing else.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infermax.costmodel import load_cost_model  # noqa: E402
from infermax.costmodel.swap import SwapCost  # noqa: E402
from infermax.engine import SimulationTimeout, simulate  # noqa: E402
from infermax.limits import Limits  # noqa: E402
from infermax.replay import replay  # noqa: E402
from infermax.request import Request  # noqa: E402
from infermax.schedule import Schedule  # noqa: E402
from infermax.schedulers import available  # noqa: E402
from infermax.schedulers.base import InfeasibleRequestError, SchedulerError  # noqa: E402
from infermax.workload import load_trace  # noqa: E402
from solvers import Objective  # noqa: E402
from solvers.lower_bound import LowerBounder  # noqa: E402
from solvers.search import search  # noqa: E402

OBJECTIVES = {"makespan": Objective(makespan=1), "latency": Objective(latency=1), "ttft": Objective(ttft=1)}
SCHEDULERS = [n for n in available() if n != "bros-strict"]  # bros-strict stops by design (NoProgressError)
TOL = 1e-9
MODELS = [("a100", "llama-2-7b", 1, "auto"), ("a100", "llama-2-7b", 1, "linear"), ("h100", "llama-2-7b", 1, "linear"),
          ("a100", "llama-2-70b", 4, "auto")]


def _lengths(rng: random.Random, n: int, azure: list[tuple[int, int]]) -> list[tuple[int, int]]:
    kind = rng.choice(["uniform", "lognormal", "azure", "mix", "identical"])
    if kind == "identical":  # the state-path bound's case (with offline arrivals)
        return [(rng.choice([1, 16, 64, 512]), rng.choice([1, 4, 32, 128]))] * n
    if kind == "uniform":
        hi_i, hi_o = rng.choice([16, 64, 512, 2048]), rng.choice([4, 32, 256])
        return [(rng.randint(1, hi_i), rng.randint(1, hi_o)) for _ in range(n)]
    if kind == "lognormal":
        mi, mo = rng.choice([64, 512, 1500]), rng.choice([16, 128, 400])
        return [(max(1, min(4000, round(rng.lognormvariate(math.log(mi), 0.8)))),
                 max(1, min(2000, round(rng.lognormvariate(math.log(mo), 1.0))))) for _ in range(n)]
    if kind == "azure":
        start = rng.randrange(len(azure) - n)
        return [(min(i, 4000), min(o, 2000)) for i, o in azure[start:start + n]]
    classes = [(rng.choice([1, 8, 128, 1024]), rng.choice([1, 16, 128, 512])) for _ in range(rng.randint(2, 3))]
    return [rng.choice(classes) for _ in range(n)]


def draw(rng: random.Random, azure: list[tuple[int, int]]) -> dict:
    """One instance: requests (as (arrival, I, O) rows), limits, cost model, and what was drawn."""
    n = rng.choice([rng.randint(4, 16), rng.randint(20, 80), rng.randint(100, 300)])
    lengths = _lengths(rng, n, azure)
    gpu, model, tp, kind = rng.choice(MODELS)
    cost = load_cost_model(gpu, model, tp, kind=kind)
    arrivals = rng.choice(["offline", "poisson", "bursty"])
    times = [0.0] * n
    if arrivals != "offline":
        # about the instance's own service rate (a token costs ~0.1 ms of prefill, a decode ~15 ms of a small batch),
        # times a load factor
        service_s = sum(1e-4 * i + 0.015 * o / 8 for i, o in lengths) / n
        rate = rng.choice([0.3, 0.8, 1.0, 1.5, 4.0]) / service_s
        t = 0.0
        for k in range(n):
            times[k] = t
            t += rng.expovariate(rate) if arrivals == "poisson" else rng.gammavariate(0.2, 1 / (0.2 * rate))
    block = rng.choice([1, 1, 16])
    peaks = [-(-(i + o - 1) // block) * block for i, o in lengths]
    longest_prompt = max(i for i, _ in lengths)
    C = rng.choice([longest_prompt, max(longest_prompt, 512), max(longest_prompt, 2048), max(longest_prompt, 4096),
                    max(64, longest_prompt // 4)])
    P = rng.choice([None, None, max(1, C // 2), C])
    M = rng.randint(max(peaks), max(max(peaks), int(sum(peaks) * rng.choice([0.1, 0.3, 1.0]))))
    Rmax = rng.choice([None, None, 4, 16, 64])
    return {"requests": [(t, i, o) for t, (i, o) in zip(times, lengths)], "limits": (C, P, M, Rmax, block),
            "model": (gpu, model, tp, kind), "arrivals": arrivals, "cost": cost}


def _requests(inst: dict) -> list[Request]:
    return [Request(k, t, i, o) for k, (t, i, o) in enumerate(inst["requests"])]


def run(inst: dict, swap: SwapCost, search_s: float, sim_timeout_s: float) -> dict:
    """Every scheduler and a search against the bounds; returns the violations and the tightest ratios."""
    reqs = _requests(inst)
    C, P, M, Rmax, block = inst["limits"]
    limits = Limits(C=C, P=P, M=M, Rmax=Rmax, block_size=block)
    cost = inst["cost"]
    bounders: dict = {}
    best: dict[str, float] = {name: math.inf for name in OBJECTIVES}
    violations, ran, refused, timed_out, messages = [], 0, Counter(), 0, set()

    def bounds_for(lim: Limits, hidden: bool) -> dict[str, float]:
        key = (lim, hidden)
        if key not in bounders:
            b = LowerBounder(reqs, lim, cost, hidden_cache=hidden)
            bounders[key] = {name: b.of(obj).value_s for name, obj in OBJECTIVES.items()}
        return bounders[key]

    def check(who: str, lb: dict[str, float], values: dict[str, float]) -> None:
        for name, got in values.items():
            if lb[name] > got * (1 + TOL) + 1e-12:
                violations.append({"who": who, "objective": name, "bound_s": lb[name], "value_s": got})

    for name in SCHEDULERS:
        try:
            result = simulate(reqs, name, limits, cost, swap_cost=swap, deadline_s=time.perf_counter() + sim_timeout_s)
        except SimulationTimeout:
            timed_out += 1
            continue
        except (InfeasibleRequestError, SchedulerError, ValueError) as e:
            refused[type(e).__name__] += 1
            if type(e) is ValueError:
                messages.add(str(e)[:120])
            continue
        ran += 1
        hidden = bool(result.batches["hidden_seqs"].sum())
        lb = bounds_for(result.schedule.limits, hidden)
        values = {n: obj.value(result) for n, obj in OBJECTIVES.items()}
        check(name, lb, values)
        if not hidden and result.schedule.limits == limits:
            for n, v in values.items():
                best[n] = min(best[n], v)
    bounds = bounds_for(limits, False)
    if search_s > 0:
        for n, obj in OBJECTIVES.items():
            found = search(reqs, limits, cost, obj, time_limit_s=search_s)
            if found.schedule is not None:
                check(f"search:{found.method}", bounds, {n: found.value_s})
                best[n] = min(best[n], found.value_s)
                # the Schedule as a user gets it (JSON), replayed on its own: the value the search reported
                again = obj.value(replay(Schedule.from_json(json.loads(json.dumps(found.schedule.to_json()))), cost,
                                         limits=limits))
                if abs(again - found.value_s) > 1e-9 * max(abs(found.value_s), 1e-300):
                    violations.append({"who": f"search:{found.method}", "objective": n, "replayed_s": again,
                                       "value_s": found.value_s})
    ratios = {n: (best[n] / bounds[n] if bounds[n] > 0 and best[n] < math.inf else None) for n in OBJECTIVES}
    return {"violations": violations, "ran": ran, "refused": refused, "timed_out": timed_out, "ratios": ratios,
            "bounds": bounds, "value_errors": messages}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--first", type=int, default=0, help="the first run's index (to replay one run)")
    ap.add_argument("--search-s", type=float, default=2.0, help="the search's time limit per objective (0: none)")
    ap.add_argument("--sim-timeout-s", type=float, default=30.0, help="per scheduler simulation")
    ap.add_argument("--out", type=Path, help="folder for the instances with a violation (JSON)")
    a = ap.parse_args()
    azure = [(r.prompt_tokens, r.output_tokens) for r in load_trace("azure-conv")]
    swap = SwapCost.for_system("a100", "llama-2-7b", 1)
    flagged, value_errors = 0, set()
    for k in range(a.first, a.first + a.runs):
        rng = random.Random(a.seed * 1_000_003 + k)
        inst = draw(rng, azure)
        t0 = time.perf_counter()
        try:
            out = run(inst, swap, a.search_s, a.sim_timeout_s)
        except Exception as e:  # a crash in the bound or the search is a finding too
            print(f"CRASH run {k}: {type(e).__name__}: {e}", flush=True)
            out = {"violations": [{"who": "crash", "error": f"{type(e).__name__}: {e}"}], "ran": 0,
                   "refused": Counter(), "timed_out": 0, "ratios": {}, "value_errors": set()}
        C, P, M, Rmax, block = inst["limits"]
        desc = (f"run {k}: n={len(inst['requests'])} {inst['arrivals']} {'/'.join(map(str, inst['model']))} "
                f"C={C} P={P} M={M} Rmax={Rmax} b={block}")
        ratios = " ".join(f"{n}={r:.3f}" for n, r in out["ratios"].items() if r is not None)
        refused = ",".join(f"{kind}x{count}" for kind, count in sorted(out["refused"].items())) or "0"
        value_errors |= out["value_errors"]
        print(f"{desc} ran={out['ran']} refused={refused} timeout={out['timed_out']} best/bound: {ratios} "
              f"{time.perf_counter() - t0:.1f}s", flush=True)
        for v in out["violations"]:
            flagged += 1
            print(f"VIOLATION run {k}: {v}", flush=True)
        if out["violations"] and a.out:
            a.out.mkdir(parents=True, exist_ok=True)
            record = {key: inst[key] for key in ("requests", "limits", "model", "arrivals")}
            (a.out / f"seed{a.seed}_run{k}.json").write_text(json.dumps({**record, **out}, indent=1, default=str))
    for message in sorted(value_errors):
        print(f"refused with ValueError: {message}", flush=True)
    print(f"done: {a.runs} runs, {flagged} violations", flush=True)
    sys.exit(1 if flagged else 0)


if __name__ == "__main__":
    main()
