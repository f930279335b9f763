"""Calibration of the cost model (docs/cost_model.md) against measured chunked prefill (`mocap-jax calibrate`)."""

from __future__ import annotations

import argparse
import dataclasses
import json

import jax.numpy as jnp
import numpy as np
import pytest

from mocap_jax.specs import HardwareSpec, ModelSpec
from mocap_jax.validation import calibration as cal
from mocap_jax.cli import calibrate as calibrate_cli

MAPE_BOUND = 15.0  # percent, held-out cells, --size small on a 2-core CPU


# --------------------------------------------------------------------------- the measured transformer is real


def _dense_reference(model: ModelSpec, weights, x):
    """Plain numpy causal forward over all tokens: final hidden states and per-layer K, V ([L, B, S, Hkv, hd])."""
    B, S, _ = x.shape
    Hq, Hkv, hd = model.q_heads, model.kv_heads, model.head_dim
    g, half = Hq // Hkv, hd // 2
    ang = np.arange(S)[:, None] * (1.0 / 10000 ** (np.arange(half) * 2.0 / hd))[None, :]
    cos, sin = np.cos(ang)[None, :, None], np.sin(ang)[None, :, None]

    def rope(t):
        t1, t2 = t[..., :half], t[..., half:]
        return np.concatenate([t1 * cos - t2 * sin, t2 * cos + t1 * sin], -1)

    def rms(t, w):
        return t / np.sqrt((t * t).mean(-1, keepdims=True) + 1e-6) * w

    x = np.asarray(x, np.float64)
    ks, vs = [], []
    causal = np.tril(np.ones((S, S), bool))
    for layer in range(model.layers):
        w = {k: np.asarray(v[layer], np.float64) for k, v in weights.items()}
        qkv = rms(x, w["ln1"]) @ w["wqkv"]
        q = rope(qkv[..., : Hq * hd].reshape(B, S, Hq, hd))
        k = rope(qkv[..., Hq * hd: (Hq + Hkv) * hd].reshape(B, S, Hkv, hd))
        v = qkv[..., (Hq + Hkv) * hd:].reshape(B, S, Hkv, hd)
        ks.append(k)
        vs.append(v)
        s = np.einsum("bqhd,bkhd->bhqk", q, np.repeat(k, g, 2)) / np.sqrt(hd)
        s = np.where(causal, s, -np.inf)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        x = x + np.einsum("bhqk,bkhd->bqhd", s, np.repeat(v, g, 2)).reshape(B, S, Hq * hd) @ w["wo"]
        a = rms(x, w["ln2"]) @ w["w13"]
        a1, a3 = a[..., : model.ffn], a[..., model.ffn:]
        x = x + (a1 / (1 + np.exp(-a1)) * a3) @ w["w2"]
    return x, np.stack(ks), np.stack(vs)


