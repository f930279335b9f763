"""WSC-LLM hardware template and instance performance models against hand-computed cases."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mocap_jax.specs import ModelSpec, SpecError, get_model, mesh
from mocap_jax.wsc import perf
from mocap_jax.wsc import plan as pl
from mocap_jax.wsc.geometry import hop_matrix, route_incidence
from mocap_jax.wsc.hardware import (WAFER_PRESETS, WaferParams, WaferSpec, a100_cluster, design_points, get_wafer,
                                    wsc_wafer)

# A toy model whose numbers are easy to follow by hand:
#   attention params 2*64*4*16 + 2*64*2*16 = 12288, MLP 3*64*128 = 24576, norms 128 -> 36992 per block;
#   attention FLOPs per (query, key) pair 2*4*(16+16) = 256; KV elements per token per block 2*2*16 = 64;
#   embedding = LM head = 100*64 = 6400 parameters.
TOY = ModelSpec("toy", layers=2, hidden=64, ffn=128, q_heads=4, kv_heads=2, head_dim=16, vocab=100)
# Hardware with round numbers: 1 TFLOP/s, 1 GB/s DRAM and links, efficiencies 1, no workspace.
HW = WaferSpec("toy-wafer", rows=2, cols=4, peak_flops=1e12, dram_capacity=1e9, dram_bandwidth=1e9,
               link_bandwidth=1e9, link_latency_s=1e-6, sync_latency_s=2e-6, eff_gemm=1.0, eff_attention=1.0,
               eff_dram=1.0, eff_link=1.0, usable_dram_fraction=1.0, activation_workspace_factor=0.0)


def params(wafer=HW, model=TOY, dtype=jnp.float64):
    return pl.model_params(model, dtype), WaferParams.from_spec(wafer, dtype)


def test_presets_match_design_points():
    p64, p96 = WAFER_PRESETS["wsc-llm-64g"], WAFER_PRESETS["wsc-llm-96g"]
    assert (p64.rows, p64.cols) == (6, 9) and p64.dram_capacity == 64e9 and p64.dram_bandwidth == 2e12 \
        and p64.link_bandwidth == 2e12
    assert p96.dram_capacity == 96e9 and p96.dram_bandwidth == 3e12 and p96.link_bandwidth == 1.5e12
    assert p64.peak_flops == pytest.approx(256 * 1.02e12)  # 16 x 16 cores of 1.02 TFLOP/s
    gpu = WAFER_PRESETS["a100-cluster"]
    assert gpu.topology == "cluster" and (gpu.rows, gpu.cols) == (6, 8) and gpu.dram_capacity == 80e9
    assert gpu.node_bandwidth == 25e9 and gpu.link_bandwidth == 300e9
    assert get_wafer("wsc-3x4").num_dies == 12 and get_wafer("a100-cluster-2x8").num_dies == 16
    with pytest.raises(SpecError, match="Did you mean"):
        get_wafer("wsc-llm-64")
    with pytest.raises(SpecError, match="positive"):
        wsc_wafer(6, 9, dram_gb=-1)
    with pytest.raises(SpecError, match="remote_kv_overlap"):
        HW.replace(remote_kv_overlap=1.5)


@pytest.mark.parametrize("field,value,fragment", [
    ("dram_capacity", 1e49, "exceeds the largest accepted value"),   # inf in float32
    ("link_bandwidth", 1e-18, "below the smallest accepted value"),   # times past float32's range
    ("eff_dram", 1e-9, "must be >= 0.0001"),
    ("sync_latency_s", 5.0, "exceeds the largest accepted value, 1"),
    ("kv_bytes", 0.0, "must be > 0"),
])
def test_wafer_fields_stay_inside_the_float32_ranges(field, value, fragment):
    """The wafer takes the prefill hardware's ranges, so its params never overflow to inf in float32."""
    with pytest.raises(SpecError, match=fragment):
        HW.replace(**{field: value})
    with pytest.raises(SpecError, match=fragment):
        design_points(HW, **{field: [getattr(HW, field), value]})


