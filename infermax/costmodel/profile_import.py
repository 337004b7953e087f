"""Turn a Vidur-format profile folder into InferMax profile folders (one per TP degree), ready to fit.

A Vidur-format folder holds ``mlp.csv`` and optionally ``attention.csv`` and ``all_reduce.csv``.
For each TP degree in ``mlp.csv`` this writes ``<out>/tp<N>/measurements.csv`` and ``profile.json``:

* non-attention operators from ``mlp.csv`` (measured);
* attention from ``attention.csv`` when it has rows for that TP (measured), otherwise **derived** from
  the bundled A100 Llama-3-8B attention sample (``profiles/_sources/``): prefill kernel times ×
  ``q_scale`` (query-head width per GPU, target / source: FLOPs) × the GPUs' peak FLOP/s ratio;
  KV-cache save unchanged (per-token overhead, far below bandwidth; see ``profiles/README.md``);
  decode rows keep their times × the GPUs' bandwidth ratio and their KV length is divided by
  ``kv_scale`` (KV-head width per GPU, target / source: the target reads ``kv_scale`` times the
  bytes per KV token, so its time at ``K`` tokens is the source's at ``K × kv_scale``);
* all-reduce (TP > 1) from ``all_reduce.csv`` or, for a GPU we bundle, Vidur's DGX network profile
  (``profiles/_sources/vidur_network/<gpu>_dgx_all_reduce.csv``; measured).

Derived rows carry their derivation in the ``derivation`` column and are never scored as measurements.
The model is recognised by its shape columns (``n_embd, n_head, n_kv_head, n_expanded_embd``) among
``infermax models``; pass ``model``/``num_layers`` for an unregistered one.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import pandas as pd

from .measurements import (MEASUREMENTS_CSV, PROFILE_JSON, Provenance, import_vidur_all_reduce, import_vidur_attention, import_vidur_mlp,
                           read_measurements, vidur_model_shape, vidur_tp_degrees, write_measurements)

SOURCES = "_sources"
ATTENTION_SAMPLE = "a100_llama3_8b_attention_sample.csv"
SAMPLE_MODEL, SAMPLE_GPU = "llama-3-8b", "a100"
SAMPLE_PROVENANCE = Provenance(
    device="A100", software="Vidur profiler, FlashInfer; versions unrecorded", date="unrecorded (commit 7ac2fe9)",
    source="github.com/sw5sh/cs378-assignment3@7ac2fe9:data/profiling/compute/a100/meta-llama/Meta-Llama-3-8B/"
           "attention.csv (sampled subset)")
VIDUR_SOFTWARE = "Vidur profiler; versions unrecorded"
NETWORK_CITATION = "github.com/microsoft/vidur@e26eb8f:data/profiling/network/{gpu}_dgx/all_reduce.csv"


def _sources_dir() -> Path:
    from . import profiles_dir

    return profiles_dir() / SOURCES


def match_model(shape: dict) -> str | None:
    """The registered model whose shapes match a Vidur ``mlp.csv``'s shape columns, if any."""
    from ..models import MODELS

    for spec in MODELS.values():
        if (spec.hidden_size, spec.num_heads, spec.num_kv_heads, spec.ffn_size) == (
                shape["n_embd"], shape["n_head"], shape["n_kv_head"], shape["n_expanded_embd"]):
            return spec.name
    return None


