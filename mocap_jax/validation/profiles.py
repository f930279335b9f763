"""The cost model against measured GPU operator profiles in the Vidur CSV layout.

A profile directory holds ``compute/GPU/ORG/MODEL/mlp.csv`` (one row per measured operator set:
model shape, ``num_tokens``, ``num_tensor_parallel_workers`` and per-operator
``time_stats.OP.median`` in milliseconds) and ``network/NAME/{all_reduce,send_recv}.csv``
(message ``size`` in bytes, ``num_workers``, ``devices_per_node``, medians in ms).  The GPU is
named by its folder (``a100``, ``h100``, or ``a100_dgx`` for a network folder); a GPU without a
preset takes ``hardware`` (a preset name or spec file).

Three comparisons, each as the mean absolute percentage error (MAPE) against the measured
medians, per GPU, operator and tensor-parallel degree:

* (a) cross-GPU: ``eff_gemm``, ``gemm_fixed_s`` and ``eff_hbm`` fitted on one GPU's GEMMs and
  used with the other GPU's datasheet (the fit minimises the MAPE itself);
* (b) datasheet only: the preset's peaks and bandwidths with the generic
  :class:`~mocap_jax.specs.HardwareSpec` default efficiencies and a flat GEMM curve -- the case
  of an accelerator nobody has profiled;
* collectives: ring all-reduce and send/recv (:mod:`mocap_jax.costs.tensor_parallel`) against
  the link model of the preset (NVLink inside a node, the network between nodes).

GEMM operators use :func:`mocap_jax.costs.gemm_time` on the per-GPU shard shapes of
:func:`mocap_jax.costs.tensor_parallel.projection_shapes`; the element-wise operators a pure
memory roofline (their bytes over ``hbm_bandwidth x eff_hbm``).  Units: seconds, bytes.
"""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from ..costs import HardwareParams, gemm_time
from ..costs.tensor_parallel import (all_reduce_time, column_share, kv_heads_share, projection_shapes, q_heads_share,
                                     send_recv_time)
from ..specs import HardwareSpec, SpecError, get_hardware
from ..specs.gpus import GPUS
from ..specs.hardware import gpu_node

GEMM_OPERATORS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
ELEMENTWISE_OPERATORS = ("emb", "input_layernorm", "attn_rope", "post_attention_layernorm", "mlp_act", "add")
SHAPE_COLUMNS = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "use_gated_mlp", "num_tokens",
                 "num_tensor_parallel_workers")
NETWORK_COLUMNS = ("size", "num_workers", "devices_per_node", "collective")
TARGET_MAPE = 10.0        # percent, GEMM operators at >= TARGET_TOKENS tokens, case (a)
TARGET_TOKENS = 512
FIT_NAMES = ("eff_gemm", "gemm_fixed_s", "eff_hbm")
BYTES = 2.0               # the profiles were taken in 16-bit precision


@dataclasses.dataclass(frozen=True)
class OperatorRows:
    """Measured operators, one entry per (GPU, model, operator, TP, tokens), duplicates' medians merged.

    Arrays ``[R]``: ``gpu``, ``model``, ``operator`` (str); ``tp``, ``tokens``, ``hidden``,
    ``q_heads``, ``kv_heads``, ``ffn`` (float); ``gated`` (bool); ``measured_s``.
    """

    gpu: np.ndarray
    model: np.ndarray
    operator: np.ndarray
    tp: np.ndarray
    tokens: np.ndarray
    hidden: np.ndarray
    q_heads: np.ndarray
    kv_heads: np.ndarray
    ffn: np.ndarray
    gated: np.ndarray
    measured_s: np.ndarray

    def select(self, mask) -> "OperatorRows":
        return OperatorRows(**{f.name: getattr(self, f.name)[mask] for f in dataclasses.fields(self)})


def _read_csv(path: Path, required: tuple[str, ...]) -> list[dict]:
    try:
        with open(path, newline="") as fh:
            rows = list(csv.DictReader(fh))
    except OSError as e:
        raise SpecError(f"cannot read profile {str(path)!r}: {e.strerror}") from None
    missing = [c for c in required if not rows or c not in rows[0]]
    if missing:
        raise SpecError(f"profile {str(path)!r} is not in the Vidur layout: missing column(s) {missing}")
    return rows


