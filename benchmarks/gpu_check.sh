#!/usr/bin/env bash
# Issue 4 on a GPU, in one call: profile Llama-2-7B and Llama-3-8B (TP 1) into profiles/<gpu>/<model>/tp1/,
# fit them, simulate vLLM and Sarathi on B=64 I=512 O=128 and on an Azure-conversation slice, execute every
# schedule with gpu-replay and print the fit-error and simulated-vs-measured tables.
#
#   bash benchmarks/gpu_check.sh            # everything
#   MODELS=llama-3-8b bash benchmarks/gpu_check.sh
#   SMOKE=1 bash benchmarks/gpu_check.sh    # the same steps on a CPU, tiny shapes, into a temporary folder
#   SCORE=0 ...                              # on the GPU: replay only; score later, without a GPU, with
#   SCORE_ONLY=runs/gpu_check/h200 bash benchmarks/gpu_check.sh   # (both fits of each replay, and the tables)
#
# Needs PyTorch with CUDA importable by `python` (pip install -e ".[gpu]"). Results: profiles/<gpu>/<model>/tp1/
# (commit these) and runs/gpu_check/<gpu>/ (batches.csv, requests.csv, summary.json per replay; copy what a
# report uses into profiles/<gpu>/replays/<date>/ as profiles/README.md says).
# Measured on an H200 (2026-11-27, 8-batch warm-up): profile with the full grid 20 s per model, fit 20 s (hidden
# behind the next profile), 6 replays with their scoring about 2.8 min per model: 312 s for both. gpu-replay now
# runs every schedule once untimed first (its default warm-up), which adds roughly the replays' GPU time, about
# 1.5 min per model: with the device tool's 15 minutes, run one model per call, e.g.
#   MODELS=llama-3-8b SKIP_PROFILE=1 bash benchmarks/gpu_session.sh   (SKIP_PROFILE: replay against the committed fits)
# Through CUDA graphs (GRAPHS=1, H200, 2026-11-30): profiles 20 and 24 s, both fits at once 12 s, then per model the
# fixed-grid and optimize replays about 80 s and each Azure replay 95 to 100 s (every batch captured): both models
# need about 11 minutes, more than one call; the second model's Azure replays went into a second call.
set -euo pipefail
cd "$(dirname "$0")/.."
MODELS=${MODELS:-"llama-2-7b llama-3-8b"}
GRID=${GRID:-full}
# Azure-conversation slice: the first 100 requests less those longer than the model's context (Llama-2-7B's 4,096
# positions: 6 of the 100 need up to 4,175; a server would refuse them, and replaying them indexes past the rotary
# table; Llama-3-8B's 8,192 keep all 100), arrivals 10x compressed so that batches overlap; M = 40,000 tokens keeps
# every request's KV range (its peak I + O - 1) inside the GPU's memory. Written to $RUNS/<model>/azure-conv-slice.csv.
# (Until 2026-11-30 one slice served every model in $MODELS, cut to the shortest context among them.)
TRACE_ARGS=(--time-scale 0.1 --M 40000)
WORKLOADS=${WORKLOADS:-"fixed azure"}
# SKIP_PROFILE=1: use the profile already in profiles/<gpu>/<model>/tp1 (a follow-up call that only replays).
FIXED_ARGS=(--B 64 --I 512 --O 128)
DEV_ARGS=(--dtype bf16)
# GRAPHS=1: profile and replay through CUDA graphs (the GPU's work without launch gaps), into profiles/<gpu>-graphs/
# and runs/gpu_check/<gpu>-graphs/, beside the eager ones. GPU only.
[ -n "${GRAPHS:-}" ] && DEV_ARGS+=(--cuda-graphs)
# DECODE_PADDING: gpu-replay's --decode-padding (default 1.25; inf: one padded decode call per batch, as until
# 2026-11-29), e.g. to measure both in one call.
REPLAY_ARGS=()
[ -n "${DECODE_PADDING:-}" ] && REPLAY_ARGS+=(--decode-padding "$DECODE_PADDING")
# Schedules from `infermax optimize` replayed too (space-separated files; benchmarks/gpu_schedules/README.md says how
# they were made): made ahead on this repository's H100 model, since the GPU image lacks HiGHS.
OPT_SCHEDULES=${OPT_SCHEDULES-"benchmarks/gpu_schedules/optimize-I64-O4-B8.json benchmarks/gpu_schedules/optimize-I512-O128-B64.json"}
PROFILES=profiles
# DECODE_KERNEL=varlen: profile and replay decode attention as one variable-length FlashAttention call per batch
# (`--decode-kernel varlen`; default sdpa, the grouped padded calls), into profiles/<gpu>[-graphs]-varlen/ and
# runs/gpu_check/<gpu>[-graphs]-varlen/, beside the others. PREFILL_KERNEL=varlen: the same for a batch's prefill
# chunks (`--prefill-kernel varlen`: one causal call and one K/V write for them all; default sdpa, one of each per
# chunk), adding -pvarlen to those folder names.
KERNEL_SUFFIX=
case ${DECODE_KERNEL:-sdpa} in
  sdpa) ;;
  varlen) KERNEL_SUFFIX=-varlen;;
  *) echo "error: DECODE_KERNEL must be sdpa or varlen, got '$DECODE_KERNEL'" >&2; exit 2;;
