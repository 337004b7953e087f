"""Wall time per simulated batch of the Apt-Serve variants and Sarathi on issue 17's workloads.

    PYTHONPATH=<worktree> python benchmarks/aptserve_speed.py WORKLOAD [NAME ...] [--timeout S] [--C N]

WORKLOAD: ``azure-conv`` / ``azure-code`` (the full traces) or ``long`` (2,000 requests, prompts
lognormal:2500:0.3:4000, outputs lognormal:200:1.0:3900, Poisson 2 req/s, seed 0: the CLI's
``--input-dist ... --arrival poisson --rate 2 --B 2000 --seed 0``). Every other limit is the default.
Run it with PYTHONPATH on the old and the new worktree, one after the other, on the same machine.

Per scheduler: wall seconds, batches simulated, ms per batch, evictions. A run stopped at ``--timeout``
reports the batches it had applied (``batch_done`` calls; fast-forwarded repeats are not counted, so
its ms per batch is an upper bound) and ``finished = no``.
"""

from __future__ import annotations

import argparse
import signal
import time

from infermax.engine import simulate
from infermax.limits import Limits
from infermax.schedulers import make_scheduler
from infermax.workload import load_trace, sampled, with_arrivals

VARIANTS = ["aptserve", "aptserve-kv", "aptserve-fcfs", "aptserve-decay", "aptserve-authors-rho", "aptserve-code",
            "aptserve-paper"]


class Timeout(Exception):
    pass


def workload(name: str):
    if name == "long":
        reqs = sampled(2000, "lognormal:2500:0.3:4000", "lognormal:200:1.0:3900", seed=0)
        return with_arrivals(reqs, "poisson", rate_per_s=2.0, seed=0)
    return with_arrivals(load_trace(name), "trace")


def run(name: str, reqs, limits: Limits, timeout_s: int) -> dict:
    from infermax.costmodel import load_cost_model

    cost = load_cost_model()
    scheduler, limits = make_scheduler(name, limits, cost)
    applied = [0]
    done = scheduler.batch_done

    def counting(batch, finished):
        applied[0] += 1
        done(batch, finished)

    scheduler.batch_done = counting

    def stop(*_):
        raise Timeout

    signal.signal(signal.SIGALRM, stop)
    signal.alarm(timeout_s)
    start = time.perf_counter()
    try:
        res = simulate(reqs, scheduler, limits, cost)
        wall = time.perf_counter() - start
        s = res.summary
        row = dict(finished="yes", wall_s=wall, batches=s["num_batches"], evictions=s["evictions"],
                   makespan_s=s["makespan_s"])
    except Timeout:
        wall = time.perf_counter() - start
        row = dict(finished="no", wall_s=wall, batches=applied[0], evictions=float("nan"), makespan_s=float("nan"))
    except Exception as exc:  # noqa: BLE001 - an error is a result row here
        wall = time.perf_counter() - start
        row = dict(finished=f"error: {str(exc)[:80]}", wall_s=wall, batches=applied[0], evictions=float("nan"),
                   makespan_s=float("nan"))
    finally:
        signal.alarm(0)
    row["ms_per_batch"] = 1000 * row["wall_s"] / max(row["batches"], 1)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workload", choices=["azure-conv", "azure-code", "long"])
    ap.add_argument("names", nargs="*", default=["sarathi", *VARIANTS])
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--C", type=int, default=None, help="token budget (default: the Limits default, 4096)")
    args = ap.parse_args()
    reqs = workload(args.workload)
    limits = Limits() if args.C is None else Limits(C=args.C)
    print(f"| workload | scheduler | finished | wall s | batches | ms/batch | evictions | makespan s |", flush=True)
    print("|---|---|---|---|---|---|---|---|", flush=True)
    for name in args.names:
        r = run(name, reqs, limits, args.timeout)
        print(f"| {args.workload} (C={limits.C}) | {name} | {r['finished']} | {r['wall_s']:.1f} | {r['batches']} | "
              f"{r['ms_per_batch']:.3f} | {r['evictions']} | {r['makespan_s']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
