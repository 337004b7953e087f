"""Plain loop vs SimPy for the engine's batch loop, measured on identical work.

Run: ``python benchmarks/engine_loop.py`` (needs ``pip install simpy``). Both twins below run the
same scheduler and replayer on the same offline workload (the body of `infermax.engine.simulate`
without arrivals, progress bar or result tables); they differ only in who advances the clock: a
plain variable, or a SimPy process yielding one ``env.timeout`` per batch. Best of 3 runs each.
"""

from __future__ import annotations

import time

import simpy

from infermax.costmodel import load_cost_model
from infermax.limits import Limits
from infermax.replay import Replayer
from infermax.schedulers import make_scheduler
from infermax.workload import fixed


def _setup(requests, name, limits, cost):
    scheduler, limits = make_scheduler(name, limits, cost)
    rp = Replayer(requests, limits, cost)
    scheduler.add_arrivals(list(rp.states.values()))
    return scheduler, rp


def run_plain(requests, name, limits, cost):
    scheduler, rp = _setup(requests, name, limits, cost)
    now = 0.0
    while rp.unfinished:
        batch = scheduler.next_batch(now)
        scheduler.batch_done(batch, rp.apply(batch))
        now = rp.clock_s
    return now, len(rp.batch_rows)


def run_simpy(requests, name, limits, cost):
    scheduler, rp = _setup(requests, name, limits, cost)
    env = simpy.Environment()

    def server():
        while rp.unfinished:
            batch = scheduler.next_batch(env.now)
            scheduler.batch_done(batch, rp.apply(batch))
            yield env.timeout(rp.clock_s - env.now)

    env.process(server())
    env.run()
    return rp.clock_s, len(rp.batch_rows)


def best_of(fn, *args, repeat=3):
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn(*args)
        times.append(time.perf_counter() - t)
    return min(times), out


def main() -> None:
    cost = load_cost_model()
    for name, (I, O, B, M) in (("vllm", (1024, 1024, 1024, 100_000)), ("sarathi", (1024, 1024, 1024, 100_000)),
                               ("vllm", (16, 32, 1024, 100))):
        args = (fixed(I, O, B), name, Limits(M=M), cost)
        t_plain, (span_a, n) = best_of(run_plain, *args)
        t_simpy, (span_b, n_b) = best_of(run_simpy, *args)
        assert n == n_b and abs(span_a - span_b) <= 1e-9 * span_a
        print(f"{name:8s} I={I} O={O} B={B} M={M}: {n} batches; plain {t_plain:.3f}s "
              f"({n / t_plain:.0f} batches/s), simpy {t_simpy:.3f}s; simpy/plain = {t_simpy / t_plain:.3f}; "
              f"simpy overhead {(t_simpy - t_plain) / n * 1e6:.1f} us/batch")


if __name__ == "__main__":
    main()
