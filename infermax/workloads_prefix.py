"""Workloads whose prompts share prefixes, for automatic prefix caching (issue 19).

Every request carries ``content`` (`Request`): its prompt as segments ``(segment_id, tokens)``, so
two requests share KV blocks exactly where their contents agree, decided by content and not by a
hit-rate knob. Segment ids are numbered from 0 by each generator; a request's own answer is the
segment `output_segment(id)`, which a later turn of its conversation quotes.

- :func:`multiturn` — conversations: turn ``t``'s prompt is the whole history (every earlier turn's
  user message and answer) followed by its new user message. The number of turns controls the share
  of shared prefix.
- :func:`system_prompt` — one or a few system prompts; a request is a system prompt plus its own
  user message. The system prompt's length and the share of requests using one control the share.
- :func:`few_shot` — ``k`` task templates (an instruction and ``shots`` worked examples) shared by
  the requests of a task, followed by the request's question. ``shots`` controls the share.
- :func:`previous_turn` — the id of the turn a conversation turn follows (its quoted answer).
- :func:`shared_prefix_fraction` — the share of prompt tokens that a request shares with the
  content (prompt and answer) of a request that arrived before it (an upper bound on what a cache
  can hit), the quantity a study across "share of shared prefix" puts on its axis.

Calibration (defaults; each number cited is the published one, the rest are chosen defaults):

- LMSYS-Chat-1M (Zheng et al., ICLR 2024, Table 1): 2.0 turns per conversation on average, 69.5
  tokens per user prompt and 214.5 tokens per response on average. These are the defaults of
  :data:`LMSYS_TURNS_MEAN`, :data:`LMSYS_MESSAGE_MEAN` and :data:`LMSYS_RESPONSE_MEAN`. The table gives
  no spread, so the lengths are lognormal with these means and the coefficients of variation that
  BROS (Table 2, shared/papers/bros.txt) measured on its LMSYS-Chat-1M requests: prompt std 148.52 on
  mean 90.50 (CV 1.64), output std 228.21 on mean 237.04 (CV 0.96). No median is published.
- Turns per conversation: geometric on {1, 2, ...} with mean ``turns_mean`` (chosen shape; with the
  LMSYS mean of 2.0 half of the conversations have one turn). For comparison, CachedAttention (Gao et
  al., USENIX ATC 2024) reports that 73% of ShareGPT conversations have more than one turn.
- Few-shot templates: the vLLM paper (Kwon et al., SOSP 2023, §6.4, Fig. 16) shares a WMT16
  translation prefix of an instruction and 1 example (80 tokens) or 5 examples (341 tokens), i.e.
  about 65 tokens per example and 15 for the instruction: :data:`FEW_SHOT_INSTRUCTION_TOKENS` and
  :data:`FEW_SHOT_EXAMPLE_TOKENS`, 5 shots by default (340 tokens). The question and answer lengths
  (lognormal, mean 50 tokens, CV 0.5) and 4 tasks are chosen defaults; the paper's text gives none.
- System prompts: 1,024 tokens by default, the shortest shared system prompt ChunkAttention (Ye et
  al., ACL 2024) evaluates (1,024 to 4,096 tokens); one system prompt used by every request is a
  chosen default.
- Think time between turns: exponential with mean 30 s, and a response-time estimate of 20 ms per
  output token: chosen defaults (no published statistic found).

Arrivals of conversation turns are open-loop (decision): turn ``t+1`` arrives at turn ``t``'s arrival
plus an estimate of turn ``t``'s response time (``response_s_per_token`` × its output tokens) plus a
think time, fixed when the workload is generated. A client that waits for the real answer would make
arrivals depend on the schedule (closed-loop per conversation); that needs engine support and is
not in scope. Under overload a turn can therefore arrive before the answer it quotes is finished;
its prompt then simply misses the cache for those tokens.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Sequence

import numpy as np

from .request import Request, output_segment, prompt_segment
from .workload import LengthDist, _check_count, _check_int, parse_length_dist, with_arrivals
from .workloads_hybrid import lognormal_lengths

PREFIX_WORKLOADS = ("multiturn", "system-prompt", "few-shot")

# LMSYS-Chat-1M, Table 1 (Zheng et al., ICLR 2024).
LMSYS_TURNS_MEAN = 2.0
LMSYS_MESSAGE_MEAN = 69.5
LMSYS_RESPONSE_MEAN = 214.5
# Coefficients of variation of BROS's LMSYS-Chat-1M requests (BROS Table 2: std / mean).
LMSYS_MESSAGE_CV = 148.52 / 90.50
LMSYS_RESPONSE_CV = 228.21 / 237.04
# vLLM (SOSP 2023) §6.4: 1-shot prefix 80 tokens, 5-shot 341 tokens.
FEW_SHOT_INSTRUCTION_TOKENS = 15
FEW_SHOT_EXAMPLE_TOKENS = 65
# Chosen defaults (no published number found).
FEW_SHOT_SHOTS = 5
FEW_SHOT_TASKS = 4
FEW_SHOT_QA_MEAN = 50.0
FEW_SHOT_QA_CV = 0.5
SYSTEM_PROMPT_TOKENS = 1024  # ChunkAttention's shortest shared system prompt
THINK_TIME_S = 30.0
RESPONSE_S_PER_TOKEN = 0.02
MAX_CONTEXT_TOKENS = 4096  # Llama-2's context window


def _check_real(name: str, value: object, minimum: float, maximum: float = math.inf) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)) \
            or not (math.isfinite(value) and minimum <= value <= maximum):
        bounds = f">= {minimum}" if maximum == math.inf else f"in [{minimum}, {maximum}]"
        raise ValueError(f"{name} must be a finite number {bounds}, got {value!r}")
    return float(value)


def _lengths(rng: np.random.Generator, n: int, dist: str | LengthDist | None, mean: float, cv: float,
             max_tokens: int) -> np.ndarray:
    """``n`` lengths from ``dist`` if given, else lognormal with this mean and CV; clipped to ``max_tokens``."""
    if dist is None:
        return lognormal_lengths(rng, mean, cv * mean, n, max_tokens)
    dist = dist if isinstance(dist, LengthDist) else parse_length_dist(dist)
    return np.minimum(dist.sample(rng, n), max_tokens)


def multiturn(num_requests: int, turns_mean: float = LMSYS_TURNS_MEAN, think_time_s: float = THINK_TIME_S,
              arrival: str = "offline", rate_per_s: float | None = None, cv: float | None = None,
              message_dist: str | LengthDist | None = None, output_dist: str | LengthDist | None = None,
              response_s_per_token: float = RESPONSE_S_PER_TOKEN, max_context_tokens: int = MAX_CONTEXT_TOKENS,
              seed: int = 0) -> list[Request]:
    """``num_requests`` conversation turns; conversations start by ``arrival`` (module docstring).

    Conversation ``c`` has a geometric number of turns with mean ``turns_mean`` (1 = every
    conversation is one request: nothing shared). Turn ``t``'s content is
    ``(m_1, a_1, ..., m_{t-1}, a_{t-1}, m_t)`` where ``m_k`` is turn ``k``'s user message (a segment of
    its own, ``message_dist`` tokens, default LMSYS-Chat-1M's mean 69.5) and ``a_k`` the previous
    request's answer ``(output_segment(id_k), output_tokens_k)`` (``output_dist``, default mean 214.5).
    Turn ``t+1`` arrives ``response_s_per_token × O_t`` plus an exponential think time (mean
    ``think_time_s``; 0 = none) after turn ``t``. Conversation starts follow ``arrival`` (``offline``,
    ``poisson`` or ``gamma`` with ``rate_per_s`` conversations per second and ``cv``, as
    `workload.with_arrivals`). A conversation ends early when its next turn's prompt plus answer would
    exceed ``max_context_tokens``; messages and answers are clipped to half of it. Conversations are
    generated until there are ``num_requests`` turns (the last one may be cut short); ids follow
    arrival order (ties: by conversation, then turn). Deterministic in ``seed``.
    """
    n = _check_count(num_requests)
    turns_mean = _check_real("turns_mean (--turns)", turns_mean, 1.0)
    think_time_s = _check_real("think_time_s (--think-time)", think_time_s, 0.0)
    response_s_per_token = _check_real("response_s_per_token", response_s_per_token, 0.0)
    max_context_tokens = _check_int("max_context_tokens", max_context_tokens, 2)
    if arrival == "trace":
        raise ValueError("multiturn conversations start by an arrival process (offline, poisson or gamma), not 'trace'")
    rng = np.random.default_rng(seed)
    clip = max_context_tokens // 2
    messages = _lengths(rng, n, message_dist, LMSYS_MESSAGE_MEAN, LMSYS_MESSAGE_CV, clip).tolist()
    outputs = _lengths(rng, n, output_dist, LMSYS_RESPONSE_MEAN, LMSYS_RESPONSE_CV, clip).tolist()
    # Conversations as lists of (message, output) turns; a turn whose prompt + answer overflows the
    # context ends the conversation (its lengths go to the next conversation's first turn).
    conversations: list[list[tuple[int, int]]] = []
    k = 0
    while k < n:
        wanted = int(rng.geometric(1.0 / turns_mean))
        turns: list[tuple[int, int]] = []
        context = 0
        while len(turns) < wanted and k < n:
            m, o = messages[k], outputs[k]
            if turns and context + m + o > max_context_tokens:
                break
            turns.append((m, o))
            context += m + o
            k += 1
        conversations.append(turns)
    starts = with_arrivals([Request(c, 0.0, 1, 1) for c in range(len(conversations))], arrival,
                           rate_per_s=rate_per_s, cv=cv, seed=seed)
    think = rng.exponential(think_time_s, n) if think_time_s > 0 else np.zeros(n)
    timeline: list[tuple[float, int, int]] = []  # (arrival_s, conversation, turn)
    k = 0
    for c, turns in enumerate(conversations):
        t_s = starts[c].arrival_s
        for t, (_, o) in enumerate(turns):
            timeline.append((t_s, c, t))
            t_s += response_s_per_token * o + float(think[k])
            k += 1
    timeline.sort()
    request_id = {(c, t): i for i, (_, c, t) in enumerate(timeline)}
    arrival_of = {(c, t): a for a, c, t in timeline}
    requests: list[Request | None] = [None] * n
    segment = 0
    for c, turns in enumerate(conversations):
        history: list[tuple[int, int]] = []
        for t, (m, o) in enumerate(turns):
            rid = request_id[(c, t)]
            content = (*history, (segment, m))
            segment += 1
            requests[rid] = Request(rid, arrival_of[(c, t)], sum(x for _, x in content), o, content=content)
            history = [*content, (output_segment(rid), o)]
    return requests


def previous_turn(request: Request) -> int | None:
    """The id of the turn whose answer ends this turn's history (`multiturn`), else None."""
    if request.content is None or len(request.content) < 2:
        return None
    seg = request.content[-2][0]
    return (-seg - 2) // 2 if seg < 0 and seg % 2 == 0 else None


