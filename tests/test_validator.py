"""The validator rejects every violation with the batch, request and rule named."""

from __future__ import annotations

import json

import pytest

from infermax.limits import Limits
from infermax.replay import ScheduleViolation, replay
from infermax.request import Request
from infermax.schedule import Schedule, ScheduledBatch


def sched(batches, limits=Limits(M=100), requests=None):
    requests = requests or [Request(0, 0.0, 4, 2), Request(1, 0.0, 2, 1)]
    return Schedule(requests, limits, [ScheduledBatch(items=i, evict=e) for i, e in batches])


VALID = [([(0, 4), (1, 2)], []), ([(0, 1)], [])]


def test_valid_schedule_replays(affine):
    res = replay(sched(VALID), affine)
    assert res.summary["makespan_s"] == (1 + 6) + (1 + 1)


@pytest.mark.parametrize("batches,limits,batch,rid,rule", [
    ([([(7, 1)], [])], Limits(M=100), 0, 7, "unknown-request"),
    ([([(0, 5)], [])], Limits(M=100), 0, 0, "chunk"),
    ([([(0, 0)], [])], Limits(M=100), 0, 0, "chunk"),
    ([([(0, 4), (1, 2)], []), ([(0, 2)], [])], Limits(M=100), 1, 0, "decode"),
    ([([(0, 4), (1, 2)], []), ([(1, 1)], [])], Limits(M=100), 1, 1, "finished"),
    ([([(0, 4), (0, 1)], [])], Limits(M=100), 0, 0, "duplicate"),
    ([([(0, 4), (1, 2)], [])], Limits(C=5, M=100), 0, None, "C"),
    ([([(0, 4), (1, 2)], [])], Limits(C=8, P=5, M=100), 0, None, "P"),
    ([([(0, 4), (1, 2)], [])], Limits(M=5), 0, None, "M"),
    ([([(0, 4), (1, 2)], [])], Limits(M=7, block_size=4), 0, None, "M"),  # blocks: 4 + 4 > 7
    ([([(0, 4), (1, 2)], [])], Limits(M=100, Rmax=1), 0, None, "Rmax"),
    ([([(0, 4), (1, 2)], []), ([(0, 1)], [1])], Limits(M=100), 1, 1, "finished"),
    ([([(0, 2)], []), ([(1, 2)], [1])], Limits(M=100), 1, 1, "evict-no-kv"),
    ([([(0, 2)], []), ([(0, 2)], [0])], Limits(M=100), 1, 0, "evict-and-process"),
    ([([], [])], Limits(M=100), 0, None, "empty"),
    ([([(0, 4), (1, 2)], [])], Limits(M=100), 1, 0, "incomplete"),
])
def test_violations_are_named(affine, batches, limits, batch, rid, rule):
    s = sched(batches, limits)
    with pytest.raises(ScheduleViolation) as err:
        replay(s, affine)
    assert (err.value.batch, err.value.request, err.value.rule) == (batch, rid, rule)
    assert f"batch {batch}" in str(err.value)


def test_eviction_in_decode_phase_refills_prompt_plus_generated(affine):
    reqs = [Request(0, 0.0, 3, 4), Request(1, 0.0, 1, 5)]
    # r0: prefill (token 1), decode (token 2), evicted: Icur = 3 + 2 = 5, refilled in two chunks,
    # completing the refill generates token 3. r1 keeps every batch non-empty.
    ok = [([(0, 3), (1, 1)], []), ([(0, 1), (1, 1)], []), ([(1, 1)], [0]), ([(0, 4), (1, 1)], []),
          ([(0, 1), (1, 1)], []), ([(0, 1)], [])]
    res = replay(sched(ok, requests=reqs), affine)
    r0 = res.requests.set_index("id").loc[0]
    assert (r0.refilled_tokens, r0.generated_tokens, r0.evictions) == (5, 4, 1)
    assert res.batches.generated_tokens.tolist() == [2, 2, 1, 1, 2, 1]
    bad = ok[:3] + [([(0, 6), (1, 1)], [])]
    with pytest.raises(ScheduleViolation, match=r"chunk.*1\.\.5"):
        replay(sched(bad, requests=reqs), affine)


def test_eviction_mid_prefill_loses_progress_but_keeps_input(affine):
    reqs = [Request(0, 0.0, 6, 1), Request(1, 0.0, 1, 3)]
    ok = [([(0, 4), (1, 1)], []), ([(1, 1)], [0]), ([(0, 6), (1, 1)], [])]  # evicted at m=4 of 6: redone whole
    res = replay(sched(ok, requests=reqs), affine)
    assert res.requests.set_index("id").loc[0, "refilled_tokens"] == 4