def _number(path: Path, row: dict, key: str) -> float:
    try:
        v = float(row[key])
    except (TypeError, ValueError):
        raise SpecError(f"profile {str(path)!r}: column {key!r} holds {row[key]!r}, not a number") from None
    if not np.isfinite(v) or v < 0:
        raise SpecError(f"profile {str(path)!r}: column {key!r} holds {row[key]!r}; expected a finite number >= 0")
    return v


def load_operator_profiles(root) -> OperatorRows:
    """Every ``compute/GPU/**/mlp.csv`` under ``root`` (see the module docstring)."""
    root = Path(root)
    files = sorted((root / "compute").glob("*/**/mlp.csv"))
    if not files:
        raise SpecError(f"no operator profiles under {str(root)!r}: expected compute/GPU/ORG/MODEL/mlp.csv "
                        f"(the Vidur data/profiling layout)")
    merged: dict[tuple, list[float]] = {}
    shape_of: dict[tuple, tuple] = {}
    for path in files:
        gpu = path.relative_to(root / "compute").parts[0].lower()
        model = path.parent.name
        ops = GEMM_OPERATORS + ELEMENTWISE_OPERATORS
        for row in _read_csv(path, SHAPE_COLUMNS):
            n = {k: _number(path, row, k) for k in SHAPE_COLUMNS if k != "use_gated_mlp"}
            gated = str(row["use_gated_mlp"]).strip().lower() == "true"
            for op in ops:
                key = f"time_stats.{op}.median"
                if row.get(key) in (None, ""):
                    continue
                cfg = (gpu, model, op, n["num_tensor_parallel_workers"], n["num_tokens"])
                merged.setdefault(cfg, []).append(_number(path, row, key) * 1e-3)
                shape_of[cfg] = (n["n_embd"], n["n_head"], n["n_kv_head"], n["n_expanded_embd"], gated)
    keys = sorted(merged)
    col = lambda i: np.array([k[i] for k in keys])
    shapes = np.array([shape_of[k][:4] for k in keys], np.float64)
    return OperatorRows(gpu=col(0), model=col(1), operator=col(2), tp=col(3).astype(np.float64),
                        tokens=col(4).astype(np.float64), hidden=shapes[:, 0], q_heads=shapes[:, 1],
                        kv_heads=shapes[:, 2], ffn=shapes[:, 3], gated=np.array([shape_of[k][4] for k in keys]),
                        measured_s=np.array([np.median(merged[k]) for k in keys]))


def load_network_profiles(root) -> list[dict[str, Any]]:
    """Rows of every ``network/NAME/*.csv``: ``folder``, ``gpu``, ``collective``, ``size``,
    ``workers``, ``per_node``, ``measured_s`` (duplicates' medians merged)."""
    root = Path(root)
    merged: dict[tuple, list[float]] = {}
    for path in sorted((root / "network").glob("*/*.csv")):
        folder = path.parent.name.lower()
        for row in _read_csv(path, NETWORK_COLUMNS):
            op = row["collective"]
            key = f"time_stats.{op}.median"
            if key not in row:
                raise SpecError(f"profile {str(path)!r}: collective {op!r} has no column {key!r}")
            cfg = (folder, op, _number(path, row, "size"), _number(path, row, "num_workers"),
                   _number(path, row, "devices_per_node"))
            merged.setdefault(cfg, []).append(_number(path, row, key) * 1e-3)
    return [dict(folder=f, gpu=f.split("_")[0], collective=op, size=s, workers=w, per_node=d,
                 measured_s=float(np.median(v))) for (f, op, s, w, d), v in sorted(merged.items())]


# --------------------------------------------------------------------------- the operator model


def hardware_for(gpu: str, hardware=None) -> HardwareSpec:
    """The spec a GPU folder is predicted with: ``hardware`` if given, else the GPU's preset."""
    if hardware is not None:
        return get_hardware(hardware)
    if gpu not in GPUS:
        raise SpecError(f"no preset for GPU folder {gpu!r} (presets: {', '.join(GPUS)}); pass --hardware with a "
                        f"preset or a .json/.toml spec file for it")
    return gpu_node(gpu)


