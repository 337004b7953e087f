"""``infermax fit PROFILE_DIR`` and ``infermax costmodel show``: fit profiles and inspect cost models."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from .common import CostModelKindOpt, CostModelPathOpt, GpuOpt, ModelOpt, TpOpt, app, console, fail, flag

costmodel_app = typer.Typer(no_args_is_help=True, help="Inspect fitted cost models.")
app.add_typer(costmodel_app, name="costmodel")


def _error_table(errors: dict, title: str) -> Table:
    """Held-out MAPE (%) per group and family (rows) and token range (columns), readable at 80 columns:
    a group's name is a row of its own above its families, and on a narrow terminal a range's header splits at
    its dash. The ranges are those the profile measured (`fitting.error_columns`)."""
    from ..costmodel.fitting import error_columns

    ranges = error_columns(errors)
    table = Table(title=title, show_edge=False)
    table.add_column("group / family", overflow="fold")
    for r in ranges:
        table.add_column(r.replace("-", "-\n") if console.width < 100 else r, justify="right", overflow="fold")
    for group, families in errors.items():
        table.add_row(group, *[""] * len(ranges), style="bold")
        for family, cells in families.items():
            values = [cells.get(r, {}).get("mape_pct") for r in ranges]
            table.add_row(f"  {family}", *("-" if v is None else f"{v:.1f}" for v in values))
    return table


@app.command()
def fit(
    profile_dir: Path = typer.Argument(..., help="Profile folder (measurements.csv), a folder of tp<N>/ profiles, "
                                                 "or a Vidur-format folder (mlp.csv [+ attention.csv, all_reduce.csv])."),
    out: Optional[Path] = typer.Option(None, help="Where to write (a Vidur folder gets out/tp<N>/; default: in place)."),
    gpu: Optional[str] = typer.Option(None, help="GPU name for a Vidur folder (default: its parent folder's name)."),
    model: Optional[str] = typer.Option(None, help="Model name for a Vidur folder (default: matched by shape)."),
    tp: Optional[int] = typer.Option(None, help="Only this TP degree of a Vidur folder."),
    num_layers: Optional[int] = typer.Option(None, help="Layers of a model `infermax models` does not know."),
    gpu_spec: Optional[str] = typer.Option(
        None, "--gpu-spec", help="Figures of a GPU `infermax models` does not list, saved with the fit so that "
        "--gpu NAME works afterwards: a JSON file or 'memory_gib=48,peak_fp16_tflops=149.7,"
        "memory_bandwidth_gbps=696[,host_link_gbps=32]' (name: --gpu or the file's 'name')."),
    plots: Annotated[bool, flag("--plots/--no-plots", help="Write one PNG per operator group.")] = True,
) -> None:
    """Fit the linear and piecewise cost models to a profile; write their JSONs, plots and error table.

    Any GPU: the fit needs only the measurements; the roofline comparison needs the GPU's figures (a listed
    GPU's, or --gpu-spec) and is skipped with a note otherwise."""
    from ..costmodel.fitting import LINEAR_JSON, fit_profile
    from ..costmodel.profile_import import prepare
    from ..jsonio import read_json

    try:
        spec = _parse_gpu_spec(gpu_spec, gpu, profile_dir) if gpu_spec is not None else None
        folders = prepare(profile_dir, out, gpu=gpu, model=model, tp=tp, num_layers=num_layers, gpu_spec=spec) \
            if (profile_dir / "mlp.csv").is_file() else prepare(profile_dir, out)
        for folder in folders:
            doc = fit_profile(folder, plots=plots, gpu_spec=spec)
            console.print(_error_table(doc["heldout_error"], f"{folder}: held-out MAPE % (auto = {doc['auto']})"))
            fit_info = read_json(folder / LINEAR_JSON).get("fit", {})
            if fit_info.get("prefill_intercept_held"):
                console.print(f"linear fit: {fit_info['prefill_intercept_held']}", highlight=False)
            if fit_info.get("lm_head_per_batch_ms"):
                console.print(f"LM head: {fit_info['lm_head_per_batch_ms']:.4g} ms per batch (its one-row time, in "
                              f"non-attention)", highlight=False)
            if "roofline" in doc:
                console.print(f"roofline {doc['roofline']}", highlight=False)
            if spec is not None:
                console.print(f"GPU spec of {spec.name!r} saved in {folder / 'profile.json'}", highlight=False)
    except (ValueError, FileNotFoundError, KeyError) as exc:
        fail(str(exc))


