"""Resource partition: goodput by hand, choice and counts against brute force on small meshes."""

import itertools
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mocap_jax.specs import SpecError, get_model
from mocap_jax.wsc import goodput
from mocap_jax.wsc import partition as part
from mocap_jax.wsc import plan as pl
from mocap_jax.wsc.hardware import WaferParams, a100_cluster, wsc_wafer
from mocap_jax.wsc.traces import get_workload, workload_from_trace
from mocap_jax.wsc.workload import WORKLOAD_PRESETS, WorkloadParams, WorkloadSpec

TRACES = Path(__file__).resolve().parents[2] / "shared" / "data" / "azure-llm-inference-2023"


def test_workload_moments_by_hand():
    wl = WorkloadSpec("two", 1.0, (100.0, 3000.0), (10.0, 30.0), (3.0, 1.0))  # weights normalise to 0.75 / 0.25
    mo = goodput.workload_moments(WorkloadParams.from_spec(wl, jnp.float64), 1000.0)
    assert float(mo["mean_prompt"]) == pytest.approx(0.75 * 100 + 0.25 * 3000)
    assert float(mo["pairs"]) == pytest.approx(0.75 * 100 * 101 / 2 + 0.25 * 3000 * 3001 / 2)
    # KV read over chunks of 1000: 100 (one chunk) and 1000 * (1 + 2 + 3) = 3000 * (3 + 1) / 2
    assert float(mo["kv_read"]) == pytest.approx(0.75 * 100 + 0.25 * 6000)
    assert float(mo["ctx_mean"]) == pytest.approx((0.75 * 10 * (100 + 5.5) + 0.25 * 30 * (3000 + 15.5))
                                                  / (0.75 * 10 + 0.25 * 30))
    assert float(mo["max_prompt"]) == 3000


@pytest.mark.skipif(not TRACES.exists(), reason="shared Azure traces not present")
def test_embedded_workloads_match_traces():
    for name, file in (("azure-code", "code.csv"), ("azure-conv", "conv.csv")):
        w = workload_from_trace(TRACES / file, name=name)
        p = WORKLOAD_PRESETS[name]
        assert w.rate == pytest.approx(p.rate, rel=1e-3)
        assert np.allclose(w.prompt_tokens, p.prompt_tokens) and np.allclose(w.output_tokens, p.output_tokens)
        assert np.allclose(w.weights, p.weights, atol=1e-6)
    assert WORKLOAD_PRESETS["azure-conv"].mean_prompt == pytest.approx(1154, abs=1)
    assert WORKLOAD_PRESETS["azure-code"].mean_output == pytest.approx(28, abs=0.5)


def _brute_pack(rows, cols, rects):
    """Independent brute force: can these (h, w) rectangles (any orientation) tile part of the grid?"""
    occ = np.zeros((rows, cols), bool)

    def rec(i):
        if i == len(rects):
            return True
        h, w = rects[i]
        for hh, ww in {(h, w), (w, h)}:
            for r in range(rows - hh + 1):
                for c in range(cols - ww + 1):
                    if not occ[r:r + hh, c:c + ww].any():
                        occ[r:r + hh, c:c + ww] = True
                        if rec(i + 1):
                            return True
                        occ[r:r + hh, c:c + ww] = False
        return False

    return rec(0)


_goodput = jax.jit(goodput.instance_goodput, static_argnames="max_batch")


def _single(model, wafer, wl, targets, cfg, max_batch):
    plan = pl.tp_plan(model, wafer, cfg)
    out = _goodput(pl.model_params(model), WaferParams.from_spec(wafer), plan, WorkloadParams.from_spec(wl),
                                targets, max_batch=max_batch)
    return float(out["prefill_rps_per_die"]), float(out["decode_rps_per_die"]), float(out["prefill_rps"]), \
        float(out["decode_rps"])


def test_partition_matches_brute_force_on_small_mesh():
    model = get_model("llama3.1-8b")  # 16 GB of weights: does not fit one 16 GB die (14.4 GB usable)
    wafer = wsc_wafer(2, 3, dram_gb=16, name="small")
    wl = get_workload("azure-conv")
    res = part.partition(model, wafer, wl, max_batch=128)
    targets = goodput.ServingTargets.make(2048, 0.1, 10.0)
    brute = {}
    for h, w in itertools.product(range(1, 3), range(1, 4)):  # every rectangle, both orientations separately
        for s in pl.STRATEGIES:
            brute[(h, w, s)] = _single(model, wafer, wl, targets, pl.InstanceConfig(h, w, s), 128)
    assert brute[(1, 1, "megatron")][:2] == (0.0, 0.0)  # the weights do not fit a single die
    best_pre = max(v[0] for v in brute.values())
    best_dec = max(v[1] for v in brute.values())
    assert res.prefill.prefill_rps_per_die == pytest.approx(best_pre, rel=1e-6)
    assert res.decode.decode_rps_per_die == pytest.approx(best_dec, rel=1e-6)
    assert res.prefill.config.dies >= 2 and res.decode.config.dies >= 2
    # rotations evaluate the same
    assert brute[(2, 1, "megatron")] == pytest.approx(brute[(1, 2, "megatron")], rel=1e-9)
    # counts: best served rate over every packable (n_p, n_d)
    pc, dc = res.prefill.config, res.decode.config
    r_p, r_d = res.prefill.prefill_rps, res.decode.decode_rps
    best = 0.0
    for n_p in range(1, 7):
        for n_d in range(1, 7):
            if n_p * pc.dies + n_d * dc.dies <= 6 and _brute_pack(2, 3, [(pc.rows, pc.cols)] * n_p
                                                                  + [(dc.rows, dc.cols)] * n_d):
                best = max(best, min(n_p * r_p, n_d * r_d))
    assert res.served_rps == pytest.approx(best, rel=1e-9)
    assert _brute_pack(2, 3, [(pc.rows, pc.cols)] * res.n_prefill + [(dc.rows, dc.cols)] * res.n_decode)
    assert res.served_rps == pytest.approx(min(res.n_prefill * r_p, res.n_decode * r_d))
    assert res.runtime_s < 60


