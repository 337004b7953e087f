"""Timing of PyTorch work: CUDA events on a GPU, ``time.perf_counter`` on a CPU."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

from . import import_torch

torch = import_torch()


@dataclass(frozen=True)
class Timing:
    """Median, mean and (sample) standard deviation of repeated runs, in milliseconds."""

    median_ms: float
    mean_ms: float
    std_ms: float
    reps: int

    @classmethod
    def of(cls, times_ms: list[float]) -> "Timing":
        std = statistics.stdev(times_ms) if len(times_ms) > 1 else 0.0
        return cls(statistics.median(times_ms), statistics.fmean(times_ms), std, len(times_ms))


class Stopwatch:
    """Times a region of work on ``device``: ``start()``, the work, ``stop()``; ``elapsed_ms()`` reads the
    time (on CUDA the events' GPU time between the two points, waiting for the GPU to reach ``stop``)."""

    def __init__(self, device):
        self.cuda = torch.device(device).type == "cuda"
        if self.cuda:
            self._begin, self._end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def start(self) -> None:
        if self.cuda:
            self._begin.record()
        else:
            self._t0 = time.perf_counter()

    def stop(self) -> None:
        if self.cuda:
            self._end.record()
        else:
            self._t1 = time.perf_counter()

    def elapsed_ms(self) -> float:
        if self.cuda:
            self._end.synchronize()
            return self._begin.elapsed_time(self._end)
        return (self._t1 - self._t0) * 1e3


def measure(fn: Callable[[], object], device, warmup: int = 3, reps: int = 10) -> Timing:
    """Run ``fn`` ``warmup`` times untimed, then ``reps`` times, each timed on its own."""
    if reps < 1 or warmup < 0:
        raise ValueError(f"need reps >= 1 and warmup >= 0, got reps={reps}, warmup={warmup}")
    for _ in range(warmup):
        fn()
    watches = [Stopwatch(device) for _ in range(reps)]
    for w in watches:  # on CUDA every event is recorded before the first is read: no sync between reps
        w.start()
        fn()
        w.stop()
    return Timing.of([w.elapsed_ms() for w in watches])