def test_prefill_time_by_hand():
    mp, hw = params()
    plan = pl.tp_plan(TOY, HW, pl.InstanceConfig(1, 1))
    t = perf.prefill_iteration_time(mp, hw, plan, jnp.array([8.0]), jnp.array([0.0]), jnp.array([True]))
    # per block: GEMM max(2*36992*8 / 1e12, (36992*2 + 2*8*64*2) / 1e9) = 76032e-9 s
    #            attention max(256 * 8*(0 + 9/2) / 1e12, 8*64*2 / 1e9) = 1024e-9 s
    per_block = 76032e-9 + 1024e-9
    embed = 8 * 64 * (2 + 2) / 1e9
    head = max(2 * 6400 / 1e12, 6400 * 2 / 1e9)
    assert float(t) == pytest.approx(2 * per_block + embed + head, rel=1e-12)
    # the aggregate form gives the same
    t2 = perf.prefill_time(mp, hw, plan, 8.0, 36.0, 8.0, 1.0)
    assert float(t2) == pytest.approx(float(t), rel=1e-12)
    # a later chunk with a prefix costs more (causal attention reads the prefix)
    t3 = perf.prefill_iteration_time(mp, hw, plan, jnp.array([8.0]), jnp.array([4096.0]), jnp.array([False]))
    assert float(t3) > float(t) - head


def test_decode_time_by_hand_and_mask():
    mp, hw = params()
    plan = pl.tp_plan(TOY, HW, pl.InstanceConfig(1, 1))
    t = perf.decode_iteration_time(mp, hw, plan, jnp.array([10.0, 20.0, 999.0]), jnp.array([True, True, False]))
    # per block: GEMM max(2*36992*2/1e12, (36992*2 + 2*2*64*2)/1e9); attention max(256*30/1e12, 30*64*2/1e9)
    per_block = (36992 * 2 + 512) / 1e9 + 30 * 64 * 2 / 1e9
    expect = 2 * per_block + 2 * 64 * 4 / 1e9 + 6400 * 2 / 1e9
    assert float(t) == pytest.approx(expect, rel=1e-12)
    # an empty batch (all rows masked) runs no iteration
    assert float(perf.decode_iteration_time(mp, hw, plan, jnp.array([10.0]), jnp.array([False]))) == 0.0
    assert float(perf.prefill_time(mp, hw, plan, 0.0, 0.0, 0.0, 0.0)) == 0.0


def test_remote_kv_read_by_hand():
    mp, hw = params()
    plan = pl.tp_plan(TOY, HW, pl.InstanceConfig(1, 1))
    remote = perf.RemoteKV(tokens=jnp.array([100.0]), hops=jnp.array([3.0]), internode=jnp.array([0.0]),
                           ingress_links=jnp.asarray(8.0))
    # 100 tokens * 64 elements * 2 bytes = 12800 B: DRAM and link 12.8 us each, + 3 hops x 1 us
    assert float(perf.remote_kv_time(mp, hw, plan, remote)) == pytest.approx(12.8e-6 + 3e-6, rel=1e-12)
    local = max(256 * 110 / 1e12, 10 * 64 * 2 / 1e9)  # 10 of the 110 context tokens are local
    base = perf.decode_iteration_time(mp, hw, plan, jnp.array([110.0]))
    t_overlap = perf.decode_iteration_time(mp, hw, plan, jnp.array([110.0]), remote=remote)
    hw0 = hw.replace(remote_kv_overlap=jnp.asarray(0.0))
    t_serial = perf.decode_iteration_time(mp, hw0, plan, jnp.array([110.0]), remote=remote)
    local_all = 110 * 64 * 2 / 1e9
    # overlapped: attention = max(local, remote); serial: local + remote (per block, 2 blocks)
    assert float(t_overlap - base) == pytest.approx(2 * (15.8e-6 - local_all), rel=1e-9)
    assert float(t_serial - base) == pytest.approx(2 * (local + 15.8e-6 - local_all), rel=1e-9)