def _prefixed(num_requests: int, templates: Sequence[tuple[tuple[int, int], ...]], prefix_share: float,
              messages: tuple, outputs: tuple, max_tokens: int, seed: int) -> list[Request]:
    """Requests ``i``, all arriving at 0: with probability ``prefix_share`` a uniformly chosen template,
    then a message segment of its own (numbered after the templates' segments). ``messages`` and
    ``outputs`` are ``(dist, default mean, default CV)`` for `_lengths`, clipped to ``max_tokens``."""
    max_tokens = _check_int("max_tokens", max_tokens)
    rng = np.random.default_rng(seed)
    message_tokens = _lengths(rng, num_requests, *messages, max_tokens)
    output_tokens = _lengths(rng, num_requests, *outputs, max_tokens)
    uses = rng.random(num_requests) < prefix_share
    which = rng.integers(0, len(templates), num_requests)
    first_segment = 1 + max(seg for template in templates for seg, _ in template)
    out = []
    for i in range(num_requests):
        content = (*(templates[which[i]] if uses[i] else ()), (first_segment + i, int(message_tokens[i])))
        out.append(Request(i, 0.0, sum(x for _, x in content), int(output_tokens[i]), content=content))
    return out


def _check_share(prefix_share: float, prefixes: int) -> tuple[float, int]:
    return (_check_real("prefix_share (--prefix-share)", prefix_share, 0.0, 1.0),
            _check_int("prefixes (--prefixes)", prefixes))


