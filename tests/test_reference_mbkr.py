"""MBKR in the event-driven reference, on hand-computed cases and invariants, and the array program's
MBKR against it (its approximation targets).

Hand cases use two stages of Llama-3.1-8B (16 layers each) on dies 0 and 1 of a 2x2 mesh, with the
die's HBM sized so that a chosen item overflows by a chosen amount.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from mocap_jax.specs import get_hardware, get_model
from mocap_jax.validation.agreement import AgreementConfig, reference
from mocap_jax.validation.agreement_mbkr import TARGET_MAX, TARGET_MEAN, run_mbkr_agreement, vectorised_group
from mocap_jax.validation.reference import reference_simulate, static_partners
from mocap_jax.validation.reference.spill import MBKRSettings, decide, dynamic_matches, room

MODEL = get_model("llama3.1-8b")
BASE = get_hardware("mocap-2x2")
PAIR = [0, 1]


def _sized(usable: float):
    """The base die with ``usable`` bytes of usable HBM."""
    return BASE.replace(name=f"sized-{usable:.0f}", hbm_capacity=usable / BASE.usable_hbm_fraction)


def _plain(partition, batch=1):
    return reference_simulate(MODEL, BASE, sum(partition), partition=partition, batch=batch, num_batches=1,
                              placement=PAIR)


def _link(nbytes, sharers=1):
    """One hop between dies 0 and 1 at the link's bandwidth divided among ``sharers`` routes."""
    return BASE.link_latency_s + nbytes / (BASE.link_bandwidth / sharers * BASE.eff_link)


# --------------------------------------------------------------------------- the rules


def test_static_partners():
    assert static_partners("cross-half", 8) == [4, 5, 6, 7, 0, 1, 2, 3]
    assert static_partners("cross-half", 5) == [3, 4, -1, 0, 1]
    assert static_partners("head-to-tail", 5) == [4, 3, -1, 1, 0]
    assert static_partners("none", 3) == static_partners("dynamic", 3) == [-1, -1, -1]


def test_roles_room_and_the_spill_rule():
    mb = MBKRSettings(p1=0.2, p2=0.8)
    assert room(10.0, 100.0, 0.0, mb) == 0.0, "below p1: local-only"
    assert room(80.0, 100.0, 0.0, mb) == 0.0, "at p2: debtor"
    assert room(50.0, 100.0, 0.0, mb) == pytest.approx(30.0), "creditor: up to p2 of its budget"
    assert room(50.0, 100.0, 45.0, mb) == pytest.approx(5.0), "and beside its in-flight activation"
    d = decide(local=90.0, kv=20.0, activation=5.0, budget=100.0, partner_room=30.0, mb=mb)
    assert (d.need, d.over, d.moved, d.overflow) == (115.0, 15.0, 15.0, False)
    d = decide(local=90.0, kv=20.0, activation=5.0, budget=100.0, partner_room=10.0, mb=mb)
    assert d.moved == 10.0 and d.overflow, "what stays exceeds the budget"
    d = decide(local=95.0, kv=3.0, activation=10.0, budget=100.0, partner_room=50.0, mb=mb)
    assert d.moved == 3.0 and d.overflow, "at most the new item's KV moves"
    fits = decide(local=50.0, kv=20.0, activation=5.0, budget=100.0, partner_room=30.0, mb=mb)
    assert fits.moved == 0.0, "overflow policy: what fits stays"
    eager = decide(local=50.0, kv=20.0, activation=5.0, budget=100.0, partner_room=30.0,
                   mb=MBKRSettings(p1=0.2, p2=0.6, spill="eager"))
    assert eager.moved == pytest.approx(10.0), "eager: the new KV above p2 of the budget"


def test_dynamic_matching_ranks_by_occupancy():
    budgets = [100.0] * 5
    assert dynamic_matches([50, 10, 90, 30, 70], budgets) == [-1, 2, 1, 4, 3]
    # ties go to the lower stage index (ranked as less loaded)
    assert dynamic_matches([0, 0, 0, 0], budgets[:4]) == [3, 2, 1, 0]
    # occupancies equal to 2^-20 of the budget tie, whatever the rounding noise (else 0 and 1 would swap)
    assert dynamic_matches([50.0 + 1e-9, 50.0, 10.0, 10.0], budgets[:4]) == [3, 2, 1, 0]


# --------------------------------------------------------------------------- hand cases