def test_megatron_and_hybrid_split_by_hand():
    mega = pl.tp_plan(TOY, HW, pl.InstanceConfig(2, 2, "megatron"))
    # t = 4 > kv_heads = 2: one q head per die, its KV head replicated on 2 dies
    assert float(mega.attn_params) == 64 * 16 * (2 * 1 + 2 * 1)
    assert float(mega.mlp_params) == 3 * 64 * 32
    assert float(mega.kv_elems) == 2 * 16 and float(mega.kv_read_amplification) == 2.0
    assert float(mega.attn_pair_flops) == 256 / 4
    hyb = pl.tp_plan(TOY, HW, pl.InstanceConfig(2, 2, "gqa-hybrid"))
    # g = gcd(4, 2) = 2 groups of s = 2 dies; KV sharded along the sequence, not replicated
    assert float(hyb.group_size) == 2 and float(hyb.kv_elems) == 16 and float(hyb.kv_read_amplification) == 1.0
    assert float(hyb.group_allgather_elems) == (4 + 2 * 2) / 2 * 16
    assert float(hyb.group_allreduce_elems) == 4 / 2 * (16 + 2)
    # where t divides kv_heads the two strategies coincide
    a = pl.tp_plan(TOY, HW, pl.InstanceConfig(1, 2, "megatron"))
    b = pl.tp_plan(TOY, HW, pl.InstanceConfig(1, 2, "gqa-hybrid"))
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        assert float(x) == float(y)
    # hybrid holds more KV per die in decode memory: its capacity is larger than megatron's here
    mp, hw = params()
    assert float(perf.kv_capacity_tokens(mp, hw, hyb, 0.0)) > float(perf.kv_capacity_tokens(mp, hw, mega, 0.0))


def test_ring_profiles_and_all_reduce_by_hand():
    assert mesh.ring_order(2, 2) == [(0, 0), (0, 1), (1, 1), (1, 0)]
    p22 = pl.tp_plan(TOY, HW, pl.InstanceConfig(2, 2))
    assert (float(p22.ring_hops), float(p22.ring_load)) == (1.0, 1.0)  # a Hamiltonian cycle of neighbours
    p14 = pl.tp_plan(TOY, HW, pl.InstanceConfig(1, 4))
    assert float(p14.ring_hops) == 3.0 and float(p14.ring_load) == 1.0  # closing step runs back over 3 hops
    w33 = wsc_wafer(3, 3)
    p33 = pl.tp_plan(TOY, w33, pl.InstanceConfig(3, 3))
    assert float(p33.ring_hops) == 4.0  # odd x odd: no cycle of neighbours; (2,2) -> (0,0) is 4 hops
    mp, hw = params()
    # all-reduce of 512 bytes over 4 dies: 2*(4-1) steps of (1 hop x 1 us + 2 us sync + 128 B / 1 GB/s)
    assert float(perf.all_reduce_time(hw, p22, 512.0)) == pytest.approx(6 * (3e-6 + 128e-9), rel=1e-12)
    assert float(perf.all_reduce_time(hw, pl.tp_plan(TOY, HW, pl.InstanceConfig(1, 1)), 512.0)) == 0.0
    # one decode block on 2x2 adds two all-reduces of tokens x hidden (the Megatron pair)
    assert float(perf.layer_comm_time(hw, p22, 2.0)) == pytest.approx(6 * (3e-6 + 2 * 128 * 2 / 4 / 1e9), rel=1e-12)


def test_cluster_rings_cross_nodes():
    gpu = a100_cluster(2, 8)
    m = get_model("llama3-70b")
    one = pl.tp_plan(m, gpu, pl.InstanceConfig(1, 8))
    two = pl.tp_plan(m, gpu, pl.InstanceConfig(2, 8))
    assert float(one.ring_internode) == 0 and float(two.ring_internode) == 1
    hw = WaferParams.from_spec(gpu, jnp.float64)
    # 16 MB all-reduce: NVLink inside a node, InfiniBand (25 GB/s) across nodes
    fast = float(perf.all_reduce_time(hw, one, 16e6))
    slow = float(perf.all_reduce_time(hw, two, 16e6))
    assert fast == pytest.approx(14 * (1e-6 + 1e-6 + 2e6 / (300e9 * 0.85)), rel=1e-9)
    assert slow == pytest.approx(30 * (5e-6 + 1e-6 + 1e6 / (25e9 * 0.85)), rel=1e-9)