esac
case ${PREFILL_KERNEL:-sdpa} in
  sdpa) ;;
  varlen) KERNEL_SUFFIX=$KERNEL_SUFFIX-pvarlen;;
  *) echo "error: PREFILL_KERNEL must be sdpa or varlen, got '$PREFILL_KERNEL'" >&2; exit 2;;
esac

if [ -n "${SCORE_ONLY:-}" ]; then  # no GPU: score the replays in $SCORE_ONLY (runs/gpu_check/<gpu>, made with SCORE=0)
  RUNS=$SCORE_ONLY GPU=$(basename "$SCORE_ONLY") MODELS=
elif [ -n "${SMOKE:-}" ]; then  # CPU, tiny model (max position 512), small workloads, nothing written to the repository
  GPU=cpu GRID=tiny
  DEV_ARGS=(--dtype fp32 --device cpu --tiny)
  FIXED_ARGS=(--B 8 --I 64 --O 8 --C 256)
  TRACE_ARGS=(--B 8 --input-dist uniform:16:200 --output-dist uniform:2:16 --arrival poisson --rate 50 --C 256)
  OPT_SCHEDULES=benchmarks/gpu_schedules/optimize-I64-O4-B8.json  # the other exceeds the tiny model's 512 positions
  export INFERMAX_PROFILES=${SMOKE_PROFILES:-$(mktemp -d)}  # (gpu_session.sh's TRACE_CASE reads it from there)
  PROFILES=$INFERMAX_PROFILES
  RUNS=$PROFILES/runs
else
  python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA GPU visible to PyTorch')"
  GPU=$(python -c "import torch; from infermax.profiling.runner import gpu_key; print(gpu_key(torch.cuda.get_device_name(), 'cuda'))")
  RUNS=runs/gpu_check/$GPU${GRAPHS:+-graphs}$KERNEL_SUFFIX
fi
[ "${DECODE_KERNEL:-sdpa}" = varlen ] && DEV_ARGS+=(--decode-kernel varlen)
[ "${PREFILL_KERNEL:-sdpa}" = varlen ] && DEV_ARGS+=(--prefill-kernel varlen)
mkdir -p "$RUNS"
echo "device: $GPU"
SECONDS=0

