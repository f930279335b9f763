"""``mocap-jax wsc-llm ...``: JSON and readable output; bad input -> one line on stderr and exit code 2."""

import json
import re

import pytest

from mocap_jax.cli import main

SMALL = ["--hardware", "wsc-3x4", "--prefill", "1x1:4", "--decode", "1x2:2"]


def run(args, capsys):
    code = main(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_partition_json_and_table(capsys):
    code, out, err = run(["wsc-llm", "partition", "--hardware", "wsc-2x3", "--json"], capsys)
    assert code == 0, err
    d = json.loads(out)
    for key in ("prefill", "decode", "n_prefill", "n_decode", "served_rps", "runtime_s", "candidates", "packing"):
        assert key in d
    assert d["dies_used"] <= 6 and d["prefill"]["strategy"] in ("megatron", "gqa-hybrid")
    assert len(d["packing"]) == d["n_prefill"] + d["n_decode"]
    code, out, _ = run(["wsc-llm", "partition", "--hardware", "wsc-2x3", "--top", "3"], capsys)
    assert code == 0 and "choice:" in out and "partition runtime" in out and "req/s/die" in out


def test_hardware_list(capsys):
    code, out, _ = run(["wsc-llm", "hardware"], capsys)
    assert code == 0 and "wsc-llm-64g" in out and "a100-cluster" in out


def test_place_with_figure(tmp_path, capsys):
    fig = tmp_path / "wsc_placement.png"
    code, out, err = run(["wsc-llm", "place", *SMALL, "--alphas", "1,2", "--random-samples", "5",
                          "--figure", str(fig), "--json"], capsys)
    assert code == 0, err
    d = json.loads(out)
    assert fig.exists() and d["figure"] == str(fig)
    assert [r["alpha"] for r in d["alpha_sensitivity"]] == [1.0, 2.0]
    assert all(r["searched"] <= r["decode_centred"] for r in d["alpha_sensitivity"])
    assert len(d["layout"]) == 6


def test_memory_json(capsys):
    code, out, err = run(["wsc-llm", "memory", *SMALL, "--requests", "150", "--rate", "40", "--json"], capsys)
    assert code == 0, err
    d = json.loads(out)
    assert set(d["policies"]) == {"greedy", "local"}
    assert len(d["policies"]["greedy"]["peak_util"]) == 3 and len(d["policies"]["greedy"]["peak_util"][0]) == 4
    assert [r["policy"] for r in d["snapshot"]["results"]] == ["greedy", "local", "optimal-lp"]


@pytest.mark.parametrize("args,fragment", [
    (["wsc-llm", "place", "--hardware", "wsc-3x4", "--prefill", "7x7:1", "--decode", "1x1:1"], "larger than the 3x4"),
    (["wsc-llm", "partition", "--model", "llama3.1-405b", "--hardware", "wsc-2x2"], "do not fit any rectangular"),
    (["wsc-llm", "place", *SMALL, "--alpha", "0.5"], "alpha must be >= 1"),
    (["wsc-llm", "place", *SMALL, "--alphas", "1,0.9"], "--alphas must be >= 1"),
    (["wsc-llm", "place", *SMALL, "--alphas", "1,1e40"], "--alphas = 1e+40 exceeds the largest accepted value, 100"),
    (["wsc-llm", "memory", "--alpha", "1e40"], "--alpha = 1e+40 exceeds the largest accepted value, 100"),
    (["wsc-llm", "partition", "--strategies", "megatron,ring"], "unknown TP strategy"),
    (["wsc-llm", "partition", "--hardware", "wsc-llm-6g"], "Did you mean"),
    (["wsc-llm", "partition", "--model", "llama2-7"], "Did you mean"),
    (["wsc-llm", "memory", "--hardware", "wsc-3x4", "--prefill", "1x1"], "HxW:N"),
    (["wsc-llm", "memory", "--hardware", "wsc-3x4", "--prefill", "1x1:4"], "give both --prefill and --decode"),
    (["wsc-llm", "partition", "--workload", "nope"], "unknown workload"),
    (["wsc-llm", "partition", "--dram-gb", "-4"], "--dram-gb must be a positive"),
    (["wsc-llm", "partition", "--ttft-slo-s", "inf"], "--ttft-slo-s must be a finite number"),
    (["wsc-llm", "partition", "--dram-gb", "1e40"], "dram_capacity = 1.0000000000000001e+49 exceeds the largest"),
    (["wsc-llm", "place", "--hardware", "a100-cluster"], "mesh wafer"),
    (["wsc-llm", "serve", "--rows", "100000"], "exceed the largest grid"),
    (["wsc-llm", "serve", "--requests", "1000000000"], "exceeds the largest value"),
    (["wsc-llm", "partition", "--hardware", "wsc-100x100"], "exceed the largest grid"),
    (["wsc-llm", "explore", "--out", __file__], "is a file, not a directory"),
    (["wsc-llm", "robustness", "--out", __file__ + "/x"], "is a file, not a directory"),
    (["wsc-llm", "serve", "--out", "metrics.txt"], "this command writes CSV"),
    (["wsc-llm", "explore", "--figure", "space.xyz"], "a figure is written in the format its extension names"),
    (["wsc-llm", "place", *SMALL, "--figure", "wafer"], "a figure is written in the format its extension names"),
])
def test_bad_input_exit_2_one_line(args, fragment, capsys):
    code = main(args)
    err = capsys.readouterr().err
    assert code == 2
    assert fragment in err and "Traceback" not in err
    # one line, prefixed by the command and sub-command that failed
    assert err.count("\n") == 1 and re.match(rf"mocap-jax wsc-llm {args[1]}: error: ", err), err