def datasheet_hardware(hw: HardwareSpec) -> HardwareSpec:
    """Case (b): the datasheet peaks and bandwidths, generic default efficiencies, a flat GEMM curve."""
    defaults = HardwareSpec(name="defaults")
    return hw.replace(eff_gemm=defaults.eff_gemm, eff_hbm=defaults.eff_hbm, gemm_fixed_s=0.0)


def _params(hw: HardwareSpec) -> HardwareParams:
    return HardwareParams.from_spec(hw.replace(weight_bytes=BYTES, activation_bytes=BYTES, kv_bytes=BYTES),
                                    np.float64)


def predict_operators(rows: OperatorRows, hw: HardwareSpec) -> np.ndarray:
    """Predicted seconds of every row on ``hw`` (GEMMs: efficiency curve + roofline; others: memory)."""
    hp = _params(hw)
    n, t, d, f = rows.tokens, rows.tp, rows.hidden, rows.ffn
    head_dim = d / rows.q_heads
    shapes = projection_shapes(d, rows.q_heads, rows.kv_heads, head_dim, f, rows.gated, t, np)
    out = np.zeros(len(n))
    for op, (k, width) in shapes.items():
        m = rows.operator == op
        params = (k * width)[m]
        bytes_ = params * BYTES + n[m] * (k + width)[m] * BYTES
        out[m] = gemm_time(params, n[m], bytes_, 1, hp, np)
    heads = q_heads_share(rows.q_heads, t, np) + kv_heads_share(rows.q_heads, rows.kv_heads, t, np)
    # elements read + written: embedding rows and activations, norms and the residual add over the
    # hidden state, rotary embedding over q and k, the activation function over the FFN shard
    elements = {"emb": 2.0 * n * d, "input_layernorm": 2.0 * n * d, "post_attention_layernorm": 2.0 * n * d,
                "add": 3.0 * n * d, "attn_rope": 2.0 * n * heads * head_dim,
                "mlp_act": np.where(rows.gated, 3.0, 2.0) * n * column_share(f, t, np)}
    for op, e in elements.items():
        m = rows.operator == op
        out[m] = e[m] * BYTES / (hp.hbm_bandwidth * hp.eff_hbm)
    return out


def mape(predicted, measured) -> float:
    """Mean absolute percentage error, percent (nan for no rows)."""
    predicted, measured = np.asarray(predicted), np.asarray(measured)
    return float(100.0 * np.mean(np.abs(predicted / measured - 1.0))) if len(measured) else float("nan")


def fit_gemm_efficiency(rows: OperatorRows, hw: HardwareSpec) -> dict[str, float]:
    """``eff_gemm``, ``gemm_fixed_s`` and ``eff_hbm`` minimising the GEMM MAPE of ``rows`` on ``hw``.

    A bounded least-squares fit of the log time ratio starts a Nelder-Mead search on the MAPE.
    """
    from scipy.optimize import least_squares, minimize

    gemms = rows.select(np.isin(rows.operator, GEMM_OPERATORS))
    if not len(gemms.tokens):
        raise SpecError("the profiles hold no GEMM operators to fit")
    unit = np.array([1.0, 1e-6, 1.0])   # gemm_fixed_s in microseconds for the optimiser
    lo, hi = np.array([0.05, 0.0, 0.05]), np.array([1.0, 1e3, 1.0])

    def predict(x):
        x = np.clip(x, lo, hi)
        return predict_operators(gemms, hw.replace(**dict(zip(FIT_NAMES, (float(v) for v in x * unit)))))

    start = least_squares(lambda x: np.log(predict(x) / gemms.measured_s), [0.75, 5.0, 0.8], bounds=(lo, hi)).x
    best = minimize(lambda x: mape(predict(x), gemms.measured_s), start, method="Nelder-Mead",
                    options=dict(xatol=1e-5, fatol=1e-5, maxiter=4000)).x
    return dict(zip(FIT_NAMES, (float(v) for v in np.clip(best, lo, hi) * unit)))


def _breakdown(rows: OperatorRows, predicted: np.ndarray, operators) -> list[dict[str, Any]]:
    out = []
    for op in operators:
        for t in np.unique(rows.tp):
            m = (rows.operator == op) & (rows.tp == t)
            if not m.any():
                continue
            big = m & (rows.tokens >= TARGET_TOKENS)
            out.append(dict(operator=op, tp=int(t), rows=int(m.sum()), mape=mape(predicted[m], rows.measured_s[m]),
                            mape_512=mape(predicted[big], rows.measured_s[big]), rows_512=int(big.sum())))
    return out