declare -A FOLDER FITPID
profile_model() {  # $1 = model; sets FOLDER[$1]
  local model=$1 pgpu=$GPU${GRAPHS:+-graphs}$KERNEL_SUFFIX
  # The bundled profiles/h100/llama-2-7b is Vidur's (imported); never overwrite a profile we did not measure:
  # ours then goes to profiles/<gpu>-pytorch/<model>/.
  local existing="$PROFILES/$pgpu/$model/tp1/measurements.csv"
  if [ -f "$existing" ] && ! grep -q "infermax profile" "$existing"; then pgpu="$pgpu-pytorch"; fi
  # A committed profile of ours is not rewritten by a new run either (OVERWRITE=1 to replace it): the new one goes to
  # profiles/<gpu>-<UTC date and time>/<model>/.
  existing="$PROFILES/$pgpu/$model/tp1/measurements.csv"
  if [ -z "${SKIP_PROFILE:-}" ] && [ -z "${OVERWRITE:-}" ] && [ -f "$existing" ]; then
    pgpu="$pgpu-${STAMP:=$(date -u +%Y%m%d-%H%M)}"
  fi
  FOLDER[$model]="$PROFILES/$pgpu/$model"
  if [ -n "${SKIP_PROFILE:-}" ]; then
    if [ ! -f "${FOLDER[$model]}/tp1/profile.json" ]; then  # e.g. GRAPHS=1 before any graphs profile exists
      echo "error: SKIP_PROFILE=1 but ${FOLDER[$model]}/tp1 has no fitted profile (profile.json); run without SKIP_PROFILE" >&2
      exit 2
    fi
    echo "using ${FOLDER[$model]}/tp1 as profiled"; return
  fi
  python -m infermax profile --model "$model" --tp 1 "${DEV_ARGS[@]}" --grid "$GRID" --out "${FOLDER[$model]}" \
    --gpu "$pgpu" --no-progress
  echo "[$SECONDS s] profiled $model into ${FOLDER[$model]}/tp1"
}

azure_slice() {  # $1 = model: writes its Azure slice and prints the file's path
  local path="$RUNS/$1/azure-conv-slice.csv"
  mkdir -p "$RUNS/$1"
  [ -f "$path" ] || python - "$path" "$1" <<'EOF' >&2
import sys
import pandas as pd
from infermax.models import get_model
from infermax.workload import trace_path
context = get_model(sys.argv[2]).max_position
rows = pd.read_csv(trace_path("azure-conv")).head(100)
kept = rows[rows.num_prefill_tokens + rows.num_decode_tokens - 1 <= context]
kept.to_csv(sys.argv[1], index=False)
print(f"Azure slice for {sys.argv[2]}: {len(kept)} of the first 100 azure-conv requests fit {context} positions")
EOF
  echo "$path"
}

score_case() {  # $1 = a replay folder, $2 = model, $3 = profile folder: the one measured run scored against both fits
  local family
  for family in linear piecewise; do  # no GPU needed
    python -m infermax gpu-replay "$1/sim/schedule.json" --measured "$1/replay" --model "$2" \
      --cost-model-file "$3/tp1/infermax_$family.json" --out "$1/score-$family" > /dev/null
  done
}

