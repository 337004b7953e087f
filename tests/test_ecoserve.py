"""EcoServe: predictor, KV ledger and pipelining geometry, grouping, reserve, regrouping, invariants.
Expected values are worked out by hand in the comments (or are the paper's numbers)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import AffineCost
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from infermax.costmodel.swap import SwapCost
from infermax.ecoserve_eval import ecoserve_metrics, ecoserve_workload
from infermax.engine import simulate
from infermax.limits import Limits
from infermax.predictor import (CALIBRATION, PADDING, TARGET_SHARES, NoisyPredictor, OraclePredictor, make_predictor,
                                provisioning_shares, with_predictions)
from infermax.request import Request
from infermax.schedulers import make_scheduler
from infermax.schedulers.ecoserve import EcoServeOptions, EcoServeScheduler
from infermax.schedulers.ecoserve_kv import KVLedger, hosting_plan

SWAP = SwapCost(per_token_s=1e-4)
VARIANTS = ["ecoserve-d", "ecoserve-sd", "ecoserve-sdo", "ecoserve", "ecoserve-oracle"]


# ------------------------------------------------------------------------------------- predictor
def test_noisy_prediction_is_per_request_and_seeded():
    p = NoisyPredictor(-0.1, 0.3, seed=5)
    a, b = Request(7, 0.0, 10, 200), Request(7, 3.0, 99, 200)
    assert p.predict(a) == p.predict(b)  # depends on (seed, id, O) only
    z = np.random.default_rng((5, 7)).standard_normal()
    assert p.predict(a) == round(200 * np.exp(-0.1 + 0.3 * z))
    for g in (1, 150, 199, 500):
        assert p.repredict(a, g) > g
    assert OraclePredictor().predict(a) == 200
    assert with_predictions([a], OraclePredictor())[0].predicted_output_tokens == 200


@pytest.mark.parametrize("dataset", ["alpaca", "sharegpt"])
def test_calibration_reproduces_the_papers_provisioning_shares(dataset):
    # The targets are the paper's section-3 numbers; a fresh sample (other seeds) must land within 1 point.
    reqs = ecoserve_workload(dataset, 5000, seed=11)
    pred = make_predictor("noisy", seed=3, dataset=dataset)
    assert (pred.mu, pred.sigma) == CALIBRATION[dataset]
    over, under = provisioning_shares([r.output_tokens for r in reqs], [pred.predict(r) for r in reqs], PADDING[dataset])
    assert over == pytest.approx(TARGET_SHARES[dataset][0], abs=0.01)
    assert under == pytest.approx(TARGET_SHARES[dataset][1], abs=0.01)


def test_provisioning_shares_by_hand():
    # O=10, pred 10, pad 0.1 -> A = 11: over 1/11; O=20, pred 10 -> A=11: under 9/11.
    over, under = provisioning_shares([10, 20], [10, 10], 0.1)
    assert over == pytest.approx((1 / 11) / 2) and under == pytest.approx((9 / 11) / 2)


def test_bad_predictor_specs():
    for spec in ("", "magic", "noisy:1", "oracle:2", "noisy:a:b"):
        with pytest.raises(ValueError, match="bad predictor"):
            make_predictor(spec)



def test_a_predictor_by_its_spec_and_wrong_ones_refused():
    """Found by probing the Python API (2026-12-02): with_predictions(reqs, "noisy") ended in "'str' object has no
    attribute 'predict'", make_predictor(None) in "'NoneType' object has no attribute 'strip'"."""
    reqs = [Request(i, 0.0, 64, 50 + i) for i in range(5)]
    assert with_predictions(reqs, "noisy") == with_predictions(reqs, make_predictor("noisy"))
    assert [r.predicted_output_tokens for r in with_predictions(reqs, "oracle")] == [50, 51, 52, 53, 54]
    with pytest.raises(ValueError, match="bad predictor None"):
        make_predictor(None)
    with pytest.raises(TypeError, match="predictor must be a Predictor or its spec"):
        with_predictions(reqs, 3)


