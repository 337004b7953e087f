from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from infermax.request import Request
from infermax.workload import (
    LengthDist, TraceFormatError, fixed, heterogeneous_mix, load_trace, parse_length_dist, read_trace,
    sampled, with_arrivals,
)


def _ids(reqs):
    return [r.id for r in reqs]


def test_fixed():
    reqs = fixed(64, 32, 5)
    assert _ids(reqs) == list(range(5))
    assert all((r.arrival_s, r.prompt_tokens, r.output_tokens) == (0.0, 64, 32) for r in reqs)
    with pytest.raises(ValueError, match="output_tokens"):
        fixed(64, 0, 5)
    with pytest.raises(ValueError, match="num_requests"):
        fixed(64, 32, 0)


def _group(r):
    return ("S" if r.prompt_tokens in (8, 16) else "L") + "I" + ("S" if r.output_tokens in (8, 16) else "L") + "O"


def test_mix_composition_and_remainder():
    reqs = heterogeneous_mix(["LILO", "SILO", "SISO"], 100, seed=1)
    assert _ids(reqs) == list(range(100))
    assert Counter(map(_group, reqs)) == {"LILO": 34, "SILO": 33, "SISO": 33}
    assert {r.prompt_tokens for r in reqs} == {8, 16, 512, 1024}
    assert all(r.arrival_s == 0 for r in reqs)
    # Shuffled: the first 34 are not all LILO.
    assert {_group(r) for r in reqs[:34]} != {"LILO"}


def test_mix_string_form_and_case():
    a = heterogeneous_mix("lilo+siso", 10, seed=3)
    b = heterogeneous_mix(["LILO", "SISO"], 10, seed=3)
    assert a == b
    assert Counter(map(_group, a)) == {"LILO": 5, "SISO": 5}


def test_mix_determinism_by_seed():
    assert heterogeneous_mix(["SILO", "LISO"], 64, seed=7) == heterogeneous_mix(["SILO", "LISO"], 64, seed=7)
    assert heterogeneous_mix(["SILO", "LISO"], 64, seed=7) != heterogeneous_mix(["SILO", "LISO"], 64, seed=8)


def test_mix_custom_sets_and_errors():
    reqs = heterogeneous_mix(["SILO"], 20, short=(4,), long=(100,))
    assert all((r.prompt_tokens, r.output_tokens) == (4, 100) for r in reqs)
    with pytest.raises(ValueError, match="SOLO.*SISO, SILO, LISO, LILO"):
        heterogeneous_mix(["SISO", "SOLO"], 10)
    with pytest.raises(ValueError, match="groups"):
        heterogeneous_mix([], 10)
    with pytest.raises(ValueError, match="short"):
        heterogeneous_mix(["SISO"], 10, short=())
    # fewer requests than groups: a named group got none (`--mix LILO+SILO --B 1` was one LILO request; 2026-12-02)
    with pytest.raises(ValueError, match=r"1 request\(s\) for the 2 groups of mix LILO\+SILO: .*B >= 2"):
        heterogeneous_mix("LILO+SILO", 1)
    assert Counter(map(_group, heterogeneous_mix("LILO+SILO", 2))) == {"LILO": 1, "SILO": 1}


@pytest.mark.parametrize("spec, lo, hi", [
    ("const:7", 7, 7), ("uniform:3:9", 3, 9), ("lognormal:200:1.5:1000", 1, 1000),
    ("exponential:50:120", 1, 120), ("normal:10:30", 1, None), ("normal:100:50:150", 1, 150),
])
def test_distribution_bounds(spec, lo, hi):
    x = parse_length_dist(spec).sample(np.random.default_rng(0), 5000)
    assert x.dtype == np.int64 and x.min() >= lo and (hi is None or x.max() <= hi)
    if spec.startswith("uniform"):
        assert set(x.tolist()) == set(range(3, 10))  # inclusive of both ends
    if spec.startswith("normal:10"):
        assert (x == 1).any()  # negative draws clipped to 1


def test_distribution_centres():
    rng = np.random.default_rng(1)
    assert np.median(parse_length_dist("lognormal:200:0.5").sample(rng, 20000)) == pytest.approx(200, rel=0.03)
    assert parse_length_dist("exponential:300").sample(rng, 20000).mean() == pytest.approx(300, rel=0.03)


@pytest.mark.parametrize("spec", [
    "gauss:1:2", "uniform:5", "uniform:9:3", "uniform:0:3", "const:2.5", "const:x", "lognormal:0:1",
    "normal:5:-1", "exponential:5:0", "exponential:5:10:20", "const:5:10", "exponential:inf", "",
])
def test_bad_distribution_specs(spec):
    with pytest.raises(ValueError) as e:
        parse_length_dist(spec)
    assert repr(spec) in str(e.value) and "uniform:LO:HI" in str(e.value)


