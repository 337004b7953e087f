#!/usr/bin/env bash
# Issue 20 in one call of the device tool: what the machine has, one or more passes of benchmarks/gpu_check.sh
# (profiles, fits and replays), then tests/test_profiling.py (its CUDA tests included). Every step has its own time
# limit and a marker in $OUT/steps.log, so a step that hangs costs its limit, not the whole call, and says which it was.
#
#   run: bash benchmarks/gpu_session.sh                       (timeout_s about 580; CALL_S the same less 20)
#   PASSES="eager:230 graphs" MODELS=llama-3-8b SKIP_PROFILE=1 SCORE=0 CALL_S=560 bash benchmarks/gpu_session.sh
#   dry run on a CPU:  SMOKE=1 OUT=$(mktemp -d) bash benchmarks/gpu_session.sh
#
# PASSES: space-separated `name[:limit_s]`, run in order; `eager` is gpu_check.sh as the caller's environment sets
# it (SKIP_PROFILE=1: replay against the committed fits), `graphs` is gpu_check.sh with GRAPHS=1 (profile, fit and
# replay through CUDA graphs), `graphs-replay` the same against the committed graph-timed fits (GRAPHS=1
# SKIP_PROFILE=1). A pass without a limit gets what is left. SCORE=0 leaves the
# scoring (CPU only) for later: `SCORE_ONLY=runs/gpu_check/<gpu> bash benchmarks/gpu_check.sh` on any machine.
#
# TRACE_CASE=<model>/<case> (e.g. llama-3-8b/vllm-azure): after the passes, kernel traces of a few batches of the
# newest replay of that case (benchmarks/gpu_batch_trace.py, with the fit and kernels the replay used), within
# TRACE_S seconds (default 90, taken from the passes' time), into runs/gpu_check/trace/ (packed) and trace.log.
# SMOKE_PROFILES=DIR (with SMOKE=1): where gpu_check.sh's smoke run writes, so that TRACE_CASE finds it.
#
# Writes $OUT/steps.log, env.txt, gpu_check-<pass>.log per pass, test_profiling.txt and results.tgz
# (profiles/<gpu>*/ and runs/gpu_check/): at most 8 files come back, each small, so they come back even when the call
# is cut short.
#
# Seen on 2026-11-27 (nvidia-h200, Firecracker): `python3` on the PATH had no torch; the image's is
# /opt/torch/.venv/bin/python3, and a symbolic link to it does not work (Python then misses the venv), hence the
# wrapper script below. One python process importing torch, numpy, pandas, scipy, sklearn, typer, rich and
# matplotlib together and calling torch.cuda.get_device_name() then printed nothing for the rest of a 590 s call;
# which import or call hung was not found. The second call that day passed every probe, so the probes now run one
# by one only when the combined one fails (each costs a Python start with torch, a few seconds of device time).
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT (the device tool sets it)}"
# The whole call must end inside the device tool's timeout_s (CALL_S a little less), or nothing is packed: probes are
# cut to PROBE_S each, and the passes get what is left after them, less TAIL_S for the tests and packing.
CALL_S=${CALL_S:-560} PROBE_S=${PROBE_S:-40} TAIL_S=${TAIL_S:-100} TRACE_S=${TRACE_S:-90}
[ -n "${TRACE_CASE:-}" ] || TRACE_S=0
[ -n "${SMOKE_PROFILES:-}" ] && export SMOKE_PROFILES
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
pass_settings() {  # $1 = a pass's name; sets `settings`, gpu_check.sh's environment for it; fails for another name
  case $1 in
    eager) settings=();;
    graphs) settings=(GRAPHS=1 SKIP_PROFILE=);;
    graphs-replay) settings=(GRAPHS=1 SKIP_PROFILE=1);;
    *) return 1;;
  esac
}
for spec in ${PASSES:-eager}; do  # a misspelt pass is refused before any device time is spent
  pass_settings "${spec%%:*}" || { echo "unknown pass '${spec%%:*}' (eager, graphs or graphs-replay)" >&2; exit 2; }