def test_jct_slo_parameters_are_checked():
    """Found by probing the Python API (2026-12-02): a negative t_p or a scale of 0 gave an SSR of 0 without a word,
    t_p given as text a numpy UFuncTypeError."""
    from infermax.ecoserve_eval import jct_slo_s

    assert list(jct_slo_s([1, 10], 0.5, 0.1)) == [2 * (0.5 + 0.1), 2 * (0.5 + 1.0)]
    for args, message in (((-1.0, 0.1, 2.0), "t_p must be a finite number >= 0, got -1.0"),
                          ((0.5, float("nan"), 2.0), "t_g must be a finite number >= 0"),
                          ((0.5, 0.1, 0), "scale must be a finite number > 0, got 0"),
                          (("1", 0.1, 2.0), "t_p must be a finite number >= 0, got '1'"),
                          ((0.0, 0.0, 2.0), "t_p and t_g are both 0")):
        with pytest.raises(ValueError, match=message):
            jct_slo_s([1, 10], *args)

# ------------------------------------------------------------------------------------- the ledger
def identity(x: int) -> int:
    return x


def test_ledger_growth_and_reserve():
    led = KVLedger(M=100, blocks=identity, grow_step=32)
    led.set_resident(0, 10)
    led.admit(0, 10, 32)  # limit 42, charge 42
    assert (led.used, led.allocs[0].limit) == (42, 42)
    assert led.need(0, 42) == (True, [])  # within the allocation
    assert led.need(0, 43)[0] and (led.used, led.allocs[0].limit) == (74, 74)  # one 32-token block more
    led.set_resident(1, 20)  # used 94: a full block no longer fits, one token does
    assert led.need(0, 75)[0] and (led.used, led.allocs[0].limit) == (95, 75)
    led.set_resident(2, 5)  # used 100 = M
    assert led.need(0, 76) == (False, [])
    led.check()