@settings(max_examples=50, deadline=None)
@given(lo=st.integers(1, 500), width=st.integers(0, 500), cap=st.integers(1, 2000), seed=st.integers(0, 2**32))
def test_sampled_within_bounds(lo, width, cap, seed):
    reqs = sampled(200, f"uniform:{lo}:{lo + width}", f"lognormal:100:2:{cap}", seed=seed)
    assert _ids(reqs) == list(range(200))
    assert all(lo <= r.prompt_tokens <= lo + width and 1 <= r.output_tokens <= cap for r in reqs)
    assert reqs == sampled(200, f"uniform:{lo}:{lo + width}", f"lognormal:100:2:{cap}", seed=seed)


def test_sampled_accepts_length_dist_and_seed_matters():
    a = sampled(50, LengthDist("const", (5.0,)), "exponential:100", seed=0)
    assert all(r.prompt_tokens == 5 for r in a)
    assert a != sampled(50, "const:5", "exponential:100", seed=1)


def test_bundled_traces():
    code, conv = load_trace("azure-code"), load_trace("AZURE-CONV")
    assert (len(code), len(conv)) == (8819, 19366)
    for reqs in (code, conv):
        assert _ids(reqs) == list(range(len(reqs)))
        arrivals = [r.arrival_s for r in reqs]
        assert arrivals[0] == 0.0 and arrivals == sorted(arrivals) and arrivals[-1] > 3000
    assert (code[1].arrival_s, code[1].prompt_tokens, code[1].output_tokens) == (0.052, 3180, 8)
    assert len(load_trace("azure-code", limit=100)) == 100


def _write(tmp_path, text):
    path = tmp_path / "t.csv"
    path.write_text(text)
    return path


def test_trace_offset_extra_columns_and_blank_lines(tmp_path):
    path = _write(tmp_path, "id,num_decode_tokens,arrived_at,num_prefill_tokens\n"
                            "a,3,10.5,7\n\nb,4.0,12,8\n")
    assert load_trace(path) == [Request(0, 0.0, 7, 3), Request(1, 1.5, 8, 4)]
    assert load_trace(str(path), limit=1) == [Request(0, 0.0, 7, 3)]


HEADER = "arrived_at,num_prefill_tokens,num_decode_tokens\n"


@pytest.mark.parametrize("body, line, what", [
    ("0,5,5\n1,x,5\n", 3, "not a number"),
    ("0,5,5\n1,5\n", 3, "missing"),
    ("0,5,5\n1,5,\n", 3, "missing"),
    ("0,5,5\n1,5,5\nnan,5,5\n", 4, "not finite"),
    ("0,5,5\n1,inf,5\n", 3, "not finite"),
    ("-1,5,5\n", 2, "negative"),
    ("0,0,5\n", 2, "integer >= 1"),
    ("0,5,2.5\n", 2, "integer >= 1"),
    ("0,5,5\n2,5,5\n1,5,5\n", 4, "not sorted"),
])
def test_malformed_trace_names_line(tmp_path, body, line, what):
    path = _write(tmp_path, HEADER + body)
    with pytest.raises(TraceFormatError, match=what) as e:
        load_trace(path)
    assert f"line {line}," in str(e.value) and str(path) in str(e.value)


def test_a_byte_order_mark_is_not_part_of_the_header(tmp_path):
    """A CSV saved by a spreadsheet starts with U+FEFF; its first column was not found ("header lacks column(s)
    num_prefill_tokens ... found \ufeffnum_prefill_tokens")."""
    path = tmp_path / "bom.csv"
    path.write_bytes(b"\xef\xbb\xbfnum_prefill_tokens,num_decode_tokens\n10,5\n20,3\n")
    requests, has_arrivals = read_trace(path)
    assert [(r.prompt_tokens, r.output_tokens) for r in requests] == [(10, 5), (20, 3)] and not has_arrivals


def test_a_file_that_is_not_utf8_text_is_refused_by_name(tmp_path):
    """A binary file given as a trace raised the codec's own message, without the file's name."""
    path = tmp_path / "results.parquet"
    path.write_bytes(b"PAR1\x15\x04\x15\xb8\x01\xff\xfe")
    with pytest.raises(TraceFormatError, match="not a UTF-8 text file") as e:
        load_trace(path)
    assert str(path) in str(e.value)