def test_requests_cannot_run_before_arrival(affine):
    reqs = [Request(0, 5.0, 1, 1)]
    res = replay(sched([([(0, 1)], [])], requests=reqs), affine)
    assert res.batches.loc[0, "start_s"] == 5.0


def test_malformed_schedule_file(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"format": "other"}))
    with pytest.raises(ValueError, match="not an InferMax schedule"):
        Schedule.load(path)
    path.write_text("{")
    with pytest.raises(ValueError, match="not valid JSON"):
        Schedule.load(path)


@pytest.mark.parametrize("change, message", [
    (lambda d: d["batches"][0]["items"][0].__setitem__(1, 1.5), "batch 0 items tokens must be an integer, got 1.5"),
    (lambda d: d["batches"][0]["items"][0].__setitem__(1, True), "batch 0 items tokens must be an integer, got True"),
    (lambda d: d["batches"][0]["items"][0].__setitem__(0, "0"), "batch 0 items request id must be an integer"),
    (lambda d: d["batches"][1].__setitem__("evict", [0.5]), "batch 1 evict must be an integer"),
    (lambda d: d["batches"][0].__setitem__("items", [[0]]), r"batch 0 items: each entry is \[request id, tokens\]"),
    (lambda d: d["batches"].__setitem__(0, None), "batch 0 must be an object"),
    (lambda d: d["requests"][0].__setitem__(2, 4.5), "request 0 prompt_tokens must be an integer, got 4.5"),
])
def test_token_counts_and_ids_are_integers_not_truncated(tmp_path, change, message):
    """A schedule written by another tool with 1.5 tokens in an item was read as 1 (``int()``), and true as 1, so
    the replay failed later with an unrelated error, or passed; now the file is refused where it is wrong. An
    integral float (4.0) is still read."""
    schedule = Schedule([Request(0, 0.0, 4, 2)], Limits(C=8, M=100),
                        [ScheduledBatch(items=[(0, 4)]), ScheduledBatch(items=[(0, 1)])])
    doc = schedule.to_json()
    path = tmp_path / "s.json"
    change(doc)
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=message):
        Schedule.load(path)
    whole = schedule.to_json()
    whole["batches"][0]["items"][0][1] = 4.0
    path.write_text(json.dumps(whole))
    assert Schedule.load(path).batches[0].items == [(0, 4)]


def test_replayer_features_match_the_batch_by_hand():
    """The replayer builds each batch's `BatchFeatures` positionally (its hot path): every field must land where
    the dataclass declares it. Checked on the declared order itself and on a batch whose first twelve fields (all
    but the swap and hidden counts, 0 here) differ: a chunk of 400 tokens after 2,100 cached ones and two decodes."""
    from dataclasses import astuple, fields

    from infermax.costmodel.base import BatchFeatures
    from infermax.replay import REPLAY_FEATURE_ORDER

    assert tuple(f.name for f in fields(BatchFeatures)) == REPLAY_FEATURE_ORDER

    class Recording:
        name = "recording"

        def __init__(self):
            self.seen = []

        def batch_time_s(self, features):
            self.seen.append(astuple(features))
            return 0.01

    model = Recording()
    requests = [Request(0, 0.0, 2500, 2), Request(1, 0.0, 4, 2), Request(2, 0.0, 9, 2)]
    schedule = Schedule(requests, Limits(C=4096, M=10_000), [
        ScheduledBatch(items=[(0, 2100), (1, 4), (2, 9)]), ScheduledBatch(items=[(0, 400), (1, 1), (2, 1)]),
        ScheduledBatch(items=[(0, 1)])])
    replay(schedule, model)
    second = dict(zip(REPLAY_FEATURE_ORDER, model.seen[1]))
    assert second == {
        "n_tokens": 402, "prefill_tokens": 400, "prefill_sq_tokens": 160_000, "prefill_ctx_tokens": 840_000,
        "prefill_ctx_cap256": 102_400, "prefill_ctx_cap512": 204_800, "prefill_ctx_cap1024": 409_600,
        "prefill_ctx_cap2048": 819_200, "n_prefill_seqs": 1, "n_decode_seqs": 2, "decode_kv_tokens": 15,
        "decode_kv_max": 10, "swap_tokens": 0, "hidden_recompute_tokens": 0}