@pytest.mark.parametrize("kv_block,q_block,q_rows", [(16, 8, 0), (7, 5, 12)])
def test_chunk_fn_matches_dense_causal_forward(kv_block, q_block, q_rows):
    """A chunk over a KV cache of p prefix tokens reproduces the full causal forward at positions p..p+c."""
    model = ModelSpec("tiny", layers=2, hidden=64, ffn=96, q_heads=4, kv_heads=2, head_dim=16, vocab=10)
    weights = cal.init_weights(model, jnp.float64, seed=3)
    B, S, s_max = 2, 80, 96
    x = np.random.default_rng(0).standard_normal((B, S, model.hidden))
    y_ref, K, V = _dense_reference(model, weights, x)
    fn = cal.build_chunk_fn(model, jnp.float64, kv_block, q_block, q_rows)
    for p, c in [(0, 16), (37, 19)]:
        kc = np.zeros((model.layers, B, model.kv_heads, s_max, model.head_dim))
        vc = np.zeros_like(kc)
        kc[:, :, :, :p] = K[:, :, :p].transpose(0, 1, 3, 2, 4)
        vc[:, :, :, :p] = V[:, :, :p].transpose(0, 1, 3, 2, 4)
        y, (k_new, v_new) = fn(weights, jnp.asarray(x[:, p:p + c]), jnp.asarray(kc), jnp.asarray(vc),
                               jnp.asarray(p, jnp.int32))
        np.testing.assert_allclose(np.asarray(y), y_ref[:, p:p + c], rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(np.asarray(k_new), K[:, :, p:p + c].transpose(0, 1, 3, 2, 4), rtol=1e-9,
                                   atol=1e-9)
        np.testing.assert_allclose(np.asarray(v_new), V[:, :, p:p + c].transpose(0, 1, 3, 2, 4), rtol=1e-9,
                                   atol=1e-9)


# --------------------------------------------------------------------------- the fit


SYN_MODEL = ModelSpec("syn", layers=3, hidden=1024, ffn=2816, q_heads=16, kv_heads=4, head_dim=64, vocab=1000)
# Ridge at 50 FLOP/byte: GEMMs of fewer than ~100 tokens and attention of chunks under ~25 tokens are
# memory-bound, so every efficiency has cells where its roofline branch binds.
SYN_HW = HardwareSpec("syn", rows=1, cols=1, peak_flops=1e12, hbm_bandwidth=2e10, weight_bytes=4.0, kv_bytes=4.0,
                      activation_bytes=4.0)
SYN_TRUE = {"eff_gemm": 0.62, "eff_attention": 0.37, "eff_hbm": 0.71, "layer_overhead_s": 4e-5}


def _synthetic_grid():
    c, p, b = np.meshgrid([16, 32, 64, 128, 256, 512], [0, 1024, 4096, 16384], [1, 2, 4], indexing="ij")
    c, p, b = c.ravel().astype(float), p.ravel().astype(float), b.ravel().astype(float)
    t = cal.predict_chunk_times(SYN_MODEL, cal.with_fitted(SYN_HW, SYN_TRUE), c, p, b)
    return c, p, b, t


def test_fit_recovers_known_efficiencies_exactly():
    c, p, b, t = _synthetic_grid()
    start = dataclasses.replace(SYN_HW, eff_gemm=1.0, eff_attention=1.0, eff_hbm=1.0)
    fit = cal.fit_cost_model(SYN_MODEL, start, c, p, b, t)
    for name, true in SYN_TRUE.items():
        assert fit["fitted"][name] == pytest.approx(true, rel=1e-4), name
    assert all(fit["identified"].values())
    assert fit["binding"]["gemm_memory_bound"] > 0 and fit["binding"]["attention_memory_bound"] > 0
    assert fit["rms_log_error"] < 1e-6


def test_fit_recovers_efficiencies_from_noisy_timings_and_predicts_held_out_cells():
    c, p, b, t = _synthetic_grid()
    t_noisy = t * np.exp(np.random.default_rng(7).normal(0.0, 0.03, t.shape))  # 3% timing noise
    is_test = cal.split_cells(t.size, 0.4, seed=1)
    tr = ~is_test
    fit = cal.fit_cost_model(SYN_MODEL, SYN_HW, c[tr], p[tr], b[tr], t_noisy[tr])
    for name in ("eff_gemm", "eff_attention", "eff_hbm"):
        assert fit["fitted"][name] == pytest.approx(SYN_TRUE[name], rel=0.05), name
    pred = cal.predict_chunk_times(SYN_MODEL, cal.with_fitted(SYN_HW, fit["fitted"]), c, p, b)
    assert cal.mape(pred[is_test], t_noisy[is_test]) < 5.0      # about the noise level
    assert cal.mape(pred[is_test], t[is_test]) < 2.0            # closer to the truth than the noise
    # standard errors of the free efficiencies are small, and the truth is within a few of them
    for name in ("eff_gemm", "eff_attention", "eff_hbm"):
        se = fit["std_error"][name]
        assert se is not None and 0 < se < 0.05
        assert abs(fit["fitted"][name] - SYN_TRUE[name]) < 5 * se + 1e-3, name


def test_fit_rejects_bad_timings():
    c, p, b, t = _synthetic_grid()
    with pytest.raises(ValueError, match="positive"):
        cal.fit_cost_model(SYN_MODEL, SYN_HW, c, p, b, np.where(np.arange(t.size) == 3, 0.0, t))
    with pytest.raises(ValueError, match="at least"):
        cal.fit_cost_model(SYN_MODEL, SYN_HW, c[:3], p[:3], b[:3], t[:3])


def test_linear_baseline_is_exact_on_linear_data():
    rng = np.random.default_rng(0)
    c, p, b = rng.integers(16, 512, 30), rng.integers(0, 8192, 30), rng.integers(1, 5, 30)
    coef = np.array([2e-3, 3e-5, 1e-6, 4e-9])
    t = cal.predict_linear_baseline(coef, c, p, b)
    np.testing.assert_allclose(cal.fit_linear_baseline(c, p, b, t), coef, rtol=1e-8)
    t_plain = cal.predict_linear_baseline(coef, c, p, b, scale_by_batch=False)
    np.testing.assert_allclose(cal.fit_linear_baseline(c, p, b, t_plain, scale_by_batch=False), coef, rtol=1e-8)


def test_split_is_seeded_and_sized():
    a, b = cal.split_cells(40, 0.4, 3), cal.split_cells(40, 0.4, 3)
    np.testing.assert_array_equal(a, b)
    assert a.sum() == 16
    assert not np.array_equal(a, cal.split_cells(40, 0.4, 4))


@pytest.mark.parametrize("kwargs,match", [
    ({"size": "huge"}, "unknown calibration size"),
    ({"size": "small", "seed": -1}, "seed"),
    ({"size": "small", "test_fraction": 1.5}, "test_fraction"),
    ({"size": "gpu"}, "needs a GPU"),
])
def test_bad_input_is_a_value_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        cal.run_calibration(**kwargs)


# --------------------------------------------------------------------------- real measurement (size small)


@pytest.fixture(scope="module")
def small_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("calibration")
    report = cal.run_calibration(size="small", seed=0, json_path=out / "calibration.json",
                                 figure_path=out / "figures" / "calibration.png")
    return report, out


def test_small_calibration_meets_mape_target(small_report):
    report, _ = small_report
    print(f"\nheld-out MAPE {report['calibration_mape']:.2f}% (linear baseline {report['baseline_linear_mape']:.2f}%), "
          f"fitted {report['fitted']}, wall {report['wall_s']:.1f} s, "
          f"median timing spread {100 * report['measurement']['median_spread_iqr_rel']:.1f}%")
    assert report["calibration_mape"] <= MAPE_BOUND
    assert np.isfinite(report["baseline_linear_mape"])
    pts = report["points"]
    assert pts["train"] + pts["test"] == report["grid"]["cells"] == len(report["records"])
    assert pts["test"] >= 10 and pts["train"] >= 10
    f = report["fitted"]
    for name in ("eff_gemm", "eff_attention", "eff_hbm"):
        assert 0 < f[name] <= 1
    assert f["layer_overhead_s"] >= 0
    assert report["device"] and report["grid"]["chunk_sizes"]
    # the report's MAPE is the one its records give
    test = [r for r in report["records"] if r["split"] == "test"]
    recomputed = 100 * np.mean([abs(r["predicted_s"] - r["measured_s"]) / r["measured_s"] for r in test])
    assert recomputed == pytest.approx(report["calibration_mape"])
    # and the records' predictions are the project's cost model with the fitted parameters
    model, hw = ModelSpec(**report["model"]), HardwareSpec(**report["hardware_fitted"])
    r0 = report["records"][0]
    assert cal.predict_chunk_times(model, hw, r0["c"], r0["p"], r0["batch"]) == pytest.approx(r0["predicted_s"])


def test_small_calibration_writes_report_and_figure(small_report):
    report, out = small_report
    saved = json.loads((out / "calibration.json").read_text())
    assert saved["calibration_mape"] == pytest.approx(report["calibration_mape"])
    png = (out / "figures" / "calibration.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


# --------------------------------------------------------------------------- CLI


def _parser():
    parser = argparse.ArgumentParser(prog="mocap-jax")
    sub = parser.add_subparsers(dest="command", required=True)
    calibrate_cli.register(sub, None)
    return parser


def test_cli_prints_summary_and_json(small_report, monkeypatch, capsys, tmp_path):
    report, _ = small_report
    seen = {}

    def fake_run(**kwargs):
        seen.update(kwargs)
        return report

    monkeypatch.setattr(cal, "run_calibration", fake_run)
    args = _parser().parse_args(["calibrate", "--size", "small", "--seed", "3", "--out", str(tmp_path / "r.json"),
                                 "--figure", "-", "--quiet"])
    assert args.func(args) == 0
    text = capsys.readouterr().out
    assert "held-out MAPE" in text and "eff_attention" in text and "linear baseline" in text
    assert seen["size"] == "small" and seen["seed"] == 3 and seen["figure_path"] is None
    assert seen["json_path"] == str(tmp_path / "r.json")

    args = _parser().parse_args(["calibrate", "--size", "small", "--json", "--quiet"])
    assert args.func(args) == 0
    assert json.loads(capsys.readouterr().out)["calibration_mape"] == pytest.approx(report["calibration_mape"])


def test_cli_defaults_and_bad_input():
    args = _parser().parse_args(["calibrate"])
    assert args.size == "cpu" and args.out == "results/calibration.json" and args.figure == "figures/calibration.png"
    with pytest.raises(SystemExit):
        _parser().parse_args(["calibrate", "--size", "huge"])
    with pytest.raises(SystemExit):     # a seed is checked where it is parsed
        _parser().parse_args(["calibrate", "--seed", "-2"])