def test_json_and_spec_files_share_the_reading(tmp_path):
    """The same for the other files a user names: a schedule or cost-model JSON and a sweep spec (a binary spec
    stopped `sweep` with a UnicodeDecodeError traceback); a byte-order mark is read past."""
    from infermax.jsonio import read_json
    from infermax.sweep.spec import SpecError, load_spec

    binary = tmp_path / "x.toml"
    binary.write_bytes(b"name = \"\xd0\x00\xff\"\n")
    with pytest.raises(SpecError, match="not a UTF-8 text file"):
        load_spec(binary)
    with pytest.raises(ValueError, match="not a UTF-8 text file"):
        read_json(binary)
    marked = tmp_path / "marked.json"
    marked.write_bytes(b"\xef\xbb\xbf{\"a\": 1}")
    assert read_json(marked) == {"a": 1}
    spec = tmp_path / "marked.toml"
    spec.write_bytes(b"\xef\xbb\xbfname = \"m\"\n[base]\nB = 2\nI = 4\nO = 2\n[axes]\nscheduler = [\"vllm\"]\n")
    assert load_spec(spec).name == "m"


def test_a_row_with_more_values_than_the_header_is_refused(tmp_path):
    """Found by probing (2026-12-02): an unquoted thousands separator ("1,024") shifted the row, which was read as a
    1-token prompt with a 24-token output and its last value ignored; a header naming a column twice was read from
    one of the two; a count of 10^23 tokens passed as the float nearest to it. Empty trailing values (a trailing
    comma, as some exports write) are still accepted."""
    lengths = "num_prefill_tokens,num_decode_tokens\n"
    with pytest.raises(TraceFormatError, match="line 3: 3 values for a header of 2 columns .*thousands separator"):
        load_trace(_write(tmp_path, lengths + "10,5\n1,024,5\n"))
    with pytest.raises(TraceFormatError, match="line 1: column num_decode_tokens appears more than once"):
        load_trace(_write(tmp_path, "num_prefill_tokens,num_decode_tokens,num_decode_tokens\n10,5,6\n"))
    with pytest.raises(TraceFormatError, match="line 2, column num_prefill_tokens: token counts above 2,147,483,647"):
        load_trace(_write(tmp_path, lengths + "99999999999999999999999,5\n"))
    assert load_trace(_write(tmp_path, lengths + "10,5,\n20,3,,\n")) == [Request(0, 0.0, 10, 5), Request(1, 0.0, 20, 3)]
    assert load_trace(_write(tmp_path, "a,num_prefill_tokens,a,num_decode_tokens\nx,10,y,5\n")) == [Request(0, 0.0, 10, 5)]


def test_trace_header_and_empty_errors(tmp_path):
    with pytest.raises(TraceFormatError, match="line 1.*num_decode_tokens"):
        load_trace(_write(tmp_path, "arrived_at,num_prefill_tokens\n0,5\n"))
    with pytest.raises(TraceFormatError, match="line 1"):
        load_trace(_write(tmp_path, ""))
    with pytest.raises(TraceFormatError, match="no requests"):
        load_trace(_write(tmp_path, HEADER))
    with pytest.raises(FileNotFoundError, match="azure-code"):
        load_trace(tmp_path / "missing.csv")
    with pytest.raises(ValueError, match="limit"):
        load_trace("azure-code", limit=0)


def test_offline_and_trace_replay():
    reqs = load_trace("azure-code", limit=50)
    off = with_arrivals(reqs)
    assert all(r.arrival_s == 0 for r in off)
    fast = with_arrivals(reqs, "trace", time_scale=0.5)
    assert [r.arrival_s for r in fast] == pytest.approx([r.arrival_s / 2 for r in reqs])
    assert [(r.id, r.prompt_tokens, r.output_tokens) for r in fast] == \
        [(r.id, r.prompt_tokens, r.output_tokens) for r in reqs]


def test_poisson_mean_interarrival():
    reqs = with_arrivals(fixed(8, 8, 20000), "poisson", rate_per_s=4.0, seed=0)
    t = np.array([r.arrival_s for r in reqs])
    assert t[0] == 0.0 and (np.diff(t) >= 0).all()
    gaps = np.diff(t)
    assert gaps.mean() == pytest.approx(0.25, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)
    assert reqs == with_arrivals(fixed(8, 8, 20000), "poisson", rate_per_s=4.0, seed=0)
    assert reqs != with_arrivals(fixed(8, 8, 20000), "poisson", rate_per_s=4.0, seed=1)


