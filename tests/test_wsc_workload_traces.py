"""WSC-LLM workloads: Azure trace loader (real files and quirks), rate scaling, fitted synthetic generator."""

from pathlib import Path

import numpy as np
import pytest

from mocap_jax.cli import main
from mocap_jax.specs import SpecError
from mocap_jax.wsc.synthetic import LENGTH_FITS, LengthFit, get_trace, resolve_workload_name, synthetic_trace
from mocap_jax.wsc.traces import Trace, load_azure_trace, parse_timestamp

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO / ".." / "shared" / "data" / "azure-llm-inference-2023"
HEADER = "arrival_timestamp,prompt_size,token_size,request_id,application_id,batch_size,request_type"
need_traces = pytest.mark.skipif(not (TRACES / "conv.csv").exists(),
                                 reason=f"shared Azure traces not present at {TRACES.resolve()}")


def _write(tmp_path, body: str, bom=False, crlf=True, name="t.csv") -> Path:
    text = body.replace("\n", "\r\n") if crlf else body
    p = tmp_path / name
    p.write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode())
    return p


@need_traces
def test_real_traces_bom_timestamps_and_statistics():
    conv = load_azure_trace(TRACES / "conv.csv")
    assert (TRACES / "conv.csv").read_bytes()[:3] == b"\xef\xbb\xbf"  # the quirk is really there
    code = load_azure_trace(TRACES / "code.csv")
    assert len(conv) == 19365 and len(code) == 8819
    # MM:SS.s stamps: code.csv runs 00:02.1 .. 59:58.4, made relative to the first request
    assert code.arrival_s[0] == 0.0 and code.span_s == pytest.approx(59 * 60 + 58.4 - 2.1)
    assert conv.span_s == pytest.approx(59 * 60 + 59.5)
    assert conv.rate == pytest.approx(5.38, abs=0.01) and code.rate == pytest.approx(2.45, abs=0.01)
    assert conv.prompt_tokens.mean() == pytest.approx(1154, abs=1) and conv.output_tokens.max() == 1000
    assert code.prompt_tokens.max() == 7437 and np.median(code.output_tokens) == 13
    assert conv.summary()["shared_timestamps"] > 1000  # several requests per timestamp, kept in file order
    assert np.all(np.diff(conv.arrival_s) >= 0)


@need_traces
def test_embedded_fits_match_the_traces():
    for name, file in (("azure-code", "code.csv"), ("azure-conv", "conv.csv")):
        tr = load_azure_trace(TRACES / file)
        assert LengthFit.fit(tr.prompt_tokens, tr.output_tokens) == LENGTH_FITS[name]
        mo = LENGTH_FITS[name].moments(n=100_000)
        assert mo["mean_prompt"] == pytest.approx(tr.prompt_tokens.mean(), rel=0.03)
        assert mo["mean_output"] == pytest.approx(tr.output_tokens.mean(), rel=0.04)
        assert mo["mean_prompt_x_output"] == pytest.approx(np.mean(tr.prompt_tokens * tr.output_tokens), rel=0.03)


def test_loader_quirks_on_a_small_file(tmp_path):
    body = (f"{HEADER}\n00:01.5,100,7,1,0,1,2\n00:01.5,50,9,2,0,1,2\n00:00.9,30,0,3,0,1,2\n"
            f"01:00.0,20,3,4,0,1,2\n\n")
    tr = load_azure_trace(_write(tmp_path, body, bom=True, crlf=True))
    assert len(tr) == 4 and tr.name == "t"
    assert tr.arrival_s.tolist() == pytest.approx([0.0, 0.6, 0.6, 59.1])  # sorted, relative, ties kept in order
    assert tr.prompt_tokens.tolist() == [30, 100, 50, 20]
    assert tr.output_tokens.tolist() == [1, 7, 9, 3]  # token_size 0 reads as the prefill's one token
    lf = load_azure_trace(_write(tmp_path, body, bom=False, crlf=False, name="lf.csv"))
    assert np.array_equal(lf.arrival_s, tr.arrival_s)


def test_timestamp_formats():
    assert parse_timestamp("00:02.1") == pytest.approx(2.1)
    assert parse_timestamp("59:58.4") == pytest.approx(3598.4)
    assert parse_timestamp("1:02:03.5") == pytest.approx(3723.5)
    assert parse_timestamp("12.25") == 12.25
    assert parse_timestamp("2023-11-16 18:15:46.6543") - parse_timestamp("2023-11-16 18:15:45.6543") \
        == pytest.approx(1.0)
    for bad in ("", "1:75.0", "a:b", "-3", "1:2:3:4", "1.5:00"):
        with pytest.raises(ValueError):
            parse_timestamp(bad)


@pytest.mark.parametrize("row,fragment", [
    ("00:01.x,10,5,1,0,1,2", "bad arrival_timestamp"),
    ("00:01.0,12.5,5,1,0,1,2", "prompt_size '12.5' is not a whole number"),
    ("00:01.0,-4,5,1,0,1,2", "prompt_size '-4' must be >= 1"),
    ("00:01.0,10,five,1,0,1,2", "token_size 'five' is not a number"),
    ("00:01.0,10,5", "expected 7 comma-separated fields, got 3"),
])
def test_malformed_rows_name_file_and_line(tmp_path, row, fragment):
    p = _write(tmp_path, f"{HEADER}\n00:00.5,10,5,0,0,1,2\n{row}\n", bom=True)
    with pytest.raises(SpecError) as e:
        load_azure_trace(p)
    assert f"{p}:3:" in str(e.value) and fragment in str(e.value)


