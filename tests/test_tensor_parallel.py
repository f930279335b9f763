"""Tensor parallelism inside a stage: hand-computed shares and collectives, TP = 1 equal to the
single-die cost model exactly, an independent oracle for a TP group, group placement, and
bad input at the API / CLI boundary."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mocap_jax import api, costs
from mocap_jax.cli import main
from mocap_jax.costs import tensor_parallel as tp
from mocap_jax.costs.params import HardwareParams, ModelParams, StageLayout
from mocap_jax.api.config import check_tensor_parallel
from mocap_jax.mbkr.pairing import pair_routes
from mocap_jax.specs import ModelSpec, SpecError, get_hardware, get_model, gpu_node, mesh


def _mp(name, dtype=np.float64):
    return ModelParams.from_spec(get_model(name), dtype)


# --------------------------------------------------------------------------- hand-computed shares


def test_head_shares_split_then_replicate():
    # 64 query heads, 8 KV heads (Llama-3-70B): KV heads split up to t = 8, then one replica per die
    q, kv = 64.0, 8.0
    assert [float(tp.q_heads_share(q, t, np)) for t in (1, 4, 8, 16)] == [64, 16, 8, 4]
    assert [float(tp.kv_heads_share(q, kv, t, np)) for t in (1, 2, 4, 8, 16, 64)] == [8, 4, 2, 1, 1, 1]
    # 32 query heads, 4 KV heads, t = 16: each die's 2 query heads read 1 KV head
    assert float(tp.kv_heads_share(32.0, 4.0, 16, np)) == 1
    # non-divisible widths round up
    assert float(tp.column_share(28672.0, 3, np)) == 9558


def test_llama3_70b_per_die_params_and_kv():
    m = _mp("llama3-70b")
    d, hd = 8192, 128
    attn8 = 2 * d * hd * (8 + 1)                       # 8 query heads + 1 KV head per die
    assert float(tp.attention_params_per_die(m, 8.0, np)) == attn8
    mlp8 = 3 * d * (28672 // 8)
    assert float(tp.dense_layer_params_per_die(m, 8.0, np)) == attn8 + mlp8 + 2 * d
    assert float(tp.kv_elements_per_die(m, 8.0, np)) == 2 * 1 * hd
    assert float(tp.kv_elements_per_die(m, 16.0, np)) == 2 * 1 * hd     # replicated beyond 8 dies
    assert float(tp.attention_flops_per_pair_per_die(m, 8.0, np)) == 2 * 8 * (hd + hd)
    assert float(tp.embedding_params_per_die(m, 8.0, np)) == 16032 * d


def test_mla_latent_cache_stays_whole_and_moe_experts_split():
    m = _mp("deepseek-v3")
    spec = get_model("deepseek-v3")
    assert float(tp.kv_elements_per_die(m, 8.0, np)) == 576
    assert float(tp.attention_params_per_die(m, 8.0, np)) == np.ceil(spec.attention_params / 8)
    assert float(tp.expert_params_per_die(m, 8.0, np)) == 3 * 7168 * 256
    static = np.ceil(spec.attention_params / 8) + spec.norm_params + spec.router_params + 1 * 3 * 7168 * 256
    assert float(tp.moe_static_params_per_die(m, 8.0, np)) == static
    assert float(tp.moe_layer_params_per_die(m, 8.0, np)) == static + 256 * 3 * 7168 * 256


def test_ring_collectives_hand_computed():
    # 8 MB over 4 dies, 1 us per step, 1 GB/s: all-reduce 2 x 3 steps of 2 MB
    assert float(tp.all_reduce_time(8e6, 4.0, 1e-6, 1e9, np)) == pytest.approx(6 * (1e-6 + 2e-3), rel=1e-12)
    assert float(tp.all_gather_time(8e6, 4.0, 1e-6, 1e9, np)) == pytest.approx(3 * (1e-6 + 2e-3), rel=1e-12)
    assert float(tp.all_reduce_time(8e6, 1.0, 1e-6, 1e9, np)) == 0.0
    assert tp.send_recv_time(1e6, 2e-6, 1e9) == pytest.approx(2e-6 + 1e-3)


def test_projection_shapes_per_die():
    s = tp.projection_shapes(8192.0, 64.0, 8.0, 128.0, 28672.0, True, 4.0, np)
    assert s["attn_pre_proj"] == (8192.0, (16 + 2 * 2) * 128)
    assert s["attn_post_proj"] == (16 * 128, 8192.0)
    assert s["mlp_up_proj"] == (8192.0, 2 * 7168)
    assert s["mlp_down_proj"] == (7168, 8192.0)


# --------------------------------------------------------------------------- TP = 1 is today's model


def _old_stage_times(mp, hp, n, c, p, b, last):
    """The single-die formulas (flat GEMM efficiency), written out independently in NumPy."""
    def roof(f, by, eff):
        return np.maximum(f / (hp.peak_flops * eff), by / (hp.hbm_bandwidth * hp.eff_hbm))
    dense, moe = (np.asarray(v) for v in costs.stage_layer_counts(mp, n, n, np))
    tok = b * c
    act = 2 * tok * mp.hidden * hp.activation_bytes
    attn = roof(mp.attention_flops_per_pair * b * c * (p + (c + 1) / 2),
                b * (p + c) * mp.kv_elements_per_token_layer * hp.kv_bytes, hp.eff_attention)
    dl = roof(2 * mp.dense_layer_params * tok, mp.dense_layer_params * hp.weight_bytes + act, hp.eff_gemm) + attn
    touched = np.minimum(mp.experts, tok * mp.experts_active)
    ml = roof(2 * mp.moe_active_params * tok, (mp.moe_static_params + touched * mp.expert_params) * hp.weight_bytes
              + act, hp.eff_gemm) + attn
    t = dense[None] * dl[:, None] + moe[None] * ml[:, None]
    t[:, 0] += tok * mp.hidden * (hp.weight_bytes + hp.activation_bytes) / (hp.hbm_bandwidth * hp.eff_hbm)
    head = roof(2 * mp.lm_head_params * b, mp.lm_head_params * hp.weight_bytes, hp.eff_gemm)
    t[:, n - 1] += np.where(last, head, 0.0)
    return t


@pytest.mark.parametrize("model", ["llama3-70b", "qwen3-235b-a22b"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_tp1_equals_single_die_costs_exactly(model, dtype):
    hw = get_hardware("mocap-4x4").replace(gemm_fixed_s=0.0)
    mp, hp = ModelParams.from_spec(get_model(model), dtype), HardwareParams.from_spec(hw, dtype)
    n = 16
    layout = StageLayout.snake(hw, n, n, dtype)
    c = np.array([4096, 1024, 100, 7], dtype)
    p = np.array([0, 4096, 5120, 5220], dtype)
    b = np.array([1, 2, 3, 1], dtype)
    last = np.array([False, False, False, True])
    t = np.asarray(costs.stage_times(mp, hp, layout, c, p, b, last, n, xp=np))
    np.testing.assert_array_equal(t, _old_stage_times(mp, hp, n, c, p, b, last).astype(dtype))
    tj = np.asarray(jax.jit(lambda *a: costs.stage_times(mp, hp, layout, *a, n))(c, p, b, last))
    np.testing.assert_allclose(tj, t, rtol=2e-6 if dtype == np.float32 else 1e-13)
    # weights and KV per token: whole blocks on one die
    dense, moe = (np.asarray(v) for v in costs.stage_layer_counts(mp, n, n, np))
    w = np.asarray(costs.stage_weight_bytes(mp, hp, n, n, xp=np, tensor_parallel=dtype(1)))
    expect = (dense * mp.dense_layer_params + moe * mp.moe_layer_params)
    expect[0] += mp.embedding_params
    expect[-1] += mp.lm_head_params
    np.testing.assert_array_equal(w, (expect * hp.weight_bytes).astype(dtype))
    kv = np.asarray(costs.stage_kv_bytes_per_token(mp, hp, n, n, xp=np, tensor_parallel=dtype(1)))
    np.testing.assert_array_equal(kv, ((dense + moe) * mp.kv_elements_per_token_layer * hp.kv_bytes).astype(dtype))


def test_group_layout_with_one_die_equals_single_die_layout():
    hw = get_hardware("mocap-4x4")
    pl = np.array([0, 1, 2, 3, 7, 6, 5, 4, 8, 9, 13, 12, 14, 15, 11, 10])
    a = StageLayout.from_groups(hw, pl[:, None], 16, np.float64)
    _, bw = pair_routes(hw, pl, None, 16, np.float64)
    shared = np.ones(16)
    shared[:15] = bw[np.arange(15), np.arange(1, 16)]
    b = StageLayout.from_placement(hw, pl, 16, np.float64)
    np.testing.assert_array_equal(a.handoff_hops, b.handoff_hops)
    np.testing.assert_array_equal(a.handoff_bandwidth, shared)
    np.testing.assert_array_equal(a.tensor_parallel, 1.0)
    np.testing.assert_array_equal(a.group_hops, np.zeros(16))


# --------------------------------------------------------------------------- TP > 1 against an oracle


def test_tp_group_stage_times_match_an_independent_oracle():
    """Two stage groups of four H100s: per-die rooflines, two ring all-reduces per block, the hand-off's
    scatter over four NVLink ports and the all-gather that reassembles it, written out by hand."""
    hw = gpu_node("h100", 8).replace(gemm_fixed_s=0.0)
    spec = get_model("llama3-70b")
    mp, hp = ModelParams.from_spec(spec, np.float64), HardwareParams.from_spec(hw, np.float64)
    layout = StageLayout.from_groups(hw, mesh.stage_groups(hw, 2, 4), 2, np.float64)
    c, p, b = 2048.0, 2048.0, 2.0
    t = np.asarray(costs.stage_times(mp, hp, layout, np.array([c]), np.array([p]), np.array([b]),
                                     np.array([True]), 2, xp=np))[0]
    d = np.asarray(costs.handoff_time(mp, hp, layout, np.array([c]), np.array([b]), 2, xp=np))[0]

    dd, hd, ffn, tok = 8192, 128, 28672, b * c
    per_die = 2 * dd * hd * (16 + 2) + 3 * dd * (ffn // 4) + 2 * dd
    roof = lambda f, by, e: max(f / (989e12 * e), by / (3.35e12 * 0.85))
    gemm = roof(2 * per_die * tok, per_die * 2 + 2 * tok * dd * 2, 0.80)
    attn = roof(2 * 16 * (hd + hd) * tok * (p + (c + 1) / 2), b * (p + c) * 2 * 2 * hd * 2, 0.75)
    step_bw = 450e9 * 0.85
    ring = lambda nbytes, steps: steps * (1e-6 + nbytes / 4 / step_bw)
    act = tok * dd * 2
    block = gemm + attn + 2 * ring(act, 6)
    emb = tok * dd * 4 / (3.35e12 * 0.85) + ring(act, 6)
    head_params = 128256 // 4 * dd
    head = roof(2 * head_params * b, head_params * 2, 0.80) + ring(b * 128256 * 2, 3)
    assert t[0] == pytest.approx(40 * block + emb, rel=1e-12)
    assert t[1] == pytest.approx(40 * block + head, rel=1e-12)
    assert d[0] == pytest.approx(1e-6 + act / (4 * 450e9 * 0.85) + ring(act, 3), rel=1e-12)
    assert d[1] == 0.0


def test_tp_degree_is_traced_vmap_over_layouts():
    hw = gpu_node("h100", 8)
    mp, hp = ModelParams.from_spec(get_model("llama3-70b")), HardwareParams.from_spec(hw)
    layouts = [StageLayout.from_groups(hw, mesh.stage_groups(hw, 8 // t, t), 8) for t in (1, 2, 4, 8)]
    stacked = jax.tree_util.tree_map(lambda *x: jnp.stack(x), *layouts)
    args = (jnp.array([1024.0]), jnp.array([0.0]), jnp.array([1.0]), jnp.array([True]))
    one = lambda lay: costs.stage_times(mp, hp, lay, *args, 8)
    batched, single = jax.jit(jax.vmap(one))(stacked), jax.jit(one)
    for i, lay in enumerate(layouts):
        np.testing.assert_allclose(batched[i], single(lay), rtol=1e-6)


# --------------------------------------------------------------------------- placement of groups


def test_default_groups_are_rectangles_in_snake_order():
    hw = get_hardware("mocap-4x4")
    groups = mesh.stage_groups(hw, 4, 4)
    assert groups.tolist() == [[0, 1, 5, 4], [2, 3, 7, 6], [10, 11, 15, 14], [8, 9, 13, 12]]
    hops, bw = mesh.group_rings(hw, groups)
    np.testing.assert_array_equal(hops, [1, 1, 1, 1])
    np.testing.assert_array_equal(bw, [5e12] * 4)
    hops, bw = mesh.group_routes(hw, groups)
    assert hops[0, 1] == 2 and hops[1, 2] == 2          # rank k of one 2x2 square to rank k of the next
    gpu = gpu_node("h20", 8, nodes=2)
    assert mesh.stage_groups(gpu, 4, 4).tolist() == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    _, bw = mesh.group_routes(gpu, mesh.stage_groups(gpu, 4, 4))
    assert bw[0, 1] == 4 * 450e9 and bw[1, 2] == 4 * 50e9      # NVLink inside a node, NICs between nodes
    with pytest.raises(ValueError, match="tiles"):
        mesh.stage_groups(hw, 2, 3)


def test_simulate_with_tp_holds_per_die_weights():
    r = api.simulate("llama3-70b", "h100-x8", 4096, "terapipe", chunks=4, tp=4, num_batches=1, timeline=False)
    assert r.num_stages == 2 and r.placement.shape == (2, 4) and r.extra["tensor_parallel"] == 4
    m = get_model("llama3-70b")
    per_die = 40 * (2 * 8192 * 128 * (16 + 2) + 3 * 8192 * 7168 + 2 * 8192)
    np.testing.assert_allclose(r.weight_bytes_per_stage, [2 * (per_die + m.vocab // 4 * 8192)] * 2, rtol=1e-6)


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("kw, match", [
    (dict(tp=0), "tp must be a positive integer"),
    (dict(tp=2.5), "tp must be an integer"),
    (dict(tp=3), "does not divide the 64 attention heads"),
    (dict(tp=16), "has 8"),
    (dict(tp=4, stages=4), "16 dies"),
    (dict(tp=2, placement="serched"), "placement must be 'snake', 'searched' or a list.*Did you mean 'searched'"),
    (dict(tp=2, placement=[[0, 1], [1, 2], [4, 5], [6, 7]]), "distinct die indices"),
])
def test_tp_bad_input_is_one_clear_error(kw, match):
    with pytest.raises(ValueError, match=match):
        api.simulate("llama3-70b", "h100-x8", 1024, **kw)


def test_tp_refused_by_kv_heads_rule():
    odd = ModelSpec("odd-kv", 4, 1024, 4096, 24, 6, 64, 1000)     # 6 KV heads: neither divides nor is divided by 4
    with pytest.raises(SpecError, match="neither divides"):
        check_tensor_parallel(odd, gpu_node("h100", 8), 4)
    assert check_tensor_parallel(get_model("qwen3-235b-a22b"), gpu_node("h100", 8), 8) == 8   # 8 = 2 x 4 KV heads


def test_cli_tp_bad_input(capsys):
    assert main(["simulate", "-m", "llama3-70b", "-w", "h100-x8", "-s", "1024", "--tp", "3"]) == 2
    err = capsys.readouterr().err
    assert "does not divide" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    with pytest.raises(SystemExit) as e:
        main(["max-seq", "-w", "h100-x8", "--tp", "0"])
    assert e.value.code == 2
    assert main(["max-batch", "-w", "h100-x8", "--tp", "4", "--scheme", "terapipe", "--stages", "4"]) == 2
    assert main(["simulate", "-w", "h100-x8", "--tp", "2", "--scheme", "lbcp", "--partition", "1024"]) == 2


# --------------------------------------------------------------------------- searched placement of stage groups


def _oracle_route_cost(hw, a: int, b: int) -> float:
    """Standard-link units of the XY route a -> b, walked link by link (cross-wafer links weighted)."""
    ratio = hw.link_bandwidth / hw.cross_wafer_bandwidth
    return sum(ratio if mesh.link_bandwidth(hw, link) == hw.cross_wafer_bandwidth and hw.wafers > 1 else 1.0
               for link in mesh.xy_route(hw, a, b))


def _oracle_group_cost(hw, groups, pairs) -> float:
    """Hand-off plus pair route length of stage groups, rank k to rank k, averaged over the ranks."""
    transfers = [(s, s + 1) for s in range(len(groups) - 1)] + [tuple(p) for p in pairs]
    return sum(np.mean([_oracle_route_cost(hw, int(groups[a][k]), int(groups[b][k])) for k in range(len(groups[0]))])
               for a, b in transfers)


@pytest.mark.parametrize("hardware, tp", [("mocap-4x4", 4), ("mocap-2x4", 2), ("mocap-2x3x2w", 2)])
def test_tile_search_finds_the_brute_force_optimum(hardware, tp):
    import itertools

    from mocap_jax.mbkr.placement import _pairs, exhaustive_placement, search_placement

    hw = get_hardware(hardware)
    if hw.wafers > 1:
        hw = hw.replace(cross_wafer_bandwidth=hw.link_bandwidth / 3)        # a cross-wafer link counts 3 hops
    tiles, _ = mesh.group_tiles(hw, tp)
    n = len(tiles)
    pairs = _pairs("cross-half", n)
    brute = min(_oracle_group_cost(hw, tiles[list(p)], pairs) for p in itertools.permutations(range(n)))
    best = exhaustive_placement(hw, n, tp=tp)
    assert best.cost == pytest.approx(brute, rel=1e-9)
    assert _oracle_group_cost(hw, best.placement, pairs) == pytest.approx(brute, rel=1e-9)
    assert search_placement(hw, n, tp=tp).cost == pytest.approx(brute, rel=1e-9)
    # every group is one whole tile, each in ring order
    assert sorted(map(tuple, best.placement.tolist())) == sorted(map(tuple, tiles.tolist()))


def test_tile_cost_is_the_rank_shift_and_annealing_reaches_the_optimum():
    from mocap_jax.mbkr.placement import anneal_placement, exhaustive_placement, group_cost_matrix

    hw = get_hardware("mocap-4x4")
    tiles, _ = mesh.group_tiles(hw, 2)                                     # 1 x 2 tiles on a 4 x 2 grid of tiles
    tr, tc = np.divmod(np.arange(len(tiles)), 2)
    shift = np.abs(tr[:, None] - tr[None, :]) * 1 + np.abs(tc[:, None] - tc[None, :]) * 2
    np.testing.assert_array_equal(group_cost_matrix(hw, tiles), shift)
    best = exhaustive_placement(hw, 8, tp=2)
    assert anneal_placement(hw, 8, tp=2, chains=64, steps=400).cost == pytest.approx(best.cost)


@pytest.mark.parametrize("hardware, tp", [("mocap-4x4", 2), ("mocap-4x4", 4), ("mocap-8x8", 2), ("mocap-8x8", 4)])
def test_searched_groups_never_cost_more_than_the_default_groups(hardware, tp):
    from mocap_jax.mbkr.placement import search_placement, snake_report

    hw = get_hardware(hardware)
    got = search_placement(hw, hw.num_dies // tp, tp=tp, steps=400)
    snake = snake_report(hw, hw.num_dies // tp, tp=tp)
    assert got.cost <= snake.cost + 1e-9
    assert got.placement.shape == (hw.num_dies // tp, tp) and len(np.unique(got.placement)) == hw.num_dies
    tiles = {tuple(t) for t in mesh.group_tiles(hw, tp)[0].tolist()}
    assert all(tuple(g) in tiles for g in got.placement.tolist())


def test_groups_on_a_switch_are_consecutive_devices():
    from mocap_jax.mbkr.placement import search_placement

    gpu = gpu_node("h20", 8, nodes=2)
    np.testing.assert_array_equal(search_placement(gpu, 4, tp=4).placement, mesh.stage_groups(gpu, 4, 4))


def test_api_searches_groups_for_mbkr_and_keeps_default_groups_otherwise():
    from mocap_jax.api.config import resolve, searched_placement

    hw = get_hardware("mocap-4x4")
    mbkr = resolve("llama3-70b", "mocap-4x4", 4096, "mbkr", chunks=4, tp=2)
    np.testing.assert_array_equal(mbkr.placement, searched_placement(hw, 8, "cross-half", 2))
    assert not np.array_equal(mbkr.placement, mesh.stage_groups(hw, 8, 2))
    for kw in (dict(scheme="terapipe"), dict(scheme="mbkr", placement="snake"), dict(scheme="mbkr", pairing="none")):
        cfg = resolve("llama3-70b", "mocap-4x4", 4096, chunks=4, tp=2, **kw)
        np.testing.assert_array_equal(cfg.placement, mesh.stage_groups(hw, 8, 2))
    assert resolve("llama3-70b", "mocap-4x4", 4096, "terapipe", chunks=4, tp=2,
                   placement="searched").placement.shape == (8, 2)


def test_mbkr_partners_are_groups_and_spills_run_rank_to_rank():
    """The MBKR routes of a grouped configuration against link shares counted here rank by rank."""
    from mocap_jax.api.config import resolve

    cfg = resolve("llama3-70b", "mocap-4x4", 4096, "mbkr", chunks=4, tp=2, placement="snake")
    groups, n = cfg.placement, 8
    partner = [s + 4 if s < 4 else s - 4 for s in range(n)]
    transfers = [(s, s + 1) for s in range(n - 1)] + [(s, partner[s]) for s in range(n)]
    share = {}
    for a, b in transfers:
        for k in range(2):
            for link in mesh.xy_route(cfg.hardware, int(groups[a, k]), int(groups[b, k])):
                share[link] = share.get(link, 0) + 1
    point = cfg.point()
    for s in range(n):
        q = partner[s]
        routes = [mesh.xy_route(cfg.hardware, int(groups[s, k]), int(groups[q, k])) for k in range(2)]
        assert point.mbkr.stage_hops[s, q] == max(len(r) for r in routes)
        rank_bw = min(5e12 / share[link] for r in routes for link in r)
        assert point.mbkr.stage_bandwidth[s, q] == pytest.approx(rank_bw, rel=1e-6)


def test_searched_groups_shorten_the_spill_routes():
    # past TeraPipe's largest batch (51) MBKR spills; the same bytes cross shorter pair routes.  The
    # latency itself is not monotone in the hop cost: hand-offs carry every item's activations and
    # lie on the critical path, pair routes only the spilled KV, and the cost weighs both alike.
    kw = dict(chunks=16, batch=52, tp=2, num_batches=1, timeline=False)
    searched = api.simulate("llama3-70b", "mocap-4x4", 131072, "mbkr", **kw)
    snake = api.simulate("llama3-70b", "mocap-4x4", 131072, "mbkr", placement="snake", **kw)
    assert searched.feasible and snake.feasible
    assert snake.extra["spilled_bytes"] > 0
    assert searched.extra["spilled_bytes"] == pytest.approx(snake.extra["spilled_bytes"], rel=1e-6)
    assert searched.extra["spill_write_s"] < 0.6 * snake.extra["spill_write_s"]


def test_cli_placement_of_stage_groups(capsys):
    import json

    assert main(["placement", "-w", "mocap-4x4", "--tp", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tp"] == 4 and out["searched"]["cost"] <= out["snake"]["cost"] and len(out["placement"]) == 4
    assert main(["placement", "-w", "mocap-4x4", "--tp", "3"]) == 2
    err = capsys.readouterr().err
    assert "no rectangle of 3 dies tiles" in err and len(err.strip().splitlines()) == 1