def test_instance_too_large_and_unknown_strategy():
    with pytest.raises(SpecError, match="larger than the 6x9"):
        pl.tp_plan(TOY, get_wafer("wsc-llm-64g"), pl.InstanceConfig(7, 7))
    with pytest.raises(SpecError, match="unknown TP strategy"):
        pl.tp_plan(TOY, HW, pl.InstanceConfig(1, 2, "pipeline"))


def test_vmap_over_design_points_and_float32():
    m = get_model("llama2-7b")
    base = get_wafer("wsc-llm-64g")
    pts, grid = design_points(base, dram_bandwidth=[1e12, 2e12, 3e12], link_bandwidth=[1.5e12, 2.5e12],
                              dtype=jnp.float64)
    assert pts.dram_bandwidth.shape == (6,) and grid["link_bandwidth"].tolist() == [1.5e12, 2.5e12] * 3
    plan = pl.tp_plan(m, base, pl.InstanceConfig(2, 2), jnp.float64)
    mp = pl.model_params(m, jnp.float64)
    ctx = jnp.full(64, 1500.0)
    f = jax.jit(jax.vmap(lambda hw: perf.decode_iteration_time(mp, hw, plan, ctx)))
    batched = np.asarray(f(pts))
    for i in range(6):
        one = WaferParams.from_spec(base.replace(dram_bandwidth=float(grid["dram_bandwidth"][i]),
                                                 link_bandwidth=float(grid["link_bandwidth"][i])), jnp.float64)
        assert batched[i] == pytest.approx(float(perf.decode_iteration_time(mp, one, plan, ctx)), rel=1e-12)
    # decode is DRAM-bound: more bandwidth is faster; a faster D2D link shortens the all-reduces
    assert batched[0] > batched[2] > batched[4] and batched[0] > batched[1]
    # float32 agrees with float64 to 1e-5
    plan32 = pl.tp_plan(m, base, pl.InstanceConfig(2, 2), jnp.float32)
    t32 = perf.decode_iteration_time(pl.model_params(m, jnp.float32), WaferParams.from_spec(base, jnp.float32),
                                     plan32, ctx.astype(jnp.float32))
    t64 = perf.decode_iteration_time(mp, WaferParams.from_spec(base, jnp.float64), plan, ctx)
    assert t32.dtype == jnp.float32 and float(t32) == pytest.approx(float(t64), rel=1e-5)


def test_vmap_over_instance_plans_and_moe():
    m = get_model("qwen3-30b-a3b")
    w = get_wafer("wsc-llm-64g")
    cfgs = [pl.InstanceConfig(h, c, s) for h, c in ((1, 1), (1, 2), (2, 2), (2, 4)) for s in pl.STRATEGIES]
    plans = pl.stack_plans([pl.tp_plan(m, w, c) for c in cfgs])
    mp, hw = pl.model_params(m), WaferParams.from_spec(w)
    t = jax.vmap(lambda p: perf.prefill_time(mp, hw, p, 2048.0, 2048.0 * 1000, 2048.0 * 1.5, 1.0))(plans)
    t = np.asarray(t)
    assert np.all(np.isfinite(t)) and t.shape == (8,)
    assert t[0] > t[2] > t[4] > t[6]  # more dies per instance, shorter iterations
    # MoE: an iteration of one token reads only the top-k experts' weights, fewer bytes than all experts
    mw = perf.weight_bytes_per_die(mp, hw, pl.tp_plan(m, w, cfgs[0]))
    assert float(mw) == pytest.approx(m.total_params * 2, rel=1e-6)


def test_route_incidence_matches_hops():
    w = wsc_wafer(3, 4)
    inc, links = route_incidence(w)
    assert np.array_equal(inc.sum(-1), hop_matrix(w))
    assert len(links) == 2 * (3 * 3 + 2 * 4)