def test_request_token_counts_are_integers(tmp_path):
    """A Request of 4.5 prompt tokens was accepted and simulated as such; a bool counted as 1. numpy integers (what
    sampled workloads hold) stay accepted, and a schedule file's integral floats are read in the object form too."""
    import numpy as np

    with pytest.raises(ValueError, match="prompt_tokens must be an integer, got 4.5"):
        Request(0, 0.0, 4.5, 2)
    with pytest.raises(ValueError, match="output_tokens must be an integer, got True"):
        Request(0, 0.0, 4, True)
    assert Request(np.int64(1), 0.0, np.int32(4), 2).prompt_tokens == 4
    schedule = Schedule([Request(0, 0.0, 4, 2, priority=1)], Limits(C=8, M=100),
                        [ScheduledBatch(items=[(0, 4)]), ScheduledBatch(items=[(0, 1)])])
    doc = schedule.to_json()
    assert isinstance(doc["requests"][0], dict)  # (the object form: it has a priority)
    path = tmp_path / "s.json"
    for prompt, ok in ((4.0, True), (4.5, False)):
        doc["requests"][0]["prompt_tokens"] = prompt
        path.write_text(json.dumps(doc))
        if ok:
            assert Schedule.load(path).requests[0].prompt_tokens == 4
        else:
            with pytest.raises(ValueError, match="prompt_tokens must be an integer, got 4.5"):
                Schedule.load(path)


def test_a_python_built_schedule_is_judged_not_crashed_on(affine, tmp_path):
    """Found by probing the Python API (2026-12-02): a schedule built in Python with a chunk of 2.5 tokens ended in a
    TypeError about list indices inside the replayer; one with np.int64 chunks replayed but could not be saved (not
    JSON serializable); a tuple for a request, a dict for the limits, a path for the schedule or a cost model's name
    ended in AttributeErrors. Now: whole-number chunks and swaps of any number type replay as their integers (as a
    file's integral floats are read), others are a violation of the chunk rule; the rest are refused by type."""
    import numpy as np

    reqs = [Request(0, 0.0, 4, 2)]

    def batches(*chunks):
        return [ScheduledBatch(items=[(0, c)]) for c in chunks]

    with pytest.raises(ScheduleViolation, match=r"batch 0, request 0: \[chunk\] token counts must be whole numbers, "
                                                r"got 2.5"):
        replay(Schedule(reqs, Limits(M=100), batches(2.5, 1.5, 1)), affine)
    with pytest.raises(ScheduleViolation, match=r"\[chunk\] token counts must be whole numbers, got True"):
        replay(Schedule(reqs, Limits(M=100), batches(True, 3, 1)), affine)
    plain = replay(Schedule(reqs, Limits(M=100), batches(2, 2, 1)), affine).summary
    assert replay(Schedule(reqs, Limits(M=100), batches(2.0, np.int32(2), 1.0)), affine).summary == plain
    built = Schedule(reqs, Limits(M=100), batches(np.int64(4), 1), meta={"B": np.int64(1)})
    built.save(tmp_path / "s.json")
    replay(built, affine).save(tmp_path / "run")  # (its summary.json holds the meta)
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["meta"]["B"] == 1
    assert json.loads((tmp_path / "s.json").read_text())["batches"][0]["items"] == [[0, 4]]
    assert replay(Schedule.load(tmp_path / "s.json"), affine).summary == replay(built, affine).summary
    with pytest.raises(TypeError, match="requests must be infermax.request.Request objects, got tuple"):
        replay(Schedule([(0, 0.0, 4, 2)], Limits(M=100), batches(4, 1)), affine)
    with pytest.raises(TypeError, match="limits must be an infermax.limits.Limits, got dict"):
        replay(Schedule(reqs, {"C": 4}, batches(4, 1)), affine)
    with pytest.raises(TypeError, match=r"schedule must be an infermax.schedule.Schedule \(Schedule.load\(path\)"):
        replay(str(tmp_path / "s.json"), affine)
    with pytest.raises(TypeError, match="cost_model must be a cost model .* got str 'linear'"):
        replay(built, "linear")
    with pytest.raises(ScheduleViolation, match=r"batch 0: \[shape\] its items must be \(request id, tokens\) pairs"):
        replay(Schedule(reqs, Limits(M=100), [ScheduledBatch(items=[(0, 4, 1)])]), affine)
    with pytest.raises(ScheduleViolation, match=r"batch 0: \[shape\] each batch must be a ScheduledBatch, got list"):
        replay(Schedule(reqs, Limits(M=100), [[(0, 4)]]), affine)
