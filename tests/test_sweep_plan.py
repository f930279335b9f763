"""Planning a sweep without enumerating it: arithmetic bucket counts against a brute-force oracle, huge grids
(--dry-run, --limit), and the validation of sweep values (types, finiteness, representable limits)."""

import json
from pathlib import Path

import numpy as np
import pytest

from mocap_jax import sweep
from mocap_jax.cli import main
from mocap_jax.specs import LIMITS
from mocap_jax.sweep import evaluate
from mocap_jax.sweep import plan as plan_module
from mocap_jax.sweep.plan import Plan
from mocap_jax.sweep.resolver import PLAN_KEYS, Resolver
from mocap_jax.sweep.space import Space
from sweep_texts import HUGE

ROOT = Path(__file__).resolve().parents[1]

# every bucket-deciding key, featured keys with several values of one class, impossible points as rows
MIXED = {
    "sweep": {"impossible": "infeasible"},
    "fixed": {"model": "llama3.1-8b"},
    "grid": [
        {"hardware": ["mocap-2x2", "mocap-2x4"], "hbm_capacity": [20e9, 180e9], "scheme": ["gpipe", "terapipe", "mbkr"],
         "load": [1.0, 2.0, 3.0], "pairing": ["cross-half", "none", "dynamic"], "admission": ["streaming", "synchronous"],
         "seq_len": [16, 4096], "chunks": [4, 32], "batch": [1, 8], "microbatch": [1, 4], "p1": [0.0, 0.9],
         "link_bandwidth": [1e12, 2e12, 3e12], "seed": [0, 1]},
        {"scheme": ["lbcp"], "batch": ["auto", 2], "seq_len": [1000, 4096, 16777216], "granularity": [256],
         "stages": [2, 4, 8], "max_batch": [8, 256]},
    ],
    "points": [{"scheme": "gpipe", "seq_len": 8192, "batch": 2}, {"scheme": "mbkr", "load": 4.0, "requests": 8}],
}


def _brute_force(cfg):
    """``(key, points, first id)`` of every bucket by resolving every point (what the count must equal)."""
    resolver = Resolver(Space(cfg))
    ids = np.arange(resolver.space.size)
    keys, inv = resolver.bucket_keys(resolver.resolve(ids))
    per_point = [keys[q] for q in inv]
    buckets = {}   # in order of first point (dicts keep insertion order)
    for i, k in enumerate(per_point):
        n, first = buckets.get(k, (0, i))
        buckets[k] = (n + 1, first)
    return [(k, n, first) for k, (n, first) in buckets.items()]


@pytest.mark.parametrize("max_points", [None, 1, 999, 20737, 41473, 41507])
def test_arithmetic_counts_equal_brute_force(max_points):
    cfg = sweep.load_sweep(MIXED, max_points=max_points)
    plan = Plan(cfg, 7, 3)
    got = [(b.key, b.points, b.first_id) for b in plan.ordered()]
    assert got == _brute_force(cfg)
    assert plan.representatives < plan.points or plan.points < 100
    # blocks cover every point once, in bucket order of first appearance, ascending inside a block
    seen = np.concatenate([ids for _, _, ids in plan.blocks()])
    assert np.array_equal(np.sort(seen), np.arange(plan.points))
    assert sum(1 for _ in plan.blocks()) == plan.num_blocks()


def test_plan_keys_are_the_only_ones_deciding_buckets():
    """Changing any key outside PLAN_KEYS never changes a point's bucket or reason."""
    base = {"model": "llama3.1-8b", "hardware": "mocap-2x2", "seq_len": 4096, "chunks": 4}
    varied = {"peak_flops": [1e15, 9e15], "placement": ["snake", "searched"],
              "read_overlap": [0.1, 0.9], "arrivals": ["poisson", "fixed"], "chains": [4, 8], "kv_bytes": [1, 2],
              "scheme": ["terapipe", "mbkr", "gpipe"], "load": [2.0]}
    assert not (set(varied) - {"scheme", "load"}) & PLAN_KEYS
    cfg = sweep.load_sweep({"fixed": base, "grid": varied})
    space = Space(cfg)
    resolver = Resolver(space)
    r = resolver.resolve(np.arange(space.size))
    keys, inv = resolver.bucket_keys(r)
    scheme = np.array(space.tables["scheme"], dtype=object)[r.codes["scheme"]]
    for s in ("terapipe", "mbkr", "gpipe"):
        assert len(set(inv[scheme == s])) == 1


