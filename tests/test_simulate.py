"""simulate / simulate_batch: semantics on hand-checked cases, batching, buckets, feasibility, bad input."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mocap_jax as mj
from mocap_jax.prefill import batch as prefill_batch
from mocap_jax.prefill.batch import spill_compacted
from mocap_jax.specs import get_hardware, get_model


def test_terapipe_items_and_closed_form_without_handoff():
    hw = get_hardware("mocap-2x2").replace(link_latency_s=0.0, link_bandwidth=1e18)
    r = mj.simulate("llama3.1-8b", hw, 4096, "terapipe", chunks=8, batch=2, num_batches=1)
    t = r.stage_times
    assert t.shape == (8, 4)
    # every stage holds 8 layers of an 8B model; embeddings/head make the ends slightly slower
    assert np.allclose(t[:, 1], t[:, 2])
    assert r.finish_times[-1, -1] == pytest.approx(r.prefill_latency_s)
    assert r.prefill_latency_s >= t.sum(0).max()
    # later chunks of equal size cost more (attention over a longer prefix)
    assert np.all(np.diff(t[:, 1]) > 0)


def test_release_policies_on_kv_peaks():
    """The peak counts the KV held at an item's start plus the KV it writes (docs/semantics.md, Memory)."""
    m, hw = get_model("llama3-70b"), get_hardware("mocap-4x4")
    S, M, B = 32768, 8, 2
    kv_token_stage = 5 * m.kv_bytes_per_token_layer(2)  # 80 layers / 16 stages
    one_batch = B * S * kv_token_stage
    kw = dict(chunks=M, batch=B, timeline=False)
    r = mj.simulate(m, hw, S, num_batches=1, release="stage", **kw)
    np.testing.assert_allclose(r.kv_peak_bytes_per_stage, one_batch, rtol=1e-6)
    # stage release: a stage frees batch 0 when it finishes batch 0's last chunk, before batch 1 starts there
    r2 = mj.simulate(m, hw, S, num_batches=2, release="stage", **kw)
    np.testing.assert_allclose(r2.kv_peak_bytes_per_stage, one_batch, rtol=1e-6)
    # request release: stage 0 still holds batch 0 when batch 1's first chunk starts; the last stage does not
    rq = mj.simulate(m, hw, S, num_batches=2, release="request", **kw)
    assert rq.kv_peak_bytes_per_stage[0] >= one_batch * (1 + 1 / M) * (1 - 1e-6)
    assert rq.kv_peak_bytes_per_stage[-1] == pytest.approx(one_batch, rel=1e-6)


def test_gpipe_stage_release_holds_only_the_running_microbatch():
    m = get_model("llama3-70b")
    r = mj.simulate(m, "mocap-4x4", 8192, "gpipe", batch=4, num_batches=1)
    assert r.chunks == 1 and r.extra["items_per_batch"] == 4 and r.feasible
    np.testing.assert_allclose(r.kv_peak_bytes_per_stage, 8192 * 5 * m.kv_bytes_per_token_layer(2), rtol=1e-6)
    rq = mj.simulate(m, "mocap-4x4", 8192, "gpipe", batch=4, num_batches=1, release="request")
    # stage 0 holds microbatches until they leave the last stage: more than the last stage ever holds
    assert rq.kv_peak_bytes_per_stage[0] > rq.kv_peak_bytes_per_stage[-1]
    np.testing.assert_allclose(rq.kv_peak_bytes_per_stage[-1], r.kv_peak_bytes_per_stage[-1], rtol=1e-6)


def test_streaming_overlaps_batches_and_synchronous_does_not():
    kw = dict(chunks=8, batch=2, num_batches=3)
    st = mj.simulate("llama3-70b", "mocap-4x4", 16384, admission="streaming", **kw)
    sy = mj.simulate("llama3-70b", "mocap-4x4", 16384, admission="synchronous", **kw)
    K = 8
    assert st.finish_times[K, 0] < st.finish_times[K - 1, -1]          # batch 1 starts before batch 0 leaves
    assert sy.start_times[K, 0] >= sy.finish_times[K - 1, -1] - 1e-9   # ... and never under synchronous
    assert st.throughput_rps > sy.throughput_rps
    # streaming saturation period is the bottleneck stage's work per batch
    assert st.period_s == pytest.approx(st.stage_times.sum(0).max(), rel=1e-6)
    assert st.throughput_rps == pytest.approx(2 / st.period_s, rel=1e-6)   # B requests per period


