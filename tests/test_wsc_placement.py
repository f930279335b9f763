"""Placement: TransferCost by hand (with shared links), packing, heuristics against the exhaustive optimum,
annealing moves and objective against plain checks, and the annealer's device-split invariance."""

import jax
import numpy as np
import pytest

from mocap_jax.search.anneal import evaluate_states, random_words
from mocap_jax.specs import SpecError
from mocap_jax.wsc import layout as lay_
from mocap_jax.wsc import placement as plc
from mocap_jax.wsc.placement_compare import compare_placements
from mocap_jax.wsc.placement_search import LayoutContext, LayoutProblem
from mocap_jax.wsc.figures_wafer import plot_placement
from mocap_jax.wsc.hardware import wsc_wafer

W33 = wsc_wafer(3, 3)
W34 = wsc_wafer(3, 4)


def lay(wafer, *insts):
    return lay_.Layout(wafer.rows, wafer.cols, tuple(lay_.Instance(*i) for i in insts))


def test_transfer_cost_by_hand_with_a_shared_link():
    # decode at the centre (1,1); prefill at (1,0), (0,2) and (0,1).
    # XY routes (columns first): (1,0)->(1,1): 1 hop; (0,2)->(0,1)->(1,1): 2 hops; (0,1)->(1,1): 1 hop.
    # The link (0,1)->(1,1) carries two transfers.
    layout = lay(W33, ("decode", 1, 1, 1, 1), ("prefill", 1, 0, 1, 1), ("prefill", 0, 2, 1, 1),
                 ("prefill", 0, 1, 1, 1))
    r1 = plc.transfer_cost(W33, layout, 1.0)
    assert r1.cost == 4.0 and r1.hop_sum == 4 and r1.shared_links == 1 and r1.max_link_use == 2
    assert r1.link_use[(1, 4)] == 2 and r1.routes[1] == [(2, 1), (1, 4)]
    # alpha = 2: each of the two uses of the shared link costs 2 -> 1 + 1 + 2 * 2 = 6
    assert plc.transfer_cost(W33, layout, 2.0).cost == 6.0
    assert plc.transfer_cost(W33, layout, 3.0).cost == 1 + 1 + 2 * 3


def test_transfer_cost_centre_to_centre_and_nearest():
    # a 2x2 decode instance's centre die is its top-left of the middle (row + (h-1)//2, col + (w-1)//2)
    layout = lay(W34, ("decode", 0, 0, 2, 2), ("decode", 0, 3, 3, 1), ("prefill", 2, 0, 1, 1),
                 ("prefill", 2, 2, 1, 1))
    rep = plc.transfer_cost(W34, layout, 1.0)
    # prefill (2,0) -> decode 0 centre (0,0): 2 hops; decode 1 centre (1,3): 4 hops
    # prefill (2,2) -> decode 0: 4 hops; decode 1: 2 hops
    assert rep.nearest == [0, 1] and rep.cost == 4.0
    # three links share nothing -> alpha does not matter
    assert plc.transfer_cost(W34, layout, 5.0).cost == 4.0
    # ties go to the decode instance listed first
    tie = lay(W33, ("decode", 0, 0, 1, 1), ("decode", 2, 2, 1, 1), ("prefill", 1, 1, 1, 1))
    assert plc.transfer_cost(W33, tie, 1.0).nearest == [0]


def test_layout_and_alpha_validation():
    with pytest.raises(SpecError, match="overlap"):
        lay(W33, ("decode", 0, 0, 2, 2), ("prefill", 1, 1, 1, 1))
    with pytest.raises(SpecError, match="leaves"):
        lay(W33, ("decode", 2, 2, 2, 1))
    ok = lay(W33, ("decode", 0, 0, 1, 1), ("prefill", 0, 1, 1, 1))
    with pytest.raises(SpecError, match="alpha must be >= 1"):
        plc.transfer_cost(W33, ok, 0.5)
    with pytest.raises(SpecError, match="larger than the 3x3"):
        plc.decode_centred_placement(W33, (1, 1), 1, (4, 1), 1)
    with pytest.raises(SpecError, match="need 10 dies"):
        plc.decode_centred_placement(W33, (1, 1), 6, (2, 2), 1)


