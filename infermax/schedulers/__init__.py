"""Scheduler registry: every scheduler is usable by name from the CLI, sweeps and Python.

Adding a scheduler = one module plus one `register` call here. The seed schedulers' modules (Apt-Serve,
BROS, round robin, EcoServe) are imported by their factories, on first use, not when the registry loads:
a run of an Algorithm 1 scheduler then compiles and imports none of them (start-up is most of a small
run). Their classes stay importable from here (``__getattr__``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from importlib import import_module
from typing import Callable

from ..costmodel.base import CostModel
from ..limits import Limits
from .algorithm1 import Algorithm1Policy, Algorithm1Scheduler
from .base import InfeasibleRequestError, NoProgressError, PrefillTooLongError, Scheduler, SchedulerError

__all__ = [
    "Algorithm1Policy", "Algorithm1Scheduler", "InfeasibleRequestError", "NoProgressError", "PrefillTooLongError",
    "Scheduler", "SchedulerError",
    "SchedulerSpec", "register", "get_spec", "available", "make_scheduler",
]


@dataclass(frozen=True)
class SchedulerSpec:
    """A registered scheduler: how to build it and its default prefill budget."""

    name: str
    description: str
    factory: Callable[[Limits, CostModel | None], Scheduler]
    default_P: int | None = None
    eviction_free: bool = False
    # True: the scheduler manages its own KV blocks from ``limits.block_size`` and the replayer counts
    # tokens (block size 1), so Σ GPU tokens <= M is checked and the block rule is the scheduler's.
    token_accounting: bool = False
    # True: the scheduler plans prefix-cache hits (`Scheduler.supports_prefix_caching`).
    supports_prefix_caching: bool = False


_REGISTRY: dict[str, SchedulerSpec] = {}


def register(spec: SchedulerSpec) -> None:
    if spec.name in _REGISTRY:
        raise ValueError(f"scheduler {spec.name!r} is already registered")
    _REGISTRY[spec.name] = spec


def available() -> list[str]:
    return list(_REGISTRY)


def get_spec(name: str) -> SchedulerSpec:
    spec = _REGISTRY.get(name.lower())
    if spec is None:
        raise ValueError(f"unknown scheduler {name!r}; registered: {', '.join(_REGISTRY)}")
    return spec


def make_scheduler(name: str, limits: Limits, cost_model: CostModel | None = None) -> tuple[Scheduler, Limits]:
    """Build a scheduler by name; returns it with the limits resolved for it (its default P)."""
    spec = get_spec(name)
    if limits.P is None and spec.default_P is not None:
        limits = replace(limits, P=min(spec.default_P, limits.C))
    scheduler = spec.factory(limits, cost_model)
    return scheduler, (replace(limits, block_size=1) if spec.token_accounting else limits)


def _register_algorithm1(name: str, description: str, policy: Algorithm1Policy) -> None:
    for suffix, pol, note in (("", policy, ""), ("-ef", policy.eviction_free_variant(), " (eviction-free: reserves I+O-1 at admission)")):
        register(SchedulerSpec(
            name=name + suffix,
            description=description + note,
            factory=lambda limits, cm, pol=pol, n=name + suffix: Algorithm1Scheduler(limits, pol, cm, name=n),
            default_P=pol.default_P,
            eviction_free=pol.eviction_free,
        ))


# The paper's Table 1 (grouping, hybrid batching, chunked prefill, P) and who evicts (section 3.1).
_register_algorithm1("vllm", "vLLM: prefill first, no hybrid, no chunking, P=C",
                     Algorithm1Policy("prefill_first", hybrid=False, chunked_prefill=False, evict_for="running"))
_register_algorithm1("sarathi", "Sarathi: decode first, hybrid, chunked prefill, P=512",
                     Algorithm1Policy("decode_first", hybrid=True, chunked_prefill=True, evict_for="running_decode",
                                      default_P=512))
_register_algorithm1("sarathi-pc", "Sarathi P=C: decode first, hybrid, chunked prefill, P=C",
                     Algorithm1Policy("decode_first", hybrid=True, chunked_prefill=True, evict_for="running_decode"))
_register_algorithm1("sarathi-nocp", "Sarathi-nocp: decode first, hybrid, no chunking, P=C",
                     Algorithm1Policy("decode_first", hybrid=True, chunked_prefill=False, evict_for="running_decode"))
_register_algorithm1("vllm-hy", "vLLM-hy: prefill first, hybrid, no chunking, P=C",
                     Algorithm1Policy("prefill_first", hybrid=True, chunked_prefill=False, evict_for="running"))
_register_algorithm1("sarathi-nohy", "Sarathi-nohy: decode first, no hybrid, no chunking, P=C",
                     Algorithm1Policy("decode_first", hybrid=False, chunked_prefill=False, evict_for="running_decode"))
# Appendix A.3 ranking schedulers: one group ordered by arrival / I / O; otherwise Sarathi P=C settings.
for _key, _label in (("arrival", "org"), ("prompt", "i"), ("output", "o")):
    _register_algorithm1(f"rank-{_label}", f"Rank_{_label.upper() if _label != 'org' else 'org'}: one group ranked by "
                         f"{_key}; hybrid, chunked prefill, P=C",
                         Algorithm1Policy("rank", hybrid=True, chunked_prefill=True, evict_for="running_decode",
                                          rank_by=_key))

# Seed schedulers' classes by module, imported on first use (see the module docstring).
_LAZY = {"AptServeOptions": "aptserve", "AptServeScheduler": "aptserve", "BrosOptions": "bros", "BrosScheduler": "bros",
         "RoundRobinScheduler": "roundrobin", "EcoServeOptions": "ecoserve", "EcoServeScheduler": "ecoserve"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _seed(scheduler: str, options: str | None = None, name: str = "", **option_values
          ) -> Callable[[Limits, CostModel | None], Scheduler]:
    """A factory building the class ``scheduler`` (with ``options(**option_values)`` and ``name`` when ``options``
    is given), whose module is imported on the first call."""

    def build(limits: Limits, cost_model: CostModel | None) -> Scheduler:
        cls = __getattr__(scheduler)
        if options is None:
            return cls(limits, cost_model)
        return cls(limits, cost_model, __getattr__(options)(**option_values), name=name)

    return build


# Apt-Serve (SIGMOD 2025) and its ablations / option variants (infermax/schedulers/aptserve.py).
for _name, _desc, _opts in (
    ("aptserve", "Apt-Serve: hybrid KV/hidden cache, value-density greedy, prefill- or decode-only iterations", {}),
    ("aptserve-kv", "Apt-Serve ablation: KV cache only (adaptive scheduling kept)", dict(hybrid=False)),
    ("aptserve-fcfs", "Apt-Serve ablation: FCFS scheduling (hybrid cache kept)", dict(adaptive=False)),
    ("aptserve-decay", "Apt-Serve*: SLO violators' value decayed by 0.4 instead of near zero", dict(demotion="decay")),
    ("aptserve-authors-rho", "Apt-Serve with the authors' rho (QKV projection slope / 5)", dict(rho="authors")),
    ("aptserve-code", "Apt-Serve as the authors' code: their rho, hidden requests re-prefilled, no single-item check",
     dict(rho="authors", reprefill_hidden=True, double_check=False)),
    ("aptserve-paper", "Apt-Serve as the paper states it: N = |W|+|R|, prefill memory M - sum of running KV sizes",
     dict(n_minus_violators=False, prefill_memory="paper")),
):
    register(SchedulerSpec(name=_name, description=_desc,
                           factory=_seed("AptServeScheduler", "AptServeOptions", _name, **_opts)))

# BROS (arXiv 2504.09590) and its baselines (infermax/schedulers/bros.py, roundrobin.py).
for _name, _desc, _opts in (
    ("bros", "BROS: RT slack-ordered packing under the most urgent RT's time budget, BE packing/replacement, "
             "bidirectional KV blocks (one RT + one BE per block of --block-size slots; use 16) with lazy "
             "checkpointing; deadlock guards on", {}),
    ("bros-strict", "BROS with Algorithm 1 as printed (no guards): raises NoProgressError when it returns an "
                    "empty batch", dict(strict=True)),
):
    register(SchedulerSpec(name=_name, description=_desc, token_accounting=True,
                           factory=_seed("BrosScheduler", "BrosOptions", _name, **_opts)))
register(SchedulerSpec(name="roundrobin", description="BROS's RR baseline: RT and BE FCFS queues in alternate "
                                                      "iterations, mixed prefill/decode, no chunking, recompute",
                       factory=_seed("RoundRobinScheduler")))

# EcoServe (arXiv 2411.06364) and the paper's ablation ladder (infermax/schedulers/ecoserve.py).
for _name, _desc, _opts in (
    ("ecoserve-d", "EcoServe-D: separate PT/GT queues, GTs admitted one by one every iteration (exact allocation)",
     dict(sync=False, ordering=False, pipelining=False)),
    ("ecoserve-sd", "EcoServe-SD: + same-length GT groups admitted when a group completes",
     dict(ordering=False, pipelining=False)),
    ("ecoserve-sdo", "EcoServe-SDO: + ordering (deadline, occupied KV, length buckets)", dict(pipelining=False)),
    ("ecoserve", "EcoServe: decoupled PT/GT, synced groups, ordering, KV pipelining; predicted lengths", {}),
    ("ecoserve-oracle", "EcoServe with the true output lengths (no padding)", dict(oracle=True, padding=0.0)),
):
    register(SchedulerSpec(name=_name, description=_desc,
                           factory=_seed("EcoServeScheduler", "EcoServeOptions", _name, **_opts)))

# vLLM's V1 engine scheduler (vLLM 0.33.0; infermax/schedulers/vllm_v1.py). One token budget (P = C).
from .vllm_v1 import V1Options, VllmV1Scheduler  # noqa: E402

for _name, _desc, _opts in (
    ("vllm-v1", "vLLM V1 (0.33.0): one token budget for prefills and decodes, running first, chunked prefill, "
                "FCFS, recompute preemption of the last running request, admission needs the whole input's KV",
     V1Options()),
    ("vllm-v1-priority", "vLLM V1 with policy=priority: waiting by (Request.priority, arrival), preempts the "
                         "largest (priority, arrival)", V1Options(policy="priority")),
    ("vllm-v1-lpt512", "vLLM V1 with long_prefill_token_threshold=512 (at most 512 tokens per request per step "
                       "when others are present)", V1Options(long_prefill_token_threshold=512)),
    ("vllm-v1-noreserve", "vLLM V1 with scheduler_reserve_full_isl=False: admission checks only the first "
                          "chunk's KV", V1Options(reserve_full_isl=False)),
    ("vllm-v1-ef", "vLLM V1, eviction-free (ours, as the paper's -ef variants): admission reserves every "
                   "request's peak I+O-1, so it never preempts", V1Options(eviction_free=True)),
):
    register(SchedulerSpec(name=_name, description=_desc, supports_prefix_caching=True, eviction_free=_opts.eviction_free,
                           factory=lambda limits, cm, o=_opts, n=_name: VllmV1Scheduler(limits, cm, o, name=n)))
