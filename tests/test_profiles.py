"""The token-dependent GEMM efficiency curve, its fit to the Vidur GPU operator profiles
(../shared/data/vidur-profiling), and the profiles report on that data."""

from pathlib import Path

import numpy as np
import pytest

from mocap_jax.costs import HardwareParams
from mocap_jax.costs.efficiency import gemm_efficiency, half_tokens
from mocap_jax.specs import HardwareSpec, SpecError
from mocap_jax.validation import profiles as pr

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "vidur-profiling"
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason="the Vidur profiles are not checked out beside the repo")


def _hp(**changes):
    return HardwareParams.from_spec(HardwareSpec(name="t", peak_flops=1e15, eff_gemm=0.8, **changes), np.float64)


def test_flat_curve_is_the_plain_plateau_exactly():
    hp = _hp(gemm_fixed_s=0.0)
    tokens = np.array([0.0, 1.0, 7.0, 512.0, 1e6])
    np.testing.assert_array_equal(gemm_efficiency(tokens, 1e8, 4, hp, np), np.full(5, 0.8))


def test_curve_reaches_half_the_plateau_at_half_tokens():
    hp = _hp(gemm_fixed_s=10e-6)
    n_half = float(half_tokens(1e8, 1, 1e15, 0.8, 10e-6))
    assert n_half == pytest.approx(10e-6 * 1e15 * 0.8 / 2e8)                # 40 tokens
    assert float(gemm_efficiency(n_half, 1e8, 1, hp, np)) == pytest.approx(0.4)
    # the compute time is the FLOPs at the plateau plus the fixed kernel time
    n = 4096.0
    t = 2 * 1e8 * n / (1e15 * float(gemm_efficiency(n, 1e8, 1, hp, np)))
    assert t == pytest.approx(2 * 1e8 * n / (1e15 * 0.8) + 10e-6)
    assert float(gemm_efficiency(0.0, 1e8, 1, hp, np)) == 0.8                # padding: no FLOPs, no nan


def test_loader_bad_input(tmp_path):
    with pytest.raises(SpecError, match="no operator profiles"):
        pr.load_operator_profiles(tmp_path)
    bad = tmp_path / "compute" / "x100" / "org" / "m"
    bad.mkdir(parents=True)
    (bad / "mlp.csv").write_text("num_tokens,foo\n1,2\n")
    with pytest.raises(SpecError, match="missing column"):
        pr.load_operator_profiles(tmp_path)
    with pytest.raises(SpecError, match="no preset for GPU folder 'x100'"):
        pr.hardware_for("x100")


@pytest.fixture(scope="module")
def rows():
    return pr.load_operator_profiles(DATA)


@pytest.fixture(scope="module")
def report(rows):
    return pr.profiles_report(DATA, operators=rows)


@needs_data
def test_cross_gpu_gemm_target_met_on_the_vidur_profiles(report):
    assert set(report["cross_gpu"]) == {"a100", "h100"}
    for gpu, case in report["cross_gpu"].items():
        assert case["source"] != gpu
        assert case["gemm_mape_512"] <= pr.TARGET_MAPE, (gpu, case["gemm_mape_512"])
        assert case["gemm_rows_512"] > 10000
    assert report["target"]["met"]
    # the datasheet-only case is reported, and fitting on the other GPU beats it on both GPUs
    for gpu in ("a100", "h100"):
        assert report["cross_gpu"][gpu]["gemm_mape_512"] < report["datasheet"][gpu]["gemm_mape_512"]
    assert {r["collective"] for r in report["collectives"]["rows"]} == {"all_reduce", "send_recv"}


@needs_data
def test_shipped_gemm_curve_default_is_the_pooled_fit(report, rows):
    pooled = report["fits"]["pooled"]
    assert HardwareSpec(name="d").gemm_fixed_s == pytest.approx(pooled["gemm_fixed_s"], rel=0.02)
    assert 0.6 < pooled["eff_gemm"] < 0.8 and 0.5 < pooled["eff_hbm"] <= 1.0
    # a fitted curve predicts better than the flat plateau fitted to the same GPU
    a100 = rows.select((rows.gpu == "a100") & np.isin(rows.operator, pr.GEMM_OPERATORS))
    hw = pr.hardware_for("a100").replace(**report["fits"]["a100"])
    flat = pr.mape(pr.predict_operators(a100, hw.replace(gemm_fixed_s=0.0)), a100.measured_s)
    assert pr.mape(pr.predict_operators(a100, hw), a100.measured_s) < flat