@pytest.mark.parametrize("cv", [0.5, 2.0, 4.0])
def test_gamma_mean_and_cv(cv):
    t = np.array([r.arrival_s for r in with_arrivals(fixed(8, 8, 20000), "gamma", rate_per_s=2.0, cv=cv, seed=3)])
    gaps = np.diff(t)
    assert t[0] == 0.0
    assert gaps.mean() == pytest.approx(0.5, rel=0.1)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.1)


@pytest.mark.parametrize("kwargs, match", [
    (dict(process="uniform"), "offline, poisson, gamma, trace"),
    (dict(process="poisson"), "rate_per_s"),
    (dict(process="poisson", rate_per_s=0), "rate_per_s"),
    (dict(process="poisson", rate_per_s=-2.0), "rate_per_s"),
    (dict(process="gamma", rate_per_s=1.0), "cv"),
    (dict(process="gamma", rate_per_s=1.0, cv=0), "cv"),
    (dict(process="poisson", rate_per_s=1.0, cv=2.0), "cv"),
    (dict(process="offline", rate_per_s=1.0), "rate_per_s"),
    (dict(process="trace", time_scale=0), "time_scale"),
    (dict(process="poisson", rate_per_s=1.0, time_scale=2.0), "time_scale"),
])
def test_arrival_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        with_arrivals(fixed(8, 8, 3), **kwargs)


def test_arrivals_on_empty_and_single():
    assert with_arrivals([], "poisson", rate_per_s=1.0) == []
    assert with_arrivals(fixed(1, 1, 1), "gamma", rate_per_s=1.0, cv=3.0)[0].arrival_s == 0.0


# Length-only traces (issue 17): public length datasets and Vidur's trace files ship only the token counts.
LENGTHS_ONLY = "num_prefill_tokens,num_decode_tokens,source,num_total_tokens\n10,5,x,15\n\n20,3,y,23\n7,2,z,9\n"


def test_length_only_trace_parses_and_ignores_extra_columns(tmp_path):
    path = _write(tmp_path, LENGTHS_ONLY)
    requests, has_arrivals = read_trace(path)
    assert not has_arrivals
    assert requests == [Request(0, 0.0, 10, 5), Request(1, 0.0, 20, 3), Request(2, 0.0, 7, 2)]
    assert load_trace(path, limit=2) == requests[:2]
    assert read_trace(_write(tmp_path, HEADER + "0,5,5\n"))[1]


@pytest.mark.parametrize("body, line, what", [("5,x\n", 2, "not a number"), ("5,0\n", 2, "integer >= 1"),
                                              ("5,5\n5\n", 3, "missing")])
def test_length_only_trace_rows_are_checked(tmp_path, body, line, what):
    path = _write(tmp_path, "num_prefill_tokens,num_decode_tokens\n" + body)
    with pytest.raises(TraceFormatError, match=what) as e:
        load_trace(path)
    assert f"line {line}," in str(e.value)


def test_length_only_trace_needs_an_arrival_process(tmp_path):
    from infermax.config import RunConfig

    path = str(_write(tmp_path, LENGTHS_ONLY))
    for arrival in (None, "trace"):
        with pytest.raises(ValueError, match="has no arrived_at column .*--arrival poisson\\|gamma"):
            RunConfig(trace=path, arrival=arrival).requests()
    offline = RunConfig(trace=path, arrival="offline").requests()
    assert [r.arrival_s for r in offline] == [0.0, 0.0, 0.0]
    poisson = RunConfig(trace=path, arrival="poisson", rate=2.0, seed=4).requests()
    assert [(r.prompt_tokens, r.output_tokens) for r in poisson] == [(10, 5), (20, 3), (7, 2)]
    assert [r.arrival_s for r in poisson] == [r.arrival_s for r in
                                              with_arrivals(offline, "poisson", rate_per_s=2.0, seed=4)]
    assert poisson[0].arrival_s == 0.0 and 0 < poisson[1].arrival_s < poisson[2].arrival_s
    gamma = RunConfig(trace=path, arrival="gamma", rate=2.0, cv=3.0).requests()
    assert gamma[2].arrival_s > 0


def test_length_only_trace_from_the_cli(tmp_path):
    from typer.testing import CliRunner

    from infermax.cli import app

    path = str(_write(tmp_path, LENGTHS_ONLY))
    runner = CliRunner()
    res = runner.invoke(app, ["simulate", "--trace", path])
    assert res.exit_code == 2 and "has no arrived_at column" in res.output
    res = runner.invoke(app, ["simulate", "--trace", path, "--arrival", "poisson", "--rate", "1", "--json"])
    assert res.exit_code == 0, res.output
    assert '"num_requests": 3' in res.output and '"generated_tokens": 10' in res.output