def test_lending_is_ledger_neutral_and_slots_come_back():
    led = KVLedger(M=1000, blocks=lambda x: -(-x // 16) * 16)
    led.set_resident(0, 32)
    led.set_resident(1, 20)  # charge 32
    led.set_resident(2, 48)
    host = led.admit(0, 32, 128)  # limit 160, charge 160; used 160 + 32 + 48 = 240
    led.lend(host, 64, 1, 20)  # host 96; guest 1: limit 84, charge 32 + 64 = 96
    g2 = led.lend(led.allocs[1], 32, 2, 48)  # guest 1: limit 52, charge 64; guest 2: limit 80, charge 80
    assert led.used == 240 and (host.limit, led.allocs[1].limit, g2.limit) == (96, 52, 80)
    led.check()
    led.release(2)  # guest 2 finishes: a zombie charging its own part (32): used 96 + 64 + 32
    assert led.used == 192
    ok, leaving = led.need(1, 53)  # guest 1 reaches guest 2's slot: it takes the space, nobody to move
    assert ok and leaving == [] and led.allocs[1].limit == 84 and led.used == 192
    ok, leaving = led.need(0, 97)  # the host reaches guest 1's slot while guest 1 still holds KV there
    assert ok and [g.rid for g in leaving] == [1]
    led.vacate(1, 20)  # its generated tokens swapped out: 20 prompt tokens stay (a 32-token charge)
    assert host.limit == 160 and led.used == 160 + 32
    led.check()


# ------------------------------------------------------------------------------------ geometry
def _positions(plan, host_own):
    """Absolute regions from a plan, computed independently: a writer lends the top of its own region."""
    start, own = {0: 0}, {0: host_own}
    for k, (w, rid, slot, deadline) in enumerate(plan, start=1):
        s0 = start[w] + own[w] - slot
        assert deadline == s0 - start[w]  # the writer reaches the slot after writing up to it
        own[w] -= slot
        start[k], own[k] = s0, slot
    return start, own


def test_hosting_plan_by_hand():
    # Host region 256, unit 32, buffer 0.15. Level 1: the host lends [128, 256) (deadline 128, cap
    # int(0.85*128) = 108). Level 2: host lends [64, 128), guest 1 lends [192, 256) (deadline 64, cap 54).
    # Level 3: host [32, 64), guest 2 [96, 128), guest 1 [160, 192), guest 3 [224, 256) (cap 27). 32 < 2*32: stop.
    lengths = [108, 54, 54, 27, 27, 27, 27, 100]
    caps = []

    def pick(cap):
        caps.append(cap)
        fit = [x for x in lengths if x <= cap]
        if not fit:
            return None
        lengths.remove(max(fit))
        return 1000 + len(caps), max(fit)

    plan = hosting_plan(256, 256, 32, 0.15, pick)
    assert caps == [108, 54, 54, 27, 27, 27, 27]
    assert [(w, slot, d) for w, _, slot, d in plan] == [(0, 128, 128), (0, 64, 64), (1, 64, 64), (0, 32, 32),
                                                        (2, 32, 32), (1, 32, 32), (3, 32, 32)]
    start, own = _positions(plan, 256)
    assert sorted((start[k], start[k] + own[k]) for k in start) == [(i, i + 32) for i in range(0, 256, 32)]


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 24), st.sampled_from([0.0, 0.1, 0.15, 0.3]), st.lists(st.integers(1, 400), min_size=1, max_size=30))
def test_guests_within_their_cap_never_meet_a_writer(units, buffer, wanted):
    # Own regions partition the host's region; then every writer writes one token per iteration from its
    # region start (the host its whole region, a guest the length it was picked with, <= its cap): the
    # written ranges of unfinished writers never overlap, so no guest within its prediction is swapped.
    pool, chosen = sorted(wanted), {}

    def pick(cap):
        fit = [x for x in pool if x <= cap]
        if not fit:
            return None
        pool.remove(max(fit))
        chosen[len(chosen) + 1] = max(fit)
        return len(chosen), max(fit)

    region = 32 * units
    plan = hosting_plan(region, region, 32, buffer, pick)
    start, own = _positions(plan, region)
    cover = sorted((start[k], start[k] + own[k]) for k in start)
    assert cover[0][0] == 0 and cover[-1][1] == region and all(a[1] == b[0] for a, b in zip(cover, cover[1:]))
    for k, (w, _, slot, deadline) in enumerate(plan, start=1):
        assert chosen[k] <= (1 - buffer) * min(deadline, slot)
    need = {0: region, **chosen}
    for t in range(1, region + 1):
        live = [(start[k], start[k] + min(t, need[k])) for k in need if t <= need[k]]
        live.sort()
        assert all(a[1] <= b[0] for a, b in zip(live, live[1:])), f"overlap at iteration {t}"
    event(f"guests: {len(plan)}")


# ------------------------------------------------------------------------------------ scheduler
def _opts(**kw):
    base = dict(padding=0.0, reserve=0.0, pipelining=False, ordering=False, regroup="pad")
    return EcoServeOptions(**{**base, **kw})


def _run(reqs, opts, M, C=4096, swap=SWAP):
    limits = Limits(C=C, M=M)
    sch = EcoServeScheduler(limits, AffineCost(0.01, 0.001), opts)
    return simulate(reqs, sch, limits, AffineCost(0.01, 0.001), swap_cost=swap), sch


def _first_decode(res):
    first = {}
    for j, b in enumerate(res.schedule.batches):
        for rid, c in b.items:
            if c == 1 and j > 0:
                first.setdefault(rid, j)
    return first


def _groups_workload(short_true=(30, 30, 30)):
    # Requests 0-2 predicted 30 (gen allocation 29 -> one 32-token block), 3-5 predicted 60 (59 -> 64).
    outs = list(short_true) + [60, 60, 60]
    preds = [30, 30, 30, 60, 60, 60]
    return [Request(i, 0.0, 8, o, predicted_output_tokens=p) for i, (o, p) in enumerate(zip(outs, preds))]