def system_prompt(num_requests: int, system_tokens: int = SYSTEM_PROMPT_TOKENS, prefixes: int = 1,
                  prefix_share: float = 1.0, message_dist: str | LengthDist | None = None,
                  output_dist: str | LengthDist | None = None, max_tokens: int = MAX_CONTEXT_TOKENS,
                  seed: int = 0) -> list[Request]:
    """``num_requests`` requests, all arriving at 0: a share ``prefix_share`` of them start with one of
    ``prefixes`` system prompts (segments ``0..prefixes-1`` of ``system_tokens`` tokens each, chosen
    uniformly), then each has its own user message (segment ``prefixes + i``; ``message_dist``, default
    LMSYS-Chat-1M's lengths) and answer (``output_dist``, default LMSYS-Chat-1M's). Messages and answers
    are clipped to ``max_tokens``. Deterministic in ``seed``; apply arrivals with `workload.with_arrivals`.
    """
    n = _check_count(num_requests)
    system_tokens = _check_int("system_tokens (--system-tokens)", system_tokens)
    prefix_share, prefixes = _check_share(prefix_share, prefixes)
    templates = [((k, system_tokens),) for k in range(prefixes)]
    return _prefixed(n, templates, prefix_share, (message_dist, LMSYS_MESSAGE_MEAN, LMSYS_MESSAGE_CV),
                     (output_dist, LMSYS_RESPONSE_MEAN, LMSYS_RESPONSE_CV), max_tokens, seed)