def test_huge_grid_dry_run_counts_without_enumerating(tmp_path, capsys, monkeypatch):
    p = tmp_path / "huge.toml"
    p.write_text(HUGE)
    resolved = []
    original = Resolver.resolve
    monkeypatch.setattr(Resolver, "resolve", lambda self, ids: resolved.append(len(ids)) or original(self, ids))
    assert main(["sweep", str(p), "--dry-run", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["points"] == 160_000_000_000 and d["representatives"] == 10 and sum(resolved) == 10
    assert [b["points"] for b in d["buckets"]] == [80_000_000_000] * 2
    assert d["blocks"] == 20_000_000_000
    assert main(["sweep", str(p), "--dry-run"]) == 0
    assert "160,000,000,000 points, 2 buckets, 20,000,000,000 blocks" in capsys.readouterr().out
    # run whole, it would not fit the disk: refused up front with the estimate, nothing created
    assert main(["sweep", str(p), "--out", str(tmp_path / "all"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "GB" in err and "320,000,000,000 rows" in err and err.count("\n") == 1
    assert not (tmp_path / "all").exists()


def test_huge_grid_limit_evaluates_one_block(tmp_path, monkeypatch):
    p = tmp_path / "huge.toml"
    p.write_text(HUGE)
    resolved = []
    original = Resolver.resolve
    monkeypatch.setattr(Resolver, "resolve", lambda self, ids: resolved.append(len(ids)) or original(self, ids))
    monkeypatch.setattr(plan_module, "WINDOW", 64)
    s = sweep.run_sweep(p, tmp_path / "o", quiet=True, limit=8, devices=1)
    assert s.evaluated == 8 and not s.complete and s.blocks_done == 1
    # planning (10 representatives) + the scan to the first full block + resolving that block
    assert sum(resolved) <= 10 + 2 * 64 + 8
    rows = (tmp_path / "o" / "parts").iterdir()
    text = next(rows).read_text()
    assert text.count("\n") == 8 and "nan" not in text


@pytest.mark.parametrize("inputs_fit,fragment", [
    (False, "the inputs of a block of 8 points take about"),
    (True, "a block of 8 points needs about"),      # inputs fit; XLA's estimate of the program does not
])
def test_block_memory_checked_before_it_is_allocated(tmp_path, monkeypatch, inputs_fit, fragment):
    checks = []

    def available(device):
        """The block's inputs are checked first, then the compiled program: room for the inputs only
        (or for nothing), whatever the program's size."""
        checks.append(device)
        return 1 << 40 if inputs_fit and len(checks) == 1 else 1

    monkeypatch.setattr(evaluate, "_COMPILED", {})
    monkeypatch.setattr(evaluate, "available_memory_bytes", available)
    with pytest.raises(ValueError) as e:
        sweep.run_sweep(HUGE, tmp_path / "o", quiet=True, limit=8, devices=1)
    msg = str(e.value)
    assert fragment in msg and "chunked K4 N4 nb2 mbkr=off" in msg and "--block-size" in msg, msg
    assert not list((tmp_path / "o" / "parts").iterdir())


def test_representatives_limit_refuses_with_the_count(tmp_path):
    grid = {"seq_len": list(range(4096, 4096 + 2049)), "chunks": list(range(1, 65)), "batch": list(range(1, 65)),
            "peak_flops": [1e15, 2e15]}
    with pytest.raises(ValueError, match="16,785,408 points .* 8,392,704 distinct combinations of batch, chunks, "
                                         "seq_len, more than the 8,388,608"):
        sweep.describe({"grid": grid})


def test_expand_refuses_huge_sweeps(tmp_path):
    with pytest.raises(ValueError, match="too many to list"):
        sweep.expand(HUGE)
    assert len(sweep.expand(HUGE, max_points=3)) == 3


@pytest.mark.parametrize("text,fragments", [
    ("[grid]\nseq_len = [10000000000]\n", ["seq_len", "134,217,728"]),
    ("[grid]\nbatch = [1000000000000]\n", ["batch", "1,048,576"]),
    ("[grid]\nchunks = [1e30]\n", ["chunks", "too large"]),
    ("[grid]\nchunks = [4.5]\n", ["chunks", "integer"]),
    ("[grid]\nbatch = [true]\n", ["batch", "integer"]),
    ("[fixed]\nload = 1e-300\n[grid]\nseq_len = [4096]\n", ["load", "1e-300", "smallest accepted"]),
    ("[fixed]\nload = nan\n[grid]\nseq_len = [4096]\n", ["load", "finite"]),
    ("[grid]\nlink_latency_s = [nan]\n", ["link_latency_s", "finite"]),
    ("[grid]\nlayer_overhead_s = [inf]\n", ["layer_overhead_s", "finite"]),
    ("[grid]\nactivation_buffer_scale = [-1.0]\n", ["activation_buffer_scale", ">= 0"]),
    ("[grid]\npeak_flops = [1e308]\n", ["peak_flops", "largest accepted"]),
    ("[grid]\neff_gemm = [true]\n", ["eff_gemm", "number"]),
    ("[grid]\nseed = [1099511627776]\n", ["seed", "2,147,483,647"]),
    ("[grid]\nseed = [3000000000]\n", ["seed", "2,147,483,647"]),
    ("[fixed]\nload = 1e-15\n[grid]\nseq_len = [4096]\n", ["load", "1e-12", "not representable"]),
    ("[grid]\npeak_flops = [1e-6]\n", ["peak_flops", "smallest accepted value, 1"]),
    ("[grid]\neff_hbm = [1e-9]\n", ["eff_hbm", "0.0001"]),
    ("[grid]\nrows = [100000]\n", ["rows", "4,096"]),
    ("[grid]\nrows = [100]\ncols = [100]\n", ["10,000 dies", "4,096"]),
    ("[sweep]\nexact = \"no\"\n[grid]\nseq_len = [4096]\n", ["exact", "true or false"]),
    ("[sweep]\nblock_size = -4\n[grid]\nseq_len = [4096]\n", ["block_size", "-4"]),
    ("[fixed]\nscheme = \"gpipe\"\nmodel = \"llama3.1-8b\"\nhardware = \"mocap-2x2\"\n[grid]\nbatch = [1048576]\n",
     ["microbatches", "4,096"]),
    ("a = " + "[" * 3000 + "]" * 3000 + "\n", ["nested too deeply"]),
])
def test_unrepresentable_values_refused(tmp_path, text, fragments):
    p = tmp_path / "s.toml"
    p.write_text(text)
    with pytest.raises(ValueError) as e:
        sweep.describe(p)
    msg = str(e.value)
    assert str(p) in msg and "\n" not in msg
    for f in fragments:
        assert f in msg, (f, msg)


def test_limits_are_the_shared_ones():
    assert sweep.KEYS["seq_len"].check("seq_len", LIMITS["seq_len"]) == LIMITS["seq_len"]
    with pytest.raises(ValueError):
        sweep.KEYS["seq_len"].check("seq_len", LIMITS["seq_len"] + 1)
    assert sweep.KEYS["seq_len"].check("seq_len", 4096.0) == 4096   # integral floats are counts


def test_bad_sources_one_message(tmp_path):
    for src in (42, None, [1, 2]):
        with pytest.raises(ValueError, match="a sweep is a path"):
            sweep.load_sweep(src)
    assert main(["sweep", str(ROOT / "sweeps" / "quick.toml"), "--dry-run", "--block-size", "4"]) == 0