def test_overflow_goes_to_an_idle_creditor():
    # one chunk; stage 0 overflows by a quarter of its KV while stage 1 is idle and empty
    S = 16384
    plain = _plain([S])
    w, kv, act = plain.weight_bytes_per_stage, plain.kv_bytes[0], plain.activation_bytes[0]
    x = kv[0] / 4
    usable = w[0] + kv[0] + act[0] - x
    r = reference_simulate(MODEL, _sized(usable), S, "mbkr", partition=[S], num_batches=1, placement=PAIR)
    first, second = r.decisions
    assert first["partner"] == 1 and first["partner_local"] == 0 and first["partner_activation"] == 0
    assert first["over"] == pytest.approx(x, rel=1e-12) and first["moved"] == pytest.approx(x, rel=1e-12)
    assert r.item_moved[0, 0] == pytest.approx(x, rel=1e-12)
    # the write shares link (0, 1) with the hand-off 0 -> 1 (bandwidth halved); stage 1's write back
    # uses (1, 0), which only the pair route uses
    assert r.item_write_s[0, 0] == pytest.approx(_link(x, sharers=2), rel=1e-12)
    assert r.finish_times[0, 0] == pytest.approx(plain.stage_times[0, 0] + _link(x, sharers=2), rel=1e-12)
    # stage 0 is exactly full; stage 1 holds the spill beside its weights
    assert r.peak_mem_bytes_per_stage[0] == pytest.approx(usable, rel=1e-12)
    assert r.timeline_mem_bytes[0, 1] == pytest.approx(w[1] + x, rel=1e-12)
    # stage 0's release frees the spill too; stage 1 then overflows by as much plus the LM head's logits
    # (and its weights' difference), and writes it to stage 0, idle and empty by then
    assert second["stage"] == 1 and second["local"] == 0 and second["partner_local"] == 0
    over1 = kv[1] + act[1] - (usable - w[1])
    assert act[1] - act[0] == pytest.approx(MODEL.vocab * BASE.activation_bytes, rel=1e-9)
    assert second["moved"] == pytest.approx(over1, rel=1e-12)
    assert r.item_write_s[0, 1] == pytest.approx(_link(over1), rel=1e-12)
    assert r.feasible and not r.overflow and r.raw_latency_s == r.finish_times[0, 1]
    np.testing.assert_allclose(r.peak_mem_bytes_per_stage, usable, rtol=1e-12)


PART3 = [8192, 4096, 4096]


def _three_chunk_case(p2):
    """Three chunks; stage 0's last chunk overflows by half its KV while stage 1 runs its first chunk."""
    plain = _plain(PART3)
    w, kv, act = plain.weight_bytes_per_stage, plain.kv_bytes[:, 0], plain.activation_bytes
    usable = w[0] + kv.sum() + act[2, 0] - kv[2] / 2
    return plain, usable, reference_simulate(MODEL, _sized(usable), sum(PART3), "mbkr", partition=PART3,
                                             num_batches=1, placement=PAIR, p2=p2)


def test_room_leaves_space_for_the_creditors_item_in_flight():
    plain, usable, r = _three_chunk_case(p2=0.85)
    d = next(d for d in r.decisions if d["stage"] == 0 and d["item"] == 2)
    budget1 = usable - plain.weight_bytes_per_stage[1]
    # stage 1 is running chunk 0: it holds the KV it is writing and that chunk's activation buffers
    assert r.start_times[0, 1] <= d["time"] < r.finish_times[0, 1]
    assert d["partner_local"] == pytest.approx(plain.kv_bytes[0, 1], rel=1e-12)
    assert d["partner_activation"] == pytest.approx(plain.activation_bytes[0, 1], rel=1e-12)
    beside = budget1 - plain.kv_bytes[0, 1] - plain.activation_bytes[0, 1]
    assert beside < 0.85 * budget1 - plain.kv_bytes[0, 1], "the in-flight activation bounds the room here"
    assert d["room"] == pytest.approx(beside, rel=1e-12)
    assert d["moved"] == pytest.approx(plain.kv_bytes[2, 0] / 2, rel=1e-12) and r.feasible