done
step() { echo "[$(date -u +%T) +${SECONDS}s] $*" | tee -a "$OUT/steps.log"; }
pack() { tar czf "$OUT/results.tgz" profiles/h100-* profiles/h200* profiles/*/llama-3-8b runs/gpu_check \
  2>/dev/null; step "packed $(du -h "$OUT/results.tgz" | cut -f1)"; }

if [ -z "${SMOKE:-}" ]; then
  PY=
  for cand in /opt/torch/.venv/bin/python3 /usr/local/bin/python3 /usr/bin/python3; do
    if [ -x "$cand" ] && timeout 60 "$cand" -c "import torch" 2>/dev/null; then PY=$cand; break; fi
  done
  [ -n "$PY" ] || { step "no python with torch found"; exit 3; }
  mkdir -p /tmp/bin
  printf '#!/bin/sh\nexec %s "$@"\n' "$PY" > /tmp/bin/python && chmod +x /tmp/bin/python
  export PATH=/tmp/bin:$PATH
fi
step "python: $(command -v python) -> ${PY:-the python on the PATH}"

{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true; nproc; } > "$OUT/env.txt" 2>&1
probes=("import sys; print(sys.version)"
        "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
        "import torch; print('device', torch.cuda.get_device_name() if torch.cuda.is_available() else 'none')"
        "import numpy, pandas, scipy, sklearn; print('numpy', numpy.__version__, 'pandas', pandas.__version__, 'scipy', scipy.__version__, 'sklearn', sklearn.__version__)"
        "import typer, rich, pyarrow; print('typer', typer.__version__, 'pyarrow', pyarrow.__version__)"
        "import matplotlib; matplotlib.use('Agg'); import matplotlib.pyplot; print('matplotlib', matplotlib.__version__)"
        "import infermax.cli, infermax.profiling.execute, infermax.costmodel.fitting; print('replay imports')")
# Everything at once first (the combination that hung on 2026-11-27 and what gpu-replay imports); only if that fails
# or hangs, each probe alone, and the combination again with one OpenMP thread (two OpenMP runtimes in one process
# are a known cause of import deadlocks), kept for the rest of the call if it helps.
combined="import sys, torch, numpy, pandas, scipy, sklearn, typer, rich, pyarrow, matplotlib
import infermax.cli, infermax.profiling.execute, infermax.costmodel.fitting
print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'numpy', numpy.__version__,
      'pandas', pandas.__version__, 'scipy', scipy.__version__, 'sklearn', sklearn.__version__,
      'typer', typer.__version__, 'pyarrow', pyarrow.__version__, 'matplotlib', matplotlib.__version__)
print('device', torch.cuda.get_device_name() if torch.cuda.is_available() else 'none')"
step "probe: every import at once"
if ! timeout -k 5 "$PROBE_S" python -c "$combined" >> "$OUT/env.txt" 2>&1; then
  step "combined probe failed or timed out: each alone"
  for probe in "${probes[@]}"; do
    step "probe: $probe"
    if ! timeout -k 5 "$PROBE_S" python -c "$probe" >> "$OUT/env.txt" 2>&1; then
      step "probe failed or timed out"
      case $probe in *torch*) step "no usable torch: stopping"; cat "$OUT/env.txt"; exit 4;; esac
    fi
  done
  if OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 timeout -k 5 "$PROBE_S" python -c "$combined" >> "$OUT/env.txt" 2>&1; then
    export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
    step "one OpenMP thread works: kept for the rest of the call"
  fi
fi
# DECODE_KERNEL=varlen / PREFILL_KERNEL=varlen (gpu_check.sh): each kernel is checked first
# (benchmarks/gpu_varlen_check.py: matches the SDPA calls, replays from a CUDA graph); where one fails the passes fall
# back to sdpa for it rather than failing whole.
for phase in decode prefill; do
  var=${phase^^}_KERNEL
  if [ "${!var:-sdpa}" = varlen ] && [ -z "${SMOKE:-}" ]; then
    step "probe: varlen $phase attention"
    if timeout -k 5 "$PROBE_S" python benchmarks/gpu_varlen_check.py --phase "$phase" >> "$OUT/env.txt" 2>&1; then
      step "varlen $phase attention works"
    else
      step "varlen $phase attention failed (env.txt says why): $var=sdpa for this call"
      export "$var"=sdpa
    fi
  fi
done
cat "$OUT/env.txt"

for spec in ${PASSES:-eager}; do
  pass=${spec%%:*} limit=${spec#*:}
  [ "$limit" = "$spec" ] && limit=
  left=$((CALL_S - SECONDS - TAIL_S - TRACE_S))
  if [ -z "$limit" ] || [ "$limit" -gt "$left" ]; then limit=$left; fi
  pass_settings "$pass"
  if [ "$limit" -lt 30 ]; then step "pass $pass: only ${limit}s left, skipped"; continue; fi
  step "pass $pass: gpu_check.sh ${settings[*]} (limit ${limit}s)"
  env "${settings[@]}" timeout -k 10 "$limit" bash benchmarks/gpu_check.sh > "$OUT/gpu_check-$pass.log" 2>&1
  step "pass $pass rc $?"
  tail -40 "$OUT/gpu_check-$pass.log"
  pack
done

if [ -n "${TRACE_CASE:-}" ]; then
  runs_root=runs/gpu_check profiles_root=profiles trace_args=() trace_out=runs/gpu_check/trace
  if [ -n "${SMOKE:-}" ]; then
    : "${SMOKE_PROFILES:?TRACE_CASE with SMOKE=1 needs SMOKE_PROFILES}"
    runs_root=$SMOKE_PROFILES/runs profiles_root=$SMOKE_PROFILES trace_args=(--tiny --device cpu --dtype fp32)
    trace_out=$SMOKE_PROFILES/trace
  fi
  case_dir=$(ls -td "$runs_root"/*/"$TRACE_CASE" "$runs_root"/"$TRACE_CASE" 2>/dev/null | head -1)
  if [ -z "$case_dir" ] || [ ! -f "$case_dir/replay/summary.json" ]; then
    step "trace: no replay of $TRACE_CASE under $runs_root"
  else
    # the replay's cost model ("<family>:<profile folder>/<model>/tp1") and kernels
    read -r family folder kernel prefill_kernel < <(python -c "import json, sys; s = json.load(open(sys.argv[1]))
family, name = s['cost_model'].split(':', 1)
print(family, name.split('/')[0], s.get('decode_kernel', 'sdpa'), s.get('prefill_kernel', 'sdpa'))" \
      "$case_dir/replay/summary.json")
    fit=$profiles_root/$folder/${TRACE_CASE%%/*}/tp1/infermax_$family.json
    step "trace: $case_dir ($fit, decode kernel $kernel, prefill kernel $prefill_kernel; limit ${TRACE_S}s)"
    timeout -k 5 "$TRACE_S" python benchmarks/gpu_batch_trace.py "$case_dir/sim/schedule.json" \
      --model "${TRACE_CASE%%/*}" --decode-kernel "$kernel" --prefill-kernel "$prefill_kernel" --cost-model-file "$fit" \
      ${trace_args[@]+"${trace_args[@]}"} --out "$trace_out" > "$OUT/trace.log" 2>&1
    step "trace rc $?"
    tail -12 "$OUT/trace.log"
    pack
  fi
fi

step "tests/test_profiling.py"
timeout -k 5 $((TAIL_S - 20)) python -m pytest -q -p no:cacheprovider tests/test_profiling.py > "$OUT/test_profiling.txt" 2>&1
step "pytest rc $?"
tail -5 "$OUT/test_profiling.txt"
pack