def _summary(rows: OperatorRows, predicted: np.ndarray) -> dict[str, Any]:
    gemm = np.isin(rows.operator, GEMM_OPERATORS)
    big = gemm & (rows.tokens >= TARGET_TOKENS)
    other = ~gemm
    return dict(gemm_mape=mape(predicted[gemm], rows.measured_s[gemm]),
                gemm_mape_512=mape(predicted[big], rows.measured_s[big]), gemm_rows_512=int(big.sum()),
                other_mape=mape(predicted[other], rows.measured_s[other]),
                by_operator=_breakdown(rows, predicted, GEMM_OPERATORS + ELEMENTWISE_OPERATORS))


def _collective_model(op: str, size, workers, step_latency_s, bandwidth):
    return all_reduce_time(size, workers, step_latency_s, bandwidth, np) if op == "all_reduce" \
        else send_recv_time(size, step_latency_s, bandwidth)


def fit_link(network: list[dict], hw: HardwareSpec) -> dict[str, float]:
    """``eff_link`` and ``link_latency_s`` minimising the MAPE of ``network``'s NVLink rows on ``hw``
    (the ``*_dgx`` folders when there are any: all GPUs on one NVSwitch, the presets' topology)."""
    from scipy.optimize import minimize

    rs = [r for r in network if r["per_node"] >= r["workers"]]
    switched = [r for r in rs if r["folder"].endswith("_dgx")]   # every GPU on one NVSwitch, as in the presets
    rs = switched or rs
    if not rs:
        raise SpecError("the profiles hold no collectives inside one node to fit the link model to")

    def total(x):
        eff, lat = np.clip(x, [0.05, 0.0], [1.0, 1e3]) * [1.0, 1e-6]
        pred = [_collective_model(r["collective"], r["size"], r["workers"], lat, hw.link_bandwidth * eff) for r in rs]
        return mape(pred, [r["measured_s"] for r in rs])

    best = np.clip(minimize(total, [0.8, 5.0], method="Nelder-Mead").x, [0.05, 0.0], [1.0, 1e3])
    return {"eff_link": float(best[0]), "link_latency_s": float(best[1] * 1e-6)}


def collective_report(network: list[dict], hardware=None) -> dict[str, Any]:
    """Ring all-reduce and send/recv against the link model, per network folder, collective and workers.

    ``datasheet``: the preset's NVLink (inside a node) or network (between nodes) bandwidth,
    ``eff_link`` and hop latency.  ``cross_gpu``: ``eff_link`` and the latency fitted on the
    other GPU's NVLink rows (``fits``), predicting this GPU's NVLink rows.
    """
    gpus = sorted({r["gpu"] for r in network if r["gpu"] in GPUS or hardware is not None})
    specs = {g: hardware_for(g, hardware) for g in gpus}
    fits = {g: fit_link([r for r in network if r["gpu"] == g], specs[g]) for g in gpus}
    groups: dict[tuple, list[dict]] = {}
    for r in network:
        if r["gpu"] in specs:
            groups.setdefault((r["folder"], r["collective"], r["workers"], r["per_node"]), []).append(r)
    rows = []
    for (folder, op, workers, per_node), rs in sorted(groups.items()):
        hw = specs[rs[0]["gpu"]]
        inside = per_node >= workers
        size = np.array([r["size"] for r in rs])
        measured = np.array([r["measured_s"] for r in rs])
        bw = hw.link_bandwidth if inside else hw.cross_wafer_bandwidth
        predicted = _collective_model(op, size, workers, hw.link_latency_s, bw * hw.eff_link)
        row = dict(folder=folder, collective=op, workers=int(workers), per_node=int(per_node),
                   link="nvlink" if inside else "network", rows=len(rs), mape=mape(predicted, measured),
                   mape_large=mape(predicted[size >= 2 ** 20], measured[size >= 2 ** 20]),
                   size=size.tolist(), measured_s=measured.tolist(), predicted_s=np.asarray(predicted).tolist())
        source = next((g for g in gpus if g != rs[0]["gpu"]), None)
        if inside and source is not None:
            f = fits[source]
            cross = _collective_model(op, size, workers, f["link_latency_s"], hw.link_bandwidth * f["eff_link"])
            row.update(cross_source=source, cross_mape=mape(cross, measured),
                       cross_mape_large=mape(cross[size >= 2 ** 20], measured[size >= 2 ** 20]))
        rows.append(row)
    return dict(fits=fits, rows=rows)


