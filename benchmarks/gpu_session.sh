#!/usr/bin/env bash
# Issue 20 in one call of the device tool: what the machine has, the profiles, fits and replays of
# benchmarks/gpu_check.sh, then tests/test_profiling.py (its CUDA test included). Every step has its own time limit
# and a marker in $OUT/steps.log, so a step that hangs costs its limit, not the whole call, and says which it was.
#
#   run: bash benchmarks/gpu_session.sh                       (timeout_s about 560; MAIN_S=420 for gpu_check.sh)
#   dry run on a CPU:  SMOKE=1 OUT=$(mktemp -d) bash benchmarks/gpu_session.sh
#
# Writes $OUT/steps.log, env.txt, gpu_check.log, test_profiling.txt and results.tgz (profiles/<gpu>*/ and
# runs/gpu_check/): at most 8 files come back, each small, so they come back even when the call is cut short.
#
# Seen on 2026-11-27 (nvidia-h200, Firecracker): `python3` on the PATH had no torch; the image's is
# /opt/torch/.venv/bin/python3, and a symbolic link to it does not work (Python then misses the venv), hence the
# wrapper script below. One python process importing torch, numpy, pandas, scipy, sklearn, typer, rich and
# matplotlib together and calling torch.cuda.get_device_name() then printed nothing for the rest of a 590 s call;
# which import or call hung was not found (that run had no per-step limits), so each is a step of its own here.
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT (the device tool sets it)}"
MAIN_S=${MAIN_S:-420}
# The whole call must end inside the device tool's timeout_s (pass the same number as CALL_S), or nothing is packed:
# probes are cut to PROBE_S each, and gpu_check.sh gets what is left after them, less TAIL_S for the tests and packing.
CALL_S=${CALL_S:-560} PROBE_S=${PROBE_S:-40} TAIL_S=${TAIL_S:-100}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
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
for probe in "import sys; print(sys.version)" \
             "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" \
             "import torch; print('device', torch.cuda.get_device_name() if torch.cuda.is_available() else 'none')" \
             "import numpy, pandas, scipy, sklearn; print('numpy', numpy.__version__, 'pandas', pandas.__version__, 'scipy', scipy.__version__, 'sklearn', sklearn.__version__)" \
             "import typer, rich, pyarrow; print('typer', typer.__version__, 'pyarrow', pyarrow.__version__)" \
             "import matplotlib; matplotlib.use('Agg'); import matplotlib.pyplot; print('matplotlib', matplotlib.__version__)" \
             "import infermax.cli; print('infermax imports')"; do
  step "probe: $probe"
  if ! timeout -k 5 "$PROBE_S" python -c "$probe" >> "$OUT/env.txt" 2>&1; then
    step "probe failed or timed out"
    case $probe in *torch*) step "no usable torch: stopping"; cat "$OUT/env.txt"; exit 4;; esac
  fi
done
# The combination that hung on 2026-11-27, and what gpu-replay imports, each under a limit; if the combination hangs,
# try it with one OpenMP thread (two OpenMP runtimes in one process are a known cause of import deadlocks) and keep
# that setting for the rest of the call if it helps.
combo="import torch, numpy, pandas, scipy, sklearn, typer, rich, matplotlib; print('combined imports', torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')"
step "probe: the 2026-11-27 combination"
if ! timeout -k 5 "$PROBE_S" python -c "$combo" >> "$OUT/env.txt" 2>&1; then
  step "combination failed or timed out; again with OMP_NUM_THREADS=1"
  if OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 timeout -k 5 "$PROBE_S" python -c "$combo" >> "$OUT/env.txt" 2>&1; then
    export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
    step "one OpenMP thread works: kept for the rest of the call"
  fi
fi
step "probe: gpu-replay's imports"
timeout -k 5 "$PROBE_S" python -c "import infermax.cli, infermax.profiling.execute, infermax.costmodel.fitting; print('replay imports')" \
  >> "$OUT/env.txt" 2>&1 || step "probe failed or timed out (rc $?)"
cat "$OUT/env.txt"

left=$((CALL_S - SECONDS - TAIL_S))
[ "$left" -lt "$MAIN_S" ] && MAIN_S=$left
step "gpu_check.sh (limit ${MAIN_S}s)"
timeout -k 10 "$MAIN_S" bash benchmarks/gpu_check.sh > "$OUT/gpu_check.log" 2>&1
step "gpu_check.sh rc $?"
tail -40 "$OUT/gpu_check.log"
pack

step "tests/test_profiling.py"
timeout -k 5 $((TAIL_S - 20)) python -m pytest -q -p no:cacheprovider tests/test_profiling.py > "$OUT/test_profiling.txt" 2>&1
step "pytest rc $?"
tail -5 "$OUT/test_profiling.txt"
pack
