"""Figures of the WSC-LLM studies: each split into a run function (arrays) and a plot function.

* :func:`run_design_space` / :func:`plot_design_space` -- the hardware design-space map
  (goodput and latency per DRAM / D2D / die-grid point, per workload and model).
* :func:`run_latency_cdf` / :func:`plot_latency_cdf` -- TTFT / TPOT / E2E CDFs per system.
* :func:`run_ablation` / :func:`plot_ablation` -- ablation bars (goodput, mean E2E, p99 TTFT).

Run functions take a finished :class:`~mocap_jax.wsc.explore.ExploreResult` /
:class:`~mocap_jax.wsc.baselines.BaselineResult`, or the arguments to compute one, and
return plain dicts of numpy arrays and labels; plot functions only draw (matplotlib, Agg)
and save to the given path.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from . import baselines as bl
from . import explore as ex


def pyplot():
    """matplotlib's pyplot on the non-interactive Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path, bbox_inches="tight") -> Path:
    """Save ``fig`` to ``path`` atomically (:func:`mocap_jax.figures.style.save`) and close it."""
    from ..figures.style import save

    return Path(save(fig, path, tight_layout=False, bbox_inches=bbox_inches))


# --------------------------------------------------------------------------- design space


def run_design_space(result: "ex.ExploreResult | None" = None, **explore_kwargs) -> dict[str, Any]:
    """Arrays of the design-space map.

    Args:
      result: a finished exploration (else ``explore(**explore_kwargs)`` is run).

    Returns:
      dict with ``workloads [W]``, ``models [M]``, ``columns [X]`` (labels ``grid / GB /
      TB/s``), ``d2d [Y]`` (TB/s), ``goodput [W, M, Y, X]`` (SLO goodput summed over the
      swept rates, req/s), ``goodput_norm`` (divided by the best of each (workload, model)),
      ``e2e [W, M, Y, X]`` (mean E2E latency at the highest rate, s), ``tokens [W, M, Y, X]``
      (output tokens/s at the highest rate), ``best [W]`` (best hardware label per workload)
      and ``best_cell [W] -> (y, x)``.  Infeasible points are nan.
    """
    res = result if result is not None else ex.explore(**explore_kwargs)
    rows = res.rows
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    models = list(dict.fromkeys(r["model"] for r in rows))
    cols = sorted({(r["dies"], r["grid"], r["dram_gb"], r["dram_tbps"]) for r in rows}, key=lambda c: (-c[0], c[2], c[3]))
    d2d = sorted({r["d2d_tbps"] for r in rows})
    col_index = {c[1:]: i for i, c in enumerate(cols)}
    shape = (len(workloads), len(models), len(d2d), len(cols))
    good, e2e, tok = np.zeros(shape), np.full(shape, np.nan), np.full(shape, np.nan)
    top_load = max(r["load"] for r in rows)
    for r in rows:
        i, j = workloads.index(r["workload"]), models.index(r["model"])
        y, x = d2d.index(r["d2d_tbps"]), col_index[(r["grid"], r["dram_gb"], r["dram_tbps"])]
        good[i, j, y, x] += float(r.get("goodput_rps") or 0.0)
        if r["load"] == top_load and r.get("feasible"):
            e = float(r["e2e_mean_s"])
            e2e[i, j, y, x] = e if math.isfinite(e) else np.nan
            tok[i, j, y, x] = float(r["tokens_per_s"])
    feas = np.zeros(shape, bool)
    for r in rows:
        if r.get("feasible"):
            i, j = workloads.index(r["workload"]), models.index(r["model"])
            feas[i, j, d2d.index(r["d2d_tbps"]), col_index[(r["grid"], r["dram_gb"], r["dram_tbps"])]] = True
    good = np.where(feas, good, np.nan)
    top = np.nanmax(np.where(np.isfinite(good), good, -np.inf), axis=(2, 3), keepdims=True)
    norm = np.where(top > 0, good / np.where(top > 0, top, 1.0), np.nan)
    best, best_cell = [], []
    for b in [b for b in res.best if b.get("subset", "all") == "all"]:
        best.append(b["hardware"])
        grid, gb, tbps, _, d = b["hardware"].replace("GB", "").replace("TB/s", "").split()
        best_cell.append((d2d.index(float(d)), col_index[(grid, float(gb), float(tbps))]))
    return {"workloads": workloads, "models": models,
            "columns": [f"{g}\n{gb:g} GB\n{bw:g} TB/s" for _, g, gb, bw in cols], "d2d": np.asarray(d2d),
            "column_dram_tbps": np.asarray([bw for *_, bw in cols]),
            "goodput": good, "goodput_norm": norm, "e2e": e2e, "tokens": tok, "best": best, "best_cell": best_cell,
            "top_load": top_load}


