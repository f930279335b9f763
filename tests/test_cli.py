"""The command line: JSON fields, readable output, and a table of bad inputs -> exit 2, one message line,
no traceback (every case an adversarial user found is a regression case here)."""

import json
import os
import subprocess
import sys

import pytest

from mocap_jax.cli import main


def run(args, capsys):
    try:
        code = main(args)
    except SystemExit as e:            # argparse's own errors
        code = e.code
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


def test_simulate_readable_gpipe_auto_batch_and_tp(capsys):
    code, out, _ = run(["simulate", "--scheme", "gpipe", "--seq-len", "8192", "--batch", "4"], capsys)
    assert code == 0 and "prefill latency" in out and "4 microbatches" in out
    code, out, _ = run(["simulate", "--seq-len", "131072", "--batch", "auto", "--json"], capsys)
    assert code == 0 and json.loads(out)["batch"] > 1
    code, out, _ = run(["simulate", "--hardware", "h100-x8", "--seq-len", "8192", "--tp", "4", "--chunks", "4",
                        "--json"], capsys)
    assert code == 0 and json.loads(out)["stages"] == 2


def test_max_seq_and_lists(capsys):
    code, out, _ = run(["max-seq", "--scheme", "terapipe", "--chunks", "16", "--granularity", "65536", "--json"],
                       capsys)
    assert code == 0 and json.loads(out)["max_seq_len"] > 1_000_000
    code, out, _ = run(["models"], capsys)
    assert code == 0 and "qwen3-235b-a22b" in out and "70.55" in out
    code, out, _ = run(["hardware"], capsys)
    assert code == 0 and "mocap-4x4" in out and "a100-x8" in out


def test_max_seq_says_when_no_sequence_fits(capsys):
    code, out, _ = run(["max-seq", "-m", "llama3.1-8b", "-w", "mocap-2x2", "--chunks", "4", "--granularity", "3",
                        "--batch", "1048576"], capsys)
    assert code == 0 and out.startswith("no sequence fits: even the shortest, 6 tokens, does not")


def test_max_seq_measures_one_batch_alone_as_the_study_does(capsys):
    """``max-seq`` answers the study's question (the longest sequence of one batch alone) unless asked
    for a stream: with two batches every stage fills at once and MBKR gains almost nothing."""
    from mocap_jax.api import max_feasible_seq_len

    common = ["--model", "llama3.1-8b", "--hardware", "mocap-2x2", "--chunks", "4", "--granularity", "16384", "--json"]
    longest = {}
    for scheme in ("terapipe", "mbkr"):
        code, out, _ = run(["max-seq", "--scheme", scheme] + common, capsys)
        d = json.loads(out)
        assert code == 0 and d["num_batches"] == 1
        longest[scheme] = d["max_seq_len"]
        assert longest[scheme] == max_feasible_seq_len("llama3.1-8b", "mocap-2x2", scheme, chunks=4, num_batches=1,
                                                       granularity=16384)
    assert longest["mbkr"] > 1.1 * longest["terapipe"]
    code, out, _ = run(["max-seq", "--scheme", "mbkr", "--num-batches", "2"] + common, capsys)
    assert code == 0 and json.loads(out)["max_seq_len"] < 1.01 * longest["terapipe"]