def test_groups_start_together_and_split_when_the_kv_cannot_hold_them():
    # Batch 0 prefills all six prompts (48 tokens resident). Batch 1: room = 207 - 48 = 159: group A costs
    # 3 x 32 = 96 (admitted), group B 3 x 64 = 192 (does not fit; a member costs 64 > 63 left). A decodes
    # 29 tokens (batches 1..29); at batch 30 room = 207 - 24 = 183: B is split, members 3 and 4 (128) run,
    # 5 waits for their group (59 decodes: batches 30..88) and starts at batch 89.
    res, sch = _run(_groups_workload(), _opts(), M=207)
    first = _first_decode(res)
    assert [first[i] for i in range(6)] == [1, 1, 1, 30, 30, 89]
    assert (res.requests.generated_tokens == res.requests.output_tokens).all()


@pytest.mark.parametrize("admit_on", ["group", "free"])
def test_time_sync_waits_for_the_group(admit_on):
    # Request 0 is over-predicted (true 10): its last token comes from batch 9, freeing 40 tokens: room
    # 63 + 40 = 103 >= 64. Synced admission ignores it until group A completes (B starts at batch 30);
    # "free" admits request 3 in batch 10, the first one planned after the finish.
    res, _ = _run(_groups_workload((10, 30, 30)), _opts(admit_on=admit_on), M=207)
    first = _first_decode(res)
    assert first[3] == (30 if admit_on == "group" else 10)


def test_under_prediction_grows_into_the_reserve():
    # Predicted 10, true 40, I = 8: allocation 9 -> 32 tokens (limit 40). Reserve 50% of M = 200 keeps group
    # admission below 100 tokens; at m = 40 the GT takes one more 32-token block from the reserve (72 <= 200).
    reqs = [Request(0, 0.0, 8, 40, predicted_output_tokens=10)]
    res, sch = _run(reqs, _opts(reserve=0.5), M=200)
    assert not sch.stats.preemptions and res.summary["evictions"] == 0
    assert res.requests.generated_tokens[0] == 40
    assert sch.stats.ledger_per_iteration[1] == 40 and max(sch.stats.ledger_per_iteration) == 72


def test_regrouping_after_under_prediction_keeps_the_kv_resident():
    # Two GTs, I = 8. Request 0: predicted 10, true 60 -> allocation 32 (limit 40). Request 1: predicted
    # and true 50 -> 49 -> 64 (limit 72). M = 16 + 32 + 64 = 112, no reserve: at m = 40 request 0 cannot
    # grow while request 1 runs, so it is preempted resident (when batch 33 is planned) and regrouped
    # ("pad": remaining max(1, ceil(0 * 10)) = 1 -> one block). It waits with its 40 tokens cached until
    # request 1's group completes (request 1 decodes in batches 1..49) and resumes in batch 50, alone.
    reqs = [Request(0, 0.0, 8, 60, predicted_output_tokens=10), Request(1, 0.0, 8, 50, predicted_output_tokens=50)]
    res, sch = _run(reqs, _opts(), M=112)
    assert sch.stats.preemptions == {0: 1}
    steps = [j for j, b in enumerate(res.schedule.batches) if any(rid == 0 for rid, _ in b.items)]
    assert steps[:33] == list(range(33)) and steps[33] == 50
    assert res.summary["evictions"] == 0 and res.requests.refilled_tokens[0] == 0  # never recomputed
    kv = res.batches.kv_tokens.to_numpy()
    assert kv[40] == 40 + 48  # request 0's 40 tokens stay cached while it waits (request 1: 8 + 40 decodes)
    assert (res.requests.generated_tokens == res.requests.output_tokens).all()
    parts = sch.stats.jct_parts()
    assert parts.loc[0, "preemption"] == pytest.approx(res.batches.duration_s[33:50].sum())


class _GuardedRequest:
    def __init__(self, req):
        self._req = req

    def __getattr__(self, name):
        if name == "output_tokens":
            raise AssertionError("the scheduler read the true output length")
        return getattr(self._req, name)


class _GuardedState:
    def __init__(self, state):
        object.__setattr__(self, "_s", state)

    def __getattr__(self, name):
        return _GuardedRequest(self._s.req) if name == "req" else getattr(self._s, name)


class _Blind(EcoServeScheduler):
    def add_arrivals(self, arrived):
        super().add_arrivals([_GuardedState(s) for s in arrived])


