"""``infermax profile``: time every operator case and write a profile folder ``infermax fit`` reads unchanged.

Writes ``<out>/tp<N>/measurements.csv`` (our schema, ``infermax.costmodel.measurements``) and
``profile.json`` (gpu, model, tp, layers, hidden size, and the environment: device, driver, CUDA,
PyTorch, dtype, grid, date). ``lm_head`` rows (final norm + LM head + greedy pick, ``num_tokens`` =
generating sequences) are fitted only at their fewest rows, a per-batch charge (``fitting.lm_head_floor_ms``).
Rows the fit does not use yet are still recorded: ``swap_out``/``swap_in`` (one layer's K and V of
``num_tokens`` tokens, device→host and host→device). On a CPU the swap rows are a host memcpy stand-in and say
so in ``derivation``.
"""

from __future__ import annotations

import json
import platform
import re
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from ..costmodel.measurements import COLUMNS, MEASUREMENTS_CSV, PROFILE_JSON, write_measurements
from . import layers as L
from .operators import OperatorBench, get_grid
from .timer import GRAPH_CALLS, measure, measure_graph, require_graphs_device

torch = L.torch
KNOWN_GPUS = ("h200", "h100", "a100", "l40s", "a10g", "l4", "v100")
NOT_FITTED = ("swap_out", "swap_in")  # (lm_head until 2026-11-30; now its one-row time is charged per batch)
CPU_SWAP_NOTE = "host memcpy stand-in (no accelerator): not a host<->device copy"
CPU_VARLEN_NOTE = "per-sequence SDPA stand-in (no accelerator): not FlashAttention's variable-length kernel"
# The operator a "varlen" kernel times per phase: on a CPU, a per-sequence stand-in (its rows' derivation says so)
VARLEN_OPERATORS = {"decode": "attn_decode", "prefill": "attn_prefill"}


def resolve_device(device: str | None) -> str:
    """``cuda`` unless ``device`` says otherwise; a clear error for an absent GPU.

    Without a GPU we never fall back to the CPU on our own: a full-size model runs there for many minutes
    with nothing to show (issue 18), so the CPU must be asked for (``device="cpu"``, ``--device cpu``)."""
    if device is None:
        if not torch.cuda.is_available():
            raise ValueError(f"PyTorch sees no CUDA GPU (torch {torch.__version__}); to run on the CPU anyway pass "
                             f"--device cpu (a full-size model takes many minutes there; --tiny is a quick check)")
        return "cuda"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but PyTorch sees no CUDA GPU (torch {torch.__version__})")
    if device.split(":")[0] not in ("cuda", "cpu"):
        raise ValueError(f"device must be cuda, cuda:N or cpu, got {device!r}")
    return device


def device_name(device: str) -> str:
    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_name(torch.device(device))
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        match = re.search(r"^model name\s*:\s*(.+)$", cpuinfo.read_text(), re.M)
        if match:
            return match.group(1).strip()
    return platform.processor() or "CPU"


def _time_case(case, device, grid, cuda_graphs: bool, not_captured: dict[str, str]):
    """``(Timing, note for the row's software)``: a CUDA-graph timing where asked and the capture works, else eager."""
    if cuda_graphs and case.operator not in not_captured:
        try:
            return measure_graph(case.run, device, grid.warmup, grid.reps), ", CUDA graph"
        except RuntimeError as exc:  # not capturable: every later case of this operator is timed eagerly
            not_captured[case.operator] = str(exc).splitlines()[0][:200]
            torch.cuda.synchronize(device)
    return measure(case.run, device, grid.warmup, grid.reps), (", eager (capture failed)" if cuda_graphs else "")


def gpu_key(name: str, device: str) -> str:
    """Short GPU name for ``profiles/<gpu>/`` (``h100``, ``h200``, ...) from the device name; ``cpu`` on a CPU."""
    if torch.device(device).type != "cuda":
        return "cpu"
    from ..models import GPUS, gpu_named_in

    return gpu_named_in(name, {*KNOWN_GPUS, *GPUS}) or re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def nvidia_driver() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
        return out.splitlines()[0].strip() or "unknown"
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown"