def test_streaming_period_matches_long_run():
    r = mj.simulate("llama3-70b", "mocap-4x4", 16384, chunks=8, batch=2, num_batches=12, timeline=False)
    exits = r.finish_times[7::8, -1]
    assert np.diff(exits)[-1] == pytest.approx(r.period_s, rel=1e-4)


def test_timeline_peaks_agree_with_peak():
    r = mj.simulate("llama3-70b", "mocap-4x4", 16384, chunks=8, batch=2, num_batches=2)
    np.testing.assert_allclose(r.timeline_kv_bytes.max(0), r.kv_peak_bytes_per_stage, rtol=1e-6)


def test_a_new_shape_with_its_timeline_compiles_two_programs(programs_compiled):
    """simulate() of a configuration whose shape no program has seen compiles its evaluation and its
    timeline's tables, one program each: built operation by operation, the tables cost a program per
    operation (seconds for every new shape)."""
    with programs_compiled() as compiled:
        r = mj.simulate("llama3-8b", mj.mocap_wafer(1, 3), 3000, chunks=5, batch=3, num_batches=3)
    assert len(compiled) == 2
    np.testing.assert_allclose(r.timeline_kv_bytes.max(0), r.kv_peak_bytes_per_stage, rtol=1e-6)


def test_batched_equals_loop_of_single_simulations():
    rng = np.random.default_rng(0)
    S = 16384
    parts = [rng.multinomial(S - 12, np.ones(12) / 12) + 1 for _ in range(5)]
    batches = rng.integers(1, 6, 5)
    out = mj.simulate_batch("llama3-70b", "mocap-4x4", S, partition=np.stack(parts), batch=batches, dtype="float64",
                            fields=("prefill_latency_s", "kv_peak_bytes_per_stage", "finish"))
    for i in range(5):
        r = mj.simulate("llama3-70b", "mocap-4x4", S, partition=parts[i], batch=int(batches[i]), dtype="float64",
                        timeline=False)
        assert out["prefill_latency_s"][i] == pytest.approx(r.prefill_latency_s, rel=1e-12)
        np.testing.assert_allclose(out["kv_peak_bytes_per_stage"][i][:16], r.kv_peak_bytes_per_stage, rtol=1e-12)
        np.testing.assert_allclose(out["finish"][i].reshape(2, 16, -1)[:, :12, :16].reshape(-1, 16), r.finish_times, rtol=1e-12)


@pytest.fixture
def limit_traces(monkeypatch):
    """``limit_traces(n)``: fail if the evaluator is traced more than ``n`` times from now on (the block
    programs compiled earlier in this process are dropped, so every program is traced afresh)."""

    def limit(n: int):
        prefill_batch._program.cache_clear()
        chex.clear_trace_counter()
        monkeypatch.setattr(prefill_batch, "evaluate_many", chex.assert_max_traces(prefill_batch.evaluate_many, n=n))

    yield limit
    prefill_batch._program.cache_clear()


def test_no_recompilation_inside_a_bucket(limit_traces):
    """Different partitions, chunk counts, sequence lengths, batches and stage counts share one program
    per stage bucket (N_pad 16 and N_pad 8)."""
    limit_traces(2)
    kw = dict(dtype="float32", num_batches=2, k_pad=32)
    for S, M, B in [(8192, 20, 1), (16384, 32, 3), (65536, 17, 2)]:
        mj.simulate_batch("llama3-70b", "mocap-4x4", [S, S], chunks=M, batch=[B, B + 1], block_size=8, **kw)
    for stages in (9, 12, 16):  # N_pad = 16 for all
        mj.simulate_batch("llama3-70b", "mocap-4x4", [8192] * 2, chunks=8, stages=stages, block_size=8, **kw)
    mj.simulate_batch("llama3-70b", "mocap-2x4", [8192] * 2, chunks=8, stages=8, block_size=8,
                      release="request", admission="synchronous", **kw)


