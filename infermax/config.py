"""One run's configuration (workload, system limits, cost model, scheduler) as plain data.

``RunConfig`` is what ``infermax simulate`` builds from its flags, what ``infermax optimize``
shares with it, and what a sweep point is: every field is JSON-serialisable, so a configuration can
be stored next to its results and rebuilt exactly.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from .limits import Limits
from .request import Request

DEFAULT_M = 100_000


def plain_values(values: dict) -> dict:
    """A configuration's values as plain JSON data: numbers from numpy or pandas as the Python numbers they equal, and
    a NaN (how a results table holds a field that was unset) as None. So a row of a sweep's results table runs again
    as the configuration it came from, under the same point id (its np.int64 values had ended in "Object of type
    int64 is not JSON serializable", its NaN rate in "rate_per_s does not apply to arrival process 'offline'")."""
    plain = {}
    for key, value in values.items():
        if type(value).__module__ == "numpy" and hasattr(value, "item"):  # a numpy scalar (np.int64, np.bool_, ...)
            value = value.item()
        if isinstance(value, float) and value != value:
            value = None
        plain[key] = value
    return plain


@dataclass(frozen=True)
class RunConfig:
    """Everything that determines a simulation's result (defaults: the README's first command).

    Workload source: ``trace`` if given (a trace without ``arrived_at`` needs ``arrival``), else ``mix``, else ``dataset`` (ShareGPT/HumanEval/
    LongBench-like lengths), else ``input_dist``/``output_dist``, else the fixed grid ``I``/``O``/``B``.
    Latency targets (every request): ``slo`` names a dataset whose Table-3 SLOs apply;
    ``slo_ttft_s``/``slo_tbt_s`` set or override them. No target: no SLO metrics. ``M`` defaults to
    100,000 tokens unless ``gpu_mem_util`` derives it from the GPU's memory. ``cost_model`` picks the fitted family (see ``load_cost_model``);
    ``costmodel_path`` overrides ``gpu``/``model``/``tp`` with an explicit JSON file. KV swaps are
    timed by ``swap_cost()``: the model's KV bytes over the GPU's host link (``host_link_gbps``
    overrides the link's GB/s per direction). ``predictor`` (``noisy``, ``noisy:MU:SIGMA``, ``oracle``;
    seeded by ``seed``) fills every request's ``predicted_output_tokens`` (``infermax.predictor``).
    Hybrid RT/BE workload (BROS, `workloads_hybrid.hybrid`): ``rt_dataset`` (sharegpt | lmsys lengths)
    with Poisson ``rt_rate`` over ``duration_s`` seconds, plus closed-loop BE batches of ``be_batch``
    requests submitted until ``duration_s``; RT targets are 0.4 s TTFT / 0.2 s TPOT (``slo_ttft_s``
    overrides the first).
    Shared-prefix workload (`workloads_prefix`, requests carry ``content``): ``workload`` is
    ``multiturn`` (``turns`` mean turns per conversation, ``think_time_s`` mean think time; ``arrival``
    starts conversations, ``rate`` in conversations/s), ``system-prompt`` (``system_tokens``) or
    ``few-shot`` (``shots``); the last two take ``prefixes`` (distinct system prompts / tasks) and
    ``prefix_share`` (share of requests using one). ``B`` counts requests; ``input_dist`` /
    ``output_dist``, if given, replace the calibrated user-message and answer lengths. Unset
    parameters take the generator's defaults.
    """

    scheduler: str = "vllm"
    model: str = "llama-2-7b"
    gpu: str = "a100"
    tp: int = 1
    cost_model: str = "auto"
    costmodel_path: str | None = None
    I: int = 512
    O: int = 128
    B: int = 1024
    mix: str | None = None
    dataset: str | None = None
    input_dist: str | None = None
    output_dist: str | None = None
    trace: str | None = None
    trace_limit: int | None = None
    arrival: str | None = None
    rate: float | None = None
    cv: float | None = None
    time_scale: float = 1.0
    C: int = 4096
    P: int | None = None
    M: int | None = None
    gpu_mem_util: float | None = None
    Rmax: int | None = None
    block_size: int = 1
    prefix_caching: bool = False
    seed: int = 0
    slo: str | None = None
    slo_ttft_s: float | None = None
    slo_tbt_s: float | None = None
    host_link_gbps: float | None = None
    rt_dataset: str | None = None
    rt_rate: float | None = None
    be_batch: int = 256
    duration_s: float = 60.0
    predictor: str | None = None
    workload: str | None = None
    turns: float | None = None
    think_time_s: float | None = None
    system_tokens: int | None = None
    shots: int | None = None
    prefixes: int | None = None
    prefix_share: float | None = None

    # Fields added after the sweep results committed under experiments/results/: a sweep point's id
    # leaves each out while it holds its default, so those results stay valid (docs/design.md, Sweeps).
    ID_OMITS_DEFAULT = ("prefix_caching", "workload", "turns", "think_time_s", "system_tokens", "shots", "prefixes", "prefix_share")

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def from_dict(cls, values: dict) -> "RunConfig":
        """Build from a mapping (`plain_values` first: a results table's row works), rejecting unknown keys with the
        list of known ones."""
        unknown = sorted(set(values) - set(cls.field_names()))
        if unknown:
            raise ValueError(f"unknown configuration key(s) {', '.join(unknown)}; known: {', '.join(cls.field_names())}")
        return cls(**plain_values(values))

    def to_dict(self) -> dict:
        return asdict(self)

    def limits(self) -> Limits:
        """The system limits (``M`` derived from the GPU when ``gpu_mem_util`` is set)."""
        from .models import get_gpu, get_model, kv_capacity_tokens

        if self.M is not None and self.gpu_mem_util is not None:
            raise ValueError("give either --M or --gpu-mem-util (M or gpu_mem_util), not both")
        if self.gpu_mem_util is not None:
            kv_tokens = kv_capacity_tokens(get_model(self.model), get_gpu(self.gpu), self.gpu_mem_util, self.tp)
        else:
            kv_tokens = DEFAULT_M if self.M is None else self.M
        return Limits(C=self.C, P=self.P, M=kv_tokens, Rmax=self.Rmax, block_size=self.block_size,
                      prefix_caching=self.prefix_caching)

    def cost(self):
        """The cost model timing the batches."""
        from .costmodel import load_cost_model
        from .models import get_gpu, get_model

        if self.costmodel_path is not None:
            return load_cost_model(path=self.costmodel_path, kind=self.cost_model)
        return load_cost_model(get_gpu(self.gpu).name, get_model(self.model).name, self.tp, kind=self.cost_model)

    def swap_cost(self):
        """The host↔GPU KV copy time model (`SwapCost`)."""
        from .costmodel.swap import SwapCost

        return SwapCost.for_system(self.gpu, self.model, self.tp, self.host_link_gbps)

    def requests(self) -> list[Request]:
        """The workload with its arrival times."""
        from . import workload

        self._check_prefix_options()
        if self.rt_dataset is not None:
            return self._hybrid_requests()
        if self.workload is not None:
            return self._with_targets(self._prefix_requests())
        sources = [name for name, given in (("trace", self.trace), ("mix", self.mix), ("dataset", self.dataset),
                                            ("input_dist/output_dist", self.input_dist or self.output_dist)) if given]
        if len(sources) > 1:
            raise ValueError(f"choose one workload source, got {' and '.join(sources)}")
        arrival = self.arrival
        if not self.trace:
            workload.check_fits_in_memory(self.B, "B (--B)")
        if self.trace:
            requests, has_arrivals = workload.read_trace(self.trace, limit=self.trace_limit)
            if has_arrivals:
                arrival = arrival or "trace"
            elif arrival in (None, "trace"):
                raise ValueError(f"trace {self.trace!r} has no arrived_at column (request lengths only): give it an "
                                 f"arrival process, --arrival poisson|gamma (with --rate) or offline")
        elif self.mix:
            requests = workload.heterogeneous_mix(self.mix, self.B, seed=self.seed)
        elif self.dataset:
            requests = workload.dataset_like(self.dataset, self.B, seed=self.seed)
        elif self.input_dist or self.output_dist:
            for spec in (self.input_dist, self.output_dist):
                if spec:  # a malformed distribution is the error to report, before the pairing rule
                    workload.parse_length_dist(spec)
            if not (self.input_dist and self.output_dist):
                raise ValueError("--input-dist and --output-dist go together (input_dist and output_dist)")
            requests = workload.sampled(self.B, self.input_dist, self.output_dist, seed=self.seed)
        else:
            requests = workload.fixed(self.I, self.O, self.B)
        arrival = arrival or "offline"
        if arrival == "trace" and not self.trace:
            raise ValueError("arrival 'trace' needs a trace")
        # (time_scale given as set: with another process, or out of range, it is an error, as rate and cv are)
        requests = workload.with_arrivals(requests, arrival, rate_per_s=self.rate, cv=self.cv,
                                          time_scale=self.time_scale, seed=self.seed)
        return self._with_targets(requests)

    def _with_targets(self, requests: list[Request]) -> list[Request]:
        """``requests`` with the predictor's output lengths and the latency targets, where configured."""
        from . import workload

        if self.predictor is not None:
            from .predictor import make_predictor, with_predictions

            requests = with_predictions(requests, make_predictor(self.predictor, self.seed, self.dataset))
        ttft, tbt = self.slo_targets()
        return requests if ttft is None and tbt is None else workload.with_slo(requests, ttft, tbt)

    # Shared-prefix parameters: RunConfig field -> (CLI option, the workloads it applies to).
    _PREFIX_OPTIONS = {"turns": ("--turns", ("multiturn",)), "think_time_s": ("--think-time", ("multiturn",)),
                       "system_tokens": ("--system-tokens", ("system-prompt",)), "shots": ("--shots", ("few-shot",)),
                       "prefixes": ("--prefixes", ("system-prompt", "few-shot")),
                       "prefix_share": ("--prefix-share", ("system-prompt", "few-shot"))}

    def _check_prefix_options(self) -> None:
        """Each shared-prefix parameter is given only with a workload it applies to."""
        for name, (option, applies) in self._PREFIX_OPTIONS.items():
            if getattr(self, name) is not None and self.workload not in applies:
                raise ValueError(f"{name} ({option}) applies to --workload {' or '.join(applies)}, "
                                 f"got {'no --workload' if self.workload is None else repr(self.workload)}")

    def _prefix_requests(self) -> list[Request]:
        from . import workload
        from .workloads_prefix import PREFIX_WORKLOADS, prefix_workload

        if self.workload not in PREFIX_WORKLOADS:
            raise ValueError(f"unknown workload {self.workload!r} (--workload); known: {', '.join(PREFIX_WORKLOADS)}")
        others = [name for name, given in (("trace", self.trace), ("mix", self.mix), ("dataset", self.dataset)) if given]
        if others:
            raise ValueError(f"workload {self.workload!r} does not combine with {', '.join(others)}; choose one "
                             f"workload source")
        for spec in (self.input_dist, self.output_dist):
            if spec:
                workload.parse_length_dist(spec)
        workload.check_fits_in_memory(self.B, "B (--B)")
        params = {"message_dist": self.input_dist, "output_dist": self.output_dist,
                  **{name: getattr(self, name) for name, (_, applies) in self._PREFIX_OPTIONS.items()
                     if self.workload in applies and getattr(self, name) is not None}}
        if "turns" in params:
            params["turns_mean"] = params.pop("turns")
        arrival = self.arrival or "offline"
        if arrival == "trace":
            raise ValueError(f"arrival 'trace' needs a trace; workload {self.workload!r} takes offline, poisson or gamma")
        if self.workload == "multiturn":
            return prefix_workload("multiturn", self.B, seed=self.seed, arrival=arrival, rate_per_s=self.rate,
                                   cv=self.cv, **params)
        requests = prefix_workload(self.workload, self.B, seed=self.seed, **params)
        return workload.with_arrivals(requests, arrival, rate_per_s=self.rate, cv=self.cv, seed=self.seed)

    def _hybrid_requests(self) -> list[Request]:
        from .workloads_hybrid import hybrid

        others = [name for name, given in (("trace", self.trace), ("mix", self.mix), ("dataset", self.dataset),
                                           ("input_dist", self.input_dist), ("output_dist", self.output_dist),
                                           ("arrival", self.arrival), ("slo", self.slo), ("slo_tbt_s", self.slo_tbt_s),
                                           ("predictor", self.predictor), ("workload", self.workload))
                  if given]
        if others:
            raise ValueError(f"rt_dataset (hybrid RT/BE workload) does not combine with {', '.join(others)}")
        if self.rt_rate is None:
            raise ValueError("rt_dataset needs rt_rate (RT requests per second)")
        return hybrid(self.rt_dataset, self.rt_rate, self.duration_s, self.be_batch, seed=self.seed,
                      ttft_slo_s=0.4 if self.slo_ttft_s is None else self.slo_ttft_s)

    def slo_targets(self) -> tuple[float | None, float | None]:
        """(TTFT, P99 TBT) targets: the ``slo`` dataset's, overridden by ``slo_ttft_s``/``slo_tbt_s``."""
        from .workload import DATASETS

        ttft = tbt = None
        if self.slo is not None:
            profile = DATASETS.get(self.slo.lower())
            if profile is None:
                raise ValueError(f"unknown SLO preset {self.slo!r}; known: {', '.join(DATASETS)} (or give the targets in "
                                 f"seconds: slo_ttft_s and slo_tbt_s, --slo-ttft and --slo-tbt)")
            ttft, tbt = profile.ttft_slo_s, profile.tbt_slo_s
        for name, value in (("slo_ttft_s", self.slo_ttft_s), ("slo_tbt_s", self.slo_tbt_s)):
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        return (self.slo_ttft_s if self.slo_ttft_s is not None else ttft,
                self.slo_tbt_s if self.slo_tbt_s is not None else tbt)

    def simulate(self, progress: bool = False):
        """Run the simulation; the result's ``meta['config']`` is this configuration."""
        from .engine import simulate

        return simulate(self.requests(), self.scheduler, self.limits(), self.cost(), progress=progress,
                        meta={"config": self.to_dict()}, swap_cost=self.swap_cost(),
                        closed_loop_until_s=self.duration_s if self.rt_dataset is not None else None)