def _parse_gpu_spec(text: str, gpu: Optional[str], profile_dir: Path):
    """``--gpu-spec``: a JSON file, or ``key=value`` pairs separated by commas (see ``models.gpu_spec_from_dict``).
    The GPU's name: ``--gpu``, else the file's ``name``, else the profile's (a Vidur folder's parent folder, or
    ``profile.json``'s ``gpu``)."""
    import json

    from ..jsonio import read_json
    from ..models import gpu_spec_from_dict

    if gpu is None and (profile_dir / "mlp.csv").is_file():
        gpu = profile_dir.resolve().parent.name
    elif gpu is None and (profile_dir / "profile.json").is_file():
        gpu = json.loads((profile_dir / "profile.json").read_text()).get("gpu")

    path = Path(text)
    if path.is_file():
        doc = read_json(path)
        return gpu_spec_from_dict(doc, (doc.get("name") if isinstance(doc, dict) else None) or gpu, str(path))
    doc = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        try:
            doc[key.strip()] = float(value)
        except ValueError:
            sep = ""
        if not sep:
            raise ValueError(f"--gpu-spec: {item!r} is not key=number (or {text!r} is not a file)")
    return gpu_spec_from_dict(doc, gpu, "--gpu-spec")


def _coefficient_lines(coef_s: dict[str, float]) -> str:
    """One line per plain coefficient, and one per counted quantity for its steps ``[count > t]`` (``t: height``)."""
    from ..costmodel.base import token_step

    lines, steps = [], {}
    for f, c in coef_s.items():
        step = token_step(f)
        if step is None:
            lines.append(f"{f}={c:.4g}")
        else:
            steps.setdefault(step[0], []).append(f"{step[1]}: {c:.3g}")
    lines += [f"steps '{count} > t' (t: height): " + ", ".join(cells) for count, cells in steps.items()]
    return "\n".join(lines)


@costmodel_app.command("show")
def show(model: ModelOpt = "llama-2-7b", gpu: GpuOpt = "a100", tp: TpOpt = 1, cost_model: CostModelKindOpt = "auto",
         costmodel: CostModelPathOpt = None) -> None:
    """Print a cost model's terms (coefficients per affine piece) and its profile's error table."""
    from ..costmodel import load_cost_model, profile_folder
    from ..jsonio import read_json

    try:
        cost = load_cost_model(gpu, model, tp, path=costmodel, kind=cost_model)
    except (ValueError, FileNotFoundError) as exc:
        fail(str(exc))
    # One small table per term (its pieces as rows), so the coefficients get most of an 80-column terminal.
    console.print(f"{cost.name}: batch time = sum of terms, each the max of its pieces (seconds)",
                  highlight=False, soft_wrap=False)
    for term in cost.milp_terms():
        terms = Table(title=f"{term.name} (active if {term.active_if} > 0)", title_justify="left", show_edge=False)
        terms.add_column("piece", justify="right")
        terms.add_column("intercept_s", justify="right")
        terms.add_column("coefficients (s per unit)", overflow="fold", ratio=1)
        for i, piece in enumerate(term.pieces):
            terms.add_row(str(i + 1), f"{piece.intercept_s:.4g}", _coefficient_lines(piece.coef_s) or "-")
        console.print(terms)
    console.print("n_tokens_pad<q> = n_tokens rounded up to a multiple of q; decode_kv_max_cap<K> = min(longest "
                  "decode KV read, K); prefill_ctx_cap<K> = Σ over prefill chunks of c·min(m, K); steps "
                  "'n_tokens > t': the height added when n_tokens exceeds t", highlight=False)
    if costmodel is not None:
        errors = getattr(cost, "doc", {}).get("fit", {}).get("heldout_error")
    else:
        profile = profile_folder(gpu, model, tp) / "profile.json"
        errors = read_json(profile).get("heldout_error") if profile.is_file() else None
    if errors:
        console.print(_error_table(errors, "held-out MAPE % by token range (roofline: error against measured rows)"))
    else:
        console.print("no error table: this model has no fitted profile (roofline error is in profiles/README.md)")