def derive_attention(target_model: str, tp: int, gpu) -> pd.DataFrame:
    """The bundled A100 Llama-3-8B attention sample scaled to ``target_model`` on ``gpu`` (a name or a
    ``models.GPUSpec``) with ``tp`` (see module doc)."""
    from ..models import get_gpu, get_model

    source, target = get_model(SAMPLE_MODEL), get_model(target_model)
    src_gpu = get_gpu(SAMPLE_GPU)
    try:
        dst_gpu = get_gpu(gpu)
    except ValueError as exc:
        raise ValueError(f"no attention.csv rows for tp={tp}, so attention would be derived from the A100 sample, "
                         f"which needs the GPU's figures: {exc}. Add attention.csv, or give the GPU's figures "
                         f"(infermax fit --gpu-spec)") from None
    q_scale = target.num_heads * target.head_dim / tp / (source.num_heads * source.head_dim)
    kv_scale = target.num_kv_heads * target.head_dim / tp / (source.num_kv_heads * source.head_dim)
    compute_ratio = src_gpu.peak_fp16_tflops / dst_gpu.peak_fp16_tflops
    bandwidth_ratio = src_gpu.memory_bandwidth_gbps / dst_gpu.memory_bandwidth_gbps
    rows = import_vidur_attention(_sources_dir() / ATTENTION_SAMPLE, 1, SAMPLE_PROVENANCE)
    rows["tp"] = tp
    prefill, decode = rows["operator"] == "attn_prefill", rows["operator"] == "attn_decode"
    rows.loc[prefill, "median_ms"] *= q_scale * compute_ratio
    rows.loc[decode, "median_ms"] *= bandwidth_ratio
    rows["kv_cache_size"] = rows["kv_cache_size"].astype(float)
    rows.loc[decode, "kv_cache_size"] /= kv_scale
    rows["derivation"] = (f"scaled from {SAMPLE_MODEL}/{SAMPLE_GPU}: prefill x q_scale {q_scale:g} x flops ratio "
                          f"{compute_ratio:.4g}; save x1; decode x bw ratio {bandwidth_ratio:.4g}, kv / {kv_scale:g}")
    return rows


def import_vidur_folder(path: Path, out: Path, *, gpu: str | None = None, model: str | None = None,
                        tp: int | None = None, num_layers: int | None = None,
                        provenance: Provenance | None = None, gpu_spec=None) -> list[Path]:
    """Write ``out/tp<N>/`` (measurements + profile.json) for each TP degree of ``path/mlp.csv``. ``gpu_spec``
    (a ``models.GPUSpec``) names the GPU and gives its figures (used to derive attention when ``attention.csv``
    lacks the TP degree; ``fitting.fit_profile`` saves it with the fit)."""
    from ..models import GPU_SPEC_KEY, MODELS, gpu_spec_to_dict

    mlp = path / "mlp.csv"
    shape = vidur_model_shape(mlp)
    if gpu_spec is not None and gpu is not None and gpu.lower() != gpu_spec.name:
        raise ValueError(f"--gpu {gpu!r} and the GPU spec's name {gpu_spec.name!r} differ")
    gpu = (gpu or (gpu_spec.name if gpu_spec is not None else None) or path.resolve().parent.name).lower()
    model = model or match_model(shape)
    if model is None:
        raise ValueError(f"{mlp}: shape {shape} matches no registered model ({', '.join(MODELS)}); "
                         "pass --model NAME and --num-layers N")
    if num_layers is None:
        if model not in MODELS:
            raise ValueError(f"model {model!r} is not registered ({', '.join(MODELS)}): pass --num-layers N")
        num_layers = MODELS[model].num_layers
    provenance = provenance or Provenance(device=gpu, software=VIDUR_SOFTWARE, date="not recorded",
                                          source=str(mlp.resolve()))
    degrees = vidur_tp_degrees(mlp)
    if tp is not None and tp not in degrees:
        raise ValueError(f"{mlp}: no rows for tp={tp}; TP degrees present: {degrees}")
    folders = []
    for degree in [tp] if tp is not None else degrees:
        parts = [import_vidur_mlp(mlp, degree, provenance)]
        attention = path / "attention.csv"
        if attention.is_file() and degree in vidur_tp_degrees(attention):
            parts.append(import_vidur_attention(attention, degree, Provenance(
                provenance.device, provenance.software, provenance.date, str(attention.resolve()))))
            attention_origin = "measured"
        else:
            parts.append(derive_attention(model, degree, gpu_spec or gpu))
            attention_origin = "derived from the bundled A100 Llama-3-8B sample"
        network = path / "all_reduce.csv"
        if not network.is_file():
            network = _sources_dir() / "vidur_network" / f"{gpu}_dgx_all_reduce.csv"
        if degree > 1 and network.is_file():
            bundled = network.parent == _sources_dir() / "vidur_network"
            parts.append(import_vidur_all_reduce(network, degree, shape["n_embd"], Provenance(
                f"{gpu.upper()} DGX node", "Vidur collective profiler; versions unrecorded",
                "unrecorded; file of 2024-05-14" if bundled else provenance.date,
                NETWORK_CITATION.format(gpu=gpu) if bundled else str(network.resolve()))))
        folder = out / f"tp{degree}"
        folder.mkdir(parents=True, exist_ok=True)
        write_measurements(pd.concat(parts, ignore_index=True), folder / MEASUREMENTS_CSV)
        profile = {"gpu": gpu, "model": model, "tp": degree, "num_layers": num_layers, "hidden_size": shape["n_embd"],
                   "attention": attention_origin,
                   "communication": "measured all-reduce" if degree > 1 and network.is_file() else
                   ("not applicable (tp=1)" if degree == 1 else "not modelled: no all_reduce.csv")}
        if gpu_spec is not None:
            profile[GPU_SPEC_KEY] = gpu_spec_to_dict(gpu_spec)
        (folder / PROFILE_JSON).write_text(json.dumps(profile, indent=2) + "\n")
        folders.append(folder)
    return folders