def test_size_counts_respects_packing():
    wafer = wsc_wafer(3, 3)
    # decode is the slow phase: by area alone, 2 decode 2x2 + 1 prefill 1x1 (9 dies) would serve min(10, 2) = 2,
    # but two 2x2 squares cannot be packed on a 3x3 grid; one decode instance serves 1, with the fewest dies
    n_p, n_d, packing = part.size_counts(wafer, (1, 1), 10.0, (2, 2), 1.0)
    assert (n_p, n_d) == (1, 1)
    assert sorted(k for k, *_ in packing) == ["decode", "prefill"]
    # prefill is the slow phase: one decode and five prefill instances fill the grid
    n_p, n_d, _ = part.size_counts(wafer, (1, 1), 1.0, (2, 2), 10.0)
    assert (n_p, n_d) == (5, 1)
    with pytest.raises(SpecError, match="cannot place"):
        part.size_counts(wafer, (2, 2), 1.0, (2, 2), 1.0)


def test_partition_packs_smaller_instances_when_the_best_ones_cannot_share_the_grid():
    # llama3-70b (141 GB of weights) on 12 dies of 32 GB: the instances with the best goodput per die are
    # too large to sit beside each other on a 3x4 grid, while two 2x3 instances can
    wafer = wsc_wafer(3, 4, dram_gb=32, name="tight")
    res = part.partition("llama3-70b", wafer, "azure-conv", max_batch=128)
    pc, dc = res.prefill.config, res.decode.config
    assert res.n_prefill >= 1 and res.n_decode >= 1 and res.dies_used <= 12
    assert _brute_pack(3, 4, [(pc.rows, pc.cols)] * res.n_prefill + [(dc.rows, dc.cols)] * res.n_decode)
    ranked = sorted((c for c in res.candidates if c.prefill_rps_per_die > 0), key=lambda c: -c.prefill_rps_per_die)
    assert res.prefill.prefill_rps_per_die < ranked[0].prefill_rps_per_die or \
        res.decode.decode_rps_per_die < max(c.decode_rps_per_die for c in res.candidates)
    # and where no pair fits, the message names the smallest instances, not the best ones
    with pytest.raises(SpecError, match=r"the smallest are \d+x\d+ and \d+x\d+"):
        part.partition("llama3-70b", wsc_wafer(3, 4, dram_gb=16, name="tighter"), "azure-conv", max_batch=128)
    with pytest.raises(SpecError, match=r"1 \+ 1 GPUs\); use a larger cluster"):
        part.partition("llama2-7b", a100_cluster(1, 1), "azure-conv", max_batch=128)


def test_cluster_partition_uses_whole_gpus_in_nodes():
    res = part.partition("llama3-70b", a100_cluster(2, 8), "azure-code", max_batch=128)
    for cand, n in ((res.prefill, res.n_prefill), (res.decode, res.n_decode)):
        assert cand.config.rows == 1 or cand.config.cols == 8  # within a node, or whole nodes
        assert cand.config.dies >= 2  # 141 GB of weights need more than one 80 GB GPU
    assert res.dies_used <= 16


def test_model_that_fits_nowhere():
    with pytest.raises(SpecError, match="do not fit any rectangular instance"):
        part.partition("llama3.1-405b", wsc_wafer(2, 2), "azure-conv")


def test_bad_partition_input():
    with pytest.raises(SpecError, match="unknown TP strategy"):
        part.partition("llama2-7b", wsc_wafer(2, 2), strategies=["megatron", "ring"])
    with pytest.raises(SpecError, match="chunk_tokens"):
        part.partition("llama2-7b", wsc_wafer(2, 2), chunk_tokens=0)
    with pytest.raises(SpecError, match="rate"):
        part.partition("llama2-7b", wsc_wafer(2, 2), rate=-1.0)


def test_goodput_vmaps_over_design_points():
    from mocap_jax.wsc.hardware import design_points

    model = get_model("llama2-7b")
    base = wsc_wafer(6, 9)
    pts, grid = design_points(base, dram_capacity=[32e9, 64e9, 96e9], dram_bandwidth=[1e12, 3e12])
    plan = pl.tp_plan(model, base, pl.InstanceConfig(1, 2))
    wl = WorkloadParams.from_spec(get_workload("azure-conv"))
    targets = goodput.ServingTargets.make()
    mp = pl.model_params(model)
    f = jax.jit(jax.vmap(lambda hw: goodput.instance_goodput(mp, hw, plan, wl, targets, 256)))
    out = jax.tree_util.tree_map(np.asarray, f(pts))
    # more DRAM capacity -> larger decode batch (or equal); more bandwidth -> more decode goodput
    cap = grid["dram_capacity"]
    bw = grid["dram_bandwidth"]
    for lo, hi in ((0, 2), (2, 4), (1, 3), (3, 5)):
        assert cap[lo] < cap[hi] and out["decode_batch"][lo] <= out["decode_batch"][hi]
    assert out["decode_rps"][1] > out["decode_rps"][0] and bw[1] > bw[0]
    assert np.all(np.isfinite(out["prefill_rps"])) and not math.isnan(float(out["tpot_s"].sum()))