def test_infeasible_when_neither_stage_has_room():
    # with p2 = 0.3 stage 1 is a debtor itself when stage 0 overflows: no room, the point does not fit
    _, _, r = _three_chunk_case(p2=0.3)
    d = next(d for d in r.decisions if d["stage"] == 0 and d["item"] == 2)
    assert d["partner_local"] >= 0.3 * (r.kv_budget_bytes_per_stage[1])
    assert d["room"] == 0 and d["moved"] == 0 and d["overflow"]
    assert not r.feasible and r.prefill_latency_s == math.inf and r.throughput_rps == 0
    assert math.isfinite(r.raw_latency_s)
    # without a partner, nothing can spill: exactly the result without MBKR
    none = reference_simulate(MODEL, r_hw(r), sum(PART3), "mbkr", partition=PART3, num_batches=1, placement=PAIR,
                              pairing="none")
    plain = reference_simulate(MODEL, r_hw(r), sum(PART3), partition=PART3, num_batches=1, placement=PAIR)
    assert not none.feasible and none.spilled_bytes == 0 and none.mbkr is None
    np.testing.assert_array_equal(none.finish_times, plain.finish_times)
    np.testing.assert_array_equal(none.peak_mem_bytes_per_stage, plain.peak_mem_bytes_per_stage)


@pytest.mark.parametrize("pairing", ["cross-half", "dynamic"])
def test_a_stage_no_spill_touches_is_judged_exactly(pairing):
    """The rounding tolerance of the spill rule covers only stages a spill touched: a stage that
    overflows by a hair (0.1 ppm) with no creditor to spill to (p1 = p2 = 1) does not
    fit, as without MBKR; with an idle, empty partner it spills the hair and fits."""
    from mocap_jax.api import simulate

    S = 16384
    plain = _plain([S])
    need = plain.weight_bytes_per_stage + plain.kv_bytes[0] + plain.activation_bytes[0]
    hair = 1e-7 * need.max()
    hw = _sized(need.max() - hair)      # only the stage of the larger need overflows, by the hair
    kw = dict(partition=[S], num_batches=1, placement=PAIR)
    assert not reference_simulate(MODEL, hw, S, **kw).feasible and need.min() < need.max() - hair
    for p1, p2, fits in ((1.0, 1.0, False), (0.0, 1.0, True)):
        ref = reference_simulate(MODEL, hw, S, "mbkr", pairing=pairing, p1=p1, p2=p2, **kw)
        arr = simulate(MODEL, hw, S, "mbkr", pairing=pairing, p1=p1, p2=p2, stages=2, dtype="float64", timeline=False,
                       **kw)
        assert ref.feasible == arr.feasible == fits, (p1, p2)
        assert (ref.spilled_bytes > 0) == fits and (arr.extra["spilled_bytes"] > 0) == fits
        if not fits:
            assert ref.peak_mem_bytes_per_stage.max() > ref.capacity_bytes


def test_a_stage_without_kv_budget_ranks_as_full():
    """Weights that fill a stage's usable HBM exactly leave it no KV budget: dynamic pairing ranks it
    as full (not by 0 / 0), and with no activation buffers it spills all its KV and fits."""
    from mocap_jax.api import simulate
    from mocap_jax.costs import HardwareParams, ModelParams, stage_weight_bytes

    base = BASE.replace(activation_buffer_scale=0.0)
    w = np.asarray(stage_weight_bytes(ModelParams.from_spec(MODEL, np.float64),
                                      HardwareParams.from_spec(base, np.float64), 4, 4, xp=np))
    frac, cap = base.usable_hbm_fraction, w.max() / base.usable_hbm_fraction
    for _ in range(64):    # the capacity whose usable bytes equal the largest stage's weights exactly
        if cap * frac == w.max():
            break
        cap = np.nextafter(cap, np.inf if cap * frac < w.max() else -np.inf)
    hw = base.replace(name="no-kv-budget", hbm_capacity=float(cap))
    kw = dict(chunks=4, batch=1, num_batches=1, pairing="dynamic")
    ref = reference_simulate(MODEL, hw, 1000, "mbkr", **kw)
    assert min(ref.kv_budget_bytes_per_stage) == 0
    arr = simulate(MODEL, hw, 1000, "mbkr", placement="snake", dtype="float64", timeline=False, **kw)   # as the reference
    assert ref.feasible and arr.feasible and ref.spilled_bytes > 0
    assert arr.raw_latency_s == pytest.approx(ref.raw_latency_s, rel=1e-12)
    assert dynamic_matches([0.0, 5.0, 1.0], [0.0, 10.0, 10.0]) == [2, -1, 0]


def r_hw(r):
    """The sized die of a hand-case result (its usable HBM)."""
    return _sized(r.capacity_bytes)