def environment(device: str, dtype: str, grid: str) -> dict:
    """What the measurements were taken on (stored in ``profile.json`` and the rows' provenance)."""
    cuda = torch.device(device).type == "cuda"
    return {"device": device_name(device), "driver": nvidia_driver() if cuda else "n/a (cpu)",
            "cuda": torch.version.cuda if cuda else "n/a (cpu)", "torch": torch.__version__, "dtype": dtype,
            "grid": grid, "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}


def profile(model: str, out: str | Path, tp: int = 1, dtype: str = "bf16", grid: str = "full", tiny: bool = False,
            device: str | None = None, gpu: str | None = None, progress: bool = True,
            cuda_graphs: bool = False, decode_kernel: str = "sdpa", prefill_kernel: str = "sdpa") -> Path:
    """Profile ``model`` (one TP shard) on ``device`` into ``out/tp<tp>/``; returns that folder.

    ``cuda_graphs``: time each operator as replays of a CUDA graph (``timer.measure_graph``: the GPU's work without
    launch gaps); an operator whose capture fails is timed as usual, and its rows' ``software`` says so.
    ``decode_kernel``: how decode attention runs ("sdpa" or "varlen", ``layers.DECODE_KERNELS``), recorded in
    ``profile.json`` so that a replay can use the same; on a CPU "varlen" is ``layers.varlen_reference``, a per-sequence
    stand-in, and its rows' ``derivation`` says so. ``prefill_kernel``: the same for prefill chunks ("varlen": the
    attention as one causal variable-length call and the K/V write as one indexed copy, what the replay runs for a
    batch's chunks; ``layers.PREFILL_KERNELS``); on a CPU its attention is a per-sequence stand-in too.
    """
    if dtype not in L.DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {', '.join(L.DTYPES)}")
    shapes, g = L.shard_shapes(model, tp, tiny), get_grid(grid)
    device = resolve_device(device)
    L.check_decode_kernel(decode_kernel, device)
    L.check_prefill_kernel(prefill_kernel, device)
    if cuda_graphs:
        require_graphs_device(device)
    env = environment(device, dtype, grid)
    gpu = gpu or gpu_key(env["device"], device)
    bench = OperatorBench(shapes, g, device, L.DTYPES[dtype], decode_kernel=decode_kernel, prefill_kernel=prefill_kernel)
    kernels = {"decode": decode_kernel, "prefill": prefill_kernel}
    varlen = [phase for phase, kernel in kernels.items() if kernel == "varlen"]
    software = (f"infermax profile: PyTorch {env['torch']}, CUDA {env['cuda']}, driver {env['driver']}, "
                f"{dtype}, SDPA attention" + "".join(f", varlen {phase} attention" for phase in varlen))
    source = (f"infermax profile --model {model} --tp {tp} --dtype {dtype} --grid {grid}" + (" --tiny" if tiny else "")
              + (" --cuda-graphs" if cuda_graphs else "")
              + "".join(f" --{phase}-kernel varlen" for phase in varlen))
    stand_in = {VARLEN_OPERATORS[phase] for phase in varlen}
    not_captured: dict[str, str] = {}  # operator -> why its capture failed (timed eagerly instead)
    cpu = torch.device(device).type != "cuda"
    rows = []
    with _progress(progress, bench.count(), f"profiling {shapes.name} tp{tp} on {env['device']}") as advance:
        with torch.inference_mode():
            for case in bench.cases():
                t, how = _time_case(case, device, g, cuda_graphs, not_captured)
                derivation = (CPU_SWAP_NOTE if cpu and case.operator.startswith("swap_") else
                              CPU_VARLEN_NOTE if cpu and case.operator in stand_in else "")
                rows.append((case.operator, case.num_tokens, case.batch_size, case.prefill_chunk_size, case.kv_cache_size,
                             tp, t.median_ms, t.mean_ms, t.std_ms, env["device"], software + how, env["date"], source,
                             derivation))
                advance()
    folder = Path(out) / f"tp{tp}"
    folder.mkdir(parents=True, exist_ok=True)
    write_measurements(pd.DataFrame(rows, columns=list(COLUMNS)), folder / MEASUREMENTS_CSV)
    doc = {"gpu": gpu, "model": shapes.name, "tp": tp, "num_layers": shapes.num_layers, "hidden_size": shapes.hidden,
           "attention": "measured: PyTorch scaled_dot_product_attention (not vLLM's paged kernels)" + "".join(
               f"; {phase} attention: torch.nn.attention.varlen (one call over unpadded keys)" for phase in varlen),
           "decode_kernel": decode_kernel, "prefill_kernel": prefill_kernel,
           "communication": "not applicable (tp=1)" if tp == 1 else
           "not measured: one shard profiled on one device, no all-reduce",
           "profiled": {**env, "command": source}, "recorded_not_fitted": list(NOT_FITTED),
           "timing": (f"CUDA graph replays of {GRAPH_CALLS} back-to-back calls, per call (GPU work without launch "
                      f"gaps)" if cuda_graphs else
                      "eager, repetitions enqueued back to back (launch gaps of small operators included)"),
           **({"not_captured": not_captured} if not_captured else {})}
    (folder / PROFILE_JSON).write_text(json.dumps(doc, indent=2) + "\n")
    return folder


class _progress:
    """A rich progress bar (or nothing) yielding an ``advance()`` callable, to be called between timed regions.

    The bar is redrawn only inside ``advance()`` (at most 10 times a second), never from rich's
    background thread, so no thread competes with the timed work for the GIL.
    """

    def __init__(self, show: bool, total: int, label: str):
        self.show, self.total, self.label = show, total, label

    def __enter__(self):
        if not self.show:
            return lambda: None
        from rich.progress import Progress

        self.bar = Progress(auto_refresh=False)
        self.bar.start()
        task = self.bar.add_task(self.label, total=self.total)
        last = [0.0]

        def advance():
            self.bar.advance(task)
            now = time.monotonic()
            if now - last[0] > 0.1:
                self.bar.refresh()
                last[0] = now

        return advance

    def __exit__(self, *exc):
        if self.show:
            self.bar.refresh()
            self.bar.stop()
        return False