def test_pack_instances():
    assert lay_.pack_instances(2, 2, [((1, 2), 2)]) is not None
    assert lay_.pack_instances(3, 3, [((2, 2), 2)]) is None
    got = lay_.pack_instances(2, 3, [((2, 1), 3)], allow_rotation=False)
    assert sorted((r, c) for _, r, c, _, _ in got) == [(0, 0), (0, 1), (0, 2)]
    assert lay_.pack_instances(2, 3, [((1, 2), 3)], allow_rotation=False) is None  # needs rotation
    assert lay_.pack_instances(2, 3, [((1, 2), 3)], allow_rotation=True) is not None
    # a tight mixed case: a 6x9 wafer with 24 dies 1x1 and 15 dominoes
    placed = lay_.pack_instances(6, 9, [((1, 1), 24), ((1, 2), 15)])
    assert placed is not None and len(placed) == 39


def test_enumerate_layouts_counts():
    # 2x2 grid, one 1x2 decode (4 positions with rotation) and two identical 1x1 prefill in the rest
    pre, dec, layouts = lay_.enumerate_layouts(wsc_wafer(2, 2), (1, 1), 2, (1, 2), 1)
    assert len(layouts) == 4 and pre.shape == (4, 2) and dec.shape == (4, 1)
    # 1x3 grid, one prefill and one decode 1x1: 3 * 2 ordered placements
    _, _, layouts = lay_.enumerate_layouts(wsc_wafer(1, 3), (1, 1), 1, (1, 1), 1)
    assert len(layouts) == 6


@pytest.fixture(scope="module")
def small_case():
    opt = {a: plc.exhaustive_placement(W34, (1, 1), 4, (1, 2), 2, a) for a in (1.0, 2.0)}
    return opt


def test_searched_optimum_beats_heuristics(small_case):
    rng = np.random.default_rng(0)
    for a, (best, cost, n) in small_case.items():
        assert n > 1000  # really exhaustive
        assert plc.transfer_cost(W34, best, a).cost == cost
        dc = plc.decode_centred_placement(W34, (1, 1), 4, (1, 2), 2, a)
        assert plc.transfer_cost(W34, dc, a).cost >= cost
        for _ in range(20):
            r = plc.random_placement(W34, (1, 1), 4, (1, 2), 2, rng)
            assert plc.transfer_cost(W34, r, a).cost >= cost
    assert small_case[1.0][1] == 4.0  # each prefill next to a decode instance


@pytest.mark.slow
def test_annealing_finds_the_exhaustive_optimum(small_case):
    starts = [plc.decode_centred_placement(W34, (1, 1), 4, (1, 2), 2, a) for a in small_case]
    res = plc.anneal_placements(W34, starts, list(small_case), chains=8, steps=600, seed=1)
    for r, (a, (_, cost, _)) in zip(res, small_case.items()):
        assert r.cost == pytest.approx(cost)
        assert r.cost <= plc.transfer_cost(W34, starts[0], a).cost
    again = plc.anneal_placements(W34, starts, list(small_case), chains=8, steps=600, seed=1)
    assert [r.cost for r in again] == [r.cost for r in res]  # fixed seed, same answer


def _problem(wafer, layout, alphas):
    insts = layout.instances
    problem = LayoutProblem(tuple(i.rows for i in insts), tuple(i.cols for i in insts),
                            tuple(i.kind == "prefill" for i in insts), wafer.rows, wafer.cols)
    g = plc._Geometry(wafer)
    return problem, LayoutContext(hops=g.hops.astype(np.int32), incidence=g.incidence,
                                  alpha=np.asarray(alphas, np.float32))