def test_remote_reads_and_creditor_blocking():
    # four chunks: stage 0 starts spilling at chunk 1, so chunks 2 and 3 read it back while stage 1
    # is still running its chunk 0 (a busy creditor: its item is delayed by each serving)
    part = [8192, 4096, 2048, 2048]
    plain = _plain(part)
    w, kv, act = plain.weight_bytes_per_stage, plain.kv_bytes[:, 0], plain.activation_bytes[:, 0]
    usable = w[0] + kv[:2].sum() + act[1] - kv[1] / 2
    r = reference_simulate(MODEL, _sized(usable), sum(part), "mbkr", partition=part, num_batches=1, placement=PAIR,
                           read_overlap=0.25)
    spilled = r.item_moved[1, 0]
    assert spilled == pytest.approx(kv[1] / 2, rel=1e-12) and r.item_moved[0, 0] == 0
    serve = BASE.hbm_bandwidth * BASE.eff_hbm
    for k in (2, 3):
        R = r.item_moved[:k, 0].sum()
        assert r.item_read_bytes[k, 0] == pytest.approx(R, rel=1e-12)
        read = _link(R, sharers=2)
        assert r.item_read_s[k, 0] == pytest.approx(read, rel=1e-12)
        att = r_attention(r, k, 0)
        assert r.item_read_extra_s[k, 0] == pytest.approx(max(read - 0.25 * att, 0.0), rel=1e-12, abs=1e-15)
    # every read is served while stage 1 runs chunk 0, whose time grows by each serving
    reads = r.item_read_bytes[:, 0]
    starts = r.start_times[:, 0]
    assert np.all((starts[reads > 0] >= r.start_times[0, 1]) & (starts[reads > 0] < r.finish_times[0, 1]))
    assert r.item_block_s[0, 1] == pytest.approx(reads.sum() / serve, rel=1e-12)
    assert r.item_times[0, 1] == pytest.approx(plain.stage_times[0, 1] + reads.sum() / serve, rel=1e-12)
    # item times are t plus the write, the unhidden read, migrations and blocking, and finish = start + time
    parts = r.stage_times + r.item_write_s + r.item_read_extra_s + r.item_migrate_s + r.item_block_s
    np.testing.assert_allclose(r.item_times, parts, rtol=1e-12)
    np.testing.assert_allclose(r.finish_times, r.start_times + r.item_times, rtol=1e-12)
    assert r.blocking_s == pytest.approx(r.item_block_s.sum()) and r.remote_read_s == pytest.approx(
        r.item_read_s.sum())


def r_attention(r, k, s):
    """Local attention seconds of item k on stage s (what hides a remote read)."""
    from mocap_jax import costs

    mp = costs.ModelParams.from_spec(MODEL, np.float64)
    hp = costs.HardwareParams.from_spec(BASE, np.float64)
    it = r.items[k]
    layers = MODEL.layers // 2
    return layers * float(costs.attention_time(mp, hp, it.tokens, it.prefix, it.requests, xp=np))


def test_eager_spills_above_p2_and_overflow_spills_only_what_cannot_stay():
    part = [8192, 4096, 2048, 2048]
    plain = _plain(part)
    assert plain.feasible
    kw = dict(partition=part, num_batches=1, placement=PAIR)
    overflow = reference_simulate(MODEL, BASE, sum(part), "mbkr", p2=0.004, **kw)
    assert overflow.spilled_bytes == 0, "a configuration that fits spills nothing"
    np.testing.assert_array_equal(overflow.finish_times, plain.finish_times)
    np.testing.assert_array_equal(overflow.peak_mem_bytes_per_stage, plain.peak_mem_bytes_per_stage)
    eager = reference_simulate(MODEL, BASE, sum(part), "mbkr", p2=0.004, spill="eager", **kw)
    assert eager.spilled_bytes > 0 and eager.feasible
    first = next(d for d in eager.decisions if d["moved"] > 0)
    budget = eager.kv_budget_bytes_per_stage[first["stage"]]
    kv = eager.kv_bytes[first["item"], first["stage"]]
    assert first["over"] == pytest.approx(min(kv, first["local"] + kv - 0.004 * budget), rel=1e-12)
    assert first["moved"] == pytest.approx(min(first["over"], first["room"], kv), rel=1e-12)
    assert eager.raw_latency_s > plain.raw_latency_s, "the writes cost time"


# --------------------------------------------------------------------------- invariants