def test_mesh_sizes_share_a_bucket_program(limit_traces):
    limit_traces(1)
    for hw in ("mocap-3x3", "mocap-3x4", "mocap-4x4"):
        mj.simulate_batch("llama3-70b", hw, [8192] * 4, chunks=8, block_size=8, k_pad=8)


def test_infeasible_points_are_results_not_errors():
    out = mj.simulate_batch("llama3-70b", "mocap-4x4", [8192, 4_000_000], chunks=16, batch=[1, 16])
    assert out["feasible"].tolist() == [True, False]
    assert np.isinf(out["prefill_latency_s"][1]) and not np.any(np.isnan(out["prefill_latency_s"]))
    r = mj.simulate("llama3-70b", "mocap-4x4", 4_000_000, chunks=16, batch=16, timeline=False)
    assert not r.feasible and np.isinf(r.prefill_latency_s) and r.throughput_rps == 0


def test_max_feasible_batch_is_the_boundary():
    S, M = 131072, 16
    B = mj.max_feasible_batch("llama3-70b", "mocap-4x4", S, chunks=M)
    assert B > 1
    ok = mj.simulate_batch("llama3-70b", "mocap-4x4", [S, S], chunks=M, batch=[B, B + 1])["feasible"]
    assert ok.tolist() == [True, False]
    r = mj.simulate("llama3-70b", "mocap-4x4", S, chunks=M, batch="auto", timeline=False)
    assert r.batch == B and r.feasible


def test_max_feasible_seq_len_is_the_boundary():
    g = 256
    for num_batches in (1, 2):
        S = mj.max_feasible_seq_len("llama3-70b", "mocap-4x4", chunks=16, batch=4, granularity=g,
                                    num_batches=num_batches)
        assert S % g == 0
        ok = mj.simulate_batch("llama3-70b", "mocap-4x4", [S, S + g], chunks=16, batch=4,
                               num_batches=num_batches)["feasible"]
        assert ok.tolist() == [True, False]


def test_multi_wafer_and_gpu_node_run():
    r = mj.simulate("llama3.1-405b", "mocap-4x4x2w", 32768, chunks=16, batch=2, timeline=False)
    assert r.feasible and r.num_stages == 32
    g = mj.simulate("llama3-70b", "h100-x8", 8192, chunks=8, timeline=False)
    assert g.feasible and np.all(g.handoff_times[:, :-1] > 0)


@pytest.mark.parametrize("kwargs,fragment", [
    (dict(model="llama3-7b"), "unknown model"),
    (dict(hardware="mocap-4x"), "unknown hardware"),
    (dict(seq_len=0), "seq_len must be"),
    (dict(seq_len=100.5), "seq_len must be an integer"),
    (dict(seq_len=10, chunks=20), "20 chunks need at least 20 tokens"),
    (dict(seq_len=100, partition=[50, 40]), "sums to 90"),
    (dict(seq_len=100, partition=[101, -1]), "partition must hold integers >= 1"),
    (dict(model="llama3.1-405b", hardware="mocap-2x2"), "does not fit"),
    (dict(scheme="terapip"), "Did you mean 'terapipe'"),
    (dict(release="never"), "unknown release policy"),
    (dict(batch=0), "batch must be a positive integer"),
    (dict(stages=40), "dies"),
])
def test_bad_input_raises_value_error(kwargs, fragment):
    args = dict(model="llama3-70b", hardware="mocap-4x4", seq_len=8192)
    args.update(kwargs)
    with pytest.raises(ValueError, match=fragment):
        mj.simulate(args.pop("model"), args.pop("hardware"), args.pop("seq_len"), **args)