def _as_layout(wafer, layout, x):
    """The placement ``x [3 N]`` as a Layout (raises SpecError if it leaves the grid or overlaps)."""
    return lay_.Layout(wafer.rows, wafer.cols, tuple(
        lay_.Instance(ref.kind, int(r), int(c), ref.cols if rot else ref.rows, ref.rows if rot else ref.cols)
        for ref, (r, c, rot) in zip(layout.instances, np.asarray(x).reshape(-1, 3))))


def test_moves_are_valid_exactly_when_the_layout_is_and_the_objective_is_transfer_cost():
    # mixed shapes on a tight grid: 1x2 decode instances and 1x1 prefill, 10 of 12 dies used
    start = plc.decode_centred_placement(W34, (1, 1), 6, (1, 2), 2, 1.0)
    problem, ctx = _problem(W34, start, [1.0, 2.0])
    x = np.asarray([(i.row, i.col, 0) for i in start.instances], np.int32).reshape(-1)
    rng = np.random.default_rng(4)
    propose = jax.jit(lambda words, x: problem.propose(words, x, ctx))
    words = np.asarray(jax.vmap(lambda k: random_words(7, 0, k, 4))(np.arange(300)))
    proposals, kinds = [], set()
    for k in range(300):
        got, valid = propose(words[k], x)
        try:
            _as_layout(W34, start, got)
            ok = True
        except SpecError:
            ok = False
        assert bool(valid) == ok
        kinds.add(ok)
        if ok:
            proposals.append(np.asarray(got))
            if rng.random() < 0.5:
                x = np.asarray(got)        # walk on, so moves start from varied layouts
    assert kinds == {True, False} and len(proposals) > 50
    xs = np.stack(proposals[:64])
    for group, alpha in enumerate((1.0, 2.0)):
        values, aux = evaluate_states(problem, xs, ctx, np.full(len(xs), group, np.int32), devices=1)
        assert (aux == group).all()
        want = [plc.transfer_cost(W34, _as_layout(W34, start, p), alpha).cost for p in xs]
        np.testing.assert_allclose(values, want, rtol=1e-6)


def test_annealing_is_independent_of_the_device_split_and_never_worse_than_its_start():
    starts = [plc.decode_centred_placement(W34, (1, 1), 4, (1, 2), 2, a) for a in (1.0, 2.0)]
    runs = [plc.anneal_placements(W34, starts, [1.0, 2.0], chains=8, steps=60, seed=5, devices=d) for d in (1, 8)]
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert a.chain_costs == b.chain_costs and a.layout == b.layout
    for r, start, a in zip(runs[0], starts, (1.0, 2.0)):
        assert r.cost == plc.transfer_cost(W34, r.layout, a).cost <= plc.transfer_cost(W34, start, a).cost
        assert min(r.chain_costs) == r.cost


def test_decode_centred_puts_decode_in_the_middle():
    w = wsc_wafer(5, 5)
    layout = plc.decode_centred_placement(w, (1, 1), 8, (1, 1), 1)
    assert layout.decode[0].centre == (2, 2)
    assert all(abs(p.row - 2) + abs(p.col - 2) <= 2 for p in layout.prefill)


def test_compare_placements_and_figure(tmp_path):
    rows, best = compare_placements(W34, (1, 1), 4, (1, 2), 2, alphas=(1.0, 2.0), random_samples=10, seed=0)
    assert [r.search_method for r in rows] == ["exhaustive", "exhaustive"]
    for r in rows:
        assert r.searched <= r.decode_centred and r.searched <= r.random_min <= r.random_mean
    out = plot_placement(W34, best[2.0], tmp_path / "fig" / "wsc.png", alpha=2.0)
    assert out.exists() and out.stat().st_size > 1000 and out.read_bytes()[:4] == b"\x89PNG"


def test_cluster_placement_is_rejected():
    from mocap_jax.wsc.hardware import a100_cluster

    with pytest.raises(SpecError, match="mesh wafer"):
        plc.decode_centred_placement(a100_cluster(2, 8), (1, 8), 1, (1, 8), 1)