CASES = [
    dict(model="llama3-70b", hardware="mocap-4x4", seq_len=131072, chunks=16, batch=56, num_batches=1),
    dict(model="llama3-70b", hardware="mocap-4x4", seq_len=131072, chunks=16, batch=56, num_batches=1,
         pairing="head-to-tail", spill="eager", p2=0.7),
    dict(model="llama3-70b", hardware="mocap-4x4", seq_len=131072, chunks=16, batch=52, num_batches=2,
         pairing="dynamic", release="request", p2=0.9),
    dict(model="qwen3-235b-a22b", hardware="mocap-2x4", seq_len=65536, chunks=8, batch=48, num_batches=2,
         pairing="dynamic", admission="synchronous", spill="eager", p2=0.6),
]


@pytest.mark.parametrize("case", CASES)
def test_kv_is_conserved_and_spills_live_on_the_partner(case):
    r = reference_simulate(scheme="mbkr", **case)
    assert r.spilled_bytes > 0
    _, held, written, released = r.kv_audit.T
    np.testing.assert_allclose(held, written - released, rtol=1e-12, atol=1e-3)
    assert released[-1] == pytest.approx(written[-1], rel=1e-12) and held[-1] == pytest.approx(0, abs=1e-3)
    assert written[-1] == pytest.approx(r.kv_bytes.sum(), rel=1e-12)
    # spills go to the stage's partner at the item's start; static partners never change
    spilled = r.item_moved > 0
    if case.get("pairing", "cross-half") != "dynamic":
        partner = static_partners(case.get("pairing", "cross-half"), r.start_times.shape[1])
        assert np.all(r.item_host == np.array(partner)[None, :])
    assert np.all(r.item_host[spilled] >= 0)
    # a migration moves everything the stage spilled and has not released to its new partner
    N = r.start_times.shape[1]
    last = np.array([it.group_last for it in r.items])
    released = r.finish_times[last] if r.release == "stage" else np.repeat(r.finish_times[last, -1:], N, axis=1)
    for k, s in np.argwhere(r.item_migrated > 0):
        live = (np.arange(len(r.items)) < k) & (released[:, s] > r.start_times[k, s])
        assert r.item_migrated[k, s] == pytest.approx(r.item_moved[live, s].sum(), rel=1e-12)
    # the partner's in-flight activation the rule saw is that of the item it was running then (an
    # item starting at the same instant runs already if its stage comes first)
    for d in r.decisions:
        y, tau = d["partner"], d["time"]
        if y < 0:
            continue
        running = (r.start_times[:, y] < tau) | ((r.start_times[:, y] == tau) & (y < d["stage"]))
        running &= r.finish_times[:, y] > tau
        assert d["partner_activation"] == (r.activation_bytes[running, y].sum() if running.any() else 0.0)
    np.testing.assert_allclose(r.finish_times, r.start_times + r.item_times, rtol=1e-12)


def test_pairing_none_and_fitting_points_are_the_plain_result():
    kw = dict(model="llama3-70b", hardware="mocap-4x4", seq_len=131072, chunks=16, num_batches=2)
    for batch in (40, 64):
        plain = reference_simulate(batch=batch, **kw)
        none = reference_simulate(scheme="mbkr", pairing="none", batch=batch, **kw)
        np.testing.assert_array_equal(none.finish_times, plain.finish_times)
        assert none.feasible == plain.feasible
        mbkr = reference_simulate(scheme="mbkr", batch=batch, **kw)
        if plain.feasible:   # MBKR never makes a fitting point infeasible, and changes nothing there
            assert mbkr.feasible and mbkr.spilled_bytes == 0
            np.testing.assert_array_equal(mbkr.finish_times, plain.finish_times)
            np.testing.assert_array_equal(mbkr.peak_mem_bytes_per_stage, plain.peak_mem_bytes_per_stage)
        else:
            assert mbkr.spilled_bytes > 0


# --------------------------------------------------------------------------- the array program against it


def test_array_mbkr_is_within_its_approximation_targets():
    res = run_mbkr_agreement(configs=40, seed=1, dtype="float64", group_size=10, programs=2, buckets=(8,),
                             searched=False)
    assert res["spilling_share"] >= 0.25, "the sample should spill often"
    assert res["latency_rel_err_mean"] <= TARGET_MEAN and res["latency_rel_err_max"] <= TARGET_MAX, res
    assert res["peak_mem_rel_err_mean"] <= TARGET_MEAN and res["peak_mem_rel_err_max"] <= TARGET_MAX, res
    assert res["feasible_mismatches"] == 0, res["mismatched"]


