"""The hidden-cache recompute cost (Apt-Serve's hybrid cache), derived from model shapes and a fitted model.

A request holding its cache in *hidden* form stores each layer's input ``x`` instead of ``K = W_k x``
and ``V = W_v x``; every batch that processes it must first project the K and V of all its cached
tokens again, in every layer. ``BatchFeatures.hidden_recompute_tokens`` counts those rows (the ``m``
cached tokens of every hidden-form item). Their cost is the K/V-projection share of the
non-attention operators: a GEMM of ``H`` rows against ``W_k, W_v`` costs ``share`` times what the
fitted non-attention operators cost for a batch of ``H`` tokens, where ``share`` is the fraction of
a layer's matmul weights (and so of its FLOPs and weight bytes) that ``W_k, W_v`` hold::

    share = 2·h·kv_dim / (h·q_dim + 2·h·kv_dim + q_dim·h + (3 if gated else 2)·h·ffn)

(0.1658 for Llama-2-7B; tensor parallelism splits every matrix alike, so ``share`` is TP-invariant).
The term is gated on ``hidden_recompute_tokens`` and is each non-attention piece scaled by
``share`` with ``n_tokens`` replaced by ``hidden_recompute_tokens``: still a max of affine pieces,
so a MILP represents it exactly. Batch-level (embedding) parts of the linear model are excluded. A
piece's padded-token coefficients (``n_tokens_pad<q>``) are added to its per-token one: the recompute
GEMM is priced without tile padding (an underestimate of at most ``q − 1`` rows' cost), since the
batch features do not carry the padded recompute row count. A step ``n_tokens_gt<t>`` becomes the same
step of the recompute row count, ``hidden_recompute_tokens_gt<t>``.
"""

from __future__ import annotations

from .base import AffinePiece, CostTerm, padding_quantum, step_name, token_step

HIDDEN_TERM = "hidden_recompute"
HIDDEN_FEATURE = "hidden_recompute_tokens"


def kv_projection_share(model: str) -> float | None:
    """Share of a layer's matmul weights that are ``W_k`` and ``W_v`` (None: model not registered)."""
    from ..models import MODELS

    spec = MODELS.get(str(model).lower())
    if spec is None:
        return None
    h, q_dim, kv_dim = spec.hidden_size, spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    total = h * q_dim + 2 * h * kv_dim + q_dim * h + (3 if spec.gated_mlp else 2) * h * spec.ffn_size
    return 2 * h * kv_dim / total


def hidden_recompute_term(non_attention: CostTerm, share: float) -> CostTerm:
    """The hidden-recompute term: ``share`` × the non-attention term evaluated at ``hidden_recompute_tokens``."""
    def coefficients(piece: AffinePiece) -> dict[str, float]:
        coef = {HIDDEN_FEATURE: share * sum(c for f, c in piece.coef_s.items()
                                            if f == "n_tokens" or padding_quantum(f) is not None)}
        for f, c in piece.coef_s.items():
            step = token_step(f)
            if step is not None and step[0] == "n_tokens":
                coef[step_name(HIDDEN_FEATURE, step[1])] = share * c
        return coef

    return CostTerm(HIDDEN_TERM, HIDDEN_FEATURE, tuple(AffinePiece(share * p.intercept_s, coefficients(p))
                                                      for p in non_attention.pieces))


def no_share_error(model: str) -> ValueError:
    return ValueError(f"cannot time hidden-cache recompute for model {model!r}: it is not a registered model, so its "
                      f"K/V projection share is unknown (see `infermax models`)")