def test_missing_columns_and_files(tmp_path):
    with pytest.raises(SpecError, match=r"t.csv:1: the header lacks column\(s\) token_size"):
        load_azure_trace(_write(tmp_path, "arrival_timestamp,prompt_size\n00:01.0,5\n"))
    with pytest.raises(SpecError, match="cannot read trace"):
        load_azure_trace(tmp_path / "missing.csv")
    with pytest.raises(SpecError, match="no requests"):
        load_azure_trace(_write(tmp_path, HEADER + "\n", name="empty.csv"))


def test_rate_scaling_and_head(tmp_path):
    tr = Trace("x", np.array([0.0, 1.0, 1.0, 4.0]), np.array([5, 6, 7, 8]), np.array([1, 2, 3, 4]))
    assert tr.rate == pytest.approx(1.0)
    fast = tr.with_rate(4.0)
    assert fast.rate == pytest.approx(4.0) and fast.arrival_s.tolist() == pytest.approx([0.0, 0.25, 0.25, 1.0])
    assert fast.prompt_tokens.tolist() == [5, 6, 7, 8]  # order and lengths untouched
    assert len(tr.head(2)) == 2 and tr.head(10).span_s == 4.0
    for bad in (-1.0, 0.0, float("nan"), float("inf")):
        with pytest.raises(SpecError, match="rate must be (> 0|a finite number)"):
            tr.with_rate(bad)
    with pytest.raises(SpecError, match="same time"):
        Trace("y", np.zeros(3), np.ones(3), np.ones(3)).with_rate(2.0)
    with pytest.raises(SpecError, match="whole numbers >= 1"):
        Trace("z", np.zeros(2), np.array([0, 3]), np.ones(2))


def test_synthetic_generator_seed_rate_and_statistics():
    a = synthetic_trace("conv", 20_000, rate=50.0, seed=3)
    b = synthetic_trace("azure-conv", 20_000, rate=50.0, seed=3)
    c = synthetic_trace("azure-conv", 20_000, rate=50.0, seed=4)
    assert np.array_equal(a.arrival_s, b.arrival_s) and np.array_equal(a.output_tokens, b.output_tokens)
    assert not np.array_equal(a.prompt_tokens, c.prompt_tokens)
    assert a.rate == pytest.approx(50.0, rel=0.03)
    gaps = np.diff(a.arrival_s)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.05)  # exponential gaps (Poisson arrivals)
    assert a.prompt_tokens.mean() == pytest.approx(1154, rel=0.04) and np.median(a.output_tokens) == \
        pytest.approx(129, rel=0.05)
    code = synthetic_trace("code", 20_000, seed=1)
    assert code.rate == pytest.approx(2.45, rel=0.05)  # the trace's rate by default
    assert code.output_tokens.mean() == pytest.approx(27.9, rel=0.08)


def test_get_trace_and_unknown_workloads(tmp_path):
    p = _write(tmp_path, f"{HEADER}\n00:00.0,10,5,0,0,1,2\n00:02.0,20,6,1,0,1,2\n00:04.0,30,7,2,0,1,2\n")
    tr = get_trace(p, requests=2, rate=10.0)
    assert len(tr) == 2 and tr.rate == pytest.approx(10.0)
    assert len(get_trace("code", requests=12)) == 12
    with pytest.raises(SpecError, match="Did you mean 'azure-conv'"):
        resolve_workload_name("azure-cnv")
    with pytest.raises(SpecError, match="unknown workload"):
        get_trace("chat")
    with pytest.raises(SpecError, match="rate must be > 0"):
        get_trace("code", rate=-2.0)
    with pytest.raises(SpecError, match="positive integer"):
        get_trace("code", requests=0)


def test_trace_cli_and_bad_input_exit_2(tmp_path, capsys):
    p = _write(tmp_path, f"{HEADER}\n00:00.0,10,5,0,0,1,2\n00:02.0,20,6,1,0,1,2\n", bom=True)
    assert main(["wsc-llm", "trace", "--workload", str(p), "--json"]) == 0
    assert '"requests": 2' in capsys.readouterr().out
    bad = _write(tmp_path, f"{HEADER}\n00:00.0,10,5,0,0,1,2\n00:0x.0,20,6,1,0,1,2\n", name="bad.csv")
    empty = _write(tmp_path, "", name="empty.csv")
    header_only = _write(tmp_path, f"{HEADER}\n", name="header.csv")
    short = _write(tmp_path, f"{HEADER}\n00:00.0,10\n", name="short.csv")
    other = _write(tmp_path, "a,b\n1,2\n", name="other.csv")
    for args, fragment in ((["--workload", str(bad)], "bad.csv:3: bad arrival_timestamp"),
                           (["--workload", str(empty)], "is empty; expected a header line"),
                           (["--workload", str(header_only)], "has a header but no requests"),
                           (["--workload", str(short)], "short.csv:2: expected 7 comma-separated fields, got 2"),
                           (["--workload", str(other)], "the header lacks column(s) arrival_timestamp"),
                           (["--workload", "nope"], "unknown workload"),
                           (["--workload", "code", "--rate", "-1"], "rate must be > 0")):
        assert main(["wsc-llm", "trace", *args]) == 2
        err = capsys.readouterr().err
        assert fragment in err and "Traceback" not in err and err.count("\n") == 1
