"""One PNG per operator group: measurements, the linear and piecewise fits, and their residuals."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .base import padding_quantum, token_step


def plot_group(fit, path: Path, title: str) -> None:
    """Top: measured whole-model ms and both fits against the group's token count (log-log); bottom:
    residuals in percent. ``fit`` is a ``fitting.GroupFit``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    group = fit.group
    order = np.argsort(group.tokens, kind="stable")
    tokens, y = group.tokens[order], group.y_ms[order]
    linear = fit.linear.predict(group.columns(group.linear_features))[order]
    piecewise = fit.piecewise.predict(group.x)[order]
    key = "prefill chunk size" if group.gate == "n_prefill_seqs" else "batch size" if group.gate == "n_decode_seqs" else "tokens"
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    top.scatter(tokens, y, s=8, color="black", label="measured" if group.measured.all() else "measured / derived")
    single = all(f == "n_tokens" or padding_quantum(f) or token_step(f) for f in group.features)  # a function of tokens alone
    style = {"lw": 1.2} if single else {"ls": "none", "marker": "."}
    top.plot(tokens, linear, color="tab:blue", label="linear (paper)", **style)
    top.plot(tokens, piecewise, color="tab:red", label=f"piecewise ({fit.piecewise.pieces} pieces)", **style)
    top.set_xscale("log")
    top.set_yscale("log")
    top.set_ylabel("batch time, ms (all layers)")
    top.set_title(f"{title}: {group.name.replace('_', ' ')}")
    top.legend()
    bottom.scatter(tokens, 100 * (linear - y) / y, s=6, color="tab:blue", label="linear")
    bottom.scatter(tokens, 100 * (piecewise - y) / y, s=6, color="tab:red", label="piecewise")
    bottom.axhline(0, color="gray", lw=0.8)
    bottom.set_xlabel(key)
    bottom.set_ylabel("residual, %")
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)
