"""MBKR in the event-driven reference (mocap_jax.validation.reference_mbkr), and the array program's
approximation error against it (docs/semantics.md "MBKR"; DESIGN §6, §9).

Self-checks of the reference: KV conservation at every KV event, no spill beyond the partner's
room, no-spill MBKR identical to the reference TeraPipe, item durations that add up, a tiny spill
case checked by hand; then a differential run of random MBKR configurations through
``mocap_jax.simulate_batch`` and the reference, held to the approximation targets (mean <= 1%,
max <= 5% relative error of latency and per-stage peak memory).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from mocap_jax import costs
from mocap_jax.specs import ModelSpec, get_hardware, mocap_wafer
from mocap_jax.validation.agreement import (MBKR_TARGET_MAX, MBKR_TARGET_MEAN, run_mbkr_agreement,
                                            sample_mbkr_configs)
from mocap_jax.validation.reference import reference_simulate
from mocap_jax.validation.reference_mbkr import static_partners

# Spilling configurations (llama3-70b on 8 dies, ~2.6M request-tokens per batch), one per pairing.
SPILL = dict(seq_len=330_000, chunks=8, batch=8, num_batches=2)
PL_2X4 = [0, 1, 2, 3, 7, 6, 5, 4]


def _spilling(pairing, release="stage", admission="streaming", **kw):
    args = dict(SPILL, release=release, admission=admission, pairing=pairing, placement=PL_2X4)
    args.update(kw)
    return reference_simulate("llama3-70b", "mocap-2x4", scheme="mbkr", **args)


# --------------------------------------------------------------------------- self-checks


@pytest.mark.parametrize("pairing, release, admission", [
    ("cross-half", "stage", "streaming"), ("cross-half", "request", "synchronous"),
    ("head-to-tail", "request", "streaming"), ("dynamic", "stage", "streaming"),
    ("dynamic", "request", "synchronous")])
def test_kv_is_conserved_at_every_event_and_spills_fit_the_partner(pairing, release, admission):
    r = _spilling(pairing, release, admission, p1=0.1, p2=0.7)
    assert r.spilled_bytes > 0, "the case must spill"
    audit = r.kv_audit
    held, added, released = audit[:, 1], audit[:, 2], audit[:, 3]
    np.testing.assert_allclose(held, added - released, rtol=1e-12, atol=1.0)
    assert np.all(np.diff(audit[:, 0]) >= 0), "KV events in time order"
    assert held[-1] == pytest.approx(0.0, abs=1.0), "every request's KV is freed in the end"
    cap = r.kv_budget_bytes_per_stage
    for d in r.decisions:
        assert d["kept"] + d["moved"] == pytest.approx(d["bytes"], rel=1e-12)
        assert 0.0 <= d["moved"] <= max(d["room"], 0.0) * (1 + 1e-12)
        if d["moved"] > 0:
            b = d["partner"]
            # the partner was a creditor and stays at or below p2 of its budget
            assert r.p1 * cap[b] <= d["partner_local_before"] < r.p2 * cap[b]
            assert d["partner_local_before"] + d["moved"] <= r.p2 * cap[b] * (1 + 1e-12)
        # the rule: keep what fits below p2 of the budget, move the excess up to the partner's room
        keep0 = min(max(r.p2 * cap[d["stage"]] - d["local_before"], 0.0), d["bytes"])
        assert d["moved"] == pytest.approx(min(d["bytes"] - keep0, d["room"]), rel=1e-12, abs=1e-3)
    # the ledgers' peaks are their largest level
    for s, tl in enumerate(r.kv_timeline):
        assert r.kv_peak_bytes_per_stage[s] == tl[:, 1].max()


@pytest.mark.parametrize("pairing", ["cross-half", "dynamic"])
def test_item_durations_add_up_and_stages_serve_in_order(pairing):
    r = _spilling(pairing, p2=0.7)
    assert r.spilled_bytes > 0 and r.blocking_s > 0
    dur = r.finish_times - r.start_times
    parts = r.stage_times + r.read_extra_s + r.write_s + r.migrate_s_items + r.blocked_s
    np.testing.assert_allclose(dur, parts, rtol=1e-9, atol=1e-12)
    # a stage starts an item only after the previous one and the hand-off of this one
    K, N = r.finish_times.shape
    assert np.all(r.start_times[1:] >= r.finish_times[:-1] - 1e-12)
    assert np.all(r.start_times[:, 1:] >= r.finish_times[:, :-1] + r.handoff_times[:, :-1] - 1e-12)
    # every second of read serving lands on an item or on an idle stage
    np.testing.assert_allclose(r.blocked_s.sum(axis=0) + r.idle_blocking_s, r.blocking_s_per_stage, rtol=1e-12)
    # reads: every later chunk of a group reads what its group spilled before it
    moved = np.zeros((K, N))
    for d in r.decisions:
        moved[d["item"], d["stage"]] = d["moved"]
    for it in r.items:
        earlier = [q for q in range(it.index) if r.items[q].group == it.group]
        np.testing.assert_allclose(r.read_bytes[it.index], moved[earlier].sum(axis=0), rtol=1e-12)
    # serving time = read bytes / effective HBM bandwidth
    hw = get_hardware("mocap-2x4")
    assert r.blocking_s == pytest.approx(r.read_bytes.sum() / (hw.hbm_bandwidth * hw.eff_hbm), rel=1e-12)


@pytest.mark.parametrize("pairing", ["cross-half", "head-to-tail", "dynamic", "none"])
@pytest.mark.parametrize("release, admission", [("stage", "streaming"), ("request", "synchronous")])
def test_no_spill_mbkr_equals_reference_terapipe_exactly(pairing, release, admission):
    kw = dict(chunks=6, batch=2, num_batches=2, release=release, admission=admission, placement=PL_2X4)
    t = reference_simulate("llama3-70b", "mocap-2x4", 65536, "terapipe", **kw)
    m = reference_simulate("llama3-70b", "mocap-2x4", 65536, "mbkr", pairing=pairing, **kw)
    assert m.spilled_bytes == 0 and m.blocking_s == 0 and m.migrate_s == 0
    np.testing.assert_array_equal(m.finish_times, t.finish_times)
    np.testing.assert_array_equal(m.start_times, t.start_times)
    np.testing.assert_array_equal(m.kv_peak_bytes_per_stage, t.kv_peak_bytes_per_stage)
    np.testing.assert_array_equal(m.peak_mem_bytes_per_stage, t.peak_mem_bytes_per_stage)
    assert m.prefill_latency_s == t.prefill_latency_s and m.feasible == t.feasible
    assert m.throughput_rps == t.throughput_rps and m.bubble_fraction == t.bubble_fraction


def test_pairing_none_never_spills_and_overflows():
    r = _spilling("none", p2=0.5)
    t = reference_simulate("llama3-70b", "mocap-2x4", scheme="terapipe", placement=PL_2X4, **SPILL)
    assert r.spilled_bytes == 0
    np.testing.assert_array_equal(r.finish_times, t.finish_times)
    assert r.feasible == t.feasible


def test_static_partners():
    assert static_partners("cross-half", 8) == [4, 5, 6, 7, 0, 1, 2, 3]
    assert static_partners("cross-half", 5) == [3, 4, -1, 0, 1]
    assert static_partners("head-to-tail", 5) == [4, 3, -1, 1, 0]
    assert static_partners("none", 4) == [-1] * 4 and static_partners("dynamic", 3) == [-1] * 3


@pytest.mark.parametrize("kwargs, match", [
    (dict(pairing="diagonal"), "pairing"), (dict(p1=0.9, p2=0.5), "p1 <= p2"), (dict(p2=1.5), "p2"),
    (dict(read_overlap=-0.1), "read_overlap")])
def test_bad_mbkr_settings_are_value_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        reference_simulate("llama3.1-8b", "mocap-2x2", 4096, "mbkr", chunks=4, **kwargs)


# --------------------------------------------------------------------------- a tiny case by hand

# Three tied-embedding layers on two stages: stage 0 holds two layers, stage 1 one, so stage 0
# makes twice stage 1's KV.  The HBM is sized so that stage 0's first chunk overflows p2 of its
# budget by half a chunk of stage-1 KV, which its partner (stage 1, idle and empty) takes.
TINY = ModelSpec("tiny-3l", layers=3, hidden=1024, ffn=4096, q_heads=8, kv_heads=2, head_dim=128, vocab=32000,
                 tied_embeddings=True)


def test_hand_checked_spill_write_read_and_blocking():
    c0, c1, B, p2, ov = 6000, 6000, 1, 0.8, 0.0   # no overlap: the whole read lengthens chunk 1
    big = mocap_wafer(1, 2, name="tiny-1x2")
    base = reference_simulate(TINY, big, c0 + c1, "terapipe", partition=[c0, c1], batch=B)
    u = base.kv_bytes[0, 1]                       # stage-1 KV of chunk 0; stage 0 makes 2u
    assert base.kv_bytes[0, 0] == 2 * u
    # size the HBM: p2 x budget of stage 0 = 1.5 u, so chunk 0 spills 0.5 u
    cap0 = 1.5 * u / p2
    usable = cap0 + base.weight_bytes_per_stage[0] + base.workspace_bytes_per_stage[0]
    hw = big.replace(hbm_capacity=usable / big.usable_hbm_fraction)
    tp = reference_simulate(TINY, hw, c0 + c1, "terapipe", partition=[c0, c1], batch=B)
    r = reference_simulate(TINY, hw, c0 + c1, "mbkr", partition=[c0, c1], batch=B, pairing="cross-half", p1=0.0,
                           p2=p2, read_overlap=ov)
    assert not tp.feasible and r.feasible, "MBKR makes the tiny case fit"
    cap = r.kv_budget_bytes_per_stage
    assert cap[0] == pytest.approx(cap0, rel=1e-12)
    t, d = r.stage_times, r.handoff_times
    moved = 2 * u - p2 * cap[0]
    assert moved == pytest.approx(0.5 * u, rel=1e-9)
    # the pair route 0 -> 1 shares link (0, 1) with the hand-off: half the link bandwidth
    bw = hw.link_bandwidth / 2 * hw.eff_link
    write = hw.link_latency_s + moved / bw
    read = hw.link_latency_s + moved / bw
    mp, hp = costs.ModelParams.from_spec(TINY, np.float64), costs.HardwareParams.from_spec(hw, np.float64)
    layout = costs.StageLayout.from_placement(hw, [0, 1], dtype=np.float64)
    attn = costs.stage_attention_times(mp, hp, layout, np.array([c0, c1], float), np.array([0.0, c0]),
                                       np.array([B, B], float), 2, xp=np)
    read_extra = max(read - ov * attn[1, 0], 0.0)
    assert read_extra == read > 0
    assert r.read_extra_s[1, 0] == pytest.approx(read, rel=1e-12)
    serve = moved / (hw.hbm_bandwidth * hw.eff_hbm)
    # stage 0: chunk 0 computes, spills, writes; chunk 1 starts after it and reads the spill back
    f00 = t[0, 0] + write
    assert r.finish_times[0, 0] == pytest.approx(f00, rel=1e-12)
    assert r.start_times[1, 0] == pytest.approx(f00, rel=1e-12)
    f10 = f00 + t[1, 0] + read_extra
    assert r.finish_times[1, 0] == pytest.approx(f10, rel=1e-12)
    # stage 1 is idle when the read starts: serving it occupies stage 1 from f00 for `serve`
    assert r.idle_blocking_s[1] == pytest.approx(serve, rel=1e-12) and r.blocked_s.sum() == 0
    s01 = max(f00 + d[0, 0], f00 + serve)
    assert r.start_times[0, 1] == pytest.approx(s01, rel=1e-12)
    f01 = s01 + t[0, 1]                            # stage 1 keeps its own chunk: nothing to write
    assert r.finish_times[0, 1] == pytest.approx(f01, rel=1e-12)
    f11 = max(f01, f10 + d[1, 0]) + t[1, 1]
    assert r.finish_times[1, 1] == pytest.approx(f11, rel=1e-12)
    assert r.prefill_latency_s == pytest.approx(f11, rel=1e-12)
    # memory: stage 0 keeps 1.5 u; stage 1 hosts 0.5 u and adds its own u before stage 0 frees the group
    assert f01 < f10
    np.testing.assert_allclose(r.kv_peak_bytes_per_stage, [1.5 * u, 1.5 * u], rtol=1e-12)
    assert [(x["stage"], x["item"], x["moved"]) for x in r.decisions] == [
        (0, 0, pytest.approx(moved)), (1, 0, 0.0), (0, 1, 0.0), (1, 1, 0.0)]
    assert r.spilled_bytes == pytest.approx(moved) and r.blocking_s == pytest.approx(serve)
    assert r.remote_read_s == pytest.approx(read) and r.spill_write_s == pytest.approx(write)


def test_busy_creditor_item_is_delayed_by_the_read():
    # stage 1 (cross-half partner of stage 0 on two dies) is still working when stage 0's later
    # chunk starts reading: the serving time lands on stage 1's item in progress.
    r = reference_simulate("llama3-70b", "mocap-2x4", 330_000, "mbkr", chunks=8, batch=8, num_batches=2,
                           pairing="cross-half", p2=0.6, placement=PL_2X4)
    assert r.blocked_s.sum() > 0
    k, s = np.argwhere(r.blocked_s > 0)[0]
    assert r.finish_times[k, s] - r.start_times[k, s] >= r.stage_times[k, s] + r.blocked_s[k, s] - 1e-12


# --------------------------------------------------------------------------- differential


DIFF_KW = dict(meshes=("mocap-2x2", "mocap-2x4"), buckets=(8,), num_batches=(1, 2))


def test_mbkr_configurations_cover_the_space():
    cfgs = sample_mbkr_configs(160, seed=3, group_size=8, **DIFF_KW)
    assert len(cfgs) == 160
    assert {c.pairing for c in cfgs} == {"cross-half", "none", "head-to-tail", "dynamic"}
    assert {c.release for c in cfgs} == {"stage", "request"} and {c.num_batches for c in cfgs} == {1, 2}
    assert {c.admission for c in cfgs} == {"streaming", "synchronous"}
    assert {"qwen3-235b-a22b", "mixtral-8x22b", "qwen3-30b-a3b"} & {c.model for c in cfgs}, "need an MoE model"
    assert all(sum(c.partition) == c.seq_len and min(c.partition) > 0 for c in cfgs)
    assert sample_mbkr_configs(160, seed=3, group_size=8, **DIFF_KW) == cfgs
    assert all(len({(c.model, c.pairing, c.p2, c.release) for c in cfgs[i:i + 8]}) == 1 for i in range(0, 160, 8))


def _check_targets(res, n):
    assert res["configs"] == n
    where = f"worst latency: {res['worst_latency']}; worst peak memory: {res['worst_peak_mem']}"
    assert res["latency_rel_err_mean"] <= MBKR_TARGET_MEAN and res["latency_rel_err_max"] <= MBKR_TARGET_MAX, where
    assert res["peak_mem_rel_err_mean"] <= MBKR_TARGET_MEAN and res["peak_mem_rel_err_max"] <= MBKR_TARGET_MAX, where
    assert res["no_spill_max_rel_err"] <= 1e-9, "without spills MBKR is TeraPipe on both sides"
    assert res["within_target"]


def test_array_mbkr_static_pairings_stay_within_the_approximation_targets():
    res = run_mbkr_agreement(configs=48, seed=3, group_size=8, pairings=("cross-half", "head-to-tail", "none"),
                             **DIFF_KW)
    assert res["spilling_share"] >= 0.2, res["spilling_share"]    # "none" never spills
    assert res["feasible_mismatches"] <= 1, res["mismatched"]
    _check_targets(res, 48)


def test_array_mbkr_dynamic_pairing_stays_within_the_approximation_targets():
    res = run_mbkr_agreement(configs=24, seed=3, group_size=8, pairings=("dynamic",), **DIFF_KW)
    assert res["spilling_share"] >= 0.3, res["spilling_share"]
    _check_targets(res, 24)
    assert math.isfinite(res["wall_s"])


def test_reference_mbkr_is_independent_of_the_array_kernels(imports_of):
    from mocap_jax.validation import reference_mbkr

    imported = imports_of(reference_mbkr)
    text = " ".join(imported)
    # allowed: the host-side route helper mbkr.pair_routes, the §4 formulas (costs), specs, the base reference
    modules = {t.split(":")[0] or t.split(":")[1] for t in imported}       # "from .. import costs" -> costs
    assert modules <= {"__future__", "heapq", "math", "dataclasses", "numpy", "costs", "mbkr", "specs",
                       "reference"}, sorted(imported)
    assert "mbkr:pair_routes" in text
    for kernel in ("pipeline", "schedule", "memory", "api", "simulate", "jax", "spills", "spill_costs"):
        assert kernel not in text, f"reference_mbkr imports {kernel}: {sorted(imported)}"


# --------------------------------------------------------------------------- validate CLI


def test_validate_reports_the_mbkr_approximation(capsys):
    import json

    from mocap_jax.cli import main

    code = main(["validate", "--configs", "2", "--mbkr-configs", "6", "--no-calibration", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == (0 if out["reference_ok"] else 1)
    assert out["mbkr_configs"] == 6 and out["mbkr"]["configs"] == 6
    for k in ("mbkr_latency_rel_err_mean", "mbkr_latency_rel_err_max", "mbkr_peak_mem_rel_err_mean",
              "mbkr_peak_mem_rel_err_max", "mbkr_spilling_share"):
        assert isinstance(out[k], float) and out[k] >= 0, k
    assert out["mbkr_target"] == {"mean": MBKR_TARGET_MEAN, "max": MBKR_TARGET_MAX}
    assert isinstance(out["mbkr_within_target"], bool)


def test_validate_text_has_an_mbkr_block_and_mbkr_can_be_skipped(capsys):
    from mocap_jax.cli import main
    from mocap_jax.cli.validate import format_mbkr

    main(["validate", "--configs", "1", "--mbkr-configs", "0", "--no-calibration", "--json"])
    import json

    out = json.loads(capsys.readouterr().out)
    assert out["mbkr_configs"] == 0 and out["mbkr"] is None and out["mbkr_latency_rel_err_max"] is None
    rep = dict(configs=3, dtype="float64", spilling_configs=2, spilling_share=2 / 3, infeasible_configs=1,
               latency_rel_err_mean=1e-5, latency_rel_err_max=2e-5, peak_mem_rel_err_mean=0.0, peak_mem_rel_err_max=0.0,
               spilling_peak_mem_rel_err_mean=0.0, spilling_peak_mem_rel_err_max=0.0,
               feasible_peak_mem_rel_err_mean=0.0, feasible_peak_mem_rel_err_max=0.0, kv_peak_rel_err_mean=0.0,
               kv_peak_rel_err_max=0.0, feasible_mismatches=0, target_mean=0.01, target_max=0.05, within_target=True,
               by_pairing={"dynamic": dict(configs=3, spilling=2, latency_rel_err_mean=1e-5, latency_rel_err_max=2e-5,
                                           peak_mem_rel_err_mean=0.0, peak_mem_rel_err_max=0.0)})
    text = "\n".join(format_mbkr(rep))
    assert "MBKR approximation: 3 random configurations" in text and "PASS" in text and "dynamic" in text


def test_validate_rejects_negative_mbkr_configs(capsys):
    from mocap_jax.cli import main

    with pytest.raises(SystemExit) as e:
        main(["validate", "--mbkr-configs", "-1"])
    assert e.value.code == 2
    assert "non-negative" in capsys.readouterr().err
