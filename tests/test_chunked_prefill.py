"""The batched chunked-prefill kernel (closed-form MBKR spills) against ``schedule.evaluate``."""

from __future__ import annotations

import zlib

import jax
import numpy as np
import pytest

from mocap_jax import api, chunked_prefill
from mocap_jax.schedule import SimShape, bucket, evaluate_items_batched

CASES = [
    # model, hardware, stages, pairing, p1, p2, release, admission
    ("llama3-70b", "mocap-4x4", None, "cross-half", 0.0, 0.85, "stage", "streaming"),
    ("llama3-70b", "mocap-4x4", None, "head-to-tail", 0.0, 0.6, "request", "streaming"),
    ("llama3-70b", "mocap-3x3", None, "cross-half", 0.2, 0.7, "stage", "synchronous"),   # odd N: unpaired middle
    ("qwen3-235b", "mocap-4x4", 12, "cross-half", 0.1, 0.5, "stage", "streaming"),      # N < N_pad, MoE
    ("llama2-7b", "mocap-2x4", None, "none", 0.0, 0.85, "request", "streaming"),       # MBKR without partners
    ("llama3-70b", "mocap-4x4", None, "cross-half", 0.5, 0.5, "stage", "streaming"),
]


def _point(model, hardware, stages, pairing, p1, p2, release, admission, chunks, mode):
    m, hw = api.get_model(model), api.get_hardware(hardware)
    n = stages or hw.num_dies
    pl = api.check_placement(hw, None, n, "mbkr" if mode != "off" else "terapipe", pairing)
    cfg = api.MBKRConfig(pairing, p1, p2)
    items = api.chunked_item_table(np.full(chunks, 256), 1, chunks)
    return api._point(m, hw, items, pl, bucket(n), admission, release, np.float64, cfg, mode), m, hw, n


def _random_partitions(rng, count, seq_len, chunks, granularity):
    units = seq_len // granularity
    cuts = np.sort(np.stack([rng.choice(np.arange(1, units), chunks - 1, replace=False) for _ in range(count)]), 1)
    bounds = np.concatenate([np.zeros((count, 1), int), cuts, np.full((count, 1), units)], 1)
    return (np.diff(bounds, axis=1) * granularity).astype(np.int32)


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[1]}-{c[3]}-{c[6]}" for c in CASES])
@pytest.mark.parametrize("mode", ["off", "mbkr"])
def test_matches_evaluate(case, mode, seed=0):
    model, hardware, stages, pairing, p1, p2, release, admission = case
    mbkr_mode = "off" if mode == "off" else ("unpaired" if pairing == "none" else "static")
    chunks, seq_len = 8, 32768
    point, m, hw, n = _point(model, hardware, stages, pairing, p1, p2, release, admission, chunks, mbkr_mode)
    rng = np.random.default_rng(zlib.crc32(repr((case, mode, seed)).encode()))
    parts = _random_partitions(rng, 24, seq_len, chunks, 256)
    # batches around the memory limit so that spills, overflows and infeasible points all occur
    b_max = max(api.max_feasible_batch(m, hw, seq_len, "mbkr" if mode != "off" else "terapipe", chunks=chunks,
                                       num_batches=1, stages=n, pairing=pairing, p1=p1, p2=p2,
                                       release=release, admission=admission, dtype="float64"), 1)
    batches = rng.integers(max(1, b_max // 2), b_max + 3, size=len(parts))
    shape = SimShape(k_pad=chunks, n_pad=bucket(n), num_batches=1, mbkr=mbkr_mode)
    structure = chunked_prefill.stage_structure(point, shape)
    fast = jax.device_get(chunked_prefill.prefill_many_jit(parts, batches, point, shape, structure))
    items = api._batched_items("terapipe", np.full(len(parts), seq_len), batches, parts, 1, chunks)
    ref = jax.device_get(evaluate_items_batched(items, point, shape))
    # the two paths round differently (prefix sums vs a sequential event scan), so a spill that is
    # exactly zero in one can be a few bytes of rounding noise in the other and add one hop of link
    # latency (1e-7 s) to an item: latencies agree to 1e-8 relative, memory to 1e-12
    np.testing.assert_array_equal(fast["feasible"], ref["feasible"])
    np.testing.assert_allclose(fast["raw_latency_s"], ref["raw_latency_s"], rtol=1e-8)
    np.testing.assert_allclose(fast["prefill_latency_s"], ref["prefill_latency_s"], rtol=1e-8)
    np.testing.assert_allclose(fast["peak_mem_bytes_per_stage"], ref["peak_mem_bytes_per_stage"], rtol=1e-12)
    np.testing.assert_allclose(fast["period_s"], ref["period_s"], rtol=1e-8)
    if mbkr_mode == "static" and p1 < p2:
        assert ref["spilled_bytes"].max() > 0, "the sample must exercise spills"
    assert 0 < ref["feasible"].sum() < len(parts), "the sample must hold feasible and infeasible points"


@pytest.mark.parametrize("release,admission,stages", [("stage", "streaming", None), ("request", "synchronous", 12)])
def test_simulate_batch_fast_route_matches_evaluate(release, admission, stages):
    """simulate_batch sends one-batch, MBKR-off chunked points through prefill_many(detail=True):
    every key evaluate returns, with the same shapes and values."""
    rng = np.random.default_rng(7)
    parts = _random_partitions(rng, 40, 65536, 16, 256)
    batches = rng.integers(1, 120, size=len(parts))
    kw = dict(partition=parts, batch=batches, num_batches=1, release=release, admission=admission, stages=stages,
              dtype="float64")
    fast = api.simulate_batch("llama3-70b", "mocap-4x4", np.full(len(parts), 65536), **kw)
    m, hw = api.get_model("llama3-70b"), api.get_hardware("mocap-4x4")
    n = stages or hw.num_dies
    point, *_ = _point("llama3-70b", "mocap-4x4", stages, "cross-half", 0.0, 0.85, release, admission, 16, "off")
    items = api._batched_items("terapipe", np.full(len(parts), 65536), batches, parts, 1, 16)
    ref = jax.device_get(evaluate_items_batched(items, point, SimShape(k_pad=16, n_pad=bucket(n), num_batches=1)))
    assert set(fast) == set(ref)
    for key in ref:
        assert np.shape(fast[key]) == np.shape(ref[key]), key
        np.testing.assert_allclose(np.asarray(fast[key], float), np.asarray(ref[key], float), rtol=1e-12, err_msg=key)
    assert 0 < ref["feasible"].sum() < len(parts)
