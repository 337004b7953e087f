"""Qualitative checks of the InferMax paper on the default model (A100, Llama-2-7B, C=4096, M=100K).

Run: ``python experiments/paper_checks.py`` (about a minute). Prints (1) TPS of evicting schedulers over
their eviction-free variants at M=100, O=32, B=1024 (section 4.4), (2) vLLM vs Sarathi total latency at
B=32, (3) eviction-free mean running size at O=B=1024 against M/(I+O) (section 4.3). Declarative sweep
specs for every figure come with the sweep tooling.
"""
from infermax.engine import simulate
from infermax.limits import Limits
from infermax.workload import fixed
from infermax.costmodel import load_cost_model
cm = load_cost_model()
print("M=100 O=32 B=1024: TPS evicting / eviction-free")
for I in (1,2,4,8,16,32,64):
    row=[]
    for n in ("vllm","sarathi"):
        a=simulate(fixed(I,32,1024), n, Limits(M=100), cm).summary; b=simulate(fixed(I,32,1024), n+"-ef", Limits(M=100), cm).summary
        row.append(f"{n}: {a['tps']:.0f}/{b['tps']:.0f}={a['tps']/b['tps']:.2f}x (ev {a['evictions']})")
    print(f"I={I:4d} " + "  ".join(row), flush=True)
print("B=32: makespan vllm vs sarathi")
for I in (64, 512, 1024):
    for O in (32, 128, 1024):
        a=simulate(fixed(I,O,32),"vllm",Limits(),cm).summary; b=simulate(fixed(I,O,32),"sarathi",Limits(),cm).summary
        print(f"I={I} O={O}: vllm {a['makespan_s']:.2f}s sarathi {b['makespan_s']:.2f}s", flush=True)
print("O=B=1024 running size (ef)")
for I in (1, 1024):
    for n in ("vllm-ef","sarathi-ef","sarathi-pc-ef"):
        s=simulate(fixed(I,1024,1024), n, Limits(), cm).summary
        print(f"{n} I={I}: mean_running {s['mean_running']:.1f} (M/(I+O) = {100000/(I+1024):.1f}) tps {s['tps']:.0f}", flush=True)
