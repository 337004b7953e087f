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

    def per_call(self, calls: int) -> "Timing":
        """The timing of one of ``calls`` calls that each timed run made back to back."""
        return Timing(self.median_ms / calls, self.mean_ms / calls, self.std_ms / calls, self.reps)

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


def require_graphs_device(device) -> None:
    """Refuse ``--cuda-graphs`` on a device without CUDA, before any work (profile and gpu-replay alike)."""
    if torch.device(device).type != "cuda":
        raise ValueError("--cuda-graphs needs a CUDA device")


# Calls of an operator captured back to back in one graph by ``measure_graph``. A replay has a fixed cost on the GPU
# besides its kernels (the graph's launch): on an H200 (2026-11-29) a 4-token ``add`` timed as one replay of a
# one-call graph took 10.5 us, several times the kernel, and a decode batch of Llama-3-8B sums about 400 such
# operator timings while its own graph pays the cost once. Graph-timed operators over-predicted the fixed grid's
# 64-sequence decode batches by 9 to 14% (profiles/README.md); GRAPH_CALLS calls per replay spread that cost over
# them, as a batch's graph spreads it over its operators.
GRAPH_CALLS = 8


def measure_graph(fn: Callable[[], object], device, warmup: int = 3, reps: int = 10,
                  calls: int = GRAPH_CALLS) -> Timing:
    """Like ``measure``, but ``calls`` calls of ``fn`` are captured back to back in one CUDA graph, each timed run is
    one replay of it, and the timing is per call.

    A replay is a single launch, so the time is the GPU's work alone, without the gaps in which the GPU waits for
    the host to launch the next kernel: what a server that captures its batches (vLLM's CUDA graphs) pays, where
    ``measure`` also counts the host's launching of small operators. Several calls per replay spread the replay's
    own fixed cost (``GRAPH_CALLS``); the gaps between kernels inside a graph are counted, as in a batch's graph.
    The ``warmup`` runs before the capture let kernels choose and plan for this shape (cuDNN, cuBLAS), which must
    not happen during a capture. Raises what the capture raises when ``fn`` cannot be captured (a host
    synchronisation or a host-to-device copy, say). The calls' results are dropped inside the capture, so their
    memory is reused from one call to the next.
    """
    if reps < 1 or warmup < 0 or calls < 1:
        raise ValueError(f"need reps >= 1, warmup >= 0 and calls >= 1, got reps={reps}, warmup={warmup}, "
                         f"calls={calls}")
    if torch.device(device).type != "cuda":
        raise ValueError("CUDA graphs need a CUDA device")
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize(device)
    graph, _ = capture(lambda: _call_times(fn, calls))
    return measure(graph.replay, device, warmup=1, reps=reps).per_call(calls)  # the first replay uploads: untimed


def _call_times(fn: Callable[[], object], calls: int) -> None:
    for _ in range(calls):
        fn()


_capture_stream = None


def capture(fn: Callable[[], object], pool=None):
    """``(graph, fn's result)``: ``fn`` captured into a new CUDA graph (memory from ``pool`` when given) on a side
    stream, as ``torch.cuda.graph`` does but without its garbage collection and cache emptying at every capture
    (hundreds of captures in one replay). The result's tensors are the graph's outputs, rewritten by each replay."""
    global _capture_stream
    if _capture_stream is None:
        _capture_stream = torch.cuda.Stream()
    graph, main = torch.cuda.CUDAGraph(), torch.cuda.current_stream()
    _capture_stream.wait_stream(main)
    with torch.cuda.stream(_capture_stream):
        graph.capture_begin(pool=pool)
        try:
            result = fn()
        finally:
            graph.capture_end()
    main.wait_stream(_capture_stream)
    return graph, result