def profiles_report(root, hardware=None, operators: OperatorRows | None = None) -> dict[str, Any]:
    """Everything ``mocap-jax validate --profiles`` reports (see the module docstring).

    Returns a dict: ``gpus``; ``fits`` per GPU and ``pooled`` (both GPUs); ``cross_gpu`` and
    ``datasheet`` per target GPU (summary + ``by_operator``); ``collectives``; ``target``
    (``met`` when every case (a) GEMM MAPE at >= 512 tokens is within 10%); ``points`` (per
    case: GPU, measured and predicted seconds of GEMMs, for the figure).  ``operators``: the
    rows of ``root`` if already loaded (:func:`load_operator_profiles`).
    """
    rows = load_operator_profiles(root) if operators is None else operators
    gpus = sorted(set(rows.gpu.tolist()))
    specs = {g: hardware_for(g, hardware) for g in gpus}
    fits = {g: fit_gemm_efficiency(rows.select(rows.gpu == g), specs[g]) for g in gpus}
    report: dict[str, Any] = dict(profiles=str(root), gpus={g: specs[g].summary() for g in gpus}, fits=fits,
                                  cross_gpu={}, datasheet={}, points={"cross_gpu": [], "datasheet": []})
    for g in gpus:
        target = rows.select(rows.gpu == g)
        for source in (s for s in gpus if s != g):
            predicted = predict_operators(target, specs[g].replace(**fits[source]))
            report["cross_gpu"][g] = dict(source=source, **_summary(target, predicted))
            report["points"]["cross_gpu"] += _points(g, target, predicted)
        predicted = predict_operators(target, datasheet_hardware(specs[g]))
        report["datasheet"][g] = _summary(target, predicted)
        report["points"]["datasheet"] += _points(g, target, predicted)
    report["fits"]["pooled"] = _pooled_fit(rows, specs, fits)
    report["collectives"] = collective_report(load_network_profiles(root), hardware)
    worst = max((c["gemm_mape_512"] for c in report["cross_gpu"].values()), default=float("nan"))
    report["target"] = dict(gemm_mape_512_max=TARGET_MAPE, worst=worst, met=bool(worst <= TARGET_MAPE))
    return report


def _points(gpu: str, rows: OperatorRows, predicted: np.ndarray) -> list[tuple]:
    m = np.isin(rows.operator, GEMM_OPERATORS)
    return [(gpu, float(a), float(b)) for a, b in zip(rows.measured_s[m], predicted[m])]


def _pooled_fit(rows: OperatorRows, specs: dict[str, HardwareSpec], fits: dict[str, dict]) -> dict[str, float]:
    """One (eff_gemm, gemm_fixed_s, eff_hbm) minimising the GEMM MAPE over every GPU at once (each GPU
    with its own datasheet): the source of the shipped ``gemm_fixed_s`` default."""
    from scipy.optimize import minimize

    gemms = rows.select(np.isin(rows.operator, GEMM_OPERATORS))
    unit = np.array([1.0, 1e-6, 1.0])
    lo, hi = np.array([0.05, 0.0, 0.05]), np.array([1.0, 1e3, 1.0])
    parts = [(gemms.gpu == g, specs[g]) for g in specs]

    def total(x):
        values = dict(zip(FIT_NAMES, (float(v) for v in np.clip(x, lo, hi) * unit)))
        predicted = np.zeros(len(gemms.tokens))
        for m, hw in parts:
            predicted[m] = predict_operators(gemms.select(m), hw.replace(**values))
        return mape(predicted, gemms.measured_s)

    start = np.mean([[f[k] / u for k, u in zip(FIT_NAMES, unit)] for f in fits.values()], axis=0)
    best = minimize(total, start, method="Nelder-Mead", options=dict(xatol=1e-5, fatol=1e-5, maxiter=4000)).x
    return dict(zip(FIT_NAMES, (float(v) for v in np.clip(best, lo, hi) * unit)))
