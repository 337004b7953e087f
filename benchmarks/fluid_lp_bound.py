"""A time-bucketed fluid LP for the sum of latencies on the optimality study's Azure slice: tried, weaker, not kept.

Issue 21 asks whether an LP over time buckets captures the Azure slice's crowding better than the one-machine
bounds (docs/design.md, "Work in progress": 17.20 s mean). Buckets of DT seconds; per request and bucket its
cumulative prefill tokens Y and decode tokens X (the KV read of each decode taken at its least, I + 1); per bucket the
number of batches n, of decode batches nd and of prefill batches np. Constraints: a request decodes at most one token
per decode batch (x ≤ nd); a bucket's batches' intercepts and per-token costs fit in DT (the paper's linear model);
at most C tokens per batch; decode items' KV, at least I + 1 each, at most M per decode batch; decode fraction ≤
prefill fraction. A request's latency is at least ∫ (1 − its decode fraction done) over its window of LMAX seconds
after arrival (the prefill fraction when O = 1), and at least its time alone. Batches that straddle a bucket
boundary are apportioned by time, which keeps every constraint linear; work left after the window costs nothing,
which only loosens it. The argument is sketched here, not proven in docs/design.md, because the LP is not used.

Measured 2026-11-27 (2 cores, HiGHS IPM through scipy): DT 5 s, LMAX 100 s: 6.01 s mean latency (solve 69 s; the
same with and without the KV row); DT 10 s, LMAX 500 s: 6.53 s (431 s). The combinatorial bounds give 17.20 s: the
fractional latency (a half-done request counts half) and the free placement of work inside a bucket lose more than
the crowding gains.

    python benchmarks/fluid_lp_bound.py DT LMAX N [M]      e.g. 5 100 2000 100000
"""
import sys, time, math
import numpy as np, scipy.sparse as sp
from scipy.optimize import linprog
from infermax.costmodel import load_cost_model
from infermax.workload import load_trace
DT = float(sys.argv[1]); LMAX = float(sys.argv[2]); N = int(sys.argv[3])
reqs = load_trace('azure-conv', N)
C = 4096
terms = {t.name: t.pieces[0] for t in load_cost_model(kind="linear").milp_terms()}  # the bundled A100 Llama-2-7B
tau0, tau_pre, tau_dec = (terms[k].intercept_s for k in ("non_attention", "prefill_attention", "decode_attention"))
w_tok = terms["non_attention"].coef_s["n_tokens"]
w_pre = terms["prefill_attention"].coef_s["prefill_tokens"]  # Σc², Σc·m dropped (≥ 0)
w_kv = terms["decode_attention"].coef_s["decode_kv_tokens"]
H = max(r.arrival_s for r in reqs) + LMAX
NB = int(math.ceil(H / DT))
t0 = time.time()
# variable indexing: per request j, buckets b in [a_j, e_j): Y_jb, X_jb (cumulative); then n_b, nd_b, np_b; then l_j
cols = 0; Yidx = []; Xidx = []; span = []
for r in reqs:
    a = int(r.arrival_s // DT); e = min(NB, int(math.ceil((r.arrival_s + LMAX) / DT)))
    span.append((a, e)); k = e - a
    Yidx.append(cols); cols += k
    if r.output_tokens > 1:
        Xidx.append(cols); cols += k
    else:
        Xidx.append(None)
n0 = cols; cols += NB; nd0 = cols; cols += NB; np0 = cols; cols += NB; l0 = cols; cols += len(reqs)
# Sized before anything is built: about 11 nonzeros per variable (measured: 206,277 variables, 2.33 M nonzeros),
# held as Python lists of about 100 bytes per nonzero while the matrix is assembled.
MAX_VARS = 500_000
if cols > MAX_VARS:
    sys.exit(f"{cols:,} variables (about {11 * cols / 1e6:.1f} M nonzeros, {11 * cols * 100 / 2**30:.1f} GiB while "
             f"building) exceed {MAX_VARS:,}: use larger buckets (DT), a shorter window (LMAX) or fewer requests")
rows, cc, vals, rhs = [], [], [], []
row = 0
def add(entries, b):
    global row
    for c_, v in entries:
        rows.append(row); cc.append(c_); vals.append(v)
    rhs.append(b); row += 1
cap = [[] for _ in range(NB)]   # capacity per bucket: entries
kvb = [[] for _ in range(NB)]
MEM = float(sys.argv[4]) if len(sys.argv) > 4 else 100000
tok = [[] for _ in range(NB)]
lb = np.zeros(cols); ub = np.full(cols, np.inf)
for j, r in enumerate(reqs):
    a, e = span[j]; I, O = r.prompt_tokens, r.output_tokens
    wp = w_tok + w_pre; wd = w_tok + w_kv * (I + 1)
    for i, b in enumerate(range(a, e)):
        Y = Yidx[j] + i; ub[Y] = I
        # increments y = Y_b - Y_{b-1}
        ent = [(Y, 1.0)] + ([(Y - 1, -1.0)] if i else [])
        add([(c_, -v) for c_, v in ent], 0.0)                 # monotone: -(Y_b - Y_{b-1}) <= 0
        add(ent + [(np0 + b, -C)], 0.0)                        # y <= C np_b
        cap[b] += [(c_, wp * v) for c_, v in ent]; tok[b] += ent
        if Xidx[j] is not None:
            X = Xidx[j] + i; ub[X] = O - 1
            ex = [(X, 1.0)] + ([(X - 1, -1.0)] if i else [])
            add([(c_, -v) for c_, v in ex], 0.0)
            add(ex + [(nd0 + b, -1.0)], 0.0)                   # x <= nd_b
            cap[b] += [(c_, wd * v) for c_, v in ex]; tok[b] += ex
            kvb[b] += [(c_, (I + 1) * v) for c_, v in ex]
            add([(X, 1.0 / (O - 1)), (Y, -1.0 / I)], 0.0)      # decode frac <= prefill frac
    # latency: l_j >= sum_b len_b (1 - Z_jb)
    lens = [min((b + 1) * DT, H) - max(b * DT, r.arrival_s) for b in range(a, e)]
    if Xidx[j] is not None:
        Z = [(Xidx[j] + i, L / (O - 1)) for i, L in enumerate(lens)]
    else:
        Z = [(Yidx[j] + i, L / I) for i, L in enumerate(lens)]
    add([(l0 + j, -1.0)] + [(c_, -v) for c_, v in Z], -sum(lens))
    floor_j = (tau0 + tau_pre + (w_tok + w_pre) * I) + (O - 1) * (tau0 + tau_dec + w_tok + w_kv * (I + 1))
    lb[l0 + j] = floor_j
for b in range(NB):
    add(cap[b] + [(n0 + b, tau0), (nd0 + b, tau_dec), (np0 + b, tau_pre)], DT)
    add(tok[b] + [(n0 + b, -C)], 0.0)
    add(kvb[b] + [(nd0 + b, -MEM)], 0.0)
    add([(nd0 + b, 1.0), (n0 + b, -1.0)], 0.0)
    add([(np0 + b, 1.0), (n0 + b, -1.0)], 0.0)
A = sp.csr_matrix((vals, (rows, cc)), shape=(row, cols))
cvec = np.zeros(cols); cvec[l0:] = 1.0
print(f"built {cols} vars {row} rows {A.nnz} nnz in {time.time()-t0:.1f}s", flush=True)
t1 = time.time()
res = linprog(cvec, A_ub=A, b_ub=np.array(rhs), bounds=list(zip(lb, ub)), method='highs-ipm', options={'disp': False})
print(res.status, res.message)
floors = lb[l0:].sum()
print(f"solve {time.time()-t1:.1f}s  bound sum {res.fun:.0f} s  mean {res.fun/len(reqs):.3f} s  (floors mean {floors/len(reqs):.3f})")