def plot_design_space(data: dict[str, Any], path="figures/wsc_design_space.png") -> Path:
    """Heat maps: colour = goodput normalised per (workload, model); text = mean E2E (s) at the top rate."""
    plt = pyplot()
    from matplotlib.patches import Rectangle

    W, M = len(data["workloads"]), len(data["models"])
    ny, nx = len(data["d2d"]), len(data["columns"])
    fig, axes = plt.subplots(W, M, figsize=(1.0 + 0.85 * nx * M, 1.2 + 1.2 * ny * W), squeeze=False,
                             constrained_layout=True)
    im = None
    for i, wl in enumerate(data["workloads"]):
        for j, m in enumerate(data["models"]):
            ax = axes[i, j]
            z = np.ma.masked_invalid(data["goodput_norm"][i, j])
            im = ax.imshow(z, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto", origin="lower")
            for y in range(ny):
                for x in range(nx):
                    e = data["e2e"][i, j, y, x]
                    g = data["goodput_norm"][i, j, y, x]
                    txt = "n/a" if not np.isfinite(g) else (f"{e:.2g}s" if np.isfinite(e) else "-")
                    ax.text(x, y, txt, ha="center", va="center", fontsize=6.5,
                            color="white" if (np.isfinite(g) and g < 0.6) else "black")
            for y in range(ny):  # the template's shoreline trade-off: D2D = 3 - DRAM bandwidth / 2
                for x in range(nx):
                    if abs(data["d2d"][y] + data["column_dram_tbps"][x] / 2 - 3.0) < 1e-9:
                        ax.add_patch(Rectangle((x - 0.42, y - 0.42), 0.84, 0.84, fill=False, ec="white", lw=1.0,
                                               ls="--"))
            by, bx = data["best_cell"][i]
            ax.add_patch(Rectangle((bx - 0.5, by - 0.5), 1, 1, fill=False, ec="red", lw=2))
            ax.set_xticks(range(nx))
            ax.set_xticklabels(data["columns"], fontsize=6)
            ax.set_yticks(range(ny))
            ax.set_yticklabels([f"{v:g}" for v in data["d2d"]], fontsize=7)
            ax.set_title(f"{wl}, {m}", fontsize=9)
            if j == 0:
                ax.set_ylabel("D2D bandwidth (TB/s)", fontsize=8)
            if i == W - 1:
                ax.set_xlabel("die grid / DRAM per die (GB, TB/s)", fontsize=8)
    cb = fig.colorbar(im, ax=axes, shrink=0.8, pad=0.02)
    cb.set_label("SLO goodput, summed over rates\n(normalised to the best point per model)", fontsize=8)
    fig.suptitle("WSC-LLM hardware design space: colour = goodput, text = mean E2E latency at "
                 f"{data['top_load']:g}x the reference capacity;\nred box = best design per workload, dashed = on the "
                 "shoreline trade-off (D2D = 3 - DRAM TB/s / 2); n/a = the model does not fit", fontsize=9)
    return save_figure(fig, path)


# --------------------------------------------------------------------------- latency CDFs


def run_latency_cdf(result: "bl.BaselineResult | None" = None, load: float | None = None,
                    **baseline_kwargs) -> dict[str, Any]:
    """Sorted per-request TTFT / TPOT / E2E of every system at one load.

    Returns:
      dict with ``systems [S]``, ``ttft``, ``tpot``, ``e2e`` (lists of sorted arrays, s;
      unfinished requests omitted), ``finished [S]`` (share), ``load`` and ``rate_rps``.
    """
    res = result if result is not None else bl.run_baselines(ablations=False, **baseline_kwargs)
    load = res.loads[len(res.loads) // 2] if load is None else float(load)
    if load not in res.loads:
        raise ValueError(f"load {load:g} was not simulated; choose one of {list(res.loads)}")
    names = [s[0] for s in bl.SYSTEMS]
    out: dict[str, Any] = {"systems": names, "load": load, "model": res.model, "workload": res.workload,
                           "rate_rps": res.results[("system", names[0], load)].trace.rate}
    for key in ("ttft", "tpot", "e2e"):
        out[key] = []
        for n in names:
            rm = res.results[("system", n, load)].requests
            x = np.asarray(getattr(rm, key)) if rm is not None else np.asarray([])
            out[key].append(np.sort(x[np.isfinite(x)]))
    out["finished"] = [float(np.mean(res.results[("system", n, load)].requests.finished))
                       if res.results[("system", n, load)].requests is not None else 0.0 for n in names]
    return out


def plot_latency_cdf(data: dict[str, Any], path="figures/wsc_latency_cdf.png") -> Path:
    """Three CDF panels (TTFT, TPOT, E2E), one line per system, log latency axis."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    styles = ["-", "--", "-", "--"]
    colours = ["#7f7f7f", "#7f7f7f", "#1f77b4", "#1f77b4"]
    for ax, key, label in zip(axes, ("ttft", "tpot", "e2e"),
                              ("time to first token (s)", "time per output token (s)", "end-to-end latency (s)")):
        for k, name in enumerate(data["systems"]):
            x = data[key][k]
            if x.size:
                ax.step(x, np.arange(1, x.size + 1) / x.size, where="post", ls=styles[k % 4], color=colours[k % 4],
                        lw=1.6 if "WSC" in name else 1.2, label=name)
        ax.set_xscale("log")
        ax.set_xlabel(label)
        ax.set_ylabel("fraction of requests")
        ax.set_ylim(0, 1.01)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8, loc="lower right")
    fig.suptitle(f"{data['model']}, {data['workload']} at {data['rate_rps']:.1f} req/s "
                 f"({data['load']:g}x the A100 + Splitwise capacity): latency CDF per system", fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path)


# --------------------------------------------------------------------------- ablations


def run_ablation(result: "bl.BaselineResult | None" = None, **baseline_kwargs) -> dict[str, Any]:
    """Ablation metrics per (ablation, load).

    Returns:
      dict with ``names [A]``, ``loads [L]``, ``rates [L]`` (req/s), ``goodput [A, L]``
      (req/s), ``e2e_mean_s [A, L]`` (s), ``ttft_p99_s [A, L]`` (s), ``tpot_mean_s [A, L]`` (s).
    """
    res = result if result is not None else bl.run_baselines(**baseline_kwargs)
    names = [a[0] for a in bl.ABLATIONS]
    if not any(("ablation", names[0], l) in res.results for l in res.loads):
        raise ValueError("this baseline run has no ablations; run it with ablations=True")
    keys = {"goodput": "goodput_rps", **{k: k for k in ("e2e_mean_s", "ttft_p99_s", "tpot_mean_s")}}
    rates = [res.results[("ablation", names[0], l)].trace.rate for l in res.loads]  # realised N / span
    out: dict[str, Any] = {"names": names, "loads": np.asarray(res.loads), "rates": np.asarray(rates),
                           "model": res.model, "workload": res.workload}
    for k, m in keys.items():
        out[k] = np.asarray([[float(res.results[("ablation", n, l)].metrics[m]) for l in res.loads] for n in names])
    return out


def plot_ablation(data: dict[str, Any], path="figures/wsc_ablation.png") -> Path:
    """Grouped bars per load: goodput, mean E2E latency and p99 TTFT of each ablation."""
    plt = pyplot()
    names, loads = data["names"], data["loads"]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    width = 0.8 / len(names)
    x = np.arange(len(loads))
    for ax, key, label in zip(axes, ("goodput", "e2e_mean_s", "ttft_p99_s"),
                              ("SLO goodput (req/s)", "mean E2E latency (s)", "p99 TTFT (s)")):
        for a, name in enumerate(names):
            vals = np.where(np.isfinite(data[key][a]), data[key][a], np.nan)
            ax.bar(x + (a - (len(names) - 1) / 2) * width, vals, width, label=name)
        ax.set_xticks(x)
        ax.set_xticklabels([f"{l:g}x\n{r:.1f} req/s" for l, r in zip(loads, data["rates"])], fontsize=8)
        ax.set_xlabel("offered load (x A100 + Splitwise capacity)")
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"WSC-LLM ablations on the wafer: {data['model']}, {data['workload']}", fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path)


# --------------------------------------------------------------------------- robustness


def run_robustness_figure(result) -> dict[str, Any]:
    """Arrays of the robustness figure from a :class:`~mocap_jax.wsc.robustness.RobustnessResult`.

    Returns:
      dict with ``scopes [S]`` (``workload / model`` labels, ``all`` = geometric mean over models),
      ``stays [S]`` (share of perturbations under which the nominal best stays best),
      ``margins [S]`` (list of arrays: the runner-up's margin under each perturbation),
      ``nominal_margin [S]``, ``nominal_best [S]`` and ``perturbations`` (count).
    """
    scopes = [(r["workload"], r["model"]) for r in result.summary]
    margins = [np.asarray([p["margin"] for p in result.per_perturbation if (p["workload"], p["model"]) == s])
               for s in scopes]
    return {"scopes": [f"{w}\n{m}" for w, m in scopes], "stays": np.asarray([r["share_best_stays_best"]
                                                                            for r in result.summary]),
            "margins": margins, "nominal_margin": np.asarray([r["nominal_margin"] for r in result.summary]),
            "nominal_best": [r["nominal_best"] for r in result.summary], "perturbations": len(result.perturbations)}


def plot_robustness(data: dict[str, Any], path="figures/wsc_robustness.png") -> Path:
    """Bars: share of perturbations the nominal best design stays best; boxes: the runner-up's margin."""
    plt = pyplot()
    s = len(data["scopes"])
    fig, axes = plt.subplots(2, 1, figsize=(max(6.0, 0.9 * s + 2), 6.2), sharex=True)
    x = np.arange(s)
    axes[0].bar(x, data["stays"], color="#5b8e7d")
    for k, v in enumerate(data["stays"]):
        axes[0].text(k, v + 0.02, f"{v:.0%}", ha="center", fontsize=7)
    axes[0].set_ylim(0, 1.12)
    axes[0].set_ylabel("nominal best\nstays best")
    axes[0].grid(axis="y", alpha=0.3)
    axes[1].boxplot([np.asarray(m) * 100 for m in data["margins"]], positions=x, widths=0.6, showfliers=True)
    axes[1].plot(x, data["nominal_margin"] * 100, "r_", ms=14, mew=2, label="nominal model")
    axes[1].set_ylabel("runner-up margin (%)\n1 - runner-up / best score")
    axes[1].set_xticks(x)
    axes[1].set_xticklabels(data["scopes"], fontsize=7)
    axes[1].grid(axis="y", alpha=0.3)
    axes[1].legend(fontsize=8)
    fig.suptitle(f"Robustness of the best design to {data['perturbations']} perturbations of the performance model "
                 f"(efficiencies +-15%, hop latency x0.5-2, alpha, contention rule)", fontsize=9)
    fig.tight_layout()
    return save_figure(fig, path)


__all__ = ["pyplot", "save_figure", "run_design_space", "plot_design_space", "run_latency_cdf", "plot_latency_cdf",
           "run_ablation", "plot_ablation", "run_robustness_figure", "plot_robustness"]