@pytest.mark.slow
def test_array_mbkr_targets_over_every_pairing_and_spill_policy():
    res = run_mbkr_agreement(configs=200, seed=2, dtype="float64", group_size=10, programs=5, searched=False)
    assert set(res["by_pairing"]) == {"cross-half", "head-to-tail", "dynamic", "none"}
    assert res["by_spill"]["eager"]["spilling"] > 0 and res["by_spill"]["overflow"]["spilling"] > 0
    assert res["latency_rel_err_mean"] <= TARGET_MEAN and res["latency_rel_err_max"] <= TARGET_MAX, res
    assert res["peak_mem_rel_err_mean"] <= TARGET_MEAN and res["peak_mem_rel_err_max"] <= TARGET_MAX, res
    assert res["feasible_mismatches"] == 0, res["mismatched"]


def test_a_read_served_by_a_finished_host_delays_nothing():
    # stage 7 spills its big first chunk to stage 3 and reads it back for its second chunk, when stage 3
    # has finished the batch: stage 3 is idle with no next item, so the serving delays nothing
    cfg = AgreementConfig(model="llama3-70b", hardware="mocap-2x4", seq_len=32768, scheme="mbkr", batch=60,
                          partition=(28672, 4096), num_batches=2, admission="synchronous",
                          placement=(0, 1, 2, 3, 7, 6, 5, 4), pairing="cross-half")
    ref = reference(cfg)
    assert ref.feasible and ref.item_read_bytes[3, 7] > 0 and ref.start_times[3, 7] > ref.finish_times[3, 3]
    assert ref.blocking_s == 0
    vec = vectorised_group([cfg], "float64", 10)
    np.testing.assert_allclose(vec["blocking_s_per_stage"][0][:8], ref.blocking_s_per_stage, atol=1e-12)


@pytest.mark.parametrize("pairing", ["cross-half", "head-to-tail"])
def test_an_odd_stage_count_leaves_the_middle_stage_alone_and_mbkr_still_admits_more(pairing):
    """Nine stages: the middle one has no partner.  Its pair program runs alone (an absent partner's
    events lie at infinity and decide nothing), so MBKR admits the batch the reference admits, one
    above the largest without MBKR, and not the one above that."""
    from mocap_jax.api import max_feasible_batch, simulate

    kw = dict(chunks=16, num_batches=1)
    plain = max_feasible_batch("llama3-70b", "mocap-3x3", 65536, "terapipe", **kw)
    for batch, fits in ((plain + 1, True), (plain + 2, False)):
        ref = reference_simulate("llama3-70b", "mocap-3x3", 65536, "mbkr", batch=batch, pairing=pairing, **kw)
        arr = simulate("llama3-70b", "mocap-3x3", 65536, "mbkr", batch=batch, pairing=pairing, timeline=False, **kw)
        assert len(ref.weight_bytes_per_stage) == 9 and ref.feasible == fits
        assert arr.feasible == fits and arr.prefill_latency_s == pytest.approx(ref.prefill_latency_s, rel=1e-4)


def test_dynamic_pairing_can_make_feasibility_non_monotone_in_the_batch():
    """The example of docs/semantics.md: with dynamic pairing a larger batch re-ranks the stages and
    can fit where a smaller one does not (both simulators agree); the batch search then returns a
    local maximum, a B' that fits with B' + 1 not fitting, which one depending on its range."""
    from mocap_jax.api import max_feasible_batch, simulate_batch

    part = [3902, 2027, 9834, 15247, 97797, 6220, 14421, 2934, 24155]
    kw = dict(num_batches=1, pairing="dynamic")
    batches = np.array([39, 40, 42, 43, 46, 47])
    fits = [True, False, False, True, True, False]
    for b, fit in zip(batches, fits):   # the reference runs the snake order
        ref = reference_simulate("llama3.1-8b", "mocap-2x4", sum(part), "mbkr", batch=int(b), partition=part, **kw)
        assert ref.feasible == fit
    arr = simulate_batch("llama3.1-8b", "mocap-2x4", sum(part), "mbkr", batch=batches, partition=[part] * len(batches),
                         placement="snake", fields=("feasible",), **kw)
    assert arr["feasible"].tolist() == fits
    # either local maximum, depending on the bracket the search starts from
    search = lambda top: max_feasible_batch("llama3.1-8b", "mocap-2x4", sum(part), "mbkr", partition=part,
                                            placement="snake", max_batch=top, **kw)
    assert (search(1024), search(64)) == (39, 46)
