"""``infermax schedulers`` and ``infermax models``: what is registered and known."""

from __future__ import annotations

from rich.table import Table

from .common import app, console


@app.command()
def schedulers() -> None:
    """List the registered schedulers."""
    from ..schedulers import available, get_spec

    table = Table(title="registered schedulers")
    table.add_column("name", no_wrap=True)
    table.add_column("description")
    table.add_column("prefix caching", justify="center")
    for name in available():
        spec = get_spec(name)
        table.add_row(name, spec.description, "yes" if spec.supports_prefix_caching else "")
    console.print(table)


@app.command()
def models() -> None:
    """List the known models, GPUs and fitted cost-model profiles."""
    from ..costmodel import available_profiles
    from ..models import GPUS, MODELS

    table = Table(title="models")
    table.add_column("name", no_wrap=True)
    for col in ("layers", "hidden", "heads", "kv heads", "ffn", "params (B)", "KV KiB per token"):
        table.add_column(col, justify="right", overflow="fold")
    for m in MODELS.values():
        table.add_row(m.name, str(m.num_layers), str(m.hidden_size), str(m.num_heads), str(m.num_kv_heads),
                      str(m.ffn_size), f"{m.num_params / 1e9:.2f}", f"{m.kv_bytes_per_token() / 1024:.0f}")
    console.print(table)
    gpus = Table(title="GPUs")
    for col in ("name", "memory GiB", "fp16 TFLOP/s", "GB/s"):
        gpus.add_column(col, overflow="fold")
    for g in GPUS.values():
        gpus.add_row(g.name, f"{g.memory_bytes / 2**30:.0f}", f"{g.peak_fp16_tflops:g}", f"{g.memory_bandwidth_gbps:g}")
    console.print(gpus)
    console.print("fitted cost models (gpu/model): " + (", ".join(f"{g}/{m}" for g, m in available_profiles()) or "none"))