def prepare(path: str | Path, out: str | Path | None = None, **options) -> list[Path]:
    """Profile folders to fit from ``path``: ours (``measurements.csv``), a model folder of ``tp<N>``
    subfolders, or a Vidur-format folder (imported into ``out``, default ``path``)."""
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"{path}: not a folder")
    if (path / MEASUREMENTS_CSV).is_file():
        if not (path / PROFILE_JSON).is_file():
            raise ValueError(f"{path}: has {MEASUREMENTS_CSV} but no {PROFILE_JSON} (what was profiled, on what: "
                             f"`infermax profile` writes both)")
        if out is None or Path(out).resolve() == path.resolve():
            return [path]
        read_measurements(path / MEASUREMENTS_CSV)  # (a broken file is named where the user keeps it, not its copy)
        Path(out).mkdir(parents=True, exist_ok=True)
        for name in (MEASUREMENTS_CSV, PROFILE_JSON):
            shutil.copy(path / name, Path(out) / name)
        return [Path(out)]
    if (path / "mlp.csv").is_file():
        return import_vidur_folder(path, Path(out) if out is not None else path, **options)
    subfolders = sorted(p.parent for p in path.glob(f"tp*/{MEASUREMENTS_CSV}"))
    if subfolders and out is None:
        return subfolders
    raise ValueError(f"{path}: expected a profile folder (measurements.csv + profile.json), a folder of tp<N>/ "
                     "profile folders, or a Vidur-format folder (mlp.csv, optional attention.csv, all_reduce.csv)")


def bundle(vidur_root: Path, commit: str, date: str) -> list[Path]:
    """Import every ``<gpu>/<model>/mlp.csv`` under ``vidur_root`` into ``profiles/<gpu>/<model>/``."""
    from . import profiles_dir

    folders = []
    for mlp in sorted(vidur_root.glob("*/*/mlp.csv")):
        gpu, vidur_model = mlp.parent.parent.name, mlp.parent.name
        model = match_model(vidur_model_shape(mlp))
        org = "codellama" if vidur_model.startswith("CodeLlama") else "meta-llama"
        provenance = Provenance(device=gpu.upper(), software=VIDUR_SOFTWARE, date=date,
                                source=f"github.com/microsoft/vidur@{commit}:data/profiling/compute/{gpu}/{org}/{vidur_model}/mlp.csv")
        folders += import_vidur_folder(mlp.parent, profiles_dir() / gpu / model, gpu=gpu, model=model,
                                       provenance=provenance)
    return folders


def main(argv: list[str] | None = None) -> None:
    """Re-create the bundled profiles: ``python -m infermax.costmodel.profile_import VIDUR_ROOT``."""
    from .fitting import error_lines, fit_profile

    parser = argparse.ArgumentParser(description="import and fit every Vidur <gpu>/<model>/mlp.csv under a folder")
    parser.add_argument("vidur_root", type=Path)
    parser.add_argument("--commit", default="bee57da", help="Vidur commit that last changed the mlp.csv files")
    parser.add_argument("--date", default="unrecorded; file of 2024-05-14")
    args = parser.parse_args(argv)
    for folder in bundle(args.vidur_root, args.commit, args.date):
        doc = fit_profile(folder)
        print(f"{folder}: auto = {doc['auto']}")
        print("\n".join(error_lines(doc["heldout_error"])))


if __name__ == "__main__":
    main()