def few_shot(num_requests: int, shots: int = FEW_SHOT_SHOTS, prefixes: int = FEW_SHOT_TASKS,
             prefix_share: float = 1.0, instruction_tokens: int = FEW_SHOT_INSTRUCTION_TOKENS,
             example_tokens: int = FEW_SHOT_EXAMPLE_TOKENS, message_dist: str | LengthDist | None = None,
             output_dist: str | LengthDist | None = None, max_tokens: int = MAX_CONTEXT_TOKENS,
             seed: int = 0) -> list[Request]:
    """``num_requests`` requests over ``prefixes`` tasks, all arriving at 0. Task ``j``'s template is its
    instruction (``instruction_tokens``) and ``shots`` worked examples (``example_tokens`` each), each a
    segment of its own (task ``j`` owns segments ``j·(shots+1) .. j·(shots+1)+shots``). A share
    ``prefix_share`` of the requests use a uniformly chosen task's template; each request then has its
    own question (``message_dist``, default lognormal mean 50, CV 0.5) and answer (``output_dist``, same
    default). Defaults: the vLLM paper's 5-shot prefix (module docstring). Deterministic in ``seed``.
    """
    n = _check_count(num_requests)
    shots = _check_int("shots (--shots)", shots, 0)
    instruction_tokens = _check_int("instruction_tokens", instruction_tokens)
    example_tokens = _check_int("example_tokens", example_tokens)
    prefix_share, prefixes = _check_share(prefix_share, prefixes)
    width = shots + 1
    templates = [((j * width, instruction_tokens), *((j * width + 1 + e, example_tokens) for e in range(shots)))
                 for j in range(prefixes)]
    return _prefixed(n, templates, prefix_share, (message_dist, FEW_SHOT_QA_MEAN, FEW_SHOT_QA_CV),
                     (output_dist, FEW_SHOT_QA_MEAN, FEW_SHOT_QA_CV), max_tokens, seed)


def prefix_workload(name: str, num_requests: int, seed: int = 0, **params) -> list[Request]:
    """The generator ``name`` (one of :data:`PREFIX_WORKLOADS`) with ``params``; unknown names are an error."""
    generators = {"multiturn": multiturn, "system-prompt": system_prompt, "few-shot": few_shot}
    generator = generators.get(str(name).lower())
    if generator is None:
        raise ValueError(f"unknown shared-prefix workload {name!r}; known: {', '.join(PREFIX_WORKLOADS)}")
    return generator(num_requests, seed=seed, **params)


def _content(r: Request) -> tuple[tuple[int, int], ...]:
    """A request's prompt content (a segment of its own when it has none)."""
    return r.content or ((prompt_segment(r.id), r.prompt_tokens),)


def shared_prefix_tokens(requests: Sequence[Request], block_size: int = 1) -> list[int]:
    """Per request (in the given order), the prompt tokens it shares with an earlier-arriving request.

    ``shared[i]`` is the longest common prefix of request ``i``'s prompt content and the content plus
    answer of any request that arrived before it (ties in ``arrival_s``: smaller id first), rounded
    down to a multiple of ``block_size`` (caching is by full blocks). Token ``j`` of segment ``s`` is the
    same token in every request, so equal segments share ``min`` of their lengths and sharing stops at
    the first difference. This is content sharing, an upper bound on what a cache can hit: a request's
    last generated token never has its KV computed (the KV holds ``I + O - 1`` tokens), an engine
    computes at least a prompt's last token, and a finite cache evicts.
    """
    block_size = _check_int("block_size", block_size)
    root: dict = {}  # node: {"kids": {(seg, n): node}, "longest": {seg: max n}}
    shared = [0] * len(requests)
    for i in sorted(range(len(requests)), key=lambda i: (requests[i].arrival_s, requests[i].id)):
        r = requests[i]
        node, count = root, 0
        for seg, tokens in _content(r):
            child = node.get("kids", {}).get((seg, tokens))
            if child is None:
                count += min(tokens, node.get("longest", {}).get(seg, 0))
                break
            count += tokens
            node = child
        shared[i] = count - count % block_size
        node = root
        for seg, tokens in (*_content(r), (output_segment(r.id), r.output_tokens)):
            longest = node.setdefault("longest", {})
            longest[seg] = max(longest.get(seg, 0), tokens)
            node = node.setdefault("kids", {}).setdefault((seg, tokens), {})
    return shared


def shared_prefix_fraction(requests: Sequence[Request], block_size: int = 1) -> float:
    """Share of all prompt tokens that `shared_prefix_tokens` counts as shared (0.0 for no requests)."""
    total = sum(r.prompt_tokens for r in requests)
    return sum(shared_prefix_tokens(requests, block_size)) / total if total else 0.0
