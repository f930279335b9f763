"""The command line: JSON fields, readable output, bad input -> one message and exit code 2."""

import json
import subprocess
import sys

import pytest

from mocap_jax.cli import main


def run(args, capsys):
    code = main(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_simulate_json_fields(capsys):
    code, out, _ = run(["simulate", "--model", "llama3-70b", "--hardware", "mocap-4x4", "--seq-len", "16384",
                        "--scheme", "terapipe", "--chunks", "8", "--batch", "2", "--json"], capsys)
    assert code == 0
    d = json.loads(out)
    for key in ("scheme", "feasible", "batch", "prefill_latency_s", "throughput_rps", "bubble_fraction"):
        assert key in d
    assert len(d["peak_mem_bytes_per_stage"]) == 16 and len(d["kv_peak_bytes_per_stage"]) == 16
    assert d["feasible"] is True and d["batch"] == 2


def test_simulate_readable_and_gpipe(capsys):
    code, out, _ = run(["simulate", "--scheme", "gpipe", "--seq-len", "8192", "--batch", "4"], capsys)
    assert code == 0 and "prefill latency" in out and "4 microbatches" in out


def test_simulate_auto_batch(capsys):
    code, out, _ = run(["simulate", "--seq-len", "131072", "--batch", "auto", "--json"], capsys)
    assert code == 0 and json.loads(out)["batch"] > 1


def test_max_seq_json(capsys):
    code, out, _ = run(["max-seq", "--scheme", "terapipe", "--chunks", "16", "--granularity", "1024", "--json"], capsys)
    assert code == 0 and json.loads(out)["max_seq_len"] > 1_000_000


def test_models_and_hardware_lists(capsys):
    code, out, _ = run(["models"], capsys)
    assert code == 0 and "qwen3-235b-a22b" in out and "70.55" in out
    code, out, _ = run(["hardware"], capsys)
    assert code == 0 and "mocap-4x4" in out and "a100-x8" in out


@pytest.mark.parametrize("args,fragment", [
    (["simulate", "--model", "llama3-7b"], "Did you mean"),
    (["simulate", "--hardware", "wafer9"], "unknown hardware"),
    (["simulate", "--seq-len", "10", "--chunks", "20"], "chunks need at least"),
    (["simulate", "--seq-len", "100", "--partition", "10,20"], "sums to 30"),
    (["simulate", "--model", "llama3.1-405b", "--hardware", "mocap-2x2"], "does not fit"),
    (["simulate", "--model", "/nonexistent/spec.json"], "cannot read spec file"),
    (["simulate", "--seq-len", "-5"], "positive integer"),
    (["simulate", "--seq-len", "1.5"], "positive integer"),
])
def test_bad_input_exit_2_one_message(args, fragment, capsys):
    with pytest.raises(SystemExit) as e:  # argparse type errors exit 2 themselves
        code = main(args)
        raise SystemExit(code)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert fragment in err and "Traceback" not in err


def test_module_entry_point_bad_input_has_no_traceback(tmp_path):
    bad = tmp_path / "m.toml"
    bad.write_text("layers = [")
    p = subprocess.run([sys.executable, "-m", "mocap_jax", "simulate", "--model", str(bad)], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2
    assert "not valid TOML" in p.stderr and "Traceback" not in p.stderr


def test_bench_anneal_small_json(capsys):
    """The annealing benchmark's command at a toy size: its JSON fields, a batch the uniform partition
    fits (found by the bisection), and an annealed objective no worse than the uniform one."""
    code, out, _ = run(["bench", "anneal", "--model", "llama3.1-8b", "--hardware", "mocap-2x4", "--seq-len", "8192",
                        "--chunks", "4", "--granularity", "512", "--chains", "16", "--steps", "4", "--json"], capsys)
    assert code == 0
    d = json.loads(out)
    for key in ("total_s", "steps_per_s", "compile_s", "placement_s", "batch_search_s", "anneal_s", "batch"):
        assert key in d
    assert d["batch"] >= 1 and d["steps_per_s"] > 0
    assert d["best_objective_s"] <= d["uniform_objective_s"] < float("inf")