@pytest.mark.parametrize("pipelining", [False, True])
def test_the_scheduler_never_reads_the_true_output_length(pipelining):
    reqs = with_predictions(ecoserve_workload("sharegpt", 60, seed=4), make_predictor("noisy", seed=1))
    limits = Limits(M=6000)
    sch = _Blind(limits, AffineCost(0.01, 0.001), EcoServeOptions(regroup="pad", pipelining=pipelining))
    res = simulate(reqs, sch, limits, AffineCost(0.01, 0.001), swap_cost=SWAP)
    assert (res.requests.generated_tokens == res.requests.output_tokens).all()
    assert sum(sch.stats.preemptions.values()) > 0  # under-predictions happened and were handled blind


@st.composite
def _workloads(draw):
    n = draw(st.integers(2, 25))
    reqs, t = [], 0.0
    for i in range(n):
        t += draw(st.sampled_from([0.0, 0.0, 0.05, 0.5]))
        o = draw(st.integers(1, 300))
        reqs.append(Request(i, t, draw(st.integers(1, 120)), o,
                            predicted_output_tokens=draw(st.one_of(st.none(), st.integers(1, 400)))))
    peak = max(r.peak_kv_tokens for r in reqs)
    block = draw(st.sampled_from([1, 16, 32]))
    M = draw(st.integers(peak + block, peak * 6 + 64))
    C = draw(st.integers(8, 512))
    return reqs, Limits(C=C, M=M, block_size=block, Rmax=draw(st.one_of(st.none(), st.integers(2, 8)))), draw(
        st.sampled_from(VARIANTS))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_workloads())
def test_invariants_every_variant(case):
    reqs, limits, name = case
    sch, limits = make_scheduler(name, limits, AffineCost(0.01, 0.001))
    plan = sch.next_batch

    def checked(now):
        batch = plan(now)
        sch.ledger.check()  # allocations never exceed M
        return batch

    sch.next_batch = checked
    res = simulate(reqs, sch, limits, AffineCost(0.01, 0.001), swap_cost=SWAP)
    r = res.requests.set_index("id")
    assert (r.generated_tokens == r.output_tokens).all()
    assert (res.batches.kv_tokens_peak <= limits.M).all()
    parts = sch.stats.jct_parts()
    assert np.allclose(parts.sum(axis=1).to_numpy(), r.latency_s.sort_index().to_numpy())
    event(f"swaps: {'yes' if res.summary['swapped_out_tokens'] else 'no'}")
    event(f"preemptions: {'yes' if sch.stats.preemptions else 'no'}")


def test_metrics_on_a_run():
    reqs = ecoserve_workload("alpaca", 40, seed=2)
    res, sch = _run(reqs, EcoServeOptions(), M=3000)
    m = ecoserve_metrics(res, t_p=0.01, t_g=0.001, scheduler=sch)
    lat = res.requests.latency_s / res.requests.output_tokens
    assert m["normalized_latency_s"] == pytest.approx(lat.mean())
    slo = 2 * (0.01 + 0.001 * res.requests.output_tokens)
    assert m["ssr"] == pytest.approx((res.requests.latency_s <= slo).mean())
    assert sum(m[f"jct_{k}_s"] for k in ("waiting", "execution", "gt_queue", "preemption")) == pytest.approx(
        res.requests.latency_s.mean())


def test_simulate_cli_reports_ecoserve_metrics_whose_jct_parts_add_up():
    import json

    from typer.testing import CliRunner

    from infermax.cli import app

    out = CliRunner().invoke(app, ["simulate", "-s", "ecoserve", "--dataset", "sharegpt", "--B", "40", "--arrival",
                                   "poisson", "--rate", "5", "--predictor", "noisy", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    extra = data["scheduler_summary"]
    parts = sum(extra[f"jct_{k}_s"] for k in ("waiting", "execution", "gt_queue", "preemption"))
    assert parts == pytest.approx(data["mean_latency_s"], rel=1e-9)
    assert extra["mean_jct_s"] == pytest.approx(data["mean_latency_s"])
    assert 0 <= extra["ssr"] <= 1