def test_advice_for_a_value_over_its_limit_is_not_given_for_one_under_it():
    """'Use fewer, longer chunks' helps with 5,000 chunks and misleads with 0."""
    with pytest.raises(ValueError) as low:
        mj.simulate("llama3.1-8b", "mocap-2x2", 8192, chunks=0)
    with pytest.raises(ValueError) as high:
        mj.simulate("llama3.1-8b", "mocap-2x2", 8192, chunks=5000)
    assert "positive integer" in str(low.value) and "fewer" not in str(low.value)
    assert "4,096" in str(high.value) and "Use fewer, longer chunks" in str(high.value)


@pytest.mark.parametrize("pattern", ["none", "all", "front", "back", "scattered"])
def test_spill_compacted_runs_the_spill_program_only_on_the_steps_it_needs(pattern):
    """Oracle: every row that fits keeps its plain value and every other row gets the spill function's
    value of that row, in the rows' order; the spill function runs on ceil(count / step) steps."""
    P, step = 32, 8
    rng = np.random.default_rng(3)
    fits = {"none": np.ones(P, bool), "all": np.zeros(P, bool), "front": np.arange(P) >= 5,
            "back": np.arange(P) < 19, "scattered": rng.random(P) < 0.6}[pattern]
    rows = {"x": jnp.asarray(rng.normal(size=P)), "y": jnp.asarray(rng.normal(size=(P, 3)))}
    plain = {"x": -rows["x"], "y": -rows["y"], "ok": jnp.asarray(fits)}
    steps_run = []

    def spilled(r):
        jax.debug.callback(lambda: steps_run.append(1))
        return {"x": 2 * r["x"], "y": 4 * r["y"], "ok": r["x"] > 0}   # exact in floating point

    out = jax.jit(lambda r, f, p: spill_compacted(r, f, p, spilled, step))(rows, jnp.asarray(fits), plain)
    jax.effects_barrier()
    x, y = np.asarray(rows["x"]), np.asarray(rows["y"])
    np.testing.assert_array_equal(out["x"], np.where(fits, -x, 2 * x))
    np.testing.assert_array_equal(out["y"], np.where(fits[:, None], -y, 4 * y))
    np.testing.assert_array_equal(out["ok"], np.where(fits, True, x > 0))
    assert len(steps_run) == -(-int((~fits).sum()) // step)


def test_mbkr_blocks_in_steps_equal_every_point_through_the_spill_passes(monkeypatch):
    """simulate_batch of MBKR points that do and do not fit without MBKR: the spill passes run only on
    the compacted points that need them, in steps of the whole block or of 8 configurations, and give
    what running every point through the spill passes gives (oracle: a point that fits spills nothing)."""
    S, B = 65536, np.arange(70, 134, 2)                   # B' without MBKR is about 100 here
    kw = dict(chunks=8, batch=np.repeat(B, 4), block_size=128, dtype="float32",
              fields=("prefill_latency_s", "raw_latency_s", "feasible", "spilled_bytes_per_stage", "overflow"))
    run = lambda: mj.simulate_batch("llama3-70b", "mocap-4x4", [S] * 128, "mbkr", **kw)
    program, spills_needed = prefill_batch._program, prefill_batch.spills_needed
    # every point through the spill passes, in programs of their own (never left in the shared cache)
    monkeypatch.setattr(prefill_batch, "_program", functools.lru_cache(maxsize=8)(program.__wrapped__))
    monkeypatch.setattr(prefill_batch, "spills_needed", lambda shape: False)
    every = run()
    monkeypatch.setattr(prefill_batch, "_program", program)
    monkeypatch.setattr(prefill_batch, "spills_needed", spills_needed)
    one = run()
    monkeypatch.setattr(prefill_batch, "STEP_CELLS", 1)   # steps of 8 configurations
    steps = run()
    assert 0 < one["feasible"].sum() and (one["spilled_bytes_per_stage"].sum(1) > 0).any()
    assert (one["spilled_bytes_per_stage"].sum(1) == 0).any()
    for k in kw["fields"]:
        np.testing.assert_allclose(one[k], every[k], rtol=1e-6, err_msg=k)
        np.testing.assert_allclose(steps[k], every[k], rtol=1e-6, err_msg=k)


@pytest.mark.parametrize("scheme", ["terapipe", "mbkr"])
def test_blocks_sharded_over_the_devices_equal_one_device(monkeypatch, scheme):
    """A block sharded over every local device (8 fake ones here) gives what one device gives.  By
    default a block this small runs on one device (sharding costs more than it saves), so both
    layouts are forced, and the devices each compiled program got are recorded."""
    S, B = 65536, np.arange(70, 134, 2)                   # MBKR: some points spill, some fit, some overflow
    kw = dict(chunks=8, batch=np.repeat(B, 4), block_size=128, num_batches=2, dtype="float32",
              fields=("prefill_latency_s", "raw_latency_s", "feasible", "peak_mem_bytes_per_stage",
                      "spilled_bytes_per_stage", "overflow"))
    used = []
    program = prefill_batch._program
    monkeypatch.setattr(prefill_batch, "_program", lambda *args: used.append(len(args[4])) or program(*args))
    monkeypatch.setattr(prefill_batch, "SHARD_CELLS", 1 << 62)
    one = mj.simulate_batch("llama3-70b", "mocap-4x4", [S] * 128, scheme, **kw)
    monkeypatch.setattr(prefill_batch, "SHARD_CELLS", 0)
    sharded = mj.simulate_batch("llama3-70b", "mocap-4x4", [S] * 128, scheme, **kw)
    assert used == [1, len(jax.local_devices())] and used[1] > 1
    if scheme == "mbkr":
        assert (one["spilled_bytes_per_stage"].sum(1) > 0).any() and (one["spilled_bytes_per_stage"].sum(1) == 0).any()
    for k in kw["fields"]:
        np.testing.assert_allclose(sharded[k], one[k], rtol=1e-6, err_msg=k)


@pytest.mark.parametrize("scheme,pairing,spill,batches", [
    ("terapipe", "cross-half", "overflow", 1), ("mbkr", "cross-half", "overflow", 1),
    ("mbkr", "cross-half", "eager", 2), ("mbkr", "dynamic", "eager", 2)])
def test_values_computed_once_leave_every_evaluation_field_unchanged(scheme, pairing, spill, batches):
    """The evaluator compiled to keep its stored values (``COMPILER_OPTIONS``) against the same program
    with XLA's defaults (which drop the marks and fuse as before), for one configuration and vmapped
    over several.  Four stages and one batch give spill loops small enough that XLA:CPU would emit
    them as single kernels, which cannot hold a kept value (its emitter aborts): the options keep
    such loops as they are."""
    from mocap_jax.api.config import resolve
    from mocap_jax.costs.computed_once import COMPILER_OPTIONS
    from mocap_jax.prefill.evaluate import evaluate

    limit = 43 if batches == 1 else 27                     # the largest batch that fits without MBKR
    cfgs = [resolve("llama3-70b", "mocap-4x4", 32768, scheme, chunks=8, stages=4, batch=b, num_batches=batches,
                    release="request", pairing=pairing, spill=spill) for b in (10, limit + 3, limit + 6)]
    shape = cfgs[0].shape()
    points = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *[c.point() for c in cfgs])
    one = lambda opts: jax.jit(evaluate, static_argnums=1, compiler_options=opts)
    many = lambda opts: jax.jit(jax.vmap(evaluate, in_axes=(0, None)), static_argnums=1, compiler_options=opts)
    kept = one(COMPILER_OPTIONS).lower(cfgs[1].point(), shape).compile().as_text()
    assert "opt-barrier" in kept                      # the marks survive compilation
    pairs = [(one(None)(cfgs[1].point(), shape), one(COMPILER_OPTIONS)(cfgs[1].point(), shape)),
             (many(None)(points, shape), many(COMPILER_OPTIONS)(points, shape))]
    for fused, stored in pairs:
        assert bool(np.any(np.asarray(stored.spilled_bytes_per_stage) > 0)) == (scheme == "mbkr")
        for name in fused.__dataclass_fields__:
            np.testing.assert_allclose(np.asarray(getattr(stored, name)), np.asarray(getattr(fused, name)),
                                       rtol=2e-6, err_msg=name)