def _file(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


BAD = [
    # unknown names and impossible combinations
    (["simulate", "--model", "llama3-7b"], "Did you mean"),
    (["simulate", "--hardware", "wafer9"], "unknown hardware"),
    (["simulate", "--seq-len", "10", "--chunks", "20"], "chunks need at least"),
    (["simulate", "--seq-len", "100", "--partition", "10,20"], "sums to 30"),
    (["simulate", "--seq-len", "100", "--partition", "50,0,50"], "partition"),
    (["simulate", "--model", "llama3.1-405b", "--hardware", "mocap-2x2"], "does not fit"),
    (["simulate", "--model", "/nonexistent/spec.json"], "cannot read spec file"),
    (["simulate", "--scheme", "lbcp", "--tp", "3", "--hardware", "h100-x8"], "does not divide"),
    # counts: signs, fractions, overflow
    (["simulate", "--seq-len", "-5"], "positive integer"),
    (["simulate", "--seq-len", "1.5"], "positive integer"),
    (["simulate", "--seq-len", "1e30"], "too large"),
    (["simulate", "--seq-len", "1099511627776"], "largest value"),
    (["simulate", "--model", "llama3.1-8b", "--hardware", "mocap-2x2", "--seq-len", "4096", "--chunks", "4",
      "--batch", "1000000000000"], "largest value"),
    (["simulate", "--batch", "0"], "positive integer"),
    (["max-seq", "--max-seq-len", "4611686018427387904"], "largest value"),
    (["partition", "--batch", "0"], "positive integer"),
    (["simulate", "--tp", "3", "--hardware", "h100-x8"], "does not divide"),
    (["simulate", "--seq-len", "4096", "--chunks", "4", "--scheme", "terapipe-dp", "--granularity", "1"],
     "TeraPipe's planner would tabulate"),
    (["simulate", "--seq-len", "4096", "--chunks", "4", "--scheme", "lbcp", "--steps", "1", "--chains", "16000000"],
     "chains = 16000000 exceeds"),
    (["bench", "anneal", "--chains", "100000000", "--steps", "10"], "chains = 100000000 exceeds"),
    (["wsc-llm", "partition", "--max-batch", "2000000"], "max_batch = 2000000 exceeds"),
    (["compare", "--schemes", ""], "unknown scheme ''"),
    (["validate", "--seed", "-1"], "expected a seed"),
    (["validate", "--configs", "1000000000", "--no-calibration"], "--configs = 1000000000 exceeds"),
    (["validate", "--mbkr-configs", "1000000000", "--no-calibration"], "--mbkr-configs = 1000000000 exceeds"),
    (["bench", "reference", "--configs", "1000000000"], "configs = 1000000000 exceeds"),
    (["bench", "pipeline", "--repeats", "1000000000"], "repeats = 1000000000 exceeds the largest value accepted"),
    (["wsc-llm", "place", "--steps", "1000000000000"], "--steps = 1000000000000 exceeds the largest value"),
    (["wsc-llm", "place", "--random-samples", "1000000000000"], "--random-samples = 1000000000000 exceeds"),
    (["wsc-llm", "memory", "--requests", "1000000000000"], "--requests = 1000000000000 exceeds"),
    (["placement", "--seed", "2147483648"], "expected a seed"),
    (["compare", "--schemes", "gpipe,gpipe"], "each scheme once"),
    (["claims", "--run", "--models", "llama3-70b,bogus", "--no-sensitivity"], "unknown model 'bogus'"),
    # thresholds and floats
    (["simulate", "--scheme", "mbkr", "--p1", "0.9", "--p2", "0.5"], "p1 <= p2"),
    (["simulate", "--scheme", "mbkr", "--p2", "nan"], "finite"),
    (["placement", "--pair-weight", "nan"], "finite"),
    # a flag the chosen scheme does not read would change nothing
    (["simulate", "--scheme", "gpipe", "--chunks", "8"], "--chunks does not apply to gpipe"),
    (["max-batch", "--scheme", "terapipe", "--microbatch", "4"], "--microbatch applies to gpipe, and terapipe splits"),
    (["simulate", "--scheme", "terapipe", "--p2", "0.5"], "--p2 applies to the MBKR schemes"),
    (["max-seq", "--scheme", "gpipe", "--spill", "eager"], "--spill applies to the MBKR schemes"),
    (["simulate", "--scheme", "lbcp", "--pairing", "dynamic"], "--pairing applies to the MBKR schemes"),
    (["simulate", "--scheme", "terapipe-dp", "--steps", "10"], "--steps applies to the schemes that anneal"),
    (["partition", "--scheme", "lbcp", "--p2", "0.5"], "--p2 applies to the MBKR schemes"),
    (["compare", "--schemes", "gpipe,terapipe", "--pairing", "dynamic"], "gpipe, terapipe are not one of them"),
    (["compare", "--schemes", "gpipe", "--chunks", "8"], "--chunks does not apply to gpipe"),
    (["compare", "--schemes", "terapipe,mbkr", "--steps", "10"], "--steps applies to the schemes that anneal"),
    (["compare", "--load", "0"], "load"),
    (["compare", "--load", "-1"], "load"),
    # meshes too large to represent
    (["simulate", "--hardware", "mocap-1000x1000", "--stages", "8"], "4,096 dies"),
    (["placement", "--hardware", "mocap-100x100", "--stages", "16"], "4,096 dies"),
]


@pytest.mark.parametrize("args,fragment", BAD)
def test_bad_input_exits_2_with_one_line(args, fragment, capsys):
    code, _, err = run(args, capsys)
    assert code == 2, err
    assert fragment in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err


SPEC_FILES = [
    ("list.json", "[1, 2, 3]", "one table"),
    ("number.json", "42", "one table"),
    ("string.json", '"llama"', "one table"),
    ("null.json", "null", "one table"),
    ("deep.json", "[" * 5000 + "]" * 5000, "nests too deeply"),
    ("nan_latency.toml", 'name = "w"\nlink_latency_s = nan\n', "finite"),
    ("inf_overhead.toml", 'name = "w"\nlayer_overhead_s = inf\n', "finite"),
    ("huge_flops.toml", 'name = "w"\npeak_flops = 1e308\n', "largest accepted"),
    ("bool_eff.toml", 'name = "w"\neff_gemm = true\n', "number"),
    ("huge_int.json", '{"name": "w", "rows": ' + "9" * 400 + "}", "largest value"),
]


@pytest.mark.parametrize("name,text,fragment", SPEC_FILES)
def test_bad_hardware_files(tmp_path, capsys, name, text, fragment):
    code, _, err = run(["simulate", "--hardware", _file(tmp_path, name, text)], capsys)
    assert code == 2 and fragment in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("text,fragment", [
    ('layers = 4\nhidden = 64\nffn = 128\nq_heads = 2\nkv_heads = 2\nhead_dim = 32\nvocab = 10\n'
     'tied_embeddings = "no"\n', "true or false"),
    ('layers = 4\nhidden = 64\nffn = 128\nq_heads = 2\nkv_heads = 2\nhead_dim = 32\nvocab = 10\n'
     'experts = 4\nexperts_active = 1\ndense_ffn = -3\n', "dense_ffn"),
    ('layers = 4\nhidden = 64\nffn = 128\nq_heads = 2\nkv_heads = 2\nhead_dim = 32\nvocab = 10\n'
     'shared_experts = -1\n', "shared_experts"),
])
def test_bad_model_files(tmp_path, capsys, text, fragment):
    code, _, err = run(["simulate", "--model", _file(tmp_path, "m.toml", text)], capsys)
    assert code == 2 and fragment in err and "Traceback" not in err, err


@pytest.mark.parametrize("text,fragment", [("[1, 2]", "not a claims ledger"), ('{"ledger": [{"claim": "a"}]}',
                                                                                "not a claims ledger"),
                                           ("{", "not JSON")])
def test_claims_refuses_a_file_that_is_not_a_ledger(tmp_path, capsys, text, fragment):
    (tmp_path / "claims.json").write_text(text)
    code, _, err = run(["claims", "--results", str(tmp_path)], capsys)
    assert code == 2 and fragment in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_output_paths_are_checked_before_any_work(tmp_path, capsys):
    a_file = _file(tmp_path, "file.txt", "x")
    for args in (["reproduce", "--results", a_file], ["reproduce", "--results", os.path.join(a_file, "sub")]):
        code, _, err = run(args, capsys)
        assert code == 2 and "file" in err and "Traceback" not in err
    locked = tmp_path / "locked"
    locked.mkdir()
    os.chmod(locked, 0o500)
    try:
        if not os.access(locked, os.W_OK):      # root ignores permission bits
            code, _, err = run(["reproduce", "--results", str(locked / "r")], capsys)
            assert code == 2 and "not writable" in err
    finally:
        os.chmod(locked, 0o700)


def test_module_entry_point_bad_input_has_no_traceback(tmp_path):
    bad = tmp_path / "m.toml"
    bad.write_text("layers = [")
    p = subprocess.run([sys.executable, "-m", "mocap_jax", "simulate", "--model", str(bad)], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2
    assert "not valid TOML" in p.stderr and "Traceback" not in p.stderr


def test_the_command_line_collects_garbage_less_often_and_keeps_the_older_generations(capsys):
    """The command line raises only the first generation's collector threshold (tracing allocates
    many short-lived objects); the older generations keep what the process had."""
    import gc

    from mocap_jax.api.process import FIRST_GENERATION_THRESHOLD

    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 7, 3)
        assert main(["models"]) == 0
        assert gc.get_threshold() == (FIRST_GENERATION_THRESHOLD, 7, 3)
    finally:
        gc.set_threshold(*before)
    assert "llama3-70b" in capsys.readouterr().out


def test_dtype_float64_on_the_command_line_runs_in_float64(tmp_path):
    """A command that offers --dtype float64 turns 64-bit JAX on itself (a fresh process, without
    JAX_ENABLE_X64), and the answer is the float32 one to float32 rounding."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_ENABLE_X64"}
    args = [sys.executable, "-m", "mocap_jax", "--compile-cache", "off", "simulate", "--model", "llama3.1-8b",
            "--hardware", "mocap-2x2", "--seq-len", "4096", "--chunks", "4", "--json"]
    runs = [subprocess.run(args + ["--dtype", d], capture_output=True, text=True, timeout=300, env=env)
            for d in ("float64", "float32")]
    assert [p.returncode for p in runs] == [0, 0], runs[0].stderr
    f64, f32 = (json.loads(p.stdout)["prefill_latency_s"] for p in runs)
    assert f64 == pytest.approx(f32, rel=1e-5) and f64 != f32


def test_placement_on_a_large_mesh_answers_quickly(capsys):
    code, out, _ = run(["placement", "--hardware", "mocap-60x60", "--stages", "16", "--json"], capsys)
    d = json.loads(out)
    assert code == 0 and len(d["placement"]) == 16 and d["searched"]["cost"] <= d["snake"]["cost"]


def test_compile_cache_is_filled_once_and_reused_by_a_later_process(tmp_path):
    """A second process finds every program the first compiled (stable keys: no new entries) and
    prints the same result; a folder that cannot be created is bad input."""
    cache = tmp_path / "xla"
    cmd = [sys.executable, "-m", "mocap_jax", "--compile-cache", str(cache), "simulate", "--seq-len", "8192",
           "--chunks", "4", "--json"]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    entries = sorted(p.name for p in cache.glob("*-cache"))
    assert first.returncode == 0 and entries
    second = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0 and second.stdout == first.stdout
    # on hosts where XLA raises its false alarm for every program it loads, none reaches the user
    assert "cpu_aot_loader" not in second.stderr, second.stderr[:500]
    assert sorted(p.name for p in cache.glob("*-cache")) == entries
    blocked = tmp_path / "file"
    blocked.write_text("")
    bad = subprocess.run([sys.executable, "-m", "mocap_jax", "--compile-cache", str(blocked / "xla"), "models"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--compile-cache" in bad.stderr and "Traceback" not in bad.stderr


NOISE = ("E1204 14:09:15.560389    7106 cpu_aot_loader.cc:195] Loading XLA:CPU AOT result. Target machine feature "
         "+prefer-no-{} is not  supported on the host machine. Machine type used for XLA:CPU compilation doesn't "
         "match the machine type for execution. Compile machine features: [+64bit,+avx512f] vs host machine "
         "features: [64bit,avx512f]. This could lead to execution errors such as SIGILL.\n")


def test_stderr_filter_drops_exactly_the_false_alarm_in_pieces_of_any_size():
    from mocap_jax.cli.stderr_filter import LineFilter

    missing = NOISE.format("gather").replace("+prefer-no-gather", "+avx512fp16")   # a real mismatch: kept
    # a bar's unfinished line may come just before a false alarm: XLA's log writes after the bar's text
    text = ("E1204 a log line of another kind\n" + NOISE.format("gather") + "sweep:  50%|#####     | 1/2\r"
            + NOISE.format("scatter") + missing + "\rsweep:  90%|E#######  | 9/10" + NOISE.format("gather")
            + "\rsweep: 100%|##########| 2/2\n" + "Error at the end, no newline")
    expect = "E1204 a log line of another kind\n" + "sweep:  50%|#####     | 1/2\r" + missing \
        + "\rsweep:  90%|E#######  | 9/10" + "\rsweep: 100%|##########| 2/2\n" + "Error at the end, no newline"
    data = text.encode()
    for size in (1, 7, 64, 1000, len(data)):
        lines = LineFilter()
        got = b"".join(lines.feed(data[i:i + size]) for i in range(0, len(data), size)) + lines.close()
        assert got.decode() == expect, size
    # a progress bar's unfinished line goes out at once; an unfinished log line waits for its end
    lines = LineFilter()
    assert lines.feed(b"sweep:  10%|#") == b"sweep:  10%|#"
    assert lines.feed(b"\rE1204 14:09:15.5603") == b"\r"
    assert lines.feed(NOISE.format("gather")[19:].encode()) == b""
    assert lines.feed(b"\rsweep:  20%|##") == b"\rsweep:  20%|##"
    assert lines.feed(NOISE.format("scatter").encode() + b"\rsweep:  30%") == b"\rsweep:  30%"


def test_stderr_filter_installed_in_a_process_filters_its_file_descriptor_2():
    """What XLA's C++ log writes to descriptor 2 is filtered; Python's own stderr passes, in order, and
    everything arrives before the process has exited."""
    script = ("import os, sys\n"
              "from mocap_jax.cli.stderr_filter import install\n"
              "assert install()\n"
              "print('before', file=sys.stderr, flush=True)\n"
              f"os.write(2, {NOISE.format('gather').encode()!r})\n"
              "os.write(2, b'kept\\n')\n"
              "print('after', file=sys.stderr)\n")
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stderr == "before\nkept\nafter\n", p.stderr


def test_stderr_filter_sync_waits_for_everything_sent_before_it_in_pieces_of_any_size():
    """Each SYNC, even cut across reads, is dropped from the text and answered once, after the text before it."""
    import threading
    import time

    from mocap_jax.cli.stderr_filter import SYNC, pump

    text = b"\rbar 10%" + SYNC + b"\rbar 100%\n" + SYNC + b"done\n"
    cuts = [0, 3, 9, 12, 20, 31, len(text)]
    source_r, source_w = os.pipe()
    sink_r, sink_w = os.pipe()
    answers_r, answers_w = os.pipe()

    def feed():
        for a, b in zip(cuts, cuts[1:]):
            os.write(source_w, text[a:b])
            time.sleep(0.02)
        os.close(source_w)

    writer = threading.Thread(target=feed)
    writer.start()
    pump(source_r, sink_w, answers_w)
    writer.join()
    for fd in (source_r, sink_w, answers_w):
        os.close(fd)
    assert os.read(sink_r, 1 << 16) == b"\rbar 10%\rbar 100%\ndone\n"
    assert os.read(answers_r, 16) == b"11"
    os.close(sink_r)
    os.close(answers_r)


def test_a_progress_bar_is_on_the_terminal_before_the_output_after_it():
    """A bar's last redraw (carriage return, text) written before the command's next line of output
    arrives first, so it cannot overwrite that line."""
    script = ("import os, sys\n"
              "from mocap_jax.cli.stderr_filter import install, sync\n"
              "assert install()\n"
              "for k in range(200):\n"
              "    os.write(2, b'\\rbar %d' % k)\n"
              "sync()\n"
              "os.write(1, b'result\\n')\n")
    p = subprocess.run([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    assert p.returncode == 0 and p.stdout.endswith(b"\rbar 199result\n"), p.stdout[-60:]


def test_top_level_help_names_every_benchmark():
    import argparse

    from mocap_jax.cli import build_parser

    subcommands = lambda p: next(a for a in p._actions if isinstance(a, argparse._SubParsersAction)).choices
    parser = build_parser()
    targets = subcommands(subcommands(parser)["bench"])
    text = " ".join(parser.format_help().split())
    listed = text.split("benchmarks (commands, not tests):")[1].split(" simulate ")[0]
    assert {t.strip() for t in listed.split(",")} == set(targets)


def test_counts_read_in_the_singular_for_one():
    from mocap_jax.cli.common import counted

    assert [counted(1, "stage"), counted(16, "stage"), counted(1, "batch", "batches"),
            counted(2, "batch", "batches"), counted(153600, "request")] == \
        ["1 stage", "16 stages", "1 batch", "2 batches", "153,600 requests"]


def test_bench_peer_never_rebuilds_a_folder_it_did_not_create(tmp_path, capsys):
    """``--venv`` naming an existing environment (or any folder with files) is refused, not cleared."""
    env = tmp_path / "my-env"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").write_text("#!/bin/sh\nexit 1\n")   # an environment without the peer
    (env / "bin" / "python").chmod(0o755)
    (env / "notes.txt").write_text("mine")
    code, _, err = run(["bench", "peer", "--venv", str(env)], capsys)
    assert code == 2 and "holds files the peer benchmark did not create" in err and err.count("\n") == 1
    assert (env / "notes.txt").read_text() == "mine" and (env / "bin" / "python").exists()


def test_bench_pipeline_and_anneal_run_at_a_tiny_size(capsys):
    """Smoke runs of the two benchmarks without a smoke test of their own elsewhere: they report the
    configuration they measured, and what they claim of it holds (the MBKR points spill at the
    benchmark's default batch; annealing never reports a best worse than the uniform partition)."""
    import jax

    small = ["--model", "llama3.1-8b", "--hardware", "mocap-2x2", "--seq-len", "16384", "--chunks", "4"]
    code, out, _ = run(["bench", "pipeline", *small, "--scheme", "mbkr", "--points", "32", "--block", "32",
                        "--repeats", "1", "--json"], capsys)
    r = json.loads(out)
    assert code == 0 and (r["points"], r["scheme"], r["chunks"], r["seq_len"]) == (32, "mbkr", 4, 16384)
    assert r["devices"] == jax.local_device_count() and r["spilling_share"] > 0
    code, out, _ = run(["bench", "anneal", *small, "--granularity", "256", "--chains", "4", "--steps", "2", "--json",
                        "--quiet"], capsys)
    r = json.loads(out)
    assert code == 0 and (r["chains"], r["steps"], r["chunks"]) == (4, 2, 4)
    assert r["best_objective_s"] <= r["uniform_objective_s"] * (1 + 1e-6) and r["uniform_batch"] >= 1