replay_model() {  # $1 = model: simulate vLLM and Sarathi on both workloads, then replay those and $OPT_SCHEDULES
  local model=$1
  # The fitted family with the lower held-out error (profile.json's auto), by file: RunConfig resolves --gpu only
  # for registered GPUs, and <gpu>-pytorch is not one.
  local cost="${FOLDER[$model]}/tp1/infermax_$(python -c "import json,sys; print(json.load(open(sys.argv[1]))['auto'])" \
    "${FOLDER[$model]}/tp1/profile.json").json"
  local sched work out args
  for sched in vllm sarathi; do
    for work in $WORKLOADS; do
      if [ "$work" = fixed ]; then args=("${FIXED_ARGS[@]}"); else args=("${TRACE_ARGS[@]}"); fi
      if [ "$work" = azure ] && [ -z "${SMOKE:-}" ]; then args+=(--trace "$(azure_slice "$model")"); fi
      out="$RUNS/$model/$sched-$work"
      python -m infermax simulate -s "$sched" --cost-model-file "$cost" --model "$model" "${args[@]}" --out "$out/sim" \
        --no-progress --json > /dev/null
    done
  done
  mkdir -p "$RUNS/$model"
  for path in $OPT_SCHEDULES; do
    out="$RUNS/$model/$(basename "$path" .json)"
    mkdir -p "$out/sim"; cp "$path" "$out/sim/schedule.json"
  done
  # Fixed grid first, then the optimize schedules, then the Azure slice (the longest to capture and replay): a call cut
  # short by its time limit keeps the cheap, comparable cases.
  for out in "$RUNS/$model"/*-fixed/ "$RUNS/$model"/optimize-*/ "$RUNS/$model"/*-azure/; do
    out=${out%/}
    [ -f "$out/sim/schedule.json" ] || continue
    if python -m infermax gpu-replay "$out/sim/schedule.json" --cost-model-file "$cost" --model "$model" \
        "${DEV_ARGS[@]}" ${REPLAY_ARGS[@]+"${REPLAY_ARGS[@]}"} --out "$out/replay" --no-progress > "$out/replay.log" 2>&1; then
      [ "${SCORE:-1}" = 0 ] || score_case "$out" "$model" "${FOLDER[$model]}"
      echo "[$SECONDS s] replayed $model $(basename "$out")"
    else
      echo "FAILED: gpu-replay $out (see $out/replay.log)"; tail -5 "$out/replay.log"
    fi
  done
}

# Every model is profiled first, then all are fitted at once (CPU only, about 20 s each on 4 threads), then
# replayed: nothing runs beside a GPU measurement. (Until 2026-11-27 each fit ran in the background while the next
# model was profiled and replayed, and launch-bound timings depend on the host.)
for model in $MODELS; do profile_model "$model"; done
for model in $MODELS; do
  if [ -n "${SKIP_PROFILE:-}" ]; then (true) & else
    (OMP_NUM_THREADS=4 python -m infermax fit "${FOLDER[$model]}" > "$RUNS/fit-$model.log" 2>&1) &
  fi
  FITPID[$model]=$!
done
FITTED=
for model in $MODELS; do
  if wait "${FITPID[$model]}"; then
    echo "[$SECONDS s] fitted $model"; FITTED+=" $model"
  else
    echo "FAILED: infermax fit ${FOLDER[$model]} (see $RUNS/fit-$model.log)"
    cat "$RUNS/fit-$model.log"
  fi
done
for model in $FITTED; do replay_model "$model"; done
if [ -n "${SCORE_ONLY:-}" ]; then
  for out in "$RUNS"/*/*/replay; do
    out=${out%/replay} model=$(basename "$(dirname "${out%/replay}")")
    score_case "$out" "$model" "$PROFILES/$GPU/$model"
  done
fi

for model in $MODELS; do sed -n '/held-out/,$p' "$RUNS/fit-$model.log" | head -40 || true; done
python - "$RUNS" <<'EOF'
import json, sys
from pathlib import Path

print("\n| model | schedule | workload | cost model | batches | per-batch MAPE | prefill / decode / mixed MAPE | "
      "e2e latency error | per-request latency MAPE | makespan error |")
print("|---|---|---|---|---|---|---|---|---|---|")
for path in sorted(Path(sys.argv[1]).glob("*/*/score-*/summary.json")):
    s = json.loads(path.read_text())
    model, (sched, work), family = path.parts[-4], path.parts[-3].split("-", 1), path.parts[-2][len("score-"):]
    by_kind = s["per_batch_mape_pct_by_kind"]
    kinds = " / ".join(f"{by_kind[k]:.1f}%" if k in by_kind else "-" for k in ("prefill", "decode", "mixed"))
    print(f"| {model} | {sched} | {work} | {family} | {s['batches']} | {s['per_batch_mape_pct']:.1f}% | {kinds} | "
          f"{s['e2e_latency_error_pct']:+.1f}% | {s['per_request_latency_mape_pct']:.1f}% | "
          f"{s['makespan_error_pct']:+.1f}% |")
EOF
echo "total: $SECONDS s"
