"""Fitting the cost model's efficiencies and per-layer overhead to measured chunk times; the linear
baselines; the held-out split."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ...costs import HardwareParams, ModelParams, dense_layer_time
from ...specs import HardwareSpec, ModelSpec
from .sizes import FIT_NAMES


def _params(model: ModelSpec, hw: HardwareSpec):
    return ModelParams.from_spec(model, np.float64), HardwareParams.from_spec(hw, np.float64)


def with_fitted(hw: HardwareSpec, fitted: dict[str, float]) -> HardwareSpec:
    """``hw`` with the fitted efficiencies and layer overhead."""
    return dataclasses.replace(hw, **{k: float(fitted[k]) for k in FIT_NAMES})


def predict_chunk_times(model: ModelSpec, hw: HardwareSpec, c, p, b) -> np.ndarray:
    """Seconds for one chunk through all ``model.layers`` blocks: ``L x dense_layer_time`` (numpy, float64)."""
    mp, hp = _params(model, hw)
    c, p, b = (np.asarray(v, np.float64) for v in (c, p, b))
    return model.layers * np.asarray(dense_layer_time(mp, hp, c, p, b, xp=np), np.float64)


def roofline_binding(model: ModelSpec, hw: HardwareSpec, c, p, b) -> dict[str, np.ndarray]:
    """Which roofline branch binds at each point, found by perturbing the project's own cost function.

    ``gemm_compute[i]`` is True where the GEMM time depends on ``eff_gemm`` (so its compute branch binds;
    otherwise the memory branch does), likewise ``attention_compute`` for ``eff_attention``.
    """
    base = predict_chunk_times(model, hw, c, p, b)

    def moved(name):
        h = dataclasses.replace(hw, **{name: getattr(hw, name) * (1 - 1e-6)})
        return np.abs(predict_chunk_times(model, h, c, p, b) - base) > 1e-9 * base

    return {"gemm_compute": moved("eff_gemm"), "attention_compute": moved("eff_attention")}


def mape(pred, meas) -> float:
    """Mean absolute percentage error, in percent."""
    pred, meas = np.asarray(pred, np.float64), np.asarray(meas, np.float64)
    if pred.size == 0:
        return float("nan")
    return float(100.0 * np.mean(np.abs(pred - meas) / meas))


def fit_cost_model(model: ModelSpec, hw: HardwareSpec, c, p, b, t, *, eff_floor: float = 1e-4,
                   loss: str = "linear", f_scale: float = 0.1) -> dict[str, Any]:
    """Fit ``eff_gemm``, ``eff_attention``, ``eff_hbm`` in ``[eff_floor, 1]`` and ``layer_overhead_s >= 0``.

    Minimises the sum of squared ``log(predicted / measured)`` over the given points with
    ``scipy.optimize.least_squares`` (trust-region reflective, bounds), started from several points
    (the roofline ``max`` makes the objective piecewise smooth); the best end point wins.

    Returns ``{"fitted": {...}, "identified": {...}, "binding": {...}, "cost": ..., "starts": ...}``.
    ``identified[name]`` is False for an efficiency whose roofline branch binds on no point (its value is
    then the start value and only bounded by the data).
    """
    from scipy.optimize import least_squares

    c, p, b, t = (np.asarray(v, np.float64).ravel() for v in (c, p, b, t))
    if not (c.size == p.size == b.size == t.size) or c.size < len(FIT_NAMES):
        raise ValueError(f"need at least {len(FIT_NAMES)} points with matching c, p, b, t to fit the cost model")
    if np.any(t <= 0) or not np.all(np.isfinite(t)):
        raise ValueError("measured times must be positive and finite")
    mp, hp0 = _params(model, hw)
    L = model.layers
    ovh_unit = max(float(np.min(t)) / L, 1e-9)  # overhead is fitted in units of the fastest point's per-layer time

    def hp_of(x):
        return dataclasses.replace(hp0, eff_gemm=np.float64(x[0]), eff_attention=np.float64(x[1]),
                                   eff_hbm=np.float64(x[2]), layer_overhead_s=np.float64(x[3] * ovh_unit))

    logt = np.log(t)

    def resid(x):
        pred = L * dense_layer_time(mp, hp_of(x), c, p, b, xp=np)
        return np.log(pred) - logt

    lo = np.array([eff_floor, eff_floor, eff_floor, 0.0])
    hi = np.array([1.0, 1.0, 1.0, 1.0])  # overhead can't exceed the fastest point's time
    best = None
    starts = [(g, a, h, o) for g in (0.05, 0.3, 0.9) for a in (0.02, 0.2, 0.9) for h in (0.2, 0.9) for o in (0.05, 0.5)]
    for x0 in starts:
        r = least_squares(resid, np.array(x0, np.float64), bounds=(lo, hi), method="trf", x_scale=1.0,
                          loss=loss, f_scale=f_scale, xtol=1e-12, ftol=1e-12, gtol=1e-12, max_nfev=2000)
        if best is None or r.cost < best.cost - 1e-15:
            best = r
    x = best.x
    fitted = {"eff_gemm": float(x[0]), "eff_attention": float(x[1]), "eff_hbm": float(x[2]),
              "layer_overhead_s": float(x[3] * ovh_unit)}
    # Standard errors from the Jacobian (free parameters only; None at a bound or when not estimable).
    std = dict.fromkeys(FIT_NAMES)
    free = best.active_mask == 0
    dof = c.size - int(free.sum())
    if dof > 0 and free.any():
        J = best.jac[:, free]
        s2 = 2 * best.cost / dof
        cov = s2 * np.linalg.pinv(J.T @ J)
        units = np.array([1.0, 1.0, 1.0, ovh_unit])[free]
        for name, v, u in zip(np.array(FIT_NAMES)[free], np.diag(cov), units):
            std[str(name)] = float(np.sqrt(v) * u) if np.isfinite(v) and v >= 0 else None
    bind = roofline_binding(model, with_fitted(hw, fitted), c, p, b)
    gemm_mem, att_mem = ~bind["gemm_compute"], ~bind["attention_compute"]
    binding = {"gemm_compute_bound": int(np.sum(~gemm_mem)), "gemm_memory_bound": int(np.sum(gemm_mem)),
               "attention_compute_bound": int(np.sum(~att_mem)), "attention_memory_bound": int(np.sum(att_mem))}
    identified = {"eff_gemm": bool(np.any(~gemm_mem)), "eff_attention": bool(np.any(~att_mem)),
                  "eff_hbm": bool(np.any(gemm_mem) or np.any(att_mem)), "layer_overhead_s": True}
    return {"fitted": fitted, "std_error": std, "identified": identified, "binding": binding, "cost": float(best.cost),
            "rms_log_error": float(np.sqrt(2 * best.cost / c.size)), "starts": len(starts)}


def _linear_features(c, p, b, scale_by_batch: bool):
    c, p, b = (np.asarray(v, np.float64).ravel() for v in (c, p, b))
    s = b if scale_by_batch else np.ones_like(b)
    return np.stack([np.ones_like(c), s * c, s * p, s * c * p], axis=1)


def fit_linear_baseline(c, p, b, t, scale_by_batch: bool = True) -> np.ndarray:
    """Coefficients ``(a, b1, b2, b3)`` of ``t = a + b1 c + b2 p + b3 c p`` (times ``B`` when ``scale_by_batch``).

    Relative-error weighted least squares (each row divided by its measured time), the same
    objective MAPE scores; ``lstsq`` handles rank deficiency (e.g. a single prefix length).
    """
    X = _linear_features(c, p, b, scale_by_batch)
    t = np.asarray(t, np.float64).ravel()
    scale = np.maximum(np.abs(X).max(axis=0), 1e-300)
    coef, *_ = np.linalg.lstsq((X / scale) / t[:, None], np.ones_like(t), rcond=None)
    return coef / scale


def predict_linear_baseline(coef, c, p, b, scale_by_batch: bool = True) -> np.ndarray:
    return _linear_features(c, p, b, scale_by_batch) @ np.asarray(coef, np.float64)


def split_cells(n: int, test_fraction: float, seed: int) -> np.ndarray:
    """Boolean ``is_test[n]``: a seeded random choice of ``round(test_fraction n)`` held-out cells."""
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    n_test = min(max(int(round(test_fraction * n)), 1), n - len(FIT_NAMES))
    if n_test < 1:
        raise ValueError(f"a grid of {n} cells is too small to hold out cells and fit {len(FIT_NAMES)} parameters")
    rng = np.random.default_rng(seed)
    is_test = np.zeros(n, bool)
    is_test[rng.choice(n, size=n_test, replace=False)] = True
    return is_test


# --------------------------------------------------------------------------- measurement
